"""Invariants of attention that hold for every score, checked with hypothesis.

Each invariant holds exactly in real arithmetic, so the two sides of a test differ only by
rounding. The tolerance is a bound on that rounding, derived below for precision u (2⁻²⁴ in
float32, 2⁻⁵³ in float64) and evaluated on the example's own inputs; the tests draw both dtypes.

Rounding bound (standard model fl(a ∘ b) = (a ∘ b)(1 + θ), |θ| ≤ u; a sum of m terms is off
by at most m·u·Σ|terms|, Higham 2002, "Accuracy and Stability of Numerical Algorithms", §3.1):

* Logits. A score computes c·q̃·k̃ from transformed rows q̃, k̃ (the registry's ``prepare``). The
  d-term dot product, the scale (SDPA may apply √c to q and to k: 2 roundings), and the
  subtraction of the row maximum (|s − max| ≤ 2L) give |δs| ≤ (d + 6)·u·L with
  L = |c|·max‖q̃‖·max‖k̃‖ (Cauchy–Schwarz). Computing q̃ itself adds a relative ℓ2 error e_q
  (e_k for keys), contributing L·(e_q + e_k):
  - no transform: 0, or u when the test rounded the input (q·a);
  - cosine and RMSNorm: ‖x‖ from d squares, a square root, a reciprocal and a product:
    (d + 4)·u;
  - LayerNorm: x − mean cancels; with κ = max|x| / σ(x) and the variance accurate to d·κ²·u for
    any of the standard algorithms (Chan, Golub & LeVeque 1983), (2d + 8)·κ²·u;
  - soft-capping adds its own elementwise function 2·cap·σ(2z/cap) − cap, whose exp contributes
    2·cap·(C_EXP + 3)·u; log-length multiplies q by s·ln n: 3·u relative.
* Softmax output o = Σ p_j v_j. A logit error δ moves every p_j by a factor in [e^{−2δ}, e^{2δ}],
  so ‖p̂ − p‖₁ ≤ e^{2δ} − 1. Each weight then carries exp (C_EXP ulp; the online softmax rescales
  once more: 2·C_EXP), the sum of n terms and a division, and o the sum of n products:
  |ô − o| ≤ [(e^{2δ} − 1) + (2n + 2·C_EXP + 6)·u]·max|v|.

C_EXP = 20 ulp is the accuracy PyTorch states for its vectorized ``exp_u20`` / ``fexp_u20``,
which SDPA's CPU flash kernel uses. A test that compares two computed values allows the sum of
their two bounds. ``make fuzz`` checks the bounds on many more examples.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnscale import SCORES, attention
from attnscale.core.scores import Context, Score, default_scale, dot_logits, registered

C_EXP = 20  # ulp of PyTorch's vectorized exp

SCORE_PARAMS = {
    "scaled_dot": {},
    "dot": {},
    "mup": {"c": 8.0},
    "cosine": {"tau": 5.0},
    "qk_layernorm": {},
    "qk_rmsnorm": {},
    "softcap": {"cap": 2.0},
    "log_length": {"s": 1.0},
}

shapes = st.tuples(
    st.integers(1, 2),  # B
    st.integers(1, 3),  # H
    st.integers(1, 9),  # Nq
    st.integers(1, 9),  # Nk
    st.sampled_from([2, 4, 8]),  # D
)
dtypes = st.sampled_from([torch.float32, torch.float64])


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2⁻ᵖ for a p-bit significand: 2⁻²⁴ for float32, 2⁻⁵³ for float64."""
    return torch.finfo(dtype).eps / 2


def layernorm_kappa(x: torch.Tensor) -> float:
    """κ = max over rows of max|x| / σ(x), the cancellation factor of x − mean(x)."""
    x = x.double()
    sigma = x.std(-1, unbiased=False)
    return float((x.abs().amax(-1) / sigma).max())


def _norm_error(x: torch.Tensor, u: float) -> float:
    return (x.shape[-1] + 4) * u  # ‖x‖: d squares, a square root, a reciprocal and a product


def _layernorm_error(x: torch.Tensor, u: float) -> float:
    return (2 * x.shape[-1] + 8) * layernorm_kappa(x) ** 2 * u


def _no_error(x: torch.Tensor, u: float) -> float:
    return 0.0


# The scores the bound is derived for (module docstring): the relative error e of each one's
# row transform, and the term of each one's elementwise ``mod``.
TRANSFORM_ERRORS = {
    "scaled_dot": _no_error,
    "dot": _no_error,
    "mup": _no_error,
    "cosine": _norm_error,
    "qk_rmsnorm": _norm_error,
    "qk_layernorm": _layernorm_error,
    "softcap": _no_error,
    "log_length": lambda x, u: 3 * u,  # q·(s·ln n)
}
MOD_ERRORS = {"softcap": lambda p, u: 2 * float(p["cap"]) * (C_EXP + 3) * u}


