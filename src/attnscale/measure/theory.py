"""Theory of attention-logit scale: closed forms and exact integrals, no sampling.

Three groups of results, each function citing where its formula comes from:

* **How big are the logits?** :func:`logit_variance` (Vaswani et al. 2017, footnote 4) and
  :func:`init_logit_std` for a pre-LN block at initialization, for every score whose registry
  entry gives a theory hook (:class:`attnscale.core.scores.Score`).
* **What does a softmax over n logits do with that size?** With n i.i.d. N(0, s²) logits the
  softmax is Derrida's Random Energy Model (Derrida 1981), which freezes at
  s_c = √(2 ln n) (:func:`rem_critical_scale`). :func:`expected_entropy`,
  :func:`expected_participation`, :func:`expected_max_weight` and :func:`rms_jacobian_norm`
  are *exact* at finite n (:mod:`attnscale.measure.quadrature`, ~1e-8 relative), and
  :func:`score_moments` / :func:`expected_stat` do the same for the registered scores with
  random q and k. Giorlandino & Goldt 2025 (arXiv 2505.24333) use this REM parallel for
  attention at init.
* **Bounded logits** (:mod:`attnscale.measure.cosine_theory`, re-exported here):
  :func:`max_weight_bound`, :func:`tau_for_max_weight`, :func:`qknorm_g0` (Henry et al. 2020)
  and the law of the cosine of two random vectors (:func:`cosine_logit_pdf`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)
import torch
from numpy.typing import ArrayLike

from attnscale.core.scores import SCORES, Score, get_score, resolve_params
from attnscale.measure.cosine_theory import (
    cosine_logit_pdf,
    cosine_logit_variance,
    max_weight_bound,
    qknorm_g0,
    tau_for_max_weight,
    tau_matching_scaled_dot,
)
from attnscale.measure.quadrature import (
    QUANTITIES,
    LogitDistribution,
    SoftmaxMoments,
    chi_rule,
    cosine_logits,
    default_chi_nodes,
    gaussian_logits,
    panel_logits,
    panel_rule,
    softmax_moments,
)
from attnscale.util.validate import check_array, check_choice, check_float, check_int

__all__ = [
    "QUANTITIES",
    "LogitDistribution",
    "SoftmaxMoments",
    "chi_rule",
    "cosine_logit_pdf",
    "cosine_logit_variance",
    "cosine_logits",
    "default_chi_nodes",
    "expected_effective_keys",
    "expected_entropy",
    "expected_max_weight",
    "expected_participation",
    "expected_stat",
    "gaussian_logits",
    "init_logit_std",
    "init_scores",
    "logit_variance",
    "max_weight_bound",
    "panel_logits",
    "qknorm_g0",
    "rem_critical_scale",
    "rem_entropy_asymptotic",
    "rem_participation_asymptotic",
    "rms_jacobian_norm",
    "score_moments",
    "softmax_moments",
    "stat_scores",
    "tau_for_max_weight",
    "tau_matching_scaled_dot",
    "two_key_closed_form",
]


def init_scores() -> tuple[str, ...]:
    """Registered scores :func:`init_logit_std` knows (a ``dot_factor`` or ``cosine_law``)."""
    return tuple(n for n, s in SCORES.items() if s.dot_factor or s.cosine_law)


def stat_scores() -> tuple[str, ...]:
    """Registered scores :func:`score_moments` integrates exactly (``Score.has_theory``)."""
    return tuple(n for n, s in SCORES.items() if s.has_theory)


def _out(arr: np.ndarray) -> float | np.ndarray:
    """A Python float for 0-d results, the array otherwise."""
    return float(arr) if np.ndim(arr) == 0 else arr


# --------------------------------------------------------------------------------------------
# How big are the logits?
# --------------------------------------------------------------------------------------------


def logit_variance(
    d: ArrayLike, var_q: ArrayLike = 1.0, var_k: ArrayLike = 1.0
) -> float | np.ndarray:
    """Variance of q·k for q, k with independent zero-mean components: d·var_q·var_k.

    q·k = Σ_i q_i k_i is a sum of d independent products, each with mean 0 and variance
    var_q·var_k, so E[q·k] = 0 and Var[q·k] = d·var_q·var_k (Vaswani et al. 2017, footnote 4).
    The mean does not grow with d; the typical *size* |q·k| ~ √d does.
    """
    d = check_array("d", d, minimum=1, integer=True)
    var_q = check_array("var_q", var_q, minimum=0)
    var_k = check_array("var_k", var_k, minimum=0)
    return _out(d * var_q * var_k)


def init_logit_std(
    d_model: int, d_head: int, weight_std: float, score: str | Score, *, n: int | None = None,
    **params: Any,
) -> float:
    """Std of one attention logit in a pre-LN block at initialization, for two different tokens.

    Setup: the LayerNorm output x has unit-variance components (‖x‖² = d_model); q = W_q x and
    k = W_k x' with W_q, W_k independent, i.i.d. N(0, weight_std²) entries, x' another token.
    Given x, q is isotropic Gaussian with component variance σ² = d_model·weight_std², same for k,
    so by Vaswani et al. 2017 (footnote 4) Var(q·k) = d_head·σ⁴. With d = d_head, from the
    score's theory hook (``params`` are its parameters, ``n`` the number of keys):

    * logit c·q·k (``dot_factor`` c: dot 1, scaled_dot 1/√d, µP c/d, log_length s·ln(n)/√d):
      c·√d·σ²;
    * logit t·cos in m dims (``cosine_law``: cosine τ·cos, the QK-norms √d·cos): t/√m, since the
      cosine of two independent isotropic vectors has variance 1/m
      (:func:`cosine_logit_variance`), whatever σ is;
    * logit mod(c·q·k) (soft-capping, Gemma Team 2024): exactly, by quadrature over
      z | ‖q‖ ~ N(0, (c·σ²·‖q‖/σ)²), ‖q‖/σ ~ χ_d; ≈ c·√d·σ² while that is ≪ the cap.
    """
    check_int("d_model", d_model)
    d = check_int("d_head", d_head)
    w = check_float("weight_std", weight_std, low=0.0)
    sc = get_score(score)
    p = resolve_params(sc, params, None)
    sigma2 = float(d_model) * w * w
    if sc.cosine_law is not None:
        dims, t = sc.cosine_law(d, p)
        if dims < 1:
            raise ValueError(f"d_head must be an integer >= {d - dims + 1} for {sc.name}, got {d}")
        return float(t) / math.sqrt(dims)
    if sc.dot_factor is None:
        raise ValueError(f"score {sc.name!r} has no init law; scores with one: {init_scores()}")
    c = float(sc.dot_factor(d, n, p))
    if sc.fused:
        return c * math.sqrt(d) * sigma2
    return _modded_std(sc, p, c * sigma2, d)


def _modded_std(sc: Score, params: dict[str, Any], scale: float, d: int) -> float:
    """√E[mod(z)²] for z = scale·r·g, r ~ χ_d, g ~ N(0, 1).

    mod can be nearly a step in g (tanh at a small cap), so g uses composite Gauss–Legendre
    panels, not Gauss–Hermite.
    """
    r, wr = chi_rule(d, default_chi_nodes(d))
    order = 14
    xi, om, _ = panel_rule(order)
    edges = np.linspace(-9.0, 9.0, 73)
    half = 0.5 * (edges[1] - edges[0])
    g = (0.5 * (edges[1:] + edges[:-1])[:, None] + half * xi[None, :]).ravel()
    wg = (half * om[None, :] * scipy.stats.norm.pdf(g.reshape(-1, order))).ravel()
    z = torch.from_numpy(scale * r[:, None] * g[None, :])  # float64
    f = sc.apply_mod(z, params).numpy()
    return math.sqrt(float(wr @ (f * f) @ wg))


# --------------------------------------------------------------------------------------------
# Random Energy Model: critical scale and asymptotics (for plots and docs)
# --------------------------------------------------------------------------------------------


def rem_critical_scale(n: ArrayLike) -> float | np.ndarray:
    """Freezing scale of the softmax over n i.i.d. N(0, s²) logits: s_c = √(2 ln n).

    Derrida 1981 (Random Energy Model). Below s_c the weight is spread over ~n·e^{−s²} keys;
    above it a handful of keys carry O(1) weight ("frozen" phase).
    """
    n = check_array("n", n, minimum=1, integer=True)
    return _out(np.sqrt(2.0 * np.log(n)))


def rem_entropy_asymptotic(n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    """Large-n entropy (nats) of the REM softmax, both phases.

    * s ≤ s_c: H ≈ ln n − s²/2 (annealed free energy; Derrida 1981).
    * s > s_c: the weights tend to Poisson–Dirichlet PD(m, 0) with m = s_c/s, whose expected
      entropy is ψ(1) − ψ(1 − m) (ψ the digamma function), from the PD sum formula
      E Σ f(p_i) = ∫₀¹ f(p) p^{−m−1}(1−p)^{m−1} dp / (Γ(m)Γ(1−m)) (Pitman & Yor 1997).

    Only an asymptote: at n ≤ 1000 it is off by O(1) near s_c; use :func:`expected_entropy`.
    """
    n = check_array("n", n, minimum=1, integer=True)
    s = check_array("s", s, minimum=0)
    sc = np.sqrt(2.0 * np.log(n))
    m = np.divide(sc, s, out=np.zeros_like(s * sc), where=s > sc)  # m < 1 where it is used
    frozen = scipy.special.digamma(1.0) - scipy.special.digamma(1.0 - m)
    return _out(np.where(s <= sc, np.log(n) - 0.5 * s * s, frozen))


def rem_participation_asymptotic(n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    """Large-n E Σp² of the REM softmax: e^{s²}/n (s < s_c/2), e^{−(s_c−s)²} (s_c/2 ≤ s < s_c),
    1 − s_c/s (s ≥ s_c, Poisson–Dirichlet). Derrida 1981. Only an asymptote.
    """
    n = check_array("n", n, minimum=1, integer=True)
    s = check_array("s", s, minimum=0)
    sc = np.sqrt(2.0 * np.log(n))
    low = np.exp(s * s) / n
    mid = np.exp(-((sc - s) ** 2))
    high = 1.0 - np.divide(sc, s, out=np.zeros_like(s * sc), where=s > 0)
    return _out(np.where(s < sc / 2, low, np.where(s < sc, mid, high)))


def two_key_closed_form(delta: ArrayLike) -> dict[str, float | np.ndarray]:
    """Exact softmax statistics for n = 2 as functions of the logit difference Δ.

    p = sigmoid(Δ): entropy −p ln p − (1−p) ln(1−p), max weight sigmoid(|Δ|),
    Σp² = p² + (1−p)², and ‖J‖_F = 2p(1−p) for J = diag(p) − ppᵀ.
    """
    delta = check_array("delta", delta)
    p = scipy.special.expit(delta)
    q = scipy.special.expit(-delta)
    return {
        "entropy": _out(-(scipy.special.xlogy(p, p) + scipy.special.xlogy(q, q))),
        "max_weight": _out(scipy.special.expit(np.abs(delta))),
        "participation": _out(p * p + q * q),
        "jacobian_norm": _out(2.0 * p * q),
    }

# --------------------------------------------------------------------------------------------
# n i.i.d. N(0, s²) logits, exactly
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _gaussian_moments(n: int, s: float) -> SoftmaxMoments:
    if s == 0.0 or n == 1:
        base = SoftmaxMoments.uniform(n)
    else:
        base = softmax_moments(gaussian_logits(s, n), n)
    return SoftmaxMoments(base.entropy, base.participation, base.cube, base.participation_sq,
                          base.max_weight, s * s)


def _rem(attr: str, n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    n = check_array("n", n, minimum=1, integer=True)
    s = check_array("s", s, minimum=0)
    fn = np.vectorize(lambda nn, ss: getattr(_gaussian_moments(int(nn), float(ss)), attr),
                      otypes=[float])
    return _out(fn(n, s))


def expected_entropy(n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    """Exact E[−Σ p ln p] (nats) for the softmax of n i.i.d. N(0, s²) logits (REM, Derrida 1981).

    Via E ln Z (Frullani integral) minus E Σ p_j ℓ_j (Laplace identity); see
    :func:`softmax_moments`. Broadcasts over n and s. Equals ln n at s = 0; → ln n − s²/2 for
    s < s_c and → ψ(1) − ψ(1 − s_c/s) for s > s_c as n → ∞ (:func:`rem_entropy_asymptotic`).
    """
    return _rem("entropy", n, s)


def expected_participation(n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    """Exact E Σ p² for n i.i.d. N(0, s²) logits: n ∫ t E[u²e^{−tu}] φ(t)^{n−1} dt, u = e^ℓ."""
    return _rem("participation", n, s)


def expected_effective_keys(n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    """Effective number of keys 1/E Σp² (n at s = 0, → 1 deep in the frozen phase)."""
    return _rem("effective_keys", n, s)


def expected_max_weight(n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    """Exact E max_j p_j for n i.i.d. N(0, s²) logits.

    E max p = n E[p₁ 1{ℓ₁ is the largest}] = n ∫ E[t e^{ℓ} e^{−t e^{ℓ}} ψ(t, ℓ)^{n−1}] dt with
    ψ(t, x) = E[e^{−t e^{ℓ}} 1{ℓ < x}] (Laplace identity for 1/Z).
    """
    return _rem("max_weight", n, s)


def rms_jacobian_norm(n: ArrayLike, s: ArrayLike) -> float | np.ndarray:
    """Root-mean-square softmax Jacobian norm √(E‖J‖_F²), J = diag(p) − ppᵀ, N(0, s²) logits.

    ‖J‖_F² = Σp² − 2Σp³ + (Σp²)², each term an exact Laplace integral; E‖J‖_F itself has no
    such form, so this is the RMS (Monte Carlo estimates the same: mean of ‖J‖_F², then the
    square root). It is √(n−1)/n at s = 0 and → 0 at one-hot: not monotone in s.
    """
    return _rem("rms_jacobian_norm", n, s)


# --------------------------------------------------------------------------------------------
# The registered scores with random q and k
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _cosine_moments(d: int, n: int, tau: float) -> SoftmaxMoments:
    if tau == 0.0 or n == 1:
        base = SoftmaxMoments.uniform(n)
    else:
        base = softmax_moments(cosine_logits(d, tau, n), n)
    return SoftmaxMoments(base.entropy, base.participation, base.cube, base.participation_sq,
                          base.max_weight, tau * tau / d)


def score_moments(
    d: int, n: int, score: str | Score, *, chi_nodes: int | None = None, **params: Any
) -> SoftmaxMoments:
    """Exact softmax moments for one query against n keys, q and k_j i.i.d. N(0, I_d).

    ``params`` are the score's parameters (e.g. ``tau=10.0`` for cosine), over its defaults.
    From the score's theory hook (:class:`attnscale.core.scores.Score`):

    * ``cosine_law`` (m, t): the logits t·cos are i.i.d. with the cosine law in m dims whatever
      q is, no average (cosine: (d, τ); qk_rmsnorm: (d, √d); qk_layernorm: (d − 1, √d), since
      LayerNorm centres; m ≥ 2 is needed);
    * ``dot_factor`` c (fused scores): given q, the logits are i.i.d. N(0, (c·‖q‖)²), so the REM
      result is averaged over ‖q‖ ~ χ_d with a Gauss rule in ‖q‖ (:func:`chi_rule`;
      ``chi_nodes`` defaults to 16 for d ≥ 16, up to 64 for d ≤ 2: ~1e-8 relative).
    """
    d = check_int("d", d)
    n = check_int("n", n)
    sc = get_score(score)
    if not sc.has_theory:
        raise ValueError(f"score {sc.name!r} has no exact softmax theory; scores with one: "
                         f"{stat_scores()}")
    p = resolve_params(sc, params, None)
    if sc.cosine_law is not None:
        dims, t = sc.cosine_law(d, p)
        if dims < 2:
            raise ValueError(f"d must be an integer >= {d - dims + 2} for {sc.name}, got {d}")
        return _cosine_moments(dims, n, float(t))
    c = float(sc.dot_factor(d, n, p))
    m = default_chi_nodes(d) if chi_nodes is None else check_int("chi_nodes", chi_nodes)
    r, wr = chi_rule(d, m)
    return SoftmaxMoments.average([_gaussian_moments(n, float(ri * c)) for ri in r], wr)


def expected_stat(quantity: str, d: int, n: int, score: str | Score, **params: Any) -> float:
    """Exact expected ``quantity`` of softmax(scores of q against n keys), q, k ~ N(0, I_d) i.i.d.

    ``quantity`` ∈ :data:`QUANTITIES`: entropy (nats), max_weight (E max p), participation
    (E Σp²), effective_keys (1/E Σp²), rms_jacobian_norm (√E‖J‖_F²), logit_std (√E ℓ²).
    ``params`` are the score's parameters. See :func:`score_moments`.
    """
    check_choice("quantity", quantity, QUANTITIES)
    return score_moments(d, n, score, **params).get(quantity)
