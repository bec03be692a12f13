"""NaN and ±inf logits: one rule (attnscale.measure.headstats) on every path -- the Python code,
the native kernel's statistics-only pass, the monitor's counterfactual pass and the fused SDPA
pass -- and float padding masks on the native path."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from attnscale.measure import native
from attnscale.measure.headstats import STATISTICS
from attnscale.measure.monitor import Monitor
from attnscale.measure.rowstats import attention_with_sums, maybe_compiled
from attnscale.measure.stats import StatsAccumulator, attention_stats, flat_means, logit_stats

B, H, N, S, D = 2, 3, 7, 9, 8
SCALE = 0.35
# The huge-scale case: positive q and k, so every partial sum of q·k grows and a logit
# overflows on every path or on none. Rows scaled by 1e-14 have logits near 1e17 (their squares
# and z-loss still float32), rows scaled by 1e10 near 1e41 (> float32's 3.4e38: inf), while
# their unscaled q·k, the dot counterfactual's logits, stays near 1e11.
HUGE_SCALE, SMALL_ROW, BIG_ROW = 1e30, 1e-14, 1e10
FIELDS = [name for name in STATISTICS if name != "jacobian_norm"]


def inputs(inject: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(q, k, scale) float32 with non-finite logits made by ``inject``."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, N, D, generator=g), torch.randn(B, H, S, D, generator=g)
    scale = SCALE
    if inject == "q_nan":  # one query row: NaN with every key
        q[0, 1, 2, 3] = math.nan
    elif inject == "q_inf":  # one query row: ±inf by the sign of each key's component
        q[1, 0, 4, 0] = math.inf
    elif inject == "k_inf":  # two keys: −inf or +inf with every query of their head
        k[0, 2, 5, 1] = k[1, 2, 2, 1] = -math.inf
    elif inject == "huge_scale":
        q, k = (q.abs() + 0.1) * SMALL_ROW, k.abs() + 0.1
        q[:, :, ::3] *= BIG_ROW / SMALL_ROW  # rows 0, 3, 6 of every head overflow
        scale = HUGE_SCALE
    elif inject == "all_nan":
        q[:] = math.nan
    return q, k, scale


def masks(kind: str) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
    """(mask given to the statistics, the same as bool keep (or None), is_causal)."""
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[1, ..., 6:] = False  # key padding
    keep[0, ..., 5] = kind != "float"  # the float mask hides an injected key of k_inf
    if kind == "none":
        return None, None, False
    if kind == "causal":
        return None, None, True
    if kind == "bool":
        return keep, keep, False
    additive = torch.zeros(B, 1, 1, S).masked_fill(~keep, -math.inf)  # float: 0 or −inf
    return additive, keep, False


def visible(keep: torch.Tensor | None, causal: bool) -> torch.Tensor:
    vis = torch.ones(B, H, N, S, dtype=torch.bool)
    if causal:
        vis &= torch.ones(N, S, dtype=torch.bool).tril()
    return vis if keep is None else vis & keep


def expected(q, k, scale, keep, causal, rows):
    """Per head: the fraction of visible logits of kept rows that are not finite, the rows with
    every visible logit finite, and whether the head saw a non-finite logit -- from the float32
    logits (q·kᵀ)·scale."""
    z = (q @ k.transpose(-2, -1)) * scale
    vis = visible(keep, causal) & rows[:, None, :, None]
    bad = ~torch.isfinite(z) & vis
    good_rows = vis.any(-1) & ~bad.any(-1)
    frac = bad.sum(dim=(0, 2, 3)).double() / vis.sum(dim=(0, 2, 3)).double()
    return frac.numpy(), good_rows.sum(dim=(0, 2)).double().numpy(), bad.any(-1).any(-1).any(0)


def assert_same(got, want, label):
    for name in FIELDS:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=2e-5, atol=2e-6,
                                   err_msg=f"{label}: {name}")
    np.testing.assert_allclose(got.jacobian_norm, want.jacobian_norm, atol=1e-3, err_msg=label)


def monitor_paths(q, k, scale, mask, causal, rows, compile):
    """{name: (actual, {counterfactual: stats}, Monitor.paths)} of the monitor's ways in."""
    layer = nn.Identity()
    call = {"attn_mask": mask, "is_causal": causal, "scale": scale, "score": "scaled_dot"}
    out = {}
    for name in ("record", "sdpa"):
        mon = Monitor(layer, counterfactuals=True, compile=compile)
        mon.query_mask = rows
        with torch.no_grad():
            if name == "record":  # the counterfactual pass measures the actual logits too
                mon.record(layer, q, k, call)
            else:  # the fused pass (output and statistics) where the mask is bool or none
                mon.sdpa(layer, q, k, torch.randn(B, H, S, 4), attn_mask=mask, is_causal=causal,
                         scale=scale)
        out[name] = (next(iter(mon.stats().values())),
                     {v: next(iter(mon.stats(v).values())) for v in ("dot", "cosine_tau1")},
                     dict(mon.paths))
    return out


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
@pytest.mark.parametrize("inject", ["q_nan", "q_inf", "k_inf", "huge_scale", "all_nan"])
def test_every_path_applies_the_same_rule(kernel, inject, mask_kind):
    """Python, the native statistics-only pass, the monitor's counterfactual pass and its fused
    SDPA pass give the same statistics of the same non-finite logits: the fraction of visible
    logits that are not finite, max |logit| +inf for the heads that have one, and every other
    statistic over the rows whose logits are all finite (NaN where none is)."""
    q, k, scale = inputs(inject)
    mask, keep, causal = masks(mask_kind)
    rows = torch.ones(B, N, dtype=torch.bool)
    rows[1, 5] = False  # a dropped query row: the q_inf row of batch 1 is row 4, still kept
    frac, good_rows, flagged = expected(q, k, scale, keep, causal, rows)
    assert flagged.any(), "the case injects no non-finite logit"
    accs = {}
    for compile in (False, None):
        acc = StatsAccumulator(H, compile=compile)
        acc.update(q, k, mask, causal, scale, query_mask=rows)
        accs[acc.path] = acc.result()
    assert set(accs) == {"python", "native"}  # a float padding mask takes the kernel too
    want = accs["python"]
    np.testing.assert_allclose(want.nonfinite_fraction, frac, rtol=1e-12)
    np.testing.assert_array_equal(want.rows, good_rows)
    np.testing.assert_array_equal(np.isinf(want.max_abs_logit), flagged.numpy())
    assert np.all(np.isnan(want.entropy) == (good_rows == 0))
    assert_same(accs["native"], want, "native")
    reference = {v: attention_stats(q, k, mask, causal, **kw, query_mask=rows)
                 for v, kw in (("dot", {"score": "dot"}),
                               ("cosine_tau1", {"score": "cosine", "tau": 1.0}))}
    for compile, ran in ((False, "python"), (None, "native")):
        for name, (actual, counterfactuals, paths) in monitor_paths(
                q, k, scale, mask, causal, rows, compile).items():
            assert set(paths) == {ran}, (name, paths)
            assert_same(actual, want, f"monitor {name} {ran}")
            for variant, stats in counterfactuals.items():  # by their own scores, not derived
                assert_same(stats, reference[variant], f"monitor {name} {ran} {variant}")


