"""attention() against the float64 reference_attention, for every registered score."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import attnscale
from attnscale import SCORES, attention, reference_attention

# Parameters chosen so that every score differs from plain scaled_dot (a small cap makes tanh bite).
PARAMS = {
    "scaled_dot": {},
    "dot": {},
    "mup": {"c": 5.0},
    "cosine": {"tau": 3.0},
    "qk_layernorm": {"eps": 1e-5},
    "qk_rmsnorm": {"eps": 1e-6},
    "softcap": {"cap": 1.5},
    "log_length": {"s": 0.7},
}
ALL = sorted(SCORES)
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 2e-5},
    torch.float64: {"rtol": 1e-10, "atol": 1e-10},
    torch.bfloat16: {"rtol": 5e-2, "atol": 5e-2},
}


def test_every_registered_score_is_tested():
    assert set(PARAMS) == set(SCORES)


def qkv(b=2, h=4, hk=None, nq=13, nk=17, d=8, dv=None, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    hk = h if hk is None else hk
    q = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hk, nk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, hk, nk, dv or d, generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_(grad) for t in (q, k, v)]


def masks(b=2, h=4, nq=13, nk=17, seed=1):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(b, h, nq, nk, generator=g) > 0.3
    keep[..., 0] = True  # no fully masked rows here; those have their own test
    padding = torch.ones(b, 1, 1, nk, dtype=torch.bool)
    padding[0, ..., -5:] = False
    additive = torch.randn(nq, nk, generator=g, dtype=torch.float64)
    additive[:, 3] = float("-inf")
    return {
        "none": None,
        "bool": keep,
        "bool-padding-broadcast": padding,
        "float-2d-broadcast": additive,
        "float-key-only": torch.randn(1, nk, generator=g, dtype=torch.float64),
    }


def check(out, ref, dtype):
    torch.testing.assert_close(out.double(), ref.double(), **TOL[dtype])


@pytest.mark.parametrize("score", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_forward_matches_reference(score, dtype):
    q, k, v = qkv(dtype=dtype)
    out = attention(q, k, v, score=score, **PARAMS[score])
    ref = reference_attention(q.double(), k.double(), v.double(), score=score, **PARAMS[score])
    assert out.dtype == dtype
    check(out, ref, dtype)


@pytest.mark.parametrize("score", ALL)
@pytest.mark.parametrize("mask_kind", list(masks()))
@pytest.mark.parametrize("causal", [False, True])
def test_masks_and_causal_match_reference(score, mask_kind, causal):
    q, k, v = qkv(dtype=torch.float64)
    mask = masks()[mask_kind]
    out = attention(q, k, v, attn_mask=mask, is_causal=causal, score=score, **PARAMS[score])
    ref = reference_attention(
        q, k, v, attn_mask=mask, is_causal=causal, score=score, **PARAMS[score]
    )
    check(out, ref, torch.float64)


@pytest.mark.parametrize("nq,nk", [(5, 11), (11, 5), (1, 9)])
def test_causal_alignment_is_top_left_like_sdpa(nq, nk):
    q, k, v = qkv(nq=nq, nk=nk, dtype=torch.float64)
    ours = attention(q, k, v, is_causal=True)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, sdpa)
    # query i sees keys 0..i: row 0 is exactly v_0
    torch.testing.assert_close(ours[:, :, 0], v[:, :, 0])


@pytest.mark.parametrize("score", ALL)
def test_gqa_matches_reference(score):
    q, k, v = qkv(h=6, hk=2, dtype=torch.float64)
    out = attention(q, k, v, is_causal=True, enable_gqa=True, score=score, **PARAMS[score])
    ref = reference_attention(
        q, k, v, is_causal=True, enable_gqa=True, score=score, **PARAMS[score]
    )
    check(out, ref, torch.float64)
    # and GQA equals repeating the kv heads by hand
    k6, v6 = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
    check(attention(q, k6, v6, is_causal=True, score=score, **PARAMS[score]), ref, torch.float64)


@pytest.mark.parametrize("score", ALL)
def test_scaled_dot_family_equals_sdpa_where_it_should(score):
    q, k, v = qkv(dtype=torch.float64)
    expected = {
        "scaled_dot": F.scaled_dot_product_attention(q, k, v),
        "dot": F.scaled_dot_product_attention(q, k, v, scale=1.0),
        "mup": F.scaled_dot_product_attention(q, k, v, scale=5.0 / 8),
    }
    if score in expected:
        check(attention(q, k, v, score=score, **PARAMS[score]), expected[score], torch.float64)
    else:  # the others really are different scorings
        diff = attention(q, k, v, score=score, **PARAMS[score]) - expected["scaled_dot"]
        assert diff.abs().max() > 1e-3


def test_value_head_dim_may_differ():
    q, k, v = qkv(dv=5, dtype=torch.float64)
    for score in ALL:
        out = attention(q, k, v, score=score, **PARAMS[score])
        assert out.shape == (2, 4, 13, 5)
        check(out, reference_attention(q, k, v, score=score, **PARAMS[score]), torch.float64)


def test_three_dimensional_inputs():
    q, k, v = (t[:, 0] for t in qkv(dtype=torch.float64))
    for score in ALL:
        out = attention(q, k, v, is_causal=True, score=score, **PARAMS[score])
        assert out.shape == (2, 13, 8)
        ref = reference_attention(q, k, v, is_causal=True, score=score, **PARAMS[score])
        check(out, ref, torch.float64)


def test_scale_override():
    q, k, v = qkv(dtype=torch.float64)
    for score in ("scaled_dot", "qk_layernorm", "qk_rmsnorm", "softcap", "log_length"):
        a = attention(q, k, v, scale=0.3, score=score, **PARAMS[score])
        check(
            a, reference_attention(q, k, v, scale=0.3, score=score, **PARAMS[score]), torch.float64
        )
        b = attention(q, k, v, score=score, **PARAMS[score])
        assert (a - b).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("score", ALL)
@pytest.mark.parametrize("setting", ["plain", "causal-mask", "gqa"])
def test_gradcheck(score, setting):
    kw = {"score": score, **PARAMS[score]}
    if setting == "gqa":
        q, k, v = qkv(b=1, h=4, hk=2, nq=5, nk=6, d=4, dtype=torch.float64, grad=True)
        kw["enable_gqa"] = True
    else:
        q, k, v = qkv(b=1, h=2, nq=5, nk=6, d=4, dtype=torch.float64, grad=True)
    if setting == "causal-mask":
        kw["is_causal"] = True
        kw["attn_mask"] = masks(b=1, h=2, nq=5, nk=6)["bool"]
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c, **kw), (q, k, v))
    # and the gradients agree with the reference's autograd
    out = attention(q, k, v, **kw)
    ref = reference_attention(q, k, v, **kw)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, r in zip(grads, ref_grads, strict=True):
        check(g, r, torch.float64)


@pytest.mark.parametrize("score,name", [("cosine", "tau"), ("softcap", "cap"), ("log_length", "s")])
def test_per_head_tensor_parameters(score, name):
    q, k, v = qkv(dtype=torch.float64)
    value = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
    out = attention(q, k, v, score=score, **{name: value})
    check(out, reference_attention(q, k, v, score=score, **{name: value}), torch.float64)
    # head h must use value[h]
    for h in range(4):
        one = attention(
            q[:, h : h + 1],
            k[:, h : h + 1],
            v[:, h : h + 1],
            score=score,
            **{name: float(value[h])},
        )
        check(out[:, h : h + 1], one, torch.float64)


def test_softcap_learned_cap_falls_back_and_is_exact():
    q, k, v = qkv(b=1, h=2, nq=4, nk=5, d=4, dtype=torch.float64, grad=True)
    cap = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c, cp: attention(a, b, c, score="softcap", cap=cp), (q, k, v, cap)
    )


def test_softcap_chunking_is_invisible(monkeypatch):
    """The chunked fallback (what runs where the native kernel cannot) gives the same numbers
    in one chunk as in many."""
    A = importlib.import_module("attnscale.core.chunked")
    N = importlib.import_module("attnscale.core.native")

    q, k, v = qkv(nq=40, nk=40, dtype=torch.float64, grad=True)
    mask = masks(nq=40, nk=40)["bool-padding-broadcast"]
    with N.forced_fallback():
        full = attention(q, k, v, attn_mask=mask, is_causal=True, score="softcap", cap=2.0)
        assert N.last_path() == "chunked"
        g_full = torch.autograd.grad(full.sum(), (q, k, v))
        monkeypatch.setattr(A, "CHUNK_ELEMENTS", 2 * 4 * 40 * 3)  # three rows per chunk
        chunked = attention(q, k, v, attn_mask=mask, is_causal=True, score="softcap", cap=2.0)
        g_chunked = torch.autograd.grad(chunked.sum(), (q, k, v))
    check(chunked, full, torch.float64)
    for a, b in zip(g_chunked, g_full, strict=True):
        check(a, b, torch.float64)


def test_softcap_flex_score_mod_matches_reference():
    """The FlexAttention path (used on GPU) runs eagerly on CPU for forward; same numbers."""
    from attnscale.core.chunked import flex_modded_attention
    from attnscale.core.scores import get_score, resolve_params

    q, k, v = qkv(b=1, h=2, nq=16, nk=16, d=8, dtype=torch.float32)
    sc = get_score("softcap")
    params = resolve_params(sc, {"cap": 1.5}, None)
    out = flex_modded_attention(sc, params, q, k, v, None, True, None)
    ref = reference_attention(q, k, v, is_causal=True, score="softcap", cap=1.5)
    check(out, ref, torch.float32)


# ---------------------------------------------------------------------------------------------
# Fully masked rows and extreme inputs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("score", ALL)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zeros_and_zero_grad(score, kind):
    q, k, v = qkv(b=1, h=2, nq=4, nk=5, d=4, dtype=torch.float64, grad=True)
    keep = torch.ones(4, 5, dtype=torch.bool)
    keep[2] = False
    mask = (
        keep
        if kind == "bool"
        else torch.zeros(4, 5, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    )
    out = attention(q, k, v, attn_mask=mask, score=score, **PARAMS[score])
    assert torch.all(out[:, :, 2] == 0)
    assert torch.isfinite(out).all()
    (gq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.all(gq[:, :, 2] == 0) and torch.isfinite(gq).all()
    check(
        out,
        reference_attention(q, k, v, attn_mask=mask, score=score, **PARAMS[score]),
        torch.float64,
    )


@pytest.mark.parametrize("score", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_huge_logits_stay_finite(score, dtype):
    # q·k up to 1e4 after scaling (dot: |q||k| = 1e4)
    q, k, v = qkv(b=1, h=2, nq=8, nk=8, d=16, dtype=torch.float64)
    q = q / q.norm(dim=-1, keepdim=True) * 100.0
    k = k / k.norm(dim=-1, keepdim=True) * 100.0
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    out = attention(q, k, v, is_causal=True, score=score, **PARAMS[score])
    assert torch.isfinite(out).all()
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def bad(**over):
    q, k, v = qkv()
    args = {"query": q, "key": k, "value": v, **over}
    return args


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        (bad(query=torch.randn(8)), ValueError, "query must have at least 2 dimensions"),
        (bad(attn_mask=torch.ones(17, dtype=torch.bool)), ValueError, "at least 2 dimensions"),
        (bad(attn_mask=torch.ones(13, 17, dtype=torch.float64)), TypeError, "attn_mask must be"),
        (bad(attn_mask=torch.ones(3, 2, 4, 13, 17).bool()), ValueError, "does not broadcast"),
        (bad(dropout_p=-0.1), ValueError, "dropout_p"),
        (bad(enable_gqa=1), TypeError, "enable_gqa must be a bool"),
        (bad(key=torch.randn(2, 4, 17, 7)), ValueError, "same head dimension"),
        (bad(value=torch.randn(2, 4, 16, 8)), ValueError, "same length"),
        (bad(query=torch.randint(0, 3, (2, 4, 13, 8))), TypeError, "floating dtype"),
        (bad(key=torch.randn(2, 4, 17, 8, dtype=torch.float64)), TypeError, "share a dtype"),
        (bad(attn_mask=torch.ones(3, 17, dtype=torch.bool)), ValueError, "does not broadcast"),
        (bad(attn_mask=torch.ones(13, 17, dtype=torch.int64)), TypeError, "attn_mask must be"),
        (bad(attn_mask=[[True]]), TypeError, "attn_mask must be"),
        (bad(score="cosinus"), ValueError, "score must be one of"),
        (bad(score="cosine", tau=0.0), ValueError, "tau must be > 0"),
        (bad(score="cosine", tau=-1.0), ValueError, "tau must be > 0"),
        (bad(score="softcap", cap=0.0), ValueError, "cap must be > 0"),
        (bad(score="mup", c=-8.0), ValueError, "c must be > 0"),
        (bad(score="qk_rmsnorm", eps=0.0), ValueError, "eps must be > 0"),
        (bad(score="qk_layernorm", eps=float("nan")), ValueError, "eps must be > 0"),
        (bad(score="cosine", cap=3.0), ValueError, "accepted: ['eps', 'tau']"),
        (bad(score="cosine", scale=0.5), ValueError, "scale must be None"),
        (bad(score="scaled_dot", scale=float("inf")), ValueError, "scale must be a finite"),
        (bad(dropout_p=1.5), ValueError, "dropout_p"),
        (bad(is_causal=1), TypeError, "is_causal"),
        (bad(query=torch.randn(2, 6, 13, 8), enable_gqa=False), ValueError, "enable_gqa=True"),
        (bad(query=torch.randn(2, 6, 13, 8), enable_gqa=True), ValueError, "multiple of"),
        (bad(query=torch.randn(3, 4, 13, 8)), ValueError, "must broadcast"),
        (bad(query=torch.randn(13, 8), enable_gqa=True), ValueError, "at least 3 dimensions"),
        (bad(query="q"), TypeError, "query must be a torch.Tensor"),
    ],
)
@pytest.mark.parametrize("fn", [attention, reference_attention])
def test_bad_input_names_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**kwargs)
    assert words in str(info.value)


def test_unknown_score_lists_valid_names():
    with pytest.raises(ValueError) as info:
        attention(*qkv(), score="nope")
    for name in SCORES:
        assert name in str(info.value)


def test_register_adds_a_score_in_one_place():
    from attnscale.core.scores import SCORES, Score, register

    double = Score(
        name="test_double_scaled",
        summary="2·q·k/√d",
        prepare=lambda q, k, scale, p, ctx: (q, k, 2.0 / ctx.head_dim**0.5),
        formula=lambda q, k, scale, p, ctx: 2.0 * (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5,
    )
    register(double)
    try:
        q, k, v = qkv(dtype=torch.float64)
        check(
            attention(q, k, v, score="test_double_scaled"),
            reference_attention(q, k, v, score="test_double_scaled"),
            torch.float64,
        )
        with pytest.raises(ValueError, match="already registered"):
            register(double)
    finally:
        del SCORES["test_double_scaled"]


def test_public_api():
    assert attnscale.attention is attention
    assert attnscale.reference_attention is reference_attention


@pytest.mark.parametrize("rms", [True, False])
def test_row_scale_backward_matches_autograd_of_the_formula(rms):
    """The hand-written backward of cosine's and qk_rmsnorm's row scaling, including rows whose
    norm is below eps (where F.normalize clamps and the derivative of the scale is 0)."""
    from attnscale.core.score_ops import RowScale

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    eps = 1e-6
    assert torch.autograd.gradcheck(lambda t: RowScale.apply(t, eps, rms), (x,))
    # rows at or below the clamp: finite differences would straddle the kink, so compare with
    # autograd of the plain formula instead
    x = x.detach().clone()
    x[0, 0, 0] = 0.0
    x[0, 1, 2] *= 1e-9
    x.requires_grad_()
    dy = torch.randn(x.shape, dtype=torch.float64, generator=g)
    if rms:
        plain = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    else:
        plain = x / x.norm(dim=-1, keepdim=True).clamp_min(eps)
    want = torch.autograd.grad(plain, x, dy)[0]
    got = torch.autograd.grad(RowScale.apply(x, eps, rms), x, dy)[0]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("score", ["qk_rmsnorm", "cosine"])
def test_half_precision_rows_with_a_large_norm(score):
    """‖x‖² overflows float16 at ‖x‖ > 256 (RMS 32 at d = 64): the norms are taken in float32."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 6, 64, generator=g) * 40 for _ in range(3))
    want = reference_attention(q.double(), k.double(), v.double(), score=score)
    got = attention(q.half(), k.half(), v.half(), score=score)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=0.5)  # v is ~40 in size


@pytest.mark.parametrize("causal", [False, True])
def test_zero_scale_gives_uniform_attention(causal):
    """scale=0 makes every logit 0: the mean of the visible values (PyTorch's CPU flash kernel
    alone returns NaN here when causal)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    out = attention(q, k, v, scale=0.0, is_causal=causal)
    if causal:
        expected = v.cumsum(-2) / torch.arange(1, 6).view(1, 1, 5, 1)
    else:
        expected = v.mean(-2, keepdim=True).expand_as(v)
    torch.testing.assert_close(out, expected)
