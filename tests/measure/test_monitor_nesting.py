"""Two monitors on one Hugging Face model at once (the health callback and QK-Clip watch the
same training step): each records what a lone monitor records, the output is a lone monitor's,
and either may exit first: the other goes on recording, and the model ends as it began."""

from __future__ import annotations

import pytest
import torch

from attnscale.measure.monitor import Monitor

transformers = pytest.importorskip("transformers")


@pytest.fixture(params=["sdpa", "eager"])
def gpt2(request):
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2Model(cfg).eval()
    model.set_attn_implementation(request.param)
    return model


def test_nested_monitors_each_record_the_whole_call(gpt2):
    ids = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = gpt2(ids).last_hidden_state
        with Monitor(gpt2) as alone:
            watched = gpt2(ids).last_hidden_state
        with Monitor(gpt2) as outer, Monitor(gpt2) as inner:
            nested = gpt2(ids).last_hidden_state
    assert torch.equal(watched, nested)
    torch.testing.assert_close(nested, plain)
    assert gpt2.config._attn_implementation in ("sdpa", "eager")  # put back
    for mon in (outer, inner):
        got = mon.flat_stats()
        assert got.keys() == alone.flat_stats().keys()
        assert got == pytest.approx(alone.flat_stats(), rel=1e-5)


def test_the_outer_monitor_may_exit_first(gpt2):
    base = gpt2.config._attn_implementation
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(2))
    outer, inner = Monitor(gpt2), Monitor(gpt2)
    with torch.no_grad():
        outer.__enter__()
        inner.__enter__()
        gpt2(ids)
        outer.__exit__(None, None, None)
        gpt2(ids)  # only the inner one is still watching
        inner.__exit__(None, None, None)
        gpt2(ids)
    rows = {k: v for k, v in inner.flat_stats().items() if k.endswith("/rows")}
    assert all(v == 2 * outer.flat_stats()[k] for k, v in rows.items())
    assert gpt2.config._attn_implementation == base


def test_attnscale_monitors_may_exit_in_any_order():
    from attnscale.core.nn import MultiheadSelfAttention

    torch.manual_seed(0)
    m = MultiheadSelfAttention(16, 4)
    x = torch.randn(2, 5, 16)
    outer, inner = Monitor(m), Monitor(m)
    with torch.no_grad():
        outer.__enter__()
        inner.__enter__()
        m(x)
        outer.__exit__(None, None, None)
        m(x)  # only the inner one records
        inner.__exit__(None, None, None)
        m(x)
    (a,), (b,) = outer.stats().values(), inner.stats().values()
    assert a.rows.sum() == 4 * 2 * 5 and b.rows.sum() == 2 * a.rows.sum()
    assert m.capture is None