@pytest.mark.parametrize("inject", ["q_inf", "k_inf"])
def test_the_torch_compiled_paths_apply_the_same_rule(inject, monkeypatch):
    """compile=True without the kernel: the compiled row reductions (accumulator) and the
    compiled fused attention (rowstats.attention_with_sums) give the Python path's statistics."""
    monkeypatch.setattr(native, "fused_kernel", lambda isa=None: None)
    q, k, scale = inputs(inject)
    _, keep, _ = masks("float")
    rows = torch.ones(B, N, dtype=torch.bool)
    for mask, causal in ((keep, False), (None, True)):
        accs = {}
        for compile in (False, True):
            acc = StatsAccumulator(H, compile=compile)
            acc.update(q, k, mask, causal, scale)
            accs[acc.path] = acc
        assert_same(accs["compiled"].result(), accs["python"].result(), f"compiled {causal}")
        fused = maybe_compiled(attention_with_sums, True)
        _, sums, head_max = fused(q, k, torch.randn(B, H, S, 4), mask, causal, scale,
                                  rows[:, None, :])
        acc = StatsAccumulator(H)
        acc.add_sums(sums, head_max)
        assert_same(acc.result(), accs["python"].result(), f"fused {causal}")


def test_counterfactuals_of_an_overflowed_call_are_those_of_their_own_scores(kernel):
    """A huge scale overflows the attention's logits, not q·k: the dot and cosine statistics
    stay finite (the kernel would have derived them from the overflowed logits)."""
    q, k, scale = inputs("huge_scale")
    actual, counterfactuals, _ = monitor_paths(q, k, scale, None, False,
                                               torch.ones(B, N, dtype=torch.bool), None)["record"]
    assert np.all(actual.nonfinite_fraction > 0)
    for stats in counterfactuals.values():
        np.testing.assert_array_equal(stats.nonfinite_fraction, 0.0)
        assert np.all(np.isfinite(stats.max_abs_logit)) and np.all(stats.rows == B * N)


@pytest.mark.parametrize("compile", [False, None])
def test_an_all_nan_layer_reads_nan_and_inf_never_zero(compile):
    q, k, scale = inputs("all_nan")
    acc = StatsAccumulator(H, compile=compile)
    acc.update(q, k, scale=scale)
    flat = flat_means({"layer": acc.result()})
    assert flat["layer/rows"] == 0.0 and flat["layer/nonfinite_fraction"] == 1.0
    assert flat["layer/max_abs_logit"] == math.inf
    for name in set(STATISTICS) - {"rows", "nonfinite_fraction", "max_abs_logit"}:
        assert math.isnan(flat[f"layer/{name}"]), name
    with pytest.raises(ValueError):  # not JSON-strict: nothing that reads it can take it for 0
        json.dumps(flat, allow_nan=False)


