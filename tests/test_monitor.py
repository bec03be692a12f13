"""The monitor: outputs untouched, statistics equal to those of the real attention weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnscale.monitor import Monitor
from attnscale.nn import MultiheadSelfAttention
from attnscale.stats import logit_stats

transformers = pytest.importorskip("transformers")


def entropy_from_weights(w: torch.Tensor, query_mask: torch.Tensor | None = None) -> np.ndarray:
    """Per-head mean entropy of attention weights (B, H, N, S) over kept query rows."""
    ent = -(w * w.clamp_min(1e-30).log()).sum(-1)  # (B, H, N)
    if query_mask is None:
        return ent.mean(dim=(0, 2)).numpy()
    m = query_mask[:, None, :].double()
    return ((ent * m).sum(dim=(0, 2)) / m.sum(dim=(0, 2))).numpy()


def tiny_bert(impl: str):
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  attn_implementation=impl)
    torch.manual_seed(0)
    return transformers.BertModel(cfg).eval()


def bert_inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_bert_output_unchanged(impl):
    model, inputs = tiny_bert(impl), bert_inputs()
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        with Monitor(model, counterfactuals=True) as mon:
            mon.query_mask = inputs["attention_mask"].bool()
            during = model(**inputs).last_hidden_state
        after = model(**inputs).last_hidden_state
    assert torch.equal(before, during)  # bitwise: the model's own attention code ran
    assert torch.equal(before, after)
    assert model.config._attn_implementation == impl  # restored
    assert len(mon.stats()) == 2 and len(mon.stats("dot")) == 2


def test_hf_stats_match_eager_output_attentions():
    model, inputs = tiny_bert("eager"), bert_inputs()
    qmask = inputs["attention_mask"].bool()
    with torch.no_grad(), Monitor(model) as mon:
        mon.query_mask = qmask
        out = model(**inputs, output_attentions=True)
    stats = list(mon.stats().values())
    assert len(stats) == len(out.attentions)
    for s, w in zip(stats, out.attentions, strict=True):
        np.testing.assert_allclose(s.entropy, entropy_from_weights(w.double(), qmask), rtol=1e-5)
        kept = w.amax(-1)[qmask[:, None, :].expand_as(w.amax(-1))]
        assert s.max_weight.mean() == pytest.approx(kept.mean().item(), rel=1e-5)
        # padding keys are excluded: real rows of sequence 1 see 6 keys
        assert s.entropy_uniform.max() < np.log(9)


def test_hf_gpt2_is_monitored_with_its_causal_mask():
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2Model(cfg).eval()
    ids = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        before = model(ids).last_hidden_state
        with Monitor(model) as mon:
            out = model(ids, output_attentions=True)
    assert torch.equal(before, out.last_hidden_state)
    for s, w in zip(mon.stats().values(), out.attentions, strict=True):
        np.testing.assert_allclose(s.entropy, entropy_from_weights(w.double()), rtol=1e-5)
        # causal: query i sees i + 1 keys
        assert s.entropy_uniform.mean() == pytest.approx(np.mean(np.log(np.arange(1, 9))))


def test_torch_multihead_attention():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True  # True = ignore, in nn.MultiheadAttention
    with torch.no_grad():
        before, w = mha(x, x, x, key_padding_mask=pad, average_attn_weights=False)
        with Monitor(mha) as mon:
            during, _ = mha(x, x, x, key_padding_mask=pad)
    assert torch.equal(before, during)
    (s,) = mon.stats().values()
    np.testing.assert_allclose(s.entropy, entropy_from_weights(w.double()), rtol=1e-5)


def test_attnscale_module_and_counterfactuals():
    torch.manual_seed(0)
    m = MultiheadSelfAttention(16, 4, score="cosine", tau=10.0, causal=True)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        before = m(x)
        with Monitor(m, counterfactuals=True) as mon:
            during = m(x)
    assert torch.equal(before, during) and m.capture is None
    q, k, _ = m.split_heads(x)
    logits = 10.0 * torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(
        k, dim=-1).transpose(-2, -1)
    expected = logit_stats(logits.detach(), is_causal=True)
    (actual,) = mon.stats().values()
    np.testing.assert_allclose(actual.entropy, expected.entropy, rtol=1e-5)
    (cos1,) = mon.stats("cosine_tau1").values()
    assert np.all(cos1.entropy > actual.entropy)  # τ = 1 spreads attention out
    (dot,) = mon.stats("dot").values()
    unscaled = logit_stats((q @ k.transpose(-2, -1)).detach(), is_causal=True)
    np.testing.assert_allclose(dot.entropy, unscaled.entropy, rtol=1e-5)


def test_every_samples_calls():
    m = MultiheadSelfAttention(16, 4)
    with torch.no_grad(), Monitor(m, every=2) as mon:
        for _ in range(4):
            m(torch.randn(1, 5, 16))
    (s,) = mon.stats().values()
    assert s.rows.sum() == 2 * 4 * 5  # two of four calls, 4 heads × 5 rows each


def test_bad_use():
    with pytest.raises(ValueError, match="no attention"):
        Monitor(nn.Linear(2, 2)).__enter__()
    with pytest.raises(ValueError, match="every"):
        Monitor(nn.Linear(2, 2), every=0)
    with pytest.raises(ValueError, match="variant"):
        Monitor(nn.Linear(2, 2)).stats("nope")


def test_compiled_statistics_equal_eager():
    """Monitor(compile=True) fuses the same math with torch.compile: same numbers."""
    model, inputs = tiny_bert("sdpa"), bert_inputs()
    results = {}
    for compile in (False, True):
        with torch.no_grad(), Monitor(model, counterfactuals=True, compile=compile) as mon:
            mon.query_mask = inputs["attention_mask"].bool()
            model(**inputs)
        results[compile] = {v: mon.stats(v) for v in ("actual", "dot", "cosine_tau1")}
    for variant, layers in results[False].items():
        for name, eager in layers.items():
            fused = results[True][variant][name]
            for field in ("entropy", "max_weight", "effective_keys", "logit_std",
                          "max_abs_logit", "jacobian_norm", "logsumexp"):
                np.testing.assert_allclose(getattr(fused, field), getattr(eager, field),
                                           rtol=1e-5, atol=1e-6, err_msg=f"{variant} {field}")
