"""attnscale.measure.stats on hand-built logits, against brute force, chunked and unchunked."""

from __future__ import annotations

import importlib
import math
import re

import numpy as np
import pytest
import torch

from attnscale import reference_attention
from attnscale.measure.stats import attention_stats, logit_stats

stats_module = importlib.import_module("attnscale.measure.stats")


def brute(logits, keep):
    """Per-head stats from explicit softmax weights, one row at a time (float64, no tricks)."""
    b, h, nq, _ = logits.shape
    out = {k: np.zeros(h) for k in ("entropy", "max_weight", "effective_keys", "jacobian_norm")}
    count = np.zeros(h)
    for hh in range(h):
        for bb in range(b):
            for i in range(nq):
                vis = keep[bb, hh, i]
                if not vis.any():
                    continue
                p = torch.softmax(logits[bb, hh, i][vis].double(), 0)
                jac = torch.diag(p) - torch.outer(p, p)
                out["entropy"][hh] += float(-(p * p.log()).sum())
                out["max_weight"][hh] += float(p.max())
                out["effective_keys"][hh] += float(1 / (p * p).sum())
                out["jacobian_norm"][hh] += float(torch.linalg.matrix_norm(jac))
                count[hh] += 1
    return {k: v / count for k, v in out.items()}


def test_uniform_logits():
    s = logit_stats(torch.zeros(2, 3, 4, 50, dtype=torch.float64))
    np.testing.assert_allclose(s.entropy, math.log(50))
    np.testing.assert_allclose(s.entropy_normalized, 1.0)
    np.testing.assert_allclose(s.effective_keys, 50)
    np.testing.assert_allclose(s.max_weight, 1 / 50)
    np.testing.assert_allclose(s.saturated_fraction, 0)
    np.testing.assert_allclose(s.logit_std, 0, atol=1e-12)


def test_one_hot_logits():
    logits = torch.zeros(1, 2, 3, 10, dtype=torch.float64)
    logits[..., 4] = 1e4
    s = logit_stats(logits)
    np.testing.assert_allclose(s.entropy, 0, atol=1e-12)
    np.testing.assert_allclose(s.max_weight, 1)
    np.testing.assert_allclose(s.effective_keys, 1)
    np.testing.assert_allclose(s.saturated_fraction, 1)
    np.testing.assert_allclose(s.jacobian_norm, 0, atol=1e-12)
    np.testing.assert_allclose(s.max_abs_logit, 1e4)