def test_layer_means_weigh_nonfinite_by_head_and_the_rest_by_finite_rows():
    """One head all NaN, one finite: the layer's fraction is their mean (0.5), not the
    row-weighted 0 the finite head alone would give; its entropy is the finite head's."""
    logits = torch.randn(1, 2, 4, 6, dtype=torch.float64, generator=torch.Generator()
                         .manual_seed(3))
    logits[0, 0] = math.nan
    s = logit_stats(logits)
    mean = s.mean()
    assert mean["nonfinite_fraction"] == 0.5 and mean["rows"] == 4.0
    assert mean["entropy"] == pytest.approx(s.entropy[1]) and np.isnan(s.entropy[0])
    assert mean["max_abs_logit"] == math.inf


def test_hidden_non_finite_logits_do_not_count():
    """NaN and inf at masked-out keys are not scored: the statistics equal those of the
    visible logits alone."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64)
    keep = torch.ones(8, dtype=torch.bool)
    keep[5:] = False
    dirty = logits.clone()
    dirty[..., 5], dirty[..., 6], dirty[..., 7] = math.nan, math.inf, -math.inf
    for mask in (keep, torch.zeros(8, dtype=torch.float64).masked_fill(~keep, -math.inf)):
        got, want = logit_stats(dirty, attn_mask=mask), logit_stats(logits[..., :5])
        for name in STATISTICS:
            np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-12,
                                       err_msg=name)
        np.testing.assert_array_equal(got.nonfinite_fraction, 0.0)


def test_a_visible_minus_inf_is_not_a_hidden_key():
    """An overflow to −inf at a visible key is a non-finite logit, with or without a mask
    elsewhere in the row (the masked path marks it before hiding keys)."""
    logits = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
    logits[0, 0, 0, 1] = -math.inf
    for mask in (None, torch.tensor([True, True, True, False])):
        s = logit_stats(logits, attn_mask=mask)
        n = 4 if mask is None else 3
        assert s.nonfinite_fraction[0] == pytest.approx(1 / (2 * n))
        assert s.rows[0] == 1 and s.max_abs_logit[0] == math.inf
        assert s.entropy_uniform[0] == pytest.approx(math.log(n))  # the finite row only


def test_float_padding_masks_take_the_native_path_and_agree_with_bool_masks(kernel):
    """A float mask that only hides keys (0 / −inf) goes to the kernel as the bool mask it is;
    one with a real bias (ALiBi-like) changes the logits and stays on the Python path."""
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(B, H, N, D, generator=g), torch.randn(B, H, S, D, generator=g)
    _, keep, _ = masks("float")
    additive = torch.zeros(B, 1, 1, S).masked_fill(~keep, -math.inf)
    results = {}
    for label, mask, compile in (("bool", keep, None), ("float", additive, None),
                                 ("python", additive, False)):
        acc = StatsAccumulator(H, compile=compile)
        acc.update(q, k, mask, scale=SCALE)
        results[label] = (acc.path, acc.result())
    assert results["bool"][0] == results["float"][0] == "native"
    assert results["python"][0] == "python"
    for label in ("float", "python"):
        assert_same(results[label][1], results["bool"][1], label)
    bias = additive + torch.linspace(-1, 0, S)  # a real bias on the visible keys
    acc = StatsAccumulator(H, compile=None)
    acc.update(q, k, bias, scale=SCALE)
    assert acc.path == "python"


def test_a_monitored_eager_model_takes_the_native_path(kernel):
    """transformers' eager attention hands the monitor float masks: without counterfactuals
    its statistics now come from the kernel too, equal to the Python path's."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    results = {}
    for compile in (None, False):
        with torch.no_grad(), Monitor(model, compile=compile) as mon:
            mon.query_mask = mask.bool()
            model(ids, attention_mask=mask)
        results[compile] = mon
    assert set(results[None].paths) == {"native"} and set(results[False].paths) == {"python"}
    for name, want in results[False].stats().items():
        assert_same(results[None].stats()[name], want, name)


def test_kernel_unavailable_keeps_the_rule(monkeypatch):
    """Without the kernel the monitor's default path is Python's, with the same statistics."""
    monkeypatch.setattr(native, "fused_kernel", lambda isa=None: None)
    q, k, scale = inputs("q_inf")
    acc = StatsAccumulator(H, compile=None)
    acc.update(q, k, scale=scale)
    assert acc.path == "python"
    frac, good_rows, flagged = expected(q, k, scale, None, False, torch.ones(B, N, dtype=bool))
    np.testing.assert_allclose(acc.result().nonfinite_fraction, frac, rtol=1e-12)
    np.testing.assert_array_equal(acc.result().rows, good_rows)
    np.testing.assert_array_equal(np.isinf(acc.result().max_abs_logit), flagged.numpy())
