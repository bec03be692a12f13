"""The monitor: outputs untouched, statistics equal to those of the real attention weights."""

from __future__ import annotations

import copy
import importlib
import types
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.measure import native
from attnscale.measure.monitor import Monitor
from attnscale.measure.stats import logit_stats
from attnscale.util import cppext

monitor_module = importlib.import_module("attnscale.measure.monitor")

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


# Which code computes the statistics, and how a monitored SDPA call is answered:
# native -- the default, Monitor(model): one pass of the native kernel gives output and statistics;
# python -- compile=False: SDPA itself, the statistics beside it in Python;
# off -- the default with $ATTNSCALE_NATIVE_ISA=off, the forced fallback: as python;
# compiled -- compile=True where the native kernel is not available: torch.compile.
PATHS = ["native", "python", "off", "compiled"]
COMPILE = {"native": None, "python": False, "off": None, "compiled": True}
RAN = {"native": "native", "python": "python", "off": "python", "compiled": "compiled"}


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Forces one path; afterwards checks that every statistic came from it (Monitor.paths)
    and that the fused pass answered the SDPA calls iff the path has one."""
    if request.param == "native":
        request.getfixturevalue("kernel")  # fails where the kernel must build and did not
    if request.param == "off":
        monkeypatch.setattr(native, "_state", {})
        monkeypatch.setenv(cppext.ENV, "off")
    if request.param == "compiled":
        monkeypatch.setattr(native, "fused_kernel", lambda isa=None: None)
    calls = []
    fused = monitor_module._attend_and_measure
    monkeypatch.setattr(monitor_module, "_attend_and_measure",
                        lambda *a: calls.append(1) or fused(*a))
    made: list[Monitor] = []

    def make(model, **kwargs) -> Monitor:
        mon = Monitor(model, compile=COMPILE[request.param], **kwargs)
        made.append(mon)
        return mon

    yield types.SimpleNamespace(name=request.param, monitor=make)
    assert made and all(set(mon.paths) == {RAN[request.param]} for mon in made), \
        [dict(mon.paths) for mon in made]
    assert all(mon.backend == RAN[request.param] for mon in made)
    assert bool(calls) == (request.param in ("native", "compiled")), "the fused pass ran"


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_bert_output_unchanged(impl):
    """Bitwise: eager always; sdpa when SDPA itself runs (compile=False)."""
    model, inputs = tiny_bert(impl), bert_inputs()
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        compile = None if impl == "eager" else False
        with Monitor(model, counterfactuals=True, compile=compile) as mon:
            mon.query_mask = inputs["attention_mask"].bool()
            during = model(**inputs).last_hidden_state
        after = model(**inputs).last_hidden_state
    assert torch.equal(before, during)  # bitwise: the model's own attention code ran
    assert torch.equal(before, after)
    assert model.config._attn_implementation == impl  # restored
    assert len(mon.stats()) == 2 and len(mon.stats("dot")) == 2


def test_hf_bert_output_within_rounding_when_fused(path):
    """A fused pass answers SDPA within float rounding (1e-6); SDPA itself, bitwise."""
    model, inputs = tiny_bert("sdpa"), bert_inputs()
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        with path.monitor(model) as mon:
            mon.query_mask = inputs["attention_mask"].bool()
            during = model(**inputs).last_hidden_state
    torch.testing.assert_close(during, before, rtol=1e-6, atol=1e-6)
    if path.name in ("python", "off"):
        assert torch.equal(during, before)
    assert len(mon.stats()) == 2


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


def test_hf_sdpa_stats_match_eager_output_attentions(path):
    """Every SDPA path records the statistics of the weights the eager code computes."""
    inputs = bert_inputs()
    qmask = inputs["attention_mask"].bool()
    with torch.no_grad():
        weights = tiny_bert("eager")(**inputs, output_attentions=True).attentions
        with path.monitor(tiny_bert("sdpa")) as mon:
            mon.query_mask = qmask
            mon.model(**inputs)
    for s, w in zip(mon.stats().values(), weights, strict=True):
        np.testing.assert_allclose(s.entropy, entropy_from_weights(w.double(), qmask), rtol=1e-5)
        kept = w.amax(-1)[qmask[:, None, :].expand_as(w.amax(-1))]
        assert s.max_weight.mean() == pytest.approx(kept.mean().item(), rel=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_hf_gqa_sdpa_is_monitored(causal, path):
    """A Llama-style model with 2 key/value heads for 4 query heads, through the sdpa path."""
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaModel(cfg).eval()
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    if not causal:  # padding turns the causal flag into an explicit bool mask
        mask[0, :3] = 0
    with torch.no_grad():
        before = model(ids, attention_mask=mask).last_hidden_state
        eager = transformers.LlamaModel(copy.deepcopy(cfg)).eval()  # not a shared config
        eager.load_state_dict(model.state_dict())
        eager.set_attn_implementation("eager")
        weights = eager(ids, attention_mask=mask, output_attentions=True).attentions
        with path.monitor(model) as mon:
            mon.query_mask = mask.bool()
            during = model(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(during, before, rtol=1e-6, atol=1e-6)
    for s, w in zip(mon.stats().values(), weights, strict=True):
        np.testing.assert_allclose(s.entropy, entropy_from_weights(w.double(), mask.bool()),
                                   rtol=1e-5, atol=1e-6)


def test_gqa_decoding_with_padding_is_monitored(path):
    """transformers packs the query heads of one-token GQA decoding into SDPA's row axis; the
    statistics then come from the model's own arguments, per query head."""
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, attn_implementation="sdpa",
                                   pad_token_id=0, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 50, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    ids[0, :2] = 0
    with torch.no_grad():
        before = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
        with path.monitor(model) as mon:
            during = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    assert torch.equal(before, during)
    (s,) = mon.stats().values()
    assert s.rows.shape == (4,) and np.all(s.rows == s.rows[0]) and s.rows[0] > 0