def require_bound(score: str) -> None:
    """Skip, naming the score, when the rounding bound was not derived for it.

    A newly registered score still runs every invariant that needs no bound; the tests that
    compare two computed values need its transform's error in the derivation above first.
    """
    derived = score in TRANSFORM_ERRORS and (SCORES[score].mod is None or score in MOD_ERRORS)
    if not derived:
        pytest.skip(f"no float32 rounding bound is derived for score {score!r}; add its "
                    "transform error to TRANSFORM_ERRORS (and MOD_ERRORS for a mod)")


def transform_error(score: str, x: torch.Tensor, u: float) -> float:
    """e: relative ℓ2 error of the score's row transform of x (see the module docstring)."""
    require_bound(score)
    return TRANSFORM_ERRORS[score](x, u)


def score_params(score: str) -> dict:
    """The parameters the tests pass, over the score's defaults."""
    return {**SCORES[score].defaults, **SCORE_PARAMS.get(score, {})}


def logit_size(score: str, q: torch.Tensor, k: torch.Tensor) -> float:
    """L = |c|·max‖q̃‖·max‖k̃‖ ≥ every |logit|, from the score's ``prepare`` in float64.

    log-length is evaluated at n = Nk, the most keys a query can see (the largest ln n).
    """
    nk = k.shape[-2]
    ctx = Context(head_dim=q.shape[-1], n_visible=lambda: torch.full((1, 1, 1, 1), float(nk)))
    qt, kt, c = SCORES[score].prepare(q.double(), k.double(), None, score_params(score), ctx)
    return abs(float(c)) * float(qt.norm(dim=-1).max()) * float(kt.norm(dim=-1).max())


def logit_error_bound(
    score: str, q: torch.Tensor, k: torch.Tensor, u: float, input_error: float = 0.0
) -> float:
    """|δs| ≤ L·[(d + 6)·u + e_q + e_k] (+ the soft-cap term), from the float64 ``prepare``.

    ``input_error`` is the relative error of q's entries before the score saw them (a rounded
    product q·a), amplified by κ where the transform cancels (LayerNorm).
    """
    d = q.shape[-1]
    amplify = layernorm_kappa(q) if score == "qk_layernorm" else 1.0
    e_q = transform_error(score, q, u) + amplify * input_error
    e_k = transform_error(score, k, u)
    delta = logit_size(score, q, k) * ((d + 6) * u + e_q + e_k)
    if SCORES[score].mod is not None:
        delta += MOD_ERRORS[score](score_params(score), u)
    return delta


def softmax_output_bound(delta: float, n: int, vmax: float, u: float) -> float:
    """|ô − o| ≤ [(e^{2δ} − 1) + (2n + 2·C_EXP + 6)·u]·max|v|."""
    return (math.expm1(2 * delta) + (2 * n + 2 * C_EXP + 6) * u) * vmax


def float32_attention_bound(
    score: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, input_error: float = 0.0
) -> float:
    """Bound on |attention(q, k, v) − exact| in q's precision (float32: u = 2⁻²⁴)."""
    u = unit_roundoff(q.dtype)
    delta = logit_error_bound(score, q, k, u, input_error)
    return softmax_output_bound(delta, k.shape[-2], float(v.abs().max()), u)


def assert_within(a: torch.Tensor, b: torch.Tensor, bound: float) -> None:
    diff = float((a.double() - b.double()).abs().max())
    assert diff <= bound, f"|a - b| = {diff:.3g} exceeds the rounding bound {bound:.3g}"


def make(shape, seed, scale=1.0, dtype=torch.float64):
    b, h, nq, nk, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def check_rows_sum_to_one(shape, seed, score, causal, scale, dtype) -> None:
    """With V = identity the output rows are the attention weights, which sum to 1.

    The bound needs nothing from the score: every registered score runs it.
    """
    q, k, _ = make(shape, seed, scale, dtype)
    b, h, nq, nk, _ = shape
    v = torch.eye(nk, dtype=dtype).expand(b, h, nk, nk)
    w = attention(q, k, v, is_causal=causal, score=score, **SCORE_PARAMS.get(score, {}))
    assert torch.all(w >= 0)
    # the sum moves only with the weights' own rounding (δ = 0), plus n more for summing them
    bound = softmax_output_bound(0.0, nk, 1.0, unit_roundoff(dtype)) + nk * unit_roundoff(dtype)
    assert_within(w.sum(-1), torch.ones(b, h, nq), bound)
    if causal:  # no weight above the diagonal
        assert torch.all(w.triu(diagonal=1) == 0)


def check_key_permutation(shape, seed, score, dtype) -> None:
    """Permuting keys and values together changes the output only by rounding."""
    require_bound(score)
    q, k, v = make(shape, seed, dtype=dtype)
    perm = torch.randperm(k.shape[-2], generator=torch.Generator().manual_seed(seed))
    params = SCORE_PARAMS.get(score, {})
    a = attention(q, k, v, score=score, **params)
    b = attention(q, k[:, :, perm], v[:, :, perm], score=score, **params)
    assert_within(a, b, 2 * float32_attention_bound(score, q, k, v))