def test_masked_keys_are_ignored():
    g = torch.Generator().manual_seed(0)
    visible = torch.randn(2, 2, 5, 6, generator=g, dtype=torch.float64)
    padded = torch.cat([visible, 1e3 * torch.randn(2, 2, 5, 4, dtype=torch.float64)], dim=-1)
    keep = torch.ones(10, dtype=torch.bool)
    keep[6:] = False
    a, b = logit_stats(visible), logit_stats(padded, attn_mask=keep)
    for name in ("entropy", "max_weight", "effective_keys", "jacobian_norm", "logit_std",
                 "max_abs_logit", "logsumexp", "entropy_normalized"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12, err_msg=name)
    # a float −inf mask is the same as a bool mask
    additive = torch.zeros(10, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    np.testing.assert_allclose(logit_stats(padded, attn_mask=additive).entropy, a.entropy)


@pytest.mark.parametrize("causal", [False, True])
def test_against_brute_force(causal):
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(2, 3, 7, 9, generator=g, dtype=torch.float64)
    keep = torch.rand(2, 3, 7, 9, generator=g) > 0.3
    keep[0, 0, 2] = False  # one fully masked row: skipped
    s = logit_stats(logits, attn_mask=keep, is_causal=causal)
    full = keep & (torch.ones(7, 9, dtype=torch.bool).tril() if causal else True)
    expected = brute(logits, full)
    for name, value in expected.items():
        np.testing.assert_allclose(getattr(s, name), value, rtol=1e-10, err_msg=name)
    assert s.rows.sum() == full.any(-1).sum()


def test_causal_rows_use_their_visible_count():
    s = logit_stats(torch.zeros(1, 1, 4, 4, dtype=torch.float64), is_causal=True)
    # rows see 1, 2, 3, 4 keys: mean entropy (ln1 + ln2 + ln3 + ln4)/4, normalized entropy 1
    np.testing.assert_allclose(s.entropy, sum(math.log(n) for n in range(1, 5)) / 4)
    np.testing.assert_allclose(s.entropy_normalized, 1.0)
    np.testing.assert_allclose(s.effective_keys, 2.5)


def test_chunked_equals_unchunked(monkeypatch):
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(2, 4, 33, 8, generator=g, dtype=torch.float64) for _ in range(2))
    full = attention_stats(q, k, is_causal=True, score="cosine", tau=4.0).to_dict()
    monkeypatch.setattr(stats_module, "CHUNK_ELEMENTS", 2 * 4 * 33 * 5)  # 5 rows per chunk
    chunked = attention_stats(q, k, is_causal=True, score="cosine", tau=4.0).to_dict()
    for name, value in full["per_head"].items():
        np.testing.assert_allclose(chunked["per_head"][name], value, rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("score,params", [("scaled_dot", {}), ("dot", {}), ("cosine", {"tau": 1.0}),
                                          ("log_length", {"s": 1.0}), ("softcap", {"cap": 2.0})])
def test_attention_stats_match_the_attention_actually_computed(score, params):
    """Max weight from the stats equals the max weight of the attention output with V = I."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) * 2
    k = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) * 2
    eye = torch.eye(6, dtype=torch.float64).expand(1, 2, 6, 6)
    weights = reference_attention(q, k, eye, is_causal=True, score=score, **params)
    s = attention_stats(q, k, is_causal=True, score=score, **params)
    np.testing.assert_allclose(s.max_weight, weights.amax(-1).mean(dim=(0, 2)).numpy(), rtol=1e-10)
    ent = -(weights * weights.clamp_min(1e-300).log()).sum(-1).mean(dim=(0, 2))
    np.testing.assert_allclose(s.entropy, ent.numpy(), rtol=1e-9, atol=1e-12)


def test_gqa_stats_equal_repeated_heads():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64)
    a = attention_stats(q, k, enable_gqa=True).entropy
    b = attention_stats(q, k.repeat_interleave(2, 1)).entropy
    np.testing.assert_allclose(a, b)


def test_to_dict_and_mean():
    s = logit_stats(torch.zeros(1, 2, 3, 4))
    d = s.to_dict()
    assert set(d) == {"per_head", "mean"}
    assert len(d["per_head"]["entropy"]) == 2
    assert d["mean"]["entropy"] == pytest.approx(math.log(4))
    assert d["mean"]["rows"] == 6


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda: logit_stats(torch.zeros(2, 2)), "shape"),
        (lambda: logit_stats(torch.zeros(1, 1, 2, 3), attn_mask=torch.ones(4, dtype=torch.bool)),
         "does not broadcast"),
        (lambda: attention_stats(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 4)), "head dim"),
        (lambda: attention_stats(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3), score="x"),
         "score must be one of"),
    ],
)
def test_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_query_mask_drops_rows_and_uniform_entropy():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64)
    qmask = torch.ones(2, 6, dtype=torch.bool)
    qmask[1, 3:] = False
    s = logit_stats(logits, query_mask=qmask)
    expected = brute(logits[:1], torch.ones(1, 2, 6, 6, dtype=torch.bool))
    part = brute(logits[1:, :, :3], torch.ones(1, 2, 3, 6, dtype=torch.bool))
    np.testing.assert_allclose(s.entropy, (6 * expected["entropy"] + 3 * part["entropy"]) / 9)
    np.testing.assert_allclose(s.rows, [9, 9])
    np.testing.assert_allclose(s.entropy_uniform, math.log(6))
    with pytest.raises(ValueError, match="query_mask must have shape"):
        logit_stats(logits, query_mask=torch.ones(2, 5, dtype=torch.bool))


def test_accumulator_over_calls_equals_one_call():
    from attnscale.measure.stats import StatsAccumulator

    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(4, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
    acc = StatsAccumulator(2)
    acc.update(q[:2], k[:2], is_causal=True)
    acc.update(q[2:], k[2:], is_causal=True)
    both = attention_stats(q, k, is_causal=True)
    for name, value in both.to_dict()["per_head"].items():
        np.testing.assert_allclose(acc.result().to_dict()["per_head"][name], value, rtol=1e-12)


def test_float32_blocks_agree_with_float64():
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(2))
    a = attention_stats(q, k).to_dict()["mean"]
    b = attention_stats(q.float(), k.float()).to_dict()["mean"]
    for name, value in a.items():
        assert b[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("causal, n, s", [(False, 6, 9), (True, 6, 9), (True, 7, 7)])
def test_attention_with_sums_is_sdpa_plus_the_statistics(causal, n, s, compile):
    """The monitor's fused kernel: SDPA's output and the statistics of the same logits.

    Against a float64 materialized reference for the output, against SDPA itself in float32,
    and against ``head_sums`` of separately built logits for the statistics. One row has no
    visible key: SDPA gives 0 there, and the statistics skip it."""
    g = torch.Generator().manual_seed(n + s + causal)
    q, k, v = (torch.randn(2, 3, m, 8, generator=g) for m in (n, s, s))
    keep = torch.rand(2, 1, n, s, generator=g) > 0.3
    keep[:, :, :, 0] = True
    keep[1, 0, 2] = False  # a query that sees nothing
    rows = torch.ones(2, 1, n, dtype=torch.bool)
    rows[0, 0, 1] = False  # a padding query row
    fused = stats_module.maybe_compiled(stats_module.attention_with_sums, compile)
    out, sums, head_max = fused(q, k, v, keep, causal, 0.3, rows)

    full = keep & torch.ones(n, s, dtype=torch.bool).tril() if causal else keep
    z = (q.double() @ k.double().transpose(-2, -1)) * 0.3
    z = z.masked_fill(~full, float("-inf"))
    ref = torch.nan_to_num(torch.softmax(z, -1)) @ v.double()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, full, scale=0.3)
    torch.testing.assert_close(out, sdpa, rtol=1e-6, atol=1e-6)
    assert torch.all(out[1, :, 2] == 0)
    want, want_max = stats_module.head_sums(z, rows, True)
    torch.testing.assert_close(sums, want.to(sums.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head_max.double(), want_max.double(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "score, params, native_path",
    [("scaled_dot", {}, True), ("dot", {}, True), ("mup", {}, True),
     ("cosine", {"tau": 4.0}, True), ("qk_layernorm", {}, True), ("qk_rmsnorm", {}, True),
     ("cosine", {"tau": torch.tensor([1.0, 5.0, 9.0])}, True),  # per-head τ: in the queries
     ("log_length", {"s": 1.0}, False), ("softcap", {"cap": 3.0}, False)],
)
def test_compiled_accumulator_equals_eager(score, params, native_path, monkeypatch):
    """compile=True takes the native kernel's statistics-only pass where the score is one
    scalar times a product, and the torch.compile path otherwise; both equal the eager sums."""
    from attnscale.measure import native

    if native.fused_kernel() is None:
        pytest.skip(native.unavailable_reason())
    calls = []
    kernel = native.fused_kernel()
    monkeypatch.setattr(native, "fused_kernel", lambda: lambda *a: calls.append(1) or kernel(*a))
    g = torch.Generator().manual_seed(9)
    q, k = (torch.randn(2, 3, 11, 16, generator=g) * 1.2 for _ in range(2))
    keep = torch.rand(2, 1, 11, 11, generator=g) > 0.3
    keep[..., 0] = True
    qmask = torch.rand(2, 11, generator=g) > 0.2
    results = {}
    for compile in (False, True):
        acc = stats_module.StatsAccumulator(3, compile=compile)
        acc.update(q, k, keep, score=score, query_mask=qmask, **params)
        acc.update(q, k, is_causal=True, score=score, **params)
        results[compile] = acc.result()
    assert bool(calls) == native_path
    for field in ("entropy", "max_weight", "effective_keys", "logit_std", "max_abs_logit",
                  "saturated_fraction", "logsumexp", "entropy_uniform", "rows"):
        np.testing.assert_allclose(getattr(results[True], field), getattr(results[False], field),
                                   rtol=2e-5, atol=1e-5, err_msg=field)
    np.testing.assert_allclose(results[True].jacobian_norm, results[False].jacobian_norm,
                               atol=1e-3)  # float32 near saturation: see head_sums


def test_query_mask_broadcasts_and_a_wrong_shape_names_both_shapes():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64)
    rows = torch.tensor([True, True, False, True, True, False])
    want = logit_stats(logits, query_mask=rows.expand(2, 6))
    for mask in (rows, rows[None]):  # (Nq,) and (1, Nq): every sequence alike
        got = logit_stats(logits, query_mask=mask)
        np.testing.assert_allclose(got.entropy, want.entropy)
        np.testing.assert_allclose(got.rows, [8, 8])
    q, k = torch.randn(2, 2, 6, 4, generator=g), torch.randn(2, 2, 6, 4, generator=g)
    for bad in (torch.ones(3, 6, dtype=torch.bool), torch.ones(2, 6, 1, dtype=torch.bool)):
        shape = str(tuple(bad.shape))
        with pytest.raises(ValueError, match=r"query_mask.*\(2, 6\).*" + re.escape(shape)):
            logit_stats(logits, query_mask=bad)
        with pytest.raises(ValueError, match=r"query_mask.*\(2, 6\).*" + re.escape(shape)):
            attention_stats(q, k, query_mask=bad)
    with pytest.raises(TypeError, match="query_mask"):
        attention_stats(q, k, query_mask=torch.ones(2, 6))


def test_every_statistic_says_what_it_is_computed_from():
    """STATISTICS documents each field: pre-softmax attn_scores or the post-softmax pattern."""
    from dataclasses import fields

    from attnscale.measure.stats import STATISTICS, AttentionStats

    assert list(STATISTICS) == [f.name for f in fields(AttentionStats)]
    sources = {text.split(":")[0] for text in STATISTICS.values()}
    assert sources == {"count", "attn_scores", "pattern", "mask only"}
    assert STATISTICS["entropy"].startswith("pattern")
    assert STATISTICS["logit_std"].startswith("attn_scores")


def test_flat_means_are_plain_json_floats_named_layer_slash_statistic():
    import json

    from attnscale.measure.stats import STATISTICS, flat_means

    g = torch.Generator().manual_seed(7)
    keep = torch.rand(1, 3, 4, 5, generator=g) > 0.3
    keep[..., 0] = True
    layers = {"blocks.0.attn": logit_stats(torch.randn(1, 3, 4, 5, generator=g), keep),
              "blocks.1.attn": logit_stats(torch.zeros(1, 3, 4, 5))}
    flat = flat_means(layers)
    assert set(flat) == {f"blocks.{i}.attn/{s}" for i in range(2) for s in STATISTICS}
    assert all(type(v) is float for v in flat.values())
    json.dumps(flat, allow_nan=False)
    first = layers["blocks.0.attn"]
    w = first.rows / first.rows.sum()
    assert flat["blocks.0.attn/entropy"] == pytest.approx(float((first.entropy * w).sum()))
    assert flat["blocks.0.attn/max_abs_logit"] == pytest.approx(float(first.max_abs_logit.max()))
    assert flat["blocks.1.attn/entropy"] == pytest.approx(math.log(5))