def test_sdpa_calls_the_fused_kernel_cannot_reproduce_run_sdpa_itself():
    """Autograd and float masks under compile=True: SDPA runs, bitwise, and the statistics are
    still taken."""
    model, inputs = tiny_bert("sdpa"), bert_inputs()
    before = model(**inputs).last_hidden_state  # grad enabled: the weights require grad
    with Monitor(model, compile=True) as mon:
        mon.query_mask = inputs["attention_mask"].bool()
        during = model(**inputs).last_hidden_state
    assert torch.equal(before, during)
    during.sum().backward()  # the graph is SDPA's own
    assert len(mon.stats()) == 2
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    bias = torch.zeros(1, 1, 5, 5)
    bias[..., 0] = torch.finfo(torch.float32).min  # a transformers-style float mask
    with torch.no_grad(), Monitor(model, compile=True) as mon:
        out = mon.sdpa(model, q, k, v, attn_mask=bias)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, bias))
    (s,) = mon.stats().values()
    np.testing.assert_allclose(s.entropy_uniform, np.log(4))  # key 0 counted as hidden
    # one query batch against two of keys: SDPA broadcasts it, the fused pass does not try
    k2, v2 = torch.randn(2, 2, 2, 5, 4).unbind(0)
    with torch.no_grad(), Monitor(model, compile=True) as mon:
        out = mon.sdpa(model, q, k2, v2)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k2, v2))


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


def llama_gqa():
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaModel(cfg).eval()