@given(
    shape=shapes,
    seed=st.integers(0, 2**31),
    score=st.sampled_from(sorted(SCORES)),
    causal=st.booleans(),
    scale=st.sampled_from([0.1, 1.0, 10.0]),
    dtype=dtypes,
)
def test_rows_sum_to_one(shape, seed, score, causal, scale, dtype):
    check_rows_sum_to_one(shape, seed, score, causal, scale, dtype)


@given(
    shape=shapes, seed=st.integers(0, 2**31), score=st.sampled_from(sorted(SCORES)), dtype=dtypes
)
def test_permuting_keys_and_values_together_changes_nothing(shape, seed, score, dtype):
    check_key_permutation(shape, seed, score, dtype)


def _halve(z: torch.Tensor, p: dict) -> torch.Tensor:
    return z.mul_(0.5)


NEW_SCORE = Score(
    name="halved_test_score",
    summary="(q·k/√d)/2 through the chunked kernel's elementwise mod (a test score)",
    prepare=lambda q, k, scale, p, ctx: (q, k, default_scale(scale, ctx.head_dim)),
    formula=lambda q, k, scale, p, ctx: dot_logits(q, k) * default_scale(scale, q.shape[-1]) / 2,
    mod=_halve,
    mod_grad=lambda f, p: torch.full_like(f, 0.5),
)


def test_a_new_score_runs_the_invariants_and_skips_the_bound_by_name():
    """A registered score the bound does not know: no KeyError, an explicit skip instead."""
    assert "halved_test_score" not in TRANSFORM_ERRORS
    with registered(NEW_SCORE):
        for seed, causal in ((0, False), (1, True)):
            check_rows_sum_to_one((2, 2, 5, 7, 4), seed, NEW_SCORE.name, causal, 1.0,
                                  torch.float32)
        with pytest.raises(pytest.skip.Exception, match="'halved_test_score'"):
            check_key_permutation((1, 1, 3, 4, 4), 0, NEW_SCORE.name, torch.float32)
        with pytest.raises(pytest.skip.Exception, match="'halved_test_score'"):
            transform_error(NEW_SCORE.name, torch.ones(1, 4), 1e-7)


@given(
    shape=shapes,
    seed=st.integers(0, 2**31),
    aq=st.floats(0.01, 100.0),
    ak=st.floats(0.01, 100.0),
    dtype=dtypes,
)
def test_cosine_ignores_the_size_of_q_and_k(shape, seed, aq, ak, dtype):
    q, k, v = make(shape, seed, dtype=dtype)
    a = attention(q, k, v, score="cosine", tau=3.0)
    b = attention(q * aq, k * ak, v, score="cosine", tau=3.0)
    u = unit_roundoff(dtype)
    # q·aq and k·ak are rounded once each: one more u in each of e_q and e_k
    bound_b = float32_attention_bound("cosine", q, k, v, input_error=2 * u)
    assert_within(a, b, float32_attention_bound("cosine", q, k, v) + bound_b)


@given(shape=shapes, seed=st.integers(0, 2**31), causal=st.booleans(), dtype=dtypes)
def test_dot_is_scaled_dot_with_scale_one(shape, seed, causal, dtype):
    q, k, v = make(shape, seed, dtype=dtype)
    assert_within(
        attention(q, k, v, is_causal=causal, score="dot"),
        attention(q, k, v, is_causal=causal, score="scaled_dot", scale=1.0),
        2 * float32_attention_bound("dot", q, k, v),
    )


@given(shape=shapes, seed=st.integers(0, 2**31), a=st.floats(0.01, 100.0), dtype=dtypes)
def test_qk_norms_ignore_the_size_of_q(shape, seed, a, dtype):
    """LN(a·q) = LN(q) and RMS(a·q) = RMS(q) up to rounding and eps.

    eps is exact arithmetic, not rounding: x/√(σ² + eps) differs from x/σ by a relative
    eps/(2σ²) at most, and by eps/(2a²σ²) for a·q (σ² is the mean square for RMSNorm).
    """
    q, k, v = make(shape, seed, dtype=dtype)
    eps, u = 1e-12, unit_roundoff(dtype)
    q64 = q.double()
    for score in ("qk_layernorm", "qk_rmsnorm"):
        spread = q64.var(-1, unbiased=False) if score == "qk_layernorm" else q64.pow(2).mean(-1)
        eps_error = eps / (2 * float(spread.min()))
        vmax, n, size = float(v.abs().max()), k.shape[-2], logit_size(score, q, k)
        bound = 0.0
        for input_error, factor in ((0.0, 1.0), (u, a)):  # q, then the rounded a·q
            delta = logit_error_bound(score, q, k, u, input_error)
            delta += size * eps_error / factor**2  # q̃ moves by eps/(2a²σ²) relative
            bound += softmax_output_bound(delta, n, vmax, u)
        assert_within(
            attention(q, k, v, score=score, eps=eps),
            attention(q * a, k, v, score=score, eps=eps),
            bound,
        )