def watched_models():
    """(name, model, run(model), query mask): every source the monitor reads, with padding."""
    inputs = bert_inputs()
    qmask = inputs["attention_mask"].bool()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(4))
    pad = torch.ones(2, 8, dtype=torch.long)
    pad[0, :3] = 0
    torch.manual_seed(0)
    module = MultiheadSelfAttention(16, 4, score="cosine", tau=10.0, causal=True)
    x = torch.randn(2, 7, 16)
    return [
        ("bert sdpa (fused pass)", tiny_bert("sdpa"), lambda m: m(**inputs), qmask),
        ("bert eager (float mask)", tiny_bert("eager"), lambda m: m(**inputs), qmask),
        ("llama gqa sdpa", llama_gqa(), lambda m: m(ids, attention_mask=pad), pad.bool()),
        ("attnscale cosine, causal", module, lambda m: m(x), None),
    ]


FIELDS = ("entropy", "max_weight", "effective_keys", "logit_mean", "logit_std", "max_abs_logit",
          "saturated_fraction", "logsumexp", "z_loss", "entropy_normalized", "rows")


def test_every_path_gives_the_same_statistics_and_counterfactuals(path):
    """The statistics of the model's own scores and of both counterfactuals -- one kernel pass
    on the native path -- equal the Python code's on every source, with grouped queries,
    causal masks, padding and a query mask."""
    for label, model, run, qmask in watched_models():
        results = {}
        for which in ("reference", path.name):
            make = path.monitor if which == path.name else Monitor
            kwargs = {} if which == path.name else {"compile": False}
            with torch.no_grad(), make(model, counterfactuals=True, **kwargs) as mon:
                mon.query_mask = qmask
                run(model)
            results[which] = {v: mon.stats(v) for v in ("actual", "dot", "cosine_tau1")}
        for variant, layers in results["reference"].items():
            assert len(layers) == len(results[path.name][variant]) > 0
            for name, want in layers.items():
                got = results[path.name][variant][name]
                for field in FIELDS:
                    np.testing.assert_allclose(getattr(got, field), getattr(want, field),
                                               rtol=2e-5, atol=2e-6,
                                               err_msg=f"{label} {variant} {name} {field}")
                np.testing.assert_allclose(got.jacobian_norm, want.jacobian_norm, atol=1e-3)


def test_default_is_native_where_it_builds(kernel):
    model = tiny_bert("sdpa")
    assert Monitor(model).backend == "native"
    assert Monitor(model, compile=False).backend == "python"
    assert Monitor(model, compile=True).backend == "native"
    with pytest.raises(TypeError, match="compile"):
        Monitor(model, compile="yes")


def test_a_failed_build_warns_once_and_the_python_path_runs(monkeypatch, tmp_path):
    """Where the kernel cannot build, the default monitor warns once (the builder's warning),
    then runs SDPA itself and the Python statistics, call after call."""
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("Error building extension: no compiler")

    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv(cppext.ENV, "generic")
    monkeypatch.setenv(cppext.PREBUILT_ENV, "off")  # no installed build: the builder runs
    monkeypatch.setenv("ATTNSCALE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    model, inputs = tiny_bert("sdpa"), bert_inputs()
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                with Monitor(model, counterfactuals=True) as mon:
                    during = model(**inputs).last_hidden_state
                assert torch.equal(during, before)
                assert set(mon.paths) == {"python"} and mon.backend == "python"
    assert len([w for w in caught if "attnscale" in str(w.message)]) == 1, [
        str(w.message) for w in caught]


@pytest.mark.parametrize("compile", [None, False, True])
def test_sdpa_path_takes_broadcast_shapes(compile):
    """The monitor's SDPA stand-in accepts what SDPA accepts (3-D queries with 4-D keys, 5-D
    inputs, a batch of 1 broadcast) and records the statistics of the broadcast call."""
    from attnscale import attention_stats

    g = torch.Generator().manual_seed(3)
    model = tiny_bert("sdpa")
    cases = [
        (torch.randn(4, 5, 8, generator=g), torch.randn(2, 4, 6, 8, generator=g)),  # 3-D q
        (torch.randn(1, 2, 5, 8, generator=g), torch.randn(3, 2, 6, 8, generator=g)),  # B = 1
        (torch.randn(2, 3, 2, 5, 8, generator=g), torch.randn(2, 3, 2, 6, 8, generator=g)),
    ]
    for q, k in cases:
        v = torch.randn(k.shape, generator=g)
        with torch.no_grad(), Monitor(model, compile=compile) as mon:
            out = mon.sdpa(model, q, k, v, is_causal=True)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert torch.equal(out, want)
        (got,) = mon.stats().values()
        ref = attention_stats(q, k, is_causal=True)
        np.testing.assert_allclose(got.entropy, ref.entropy, rtol=1e-6)
        np.testing.assert_allclose(got.logit_std, ref.logit_std, rtol=1e-6)


@pytest.mark.parametrize("compile", [None, False, True])
def test_a_query_mask_that_does_not_fit_raises_naming_both_shapes(compile):
    """A mask of the wrong shape used to be skipped silently, counting the padding rows."""
    m = MultiheadSelfAttention(16, 4)
    with torch.no_grad(), Monitor(m, compile=compile) as mon:
        mon.query_mask = torch.ones(2, 5, dtype=torch.bool)
        with pytest.raises(ValueError, match=r"query_mask.*\(2, 7\).*\(2, 5\)"):
            m(torch.randn(2, 7, 16))
    model, q = tiny_bert("sdpa"), torch.randn(2, 4, 9, 8)  # the SDPA stand-in, fused or not
    with torch.no_grad(), Monitor(model, compile=compile) as mon:
        mon.query_mask = torch.ones(2, 8, dtype=torch.bool)
        with pytest.raises(ValueError, match=r"query_mask.*\(2, 9\).*\(2, 8\)"):
            mon.sdpa(model, q, q, q)
        mon.query_mask = torch.ones(2, 9)  # not bool
        with pytest.raises(TypeError, match="query_mask"):
            mon.sdpa(model, q, q, q)


def test_a_query_mask_broadcasts_over_the_batch():
    model, inputs = tiny_bert("eager"), bert_inputs()
    inputs["attention_mask"][1, 6:] = 1  # no padding: one row mask serves both sequences
    rows = torch.ones(9, dtype=torch.bool)
    rows[7:] = False
    with torch.no_grad(), Monitor(model) as mon:
        mon.query_mask = rows
        out = model(**inputs, output_attentions=True)
    for s, w in zip(mon.stats().values(), out.attentions, strict=True):
        np.testing.assert_allclose(s.entropy, entropy_from_weights(w.double(), rows.expand(2, 9)),
                                   rtol=1e-5)


def test_flat_stats_are_json_floats_of_the_real_attention_pattern():
    import json

    from attnscale.measure.stats import STATISTICS

    model, inputs = tiny_bert("eager"), bert_inputs()
    qmask = inputs["attention_mask"].bool()
    with torch.no_grad(), Monitor(model, counterfactuals=True) as mon:
        mon.query_mask = qmask
        out = model(**inputs, output_attentions=True)
    flat = mon.flat_stats()
    layers = [f"encoder.layer.{i}.attention.self" for i in range(2)]
    assert list(mon.stats()) == layers
    assert set(flat) == {f"{layer}/{s}" for layer in layers for s in STATISTICS}
    assert all(type(v) is float for v in flat.values())
    json.loads(json.dumps(flat, allow_nan=False))
    for layer, w in zip(layers, out.attentions, strict=True):  # mean over heads and kept rows
        w = w.double()
        ent = -(w * w.clamp_min(1e-30).log()).sum(-1)[qmask[:, None, :].expand(-1, 4, -1)]
        assert flat[f"{layer}/entropy"] == pytest.approx(ent.mean().item(), rel=1e-5)
        assert flat[f"{layer}/rows"] == qmask.sum().item() * 4
    dot = mon.flat_stats("dot")
    assert set(dot) == set(flat) and dot != flat
