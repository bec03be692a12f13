"""Theory of attention-logit scale: closed forms and exact integrals, no sampling.

Three groups of results, each function citing where its formula comes from:

* **How big are the logits?** :func:`logit_variance` (Vaswani et al. 2017, footnote 4) and
  :func:`init_logit_std` for a pre-LN block at initialization, for every score in the project.
* **What does a softmax over n logits do with that size?** With n i.i.d. N(0, s²) logits the
  softmax is Derrida's Random Energy Model (Derrida 1981), which freezes at
  s_c = √(2 ln n) (:func:`rem_critical_scale`). :func:`expected_entropy`,
  :func:`expected_participation`, :func:`expected_max_weight` and
  :func:`expected_jacobian_norm` are *exact* at finite n (numerical integration of
  Laplace-transform identities, accurate to ~1e-8 relative), and :func:`expected_stat` does the
  same for the actual scores (dot, scaled dot, µP, cosine, QK-norm) with random q and k.
  Giorlandino & Goldt 2025 (arXiv 2505.24333) use this REM parallel for attention at init.
* **Bounded logits.** :func:`max_weight_bound` (the most weight one key can get when every logit
  lies in [−τ, τ]), :func:`tau_for_max_weight`, :func:`qknorm_g0` (Henry et al. 2020) and the
  law of the cosine of two random vectors (:func:`cosine_logit_pdf`).

The exact integrals rest on one identity. For Z = Σ_j e^{ℓ_j} and k > 0,

    1/Z^k = (1/Γ(k)) ∫_0^∞ t^{k−1} e^{−tZ} dt,

so with i.i.d. logits and φ(t) = E[exp(−t e^ℓ)] every moment of the weights p_j = e^{ℓ_j}/Z
becomes a 1-D integral over t of products of 1-D expectations over ℓ, e.g.

    E Σ_j p_j² = n ∫_0^∞ t E[e^{2ℓ} e^{−t e^ℓ}] φ(t)^{n−1} dt.

The expectations over ℓ use composite Gauss–Legendre panels (any 1-D law: Gaussian, cosine,
mixtures), the t-integral uses the trapezoid rule in y = −ln t, which converges exponentially
here because every integrand is analytic in a strip around the real y axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
from numpy.polynomial import legendre
from numpy.typing import ArrayLike
from scipy import special, stats
from scipy.linalg import eigh_tridiagonal

__all__ = [
    "INIT_SCORES",
    "MUP_C",
    "QUANTITIES",
    "STAT_SCORES",
    "LogitDistribution",
    "SoftmaxMoments",
    "cosine_logit_pdf",
    "cosine_logit_variance",
    "cosine_logits",
    "expected_effective_keys",
    "expected_entropy",
    "expected_jacobian_norm",
    "expected_max_weight",
    "expected_participation",
    "expected_stat",
    "gaussian_logits",
    "init_logit_std",
    "logit_variance",
    "max_weight_bound",
    "panel_logits",
    "plot_entropy_vs_scale",
    "plot_phase_diagram",
    "qknorm_g0",
    "rem_critical_scale",
    "rem_entropy_asymptotic",
    "rem_participation_asymptotic",
    "score_moments",
    "softmax_moments",
    "tau_for_max_weight",
    "tau_matching_scaled_dot",
    "two_key_closed_form",
]

MUP_C = 8.0
"""µP attention constant: logits are c·q·k/d with c = 8 (microsoft/mup; Yang et al. 2022)."""

INIT_SCORES = (
    "dot",
    "scaled_dot",
    "mup",
    "cosine",
    "qk_layernorm",
    "qk_rmsnorm",
    "softcap",
    "log_length",
)
"""Scores :func:`init_logit_std` knows."""

STAT_SCORES = ("dot", "scaled_dot", "mup", "log_length", "cosine", "qk_rmsnorm", "qk_layernorm")
"""Scores :func:`expected_stat` integrates exactly."""

QUANTITIES = ("entropy", "max_weight", "participation", "effective_keys", "jacobian_norm",
              "logit_std")
"""Quantities :func:`expected_stat` returns (see :class:`SoftmaxMoments` for definitions)."""


# --------------------------------------------------------------------------------------------
# Input validation: every public function fails loudly, naming the argument and its range.
# --------------------------------------------------------------------------------------------


def _real(name: str, x: ArrayLike) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {x!r}") from None
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not be NaN, got {x!r}")
    return arr


def _nonneg(name: str, x: ArrayLike) -> np.ndarray:
    arr = _real(name, x)
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError(f"{name} must be finite and >= 0, got {x!r}")
    return arr


def _positive(name: str, x: ArrayLike) -> np.ndarray:
    arr = _real(name, x)
    if not np.isfinite(arr).all() or (arr <= 0).any():
        raise ValueError(f"{name} must be finite and > 0, got {x!r}")
    return arr


def _integer(name: str, x: ArrayLike, minimum: int) -> np.ndarray:
    arr = _real(name, x)
    if not np.isfinite(arr).all() or (arr != np.round(arr)).any() or (arr < minimum).any():
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    return arr


def _choice(name: str, x: str, options: tuple[str, ...]) -> str:
    if x not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {x!r}")
    return x


def _out(arr: np.ndarray) -> float | np.ndarray:
    """Return a Python float for 0-d results, the array otherwise."""
    return float(arr) if np.ndim(arr) == 0 else arr


# --------------------------------------------------------------------------------------------
# How big are the logits?
# --------------------------------------------------------------------------------------------


def logit_variance(d: ArrayLike, var_q: ArrayLike = 1.0, var_k: ArrayLike = 1.0):
    """Variance of q·k for q, k with independent zero-mean components: d·var_q·var_k.

    q·k = Σ_i q_i k_i is a sum of d independent products, each with mean 0 and variance
    var_q·var_k, so E[q·k] = 0 and Var[q·k] = d·var_q·var_k (Vaswani et al. 2017, footnote 4).
    The mean does not grow with d; the typical *size* |q·k| ~ √d does.
    """
    d = _integer("d", d, 1)
    var_q = _nonneg("var_q", var_q)
    var_k = _nonneg("var_k", var_k)
    return _out(d * var_q * var_k)


def init_logit_std(
    d_model: int,
    d_head: int,
    weight_std: float,
    score: str,
    *,
    tau: float = 1.0,
    n: int | None = None,
    mup_c: float = MUP_C,
    cap: float = 50.0,
    log_scale: float = 1.0,
    qk_scale: float | None = None,
) -> float:
    """Std of one attention logit in a pre-LN block at initialization, for two different tokens.

    Setup: the LayerNorm output x has unit-variance components (‖x‖² = d_model); q = W_q x and
    k = W_k x' with W_q, W_k independent, i.i.d. N(0, weight_std²) entries, x' another token.
    Given x, q is isotropic Gaussian with component variance σ² = d_model·weight_std², same for k,
    so by Vaswani et al. 2017 (footnote 4) Var(q·k) = d_head·σ⁴. Per score (d = d_head):

    * ``dot``: √d·σ²;  ``scaled_dot`` (Vaswani eq. 1): σ²;  ``mup`` (c·q·k/d, Yang et al. 2022):
      c·σ²/√d;  ``log_length`` (s·ln n·q·k/√d, Nakanishi 2025): s·ln(n)·σ² (needs ``n``).
    * ``cosine`` (τ·cos): τ/√d, since the cosine of two independent isotropic vectors has
      variance 1/d (:func:`cosine_logit_variance`), whatever σ is.
    * ``qk_rmsnorm``: RMS(q)·RMS(k)·scale = d·cos·scale; with the default scale 1/√d this is 1.
    * ``qk_layernorm`` (Dehghani et al. 2023): LN(q)·LN(k)/√d = √d·cos in the (d−1)-dim space of
      centred vectors, std √(d/(d−1)).
    * ``softcap`` (c·tanh(z/c) of the scaled logit z, Gemma Team 2024): computed exactly by
      quadrature over z | ‖q‖ ~ N(0, σ⁴χ²_d/d); ≈ the scaled_dot std while σ² ≪ c.
    """
    _integer("d_model", d_model, 1)
    d = float(_integer("d_head", d_head, 1))
    w = float(_positive("weight_std", weight_std))
    _choice("score", score, INIT_SCORES)
    sigma2 = float(d_model) * w * w
    if score == "dot":
        return math.sqrt(d) * sigma2
    if score == "scaled_dot":
        return sigma2
    if score == "mup":
        return float(_positive("mup_c", mup_c)) * sigma2 / math.sqrt(d)
    if score == "cosine":
        return float(_nonneg("tau", tau)) / math.sqrt(d)
    if score == "qk_rmsnorm":
        scale = 1.0 / math.sqrt(d) if qk_scale is None else float(_positive("qk_scale", qk_scale))
        return scale * math.sqrt(d)
    if score == "qk_layernorm":
        if d < 2:
            raise ValueError(f"d_head must be an integer >= 2 for qk_layernorm, got {d_head!r}")
        return math.sqrt(d / (d - 1.0))
    if score == "log_length":
        if n is None:
            raise ValueError("n (number of keys, integer >= 1) is required for log_length")
        n_keys = float(_integer("n", n, 1))
        return float(_nonneg("log_scale", log_scale)) * math.log(n_keys) * sigma2
    # softcap: E[c² tanh²(z/c)] with z | r ~ N(0, (σ² r)²/d), r = ‖q‖/σ ~ chi_d. tanh² can be
    # nearly a step in g, so g uses composite Gauss–Legendre panels, not Gauss–Hermite.
    c = float(_positive("cap", cap))
    r, wr = _chi_rule(int(d), _default_chi_nodes(int(d)))
    xi, om, _ = _panel_rule(_ORDER)
    edges = np.linspace(-9.0, 9.0, 73)
    half = 0.5 * (edges[1] - edges[0])
    g = (0.5 * (edges[1:] + edges[:-1])[:, None] + half * xi[None, :]).ravel()
    wg = (half * om[None, :] * stats.norm.pdf(g.reshape(-1, _ORDER))).ravel()
    z = sigma2 * r[:, None] * g[None, :] / math.sqrt(d)
    return math.sqrt(float(wr @ (c * c * np.tanh(z / c) ** 2) @ wg))


# --------------------------------------------------------------------------------------------
# Bounded logits and cosine similarity
# --------------------------------------------------------------------------------------------


def max_weight_bound(n: ArrayLike, tau: ArrayLike):
    """Largest softmax weight possible when all n logits lie in [−τ, τ]: e^{2τ}/(e^{2τ}+n−1).

    The maximum is reached with one logit at +τ and the other n−1 at −τ. For n = 512 and τ = 1
    (cosine attention without a temperature) it is ≈ 1.42%: no key can take more.
    Source: direct maximisation; quoted in the project anchors for claim C4.
    """
    n = _integer("n", n, 1)
    tau = _nonneg("tau", tau)
    # e^{2τ}/(e^{2τ}+n−1) = 1/(1 + (n−1)e^{−2τ}); this form cannot overflow.
    return _out(1.0 / (1.0 + (n - 1.0) * np.exp(-2.0 * tau)))


def tau_for_max_weight(n: ArrayLike, p: ArrayLike):
    """Smallest logit half-range τ that lets one of n keys reach weight p: ½·ln(p(n−1)/(1−p)).

    Inverse of :func:`max_weight_bound`. Needs n ≥ 2 and 1/n ≤ p < 1 (a weight below 1/n needs
    no range at all; weight 1 needs infinite range).
    """
    n = _integer("n", n, 2)
    p = _real("p", p)
    if ((p <= 0) | (p >= 1)).any():
        raise ValueError(f"p must lie in the open interval (0, 1), got {p!r}")
    if (p < 1.0 / n).any():
        raise ValueError(f"p must be >= 1/n (the uniform weight), got p={p!r} for n={n!r}")
    return _out(0.5 * np.log(p * (n - 1.0) / (1.0 - p)))


def qknorm_g0(L: ArrayLike):
    """QKNorm initial gain g₀ = log₂(L² − L), L the 97.5th percentile of sequence length.

    Henry et al. 2020 (arXiv 2010.04245). L = 72 gives 12.32. Needs L > 1.
    """
    L = _real("L", L)
    if not np.isfinite(L).all() or (L <= 1).any():
        raise ValueError(f"L must be finite and > 1, got {L!r}")
    return _out(np.log2(L * L - L))


def cosine_logit_pdf(x: ArrayLike, d: int):
    """Density of cos(q, k) for independent isotropic q, k in d ≥ 2 dimensions.

    f(x) = (1 − x²)^{(d−3)/2} / B(½, (d−1)/2) on [−1, 1], 0 outside. It is the law of one
    coordinate of a uniform point on the sphere S^{d−1} (a Beta((d−1)/2, (d−1)/2) variable
    on [−1, 1]); its variance is 1/d. For d = 2 it is the arcsine law, for d = 3 uniform.
    """
    d = float(_integer("d", d, 2))
    x = _real("x", x)
    inside = np.abs(x) < 1.0
    xs = np.where(inside, x, 0.0)
    log_f = 0.5 * (d - 3.0) * np.log1p(-xs * xs) - special.betaln(0.5, 0.5 * (d - 1.0))
    return _out(np.where(inside, np.exp(log_f), 0.0))


def cosine_logit_variance(d: ArrayLike):
    """Var cos(q, k) = 1/d for independent isotropic q, k: E[cos²] = E[u₁²] = 1/d on S^{d−1}."""
    return _out(1.0 / _integer("d", d, 1))


def tau_matching_scaled_dot(d: ArrayLike):
    """Temperature τ with std(τ·cos) = std(q·k/√d) = 1 for unit-variance random q, k: τ = √d.

    std(q·k/√d) = 1 (Vaswani et al. 2017, footnote 4) and std(cos) = 1/√d, so τ = √d. At d = 64
    this is 8, the flash-cosine-sim-attention default; x-transformers uses 10.
    """
    return _out(np.sqrt(_integer("d", d, 1)))


# --------------------------------------------------------------------------------------------
# Random Energy Model: critical scale and asymptotics (for plots and docs)
# --------------------------------------------------------------------------------------------


def rem_critical_scale(n: ArrayLike):
    """Freezing scale of the softmax over n i.i.d. N(0, s²) logits: s_c = √(2 ln n).

    Derrida 1981 (Random Energy Model). Below s_c the weight is spread over ~n·e^{−s²} keys;
    above it a handful of keys carry O(1) weight ("frozen" phase).
    """
    n = _integer("n", n, 1)
    return _out(np.sqrt(2.0 * np.log(n)))


def rem_entropy_asymptotic(n: ArrayLike, s: ArrayLike):
    """Large-n entropy (nats) of the REM softmax, both phases.

    * s ≤ s_c: H ≈ ln n − s²/2 (annealed free energy; Derrida 1981).
    * s > s_c: the weights tend to Poisson–Dirichlet PD(m, 0) with m = s_c/s, whose expected
      entropy is ψ(1) − ψ(1 − m) (ψ the digamma function), from the PD sum formula
      E Σ f(p_i) = ∫₀¹ f(p) p^{−m−1}(1−p)^{m−1} dp / (Γ(m)Γ(1−m)) (Pitman & Yor 1997).

    Only an asymptote: at n ≤ 1000 it is off by O(1) near s_c; use :func:`expected_entropy`.
    """
    n = _integer("n", n, 1)
    s = _nonneg("s", s)
    sc = np.sqrt(2.0 * np.log(n))
    m = np.divide(sc, s, out=np.zeros_like(s * sc), where=s > sc)  # m < 1 where it is used
    frozen = special.digamma(1.0) - special.digamma(1.0 - m)
    return _out(np.where(s <= sc, np.log(n) - 0.5 * s * s, frozen))


def rem_participation_asymptotic(n: ArrayLike, s: ArrayLike):
    """Large-n E Σp² of the REM softmax: e^{s²}/n (s < s_c/2), e^{−(s_c−s)²} (s_c/2 ≤ s < s_c),
    1 − s_c/s (s ≥ s_c, Poisson–Dirichlet). Derrida 1981; anchors. Only an asymptote.
    """
    n = _integer("n", n, 1)
    s = _nonneg("s", s)
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
    delta = _real("delta", delta)
    p = special.expit(delta)
    q = special.expit(-delta)
    return {
        "entropy": _out(-(special.xlogy(p, p) + special.xlogy(q, q))),
        "max_weight": _out(special.expit(np.abs(delta))),
        "participation": _out(p * p + q * q),
        "jacobian_norm": _out(2.0 * p * q),
    }


# --------------------------------------------------------------------------------------------
# Exact finite-n integrals for a generic 1-D logit law
# --------------------------------------------------------------------------------------------

_ORDER = 14  # Gauss–Legendre nodes per panel
_PANEL = 3.0  # panel length in logit units: the kernel exp(−e^{ℓ−y}) varies on a scale of 1
_STEP = 0.25  # trapezoid step in y = −ln t
_BLOCK = 1 << 20  # kernel entries per block of y rows (bounds memory at ~10 MB per array)


@cache
def _panel_rule(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes ξ, weights ω on [−1, 1] and the upper partial-integral matrix.

    ``upper[i, j] = ∫_{ξ_i}^{1} L_j(ξ) dξ / ω_j`` with L_j the Lagrange basis polynomial, so that
    Σ_j upper[i, j]·w_j·g_j is the integral of g·dF from node i to the panel end (spectral
    accuracy, like the panel rule itself). Needed for E max p, which integrates P(ℓ < x).
    """
    xi, om = legendre.leggauss(m)
    coef = np.linalg.inv(legendre.legvander(xi, m - 1))  # column j: Legendre coeffs of L_j
    upper = np.empty((m, m))
    for j in range(m):
        antider = legendre.legint(coef[:, j])
        upper[:, j] = legendre.legval(1.0, antider) - legendre.legval(xi, antider)
    return xi, om, upper / om[None, :]


@dataclass(frozen=True)
class LogitDistribution:
    """A 1-D logit law as composite Gauss–Legendre panels plus one lumped atom below them.

    ``nodes`` (P, m) are ascending logit values (Gauss–Legendre nodes of a monotone
    parametrisation, one row per panel), ``weights`` (P, m) their probability masses. ``atom``
    is where the far lower tail (mass ``atom_mass``) is lumped: keys that far down get
    weight < e^{−30} relative to the top key, so moving them changes nothing measurable.
    ``smooth_scale`` is a length (in logit units) on which the density is smooth everywhere
    (s for N(0, s²), 0 if it has edges or spikes); it lets the y-step grow for wide laws.
    """

    nodes: np.ndarray
    weights: np.ndarray
    atom: float = 0.0
    atom_mass: float = 0.0
    smooth_scale: float = 0.0


def panel_logits(
    transform: Callable[[np.ndarray], np.ndarray],
    density: Callable[[np.ndarray], np.ndarray],
    edges: ArrayLike,
    *,
    atom: float | None = None,
    atom_mass: float = 0.0,
    smooth_scale: float = 0.0,
    order: int = _ORDER,
) -> LogitDistribution:
    """Discretise the law of ℓ = transform(v), v with ``density``, on panels between ``edges``.

    ``transform`` must be increasing and smooth, ``density`` smooth on each panel (zeros at the
    ends are fine); each panel gets ``order`` Gauss–Legendre nodes. Panels must be short enough
    to resolve the kernel exp(−e^{ℓ−y}) (≲ 3 logit units) and the density.
    """
    xi, om, _ = _panel_rule(order)
    edges = np.asarray(edges, dtype=float)
    mid, half = 0.5 * (edges[1:] + edges[:-1]), 0.5 * (edges[1:] - edges[:-1])
    v = mid[:, None] + half[:, None] * xi[None, :]
    nodes = np.asarray(transform(v), dtype=float)
    if np.any(np.diff(nodes.ravel()) < 0):
        raise ValueError("transform must be increasing on [lo, hi]")
    weights = half[:, None] * om[None, :] * density(v)
    return LogitDistribution(nodes, weights, nodes[0, 0] if atom is None else atom, atom_mass,
                             smooth_scale)


def gaussian_logits(s: float, n: int) -> LogitDistribution:
    """N(0, s²) logits discretised for a softmax over n keys (s > 0).

    Upper cut where n·P(ℓ > cut) = 1e-14. Lower cut: the n-key maximum exceeds the
    (1e-14)^{1/n} quantile q_n except with probability 1e-14, so mass below q_n − ln n − 32 can
    be lumped at that point (it moves Z by < e^{−32} relative); never below −8.2 s.
    """
    s = float(_positive("s", s))
    n = int(_integer("n", n, 1))
    hi = s * stats.norm.isf(1e-14 / n)
    q_n = s * stats.norm.ppf(math.exp(math.log(1e-14) / n))
    lo = max(q_n - math.log(n) - 32.0, -s * stats.norm.isf(1e-16))
    panels = max(1, math.ceil((hi - lo) / min(_PANEL, s)))
    return panel_logits(
        lambda v: v,
        lambda v: stats.norm.pdf(v / s) / s,
        np.linspace(lo, hi, panels + 1),
        atom=lo,
        atom_mass=float(stats.norm.cdf(lo / s)),
        smooth_scale=s,
    )


def cosine_logits(d: int, tau: float, n: int = 1) -> LogitDistribution:
    """τ·cos(q, k) logits for independent isotropic q, k in d ≥ 2 dims (τ > 0), n keys.

    Parametrised by the angle: ℓ = −τ·cos v with v ∈ [0, π] of density sin^{d−2}v / B, which is
    smooth even where the density of cos is not (d = 2, 3). For large d only
    |v − π/2| ≤ 9.5/√(d−2) is kept (the rest has mass < e^{−45}). When that range reaches the
    top (v = π), P(v > π − ε) ∝ ε^{d−1} and the largest of n keys sits at ε ~ n^{−1/(d−1)}, so
    the last panel is split geometrically down to well below that scale (E max p needs it).
    """
    d = int(_integer("d", d, 2))
    tau = float(_positive("tau", tau))
    n = int(_integer("n", n, 1))
    half = min(math.pi / 2, 9.5 / math.sqrt(max(d - 2.0, 1.0)))
    lo, hi = math.pi / 2 - half, math.pi / 2 + half
    log_norm = 0.5 * math.log(math.pi) + special.gammaln((d - 1) / 2) - special.gammaln(d / 2)
    width = min(0.5, _PANEL / tau, 1.0 / math.sqrt(max(d - 2.0, 1.0)))
    edges = np.linspace(lo, hi, math.ceil((hi - lo) / width) + 1)
    if hi == math.pi and n > 1:
        gap = edges[-1] - edges[-2]
        finest = 1e-3 * n ** (-1.0 / (d - 1.0))
        levels = max(0, math.ceil(math.log2(gap / finest)))
        edges = np.concatenate([edges[:-1], hi - gap * 0.5 ** np.arange(1, levels + 1), [hi]])

    def density(v: np.ndarray) -> np.ndarray:
        return np.exp((d - 2.0) * np.log(np.sin(v)) - log_norm)

    return panel_logits(lambda v: -tau * np.cos(v), density, edges)


@dataclass(frozen=True)
class SoftmaxMoments:
    """Exact expectations for the softmax p of n i.i.d. logits (all in one pass).

    ``entropy`` E[−Σ p ln p] (nats); ``participation`` E Σp²; ``cube`` E Σp³;
    ``participation_sq`` E (Σp²)²; ``max_weight`` E max p; ``logit_sq`` E ℓ² (when known).
    """

    entropy: float
    participation: float
    cube: float
    participation_sq: float
    max_weight: float
    logit_sq: float = float("nan")

    @property
    def jacobian_sq(self) -> float:
        """E‖J‖_F² for J = diag(p) − ppᵀ: E[Σp² − 2Σp³ + (Σp²)²]."""
        return self.participation - 2.0 * self.cube + self.participation_sq

    @property
    def jacobian_norm(self) -> float:
        """Root-mean-square Jacobian norm √(E‖J‖_F²) (E‖J‖_F itself has no 1-D integral form)."""
        return math.sqrt(max(self.jacobian_sq, 0.0))

    @property
    def effective_keys(self) -> float:
        """Effective number of keys 1/E[Σp²] (the inverse of the mean participation ratio).

        Not E[1/Σp²]: this one is an exact 1-D integral and Monte Carlo estimates it without
        bias in the mean of Σp².
        """
        return 1.0 / self.participation

    @property
    def logit_std(self) -> float:
        """√(E ℓ²), the root-mean-square logit (its std, since every logit law here has mean 0)."""
        return math.sqrt(self.logit_sq)

    def get(self, quantity: str) -> float:
        """Value of one of :data:`QUANTITIES`."""
        return float(getattr(self, _choice("quantity", quantity, QUANTITIES)))

    @staticmethod
    def uniform(n: int) -> SoftmaxMoments:
        """All logits equal: p_j = 1/n."""
        return SoftmaxMoments(math.log(n), 1.0 / n, 1.0 / n**2, 1.0 / n**2, 1.0 / n, 0.0)

    @staticmethod
    def average(parts: list[SoftmaxMoments], weights: np.ndarray) -> SoftmaxMoments:
        """Mixture over an outer variable (e.g. ‖q‖): every field is a plain expectation."""
        fields = ("entropy", "participation", "cube", "participation_sq", "max_weight",
                  "logit_sq")
        vals = {f: float(np.dot(weights, [getattr(p, f) for p in parts])) for f in fields}
        return SoftmaxMoments(**vals)


def _log1m(om: np.ndarray, direct: np.ndarray) -> np.ndarray:
    """ln(x) given om = 1 − x and direct = x, using whichever is accurate (no cancellation)."""
    with np.errstate(divide="ignore"):
        return np.where(om < 0.5, np.log1p(-np.minimum(om, 0.5)), np.log(np.maximum(direct, 0.0)))


def softmax_moments(dist: LogitDistribution, n: int, step: float | None = None) -> SoftmaxMoments:
    """Exact moments of the softmax of n i.i.d. logits drawn from ``dist`` (n ≥ 1).

    With u = e^ℓ, t = e^{−y}, κ(y) = exp(−e^{ℓ−y}), φ(y) = E κ and A_k(y) = E[(tu)^k κ]:

    * E Σp^k = n/Γ(k) ∫ A_k φ^{n−1} dy  (k = 2, 3, 4), from 1/Z^k = ∫ t^{k−1}e^{−tZ} dt/Γ(k);
    * E Σ_{i≠j} p_i²p_j² = n(n−1)/6 ∫ A_2² φ^{n−2} dy;
    * E ln Z = Y − γ − ∫_{−∞}^{Y} φ^n dy + ∫_Y^∞ (1 − φ^n) dy for any Y (Frullani-type identity
      ln Z = ∫_0^∞ (e^{−t} − e^{−tZ}) dt/t, with γ Euler's constant); the entropy is
      H = ln Z − Σ p_j ℓ_j with E Σ p_j ℓ_j = n ∫ E[ℓ (tu) κ] φ^{n−1} dy;
    * E max p = n ∫ E[(tu) κ ψ(y, ℓ)^{n−1}] dy with ψ(y, x) = E[κ 1{ℓ < x}].

    Every y-integrand is a convolution of the logit law with an analytic kernel, so the trapezoid
    rule converges exponentially; the default ``step`` grows with the spread of the law over
    s_c = √(2 ln n) (the scale on which φ^{n−1} changes). Accuracy ~1e-9 relative for Gaussian
    logits (checked against refined grids): exact up to quadrature error, not an asymptotic.
    """
    n = int(_integer("n", n, 1))
    if n == 1:
        return SoftmaxMoments(0.0, 1.0, 1.0, 1.0, 1.0)
    x, w = dist.nodes.ravel(), dist.weights.ravel()
    n_panels, order = dist.nodes.shape
    upper = _panel_rule(order)[2]
    if step is None:
        step = _STEP * max(1.0, dist.smooth_scale / max(1.0, math.sqrt(2.0 * math.log(n))))
    # y range: below y0, φ^{n−1} < e^{−45}; above y1 every remaining term is < e^{−25}.
    cdf = dist.atom_mass + np.cumsum(w)
    with np.errstate(divide="ignore"):
        low = np.nonzero((n - 1) * np.log(cdf) < -45.0)[0]
    y0 = max(dist.atom - 5.0, x[low[-1]] - 4.0) if low.size else dist.atom - 5.0
    y1 = x[-1] + math.log(n) + 25.0
    y = np.linspace(y0, y1, max(3, math.ceil((y1 - y0) / step) + 1))
    wy = np.full(y.size, y[1] - y[0])  # trapezoid weights
    wy[[0, -1]] *= 0.5
    rows = max(1, _BLOCK // x.size)
    sums = sum(
        _moment_block(y[i : i + rows], x, w, dist, n, n_panels, order, upper) @ wy[i : i + rows]
        for i in range(0, y.size, rows)
    )
    e_p2, e_p3, e_p4, e_pair, e_pl, e_phi_n, e_max = sums
    # ∫_{y1}^∞ (1 − φ^n) dy ≈ n E[e^ℓ] e^{−y1} (< e^{−25}).
    tail = n * (np.dot(w, np.exp(x - y1)) + dist.atom_mass * math.exp(dist.atom - y1))
    e_log_z = y1 - np.euler_gamma - e_phi_n + tail
    return SoftmaxMoments(
        entropy=float(e_log_z - n * e_pl),
        participation=float(n * e_p2),
        cube=float(n * e_p3 / 2.0),
        participation_sq=float((n * e_p4 + n * (n - 1) * e_pair) / 6.0),
        max_weight=float(n * e_max),
    )


def _moment_block(y, x, w, dist, n, n_panels, order, upper) -> np.ndarray:
    """The seven y-integrands of :func:`softmax_moments` on a block of y values, (7, len(y))."""
    z = np.minimum(x[None, :] - y[:, None], 40.0)  # ln(t·u); beyond 40, κ = 0 exactly
    tu = np.exp(z)
    kappa = np.exp(-tu)
    za = np.exp(np.minimum(dist.atom - y, 40.0))
    om_phi = -np.expm1(-tu) @ w + dist.atom_mass * -np.expm1(-za)  # 1 − φ without cancellation
    phi = kappa @ w + dist.atom_mass * np.exp(-za)
    log_phi = _log1m(om_phi, phi)
    pow1 = np.exp((n - 1) * log_phi)

    def a(k: int) -> np.ndarray:  # A_k(y) = E[(tu)^k κ], in a form that cannot overflow
        return np.exp(k * z - tu) @ w

    a2 = a(2)
    tuk = tu * kappa
    out = np.empty((7, y.size))
    out[0] = a2 * pow1
    out[1] = a(3) * pow1
    out[2] = a(4) * pow1
    out[3] = a2 * a2 * (np.exp((n - 2) * log_phi) if n > 2 else 1.0)
    out[4] = ((tuk * x[None, :]) @ w) * pow1
    out[5] = np.exp(n * log_phi)
    # ψ(y, x_i) = φ(y) − ∫_{x_i}^∞ κ dF: suffix sums over panels plus in-panel partial sums.
    g = (kappa * w[None, :]).reshape(y.size, n_panels, order)
    within = np.einsum("ypj,ij->ypi", g, upper)
    totals = g.sum(axis=2)
    later = np.cumsum(totals[:, ::-1], axis=1)[:, ::-1] - totals
    above = (within + later[:, :, None]).reshape(y.size, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_psi = np.log1p(-np.minimum(om_phi[:, None] + above, 1.0))
    out[6] = (tuk * np.exp((n - 1) * log_psi)) @ w
    return out


@lru_cache(maxsize=4096)
def _gaussian_moments(n: int, s: float) -> SoftmaxMoments:
    if s == 0.0 or n == 1:
        base = SoftmaxMoments.uniform(n)
    else:
        base = softmax_moments(gaussian_logits(s, n), n)
    return SoftmaxMoments(base.entropy, base.participation, base.cube, base.participation_sq,
                          base.max_weight, s * s)


def _rem(attr: str, n: ArrayLike, s: ArrayLike):
    n = _integer("n", n, 1)
    s = _nonneg("s", s)
    fn = np.vectorize(lambda nn, ss: getattr(_gaussian_moments(int(nn), float(ss)), attr),
                      otypes=[float])
    return _out(fn(n, s))


def expected_entropy(n: ArrayLike, s: ArrayLike):
    """Exact E[−Σ p ln p] (nats) for the softmax of n i.i.d. N(0, s²) logits (REM, Derrida 1981).

    Via E ln Z (Frullani integral) minus E Σ p_j ℓ_j (Laplace identity); see
    :func:`softmax_moments`. Broadcasts over n and s. Equals ln n at s = 0; → ln n − s²/2 for
    s < s_c and → ψ(1) − ψ(1 − s_c/s) for s > s_c as n → ∞ (:func:`rem_entropy_asymptotic`).
    """
    return _rem("entropy", n, s)


def expected_participation(n: ArrayLike, s: ArrayLike):
    """Exact E Σ p² for n i.i.d. N(0, s²) logits: n ∫ t E[u²e^{−tu}] φ(t)^{n−1} dt, u = e^ℓ."""
    return _rem("participation", n, s)


def expected_effective_keys(n: ArrayLike, s: ArrayLike):
    """Effective number of keys 1/E Σp² (n at s = 0, → 1 deep in the frozen phase)."""
    return _rem("effective_keys", n, s)


def expected_max_weight(n: ArrayLike, s: ArrayLike):
    """Exact E max_j p_j for n i.i.d. N(0, s²) logits.

    E max p = n E[p₁ 1{ℓ₁ is the largest}] = n ∫ E[t e^{ℓ} e^{−t e^{ℓ}} ψ(t, ℓ)^{n−1}] dt with
    ψ(t, x) = E[e^{−t e^{ℓ}} 1{ℓ < x}] (Laplace identity for 1/Z).
    """
    return _rem("max_weight", n, s)


def expected_jacobian_norm(n: ArrayLike, s: ArrayLike):
    """Root-mean-square softmax Jacobian norm √(E‖J‖_F²), J = diag(p) − ppᵀ, N(0, s²) logits.

    ‖J‖_F² = Σp² − 2Σp³ + (Σp²)² (anchors), each term an exact Laplace integral; E‖J‖_F itself
    has no such form, so this is the RMS (Monte Carlo estimates the same: mean of ‖J‖_F², then
    the square root). It is √(n−1)/n at s = 0 and → 0 at one-hot: not monotone in s.
    """
    return _rem("jacobian_norm", n, s)


# --------------------------------------------------------------------------------------------
# The actual scores with random q and k
# --------------------------------------------------------------------------------------------


def _gauss_from_discrete(x: np.ndarray, w: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """m-node Gauss rule of a fine discrete measure (x, w), by Lanczos on diag(x).

    The Lanczos recurrence (with full re-orthogonalisation) gives the Jacobi matrix of the
    measure's orthogonal polynomials; its eigenvalues are the Gauss nodes and the squared first
    eigenvector components the weights (Golub & Welsch 1969; Gautschi 2004, §2.2.3).
    """
    basis = np.zeros((m, x.size))
    diag, off = np.zeros(m), np.zeros(m - 1)
    basis[0] = np.sqrt(w / w.sum())
    for k in range(m):
        u = x * basis[k]
        diag[k] = u @ basis[k]
        if k + 1 == m:
            break
        for _ in range(2):  # twice is enough (Kahan–Parlett)
            u -= basis[: k + 1].T @ (basis[: k + 1] @ u)
        off[k] = np.linalg.norm(u)
        basis[k + 1] = u / off[k]
    nodes, vectors = eigh_tridiagonal(diag, off)
    weights = vectors[0] ** 2
    return nodes, weights / weights.sum()


@cache
def _chi_rule(d: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss rule in r = ‖q‖ for q ~ N(0, I_d) (chi law, density ∝ r^{d−1}e^{−r²/2}).

    A rule in r itself, not in r²: E max p grows like |s| near s = 0, which a rule in r² (Gauss–
    Laguerre) integrates badly for small d. Built from a 1200-point panel discretisation of the
    chi density over its 1e-18 quantiles.
    """
    lo, hi = stats.chi.ppf(1e-18, d), stats.chi.isf(1e-18, d)
    xi, om = legendre.leggauss(20)
    edges = np.linspace(lo, hi, 61)
    mid, half = 0.5 * (edges[1:] + edges[:-1]), 0.5 * (edges[1:] - edges[:-1])
    r = mid[:, None] + half[:, None] * xi[None, :]
    return _gauss_from_discrete(r.ravel(), (half[:, None] * om * stats.chi.pdf(r, d)).ravel(), m)


def _default_chi_nodes(d: int) -> int:
    """Nodes for ~1e-8 relative accuracy of the ‖q‖ average (measured against 120 nodes)."""
    return 16 if d >= 16 else 24 if d >= 8 else 32 if d >= 4 else 64


def _gaussian_scale(score: str, d: int, n: int, mup_c: float, log_scale: float) -> float:
    """Logit std per unit ‖q‖: given q, the logits q·k_j·scale are i.i.d. N(0, (‖q‖·scale)²)."""
    if score == "dot":
        return 1.0
    if score == "scaled_dot":
        return 1.0 / math.sqrt(d)
    if score == "mup":
        return mup_c / d
    return log_scale * math.log(n) / math.sqrt(d)  # log_length


@lru_cache(maxsize=1024)
def _cosine_moments(d: int, n: int, tau: float) -> SoftmaxMoments:
    if tau == 0.0 or n == 1:
        base = SoftmaxMoments.uniform(n)
    else:
        base = softmax_moments(cosine_logits(d, tau, n), n)
    return SoftmaxMoments(base.entropy, base.participation, base.cube, base.participation_sq,
                          base.max_weight, tau * tau / d)


def score_moments(
    d: int,
    n: int,
    score: str,
    tau: float = 1.0,
    *,
    mup_c: float = MUP_C,
    log_scale: float = 1.0,
    chi_nodes: int | None = None,
) -> SoftmaxMoments:
    """Exact softmax moments for one query against n keys, q and k_j i.i.d. N(0, I_d).

    * dot, scaled_dot, mup, log_length: given q, the logits are i.i.d. N(0, (‖q‖·scale)²), so the
      REM result is averaged over ‖q‖ ~ chi_d with a Gauss rule in ‖q‖ (:func:`_chi_rule`;
      ``chi_nodes`` defaults to 16 for d ≥ 16, up to 64 for d ≤ 2: ~1e-8 relative).
    * cosine (τ·cos): the logits are i.i.d. with the cosine law whatever q is, no average.
    * qk_rmsnorm: RMS(q)·RMS(k)/√d = √d·cos;  qk_layernorm: LN(q)·LN(k)/√d = √d·cos in the
      d−1 dims orthogonal to (1, …, 1) (LayerNorm centres), needs d ≥ 3.
    """
    d = int(_integer("d", d, 1))
    n = int(_integer("n", n, 1))
    _choice("score", score, STAT_SCORES)
    if score in ("cosine", "qk_rmsnorm", "qk_layernorm"):
        dims = d - 1 if score == "qk_layernorm" else d
        if dims < 2:
            raise ValueError(f"d must be an integer >= {d - dims + 2} for {score}, got {d}")
        t = float(_nonneg("tau", tau)) if score == "cosine" else math.sqrt(d)
        base = _cosine_moments(dims, n, t)
        if score == "qk_layernorm":  # report E ℓ² of the actual logit (√d·cos_{d−1})
            base = SoftmaxMoments(base.entropy, base.participation, base.cube,
                                  base.participation_sq, base.max_weight, d / (d - 1.0))
        return base
    scale = _gaussian_scale(score, d, n, float(_positive("mup_c", mup_c)),
                            float(_nonneg("log_scale", log_scale)))
    m = _default_chi_nodes(d) if chi_nodes is None else int(_integer("chi_nodes", chi_nodes, 1))
    r, wr = _chi_rule(d, m)
    parts = [_gaussian_moments(n, float(ri * scale)) for ri in r]
    return SoftmaxMoments.average(parts, wr)


def expected_stat(
    quantity: str,
    d: int,
    n: int,
    score: str,
    tau: float = 1.0,
    *,
    mup_c: float = MUP_C,
    log_scale: float = 1.0,
) -> float:
    """Exact expected ``quantity`` of softmax(scores of q against n keys), q, k ~ N(0, I_d) i.i.d.

    ``quantity`` ∈ :data:`QUANTITIES`: entropy (nats), max_weight (E max p), participation
    (E Σp²), effective_keys (1/E Σp²), jacobian_norm (√E‖J‖_F²), logit_std (√E ℓ²).
    ``score`` ∈ :data:`STAT_SCORES`; ``tau`` is the cosine temperature. See :func:`score_moments`.
    """
    _choice("quantity", quantity, QUANTITIES)
    return score_moments(d, n, score, tau, mup_c=mup_c, log_scale=log_scale).get(quantity)


# --------------------------------------------------------------------------------------------
# Plots (matplotlib imported lazily; Agg backend, so no display is needed)
# --------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_entropy_vs_scale(
    path: str,
    ns: tuple[int, ...] = (16, 256, 4096),
    samples: int = 400,
    seed: int = 0,
) -> str:
    """Plot normalised entropy H/ln n against the logit std s, for a few n.

    Lines: exact theory (:func:`expected_entropy`); dotted: REM asymptote; points: Monte Carlo
    (:func:`attnscale.measure.montecarlo.mc_softmax_stats`) with ±2 SE bars; vertical lines at
    s_c = √(2 ln n). Writes ``path`` and returns it.
    """
    from attnscale.measure.montecarlo import mc_softmax_stats

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    s_max = 3.0 * float(rem_critical_scale(max(ns)))
    grid = np.linspace(0.0, s_max, 61)
    for i, n in enumerate(ns):
        color = f"C{i}"
        ln_n = math.log(n)
        ax.plot(grid, expected_entropy(n, grid) / ln_n, color=color, label=f"n = {n} (exact)")
        s_c = float(rem_critical_scale(n))
        # The asymptotes fail near s_c at finite n (one goes negative, one diverges): hide that.
        asym = np.where(np.abs(grid - s_c) < 0.3 * s_c, np.nan, rem_entropy_asymptotic(n, grid))
        ax.plot(grid, asym / ln_n, color=color, ls=":", lw=1)
        pts = np.linspace(0.25, s_max, 9)
        est = [mc_softmax_stats(n, s, samples=samples, seed=seed + j)["entropy"]
               for j, s in enumerate(pts)]
        ax.errorbar(pts, [e.mean / ln_n for e in est], yerr=[2 * e.se / ln_n for e in est],
                    fmt="o", ms=3, color=color)
        ax.axvline(s_c, color=color, ls="--", lw=0.8)
    ax.set_xlabel("logit std s")
    ax.set_ylabel("E[entropy] / ln n")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Softmax of n i.i.d. N(0, s²) logits; dashed: s_c = √(2 ln n); "
                 "dotted: REM asymptotes", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_phase_diagram(path: str, d_max: int = 4096, n_max: int = 1 << 20, grid: int = 20) -> str:
    """Plot the (d_k, n) plane: where unscaled dot-product attention is frozen.

    Colour: exact normalised entropy E[H]/ln n with logit std s = √d_k (unscaled q·k, typical
    ‖q‖ = √d) in the left panel and s = 1 (q·k/√d_k) in the right. The black line is
    √d_k = s_c(n) = √(2 ln n), i.e. d_k = 2 ln n: to its right unscaled attention is frozen
    (REM, Derrida 1981); scaled attention would need n < e^{1/2} to freeze, i.e. never.
    """
    plt = _pyplot()
    ds = np.unique(np.round(np.geomspace(1, d_max, grid)).astype(int))
    ns = np.unique(np.round(np.geomspace(2, n_max, grid)).astype(int))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True, layout="constrained")
    for ax, (title, scale) in zip(axes, (("unscaled q·k (s = √d_k)", True),
                                         ("scaled q·k/√d_k (s = 1)", False)), strict=True):
        s = np.sqrt(ds)[None, :] if scale else np.ones((1, ds.size))
        h = expected_entropy(ns[:, None], s) / np.log(ns)[:, None]
        mesh = ax.pcolormesh(ds, ns, h, shading="nearest", vmin=0, vmax=1, cmap="viridis")
        ax.plot(2 * np.log(ns), ns, color="k", lw=1.5, label="d_k = 2 ln n: unscaled s = s_c")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(ds[0], ds[-1])
        ax.set_ylim(ns[0], ns[-1])
        ax.set_xlabel("d_k")
        ax.set_title(title)
    axes[0].set_ylabel("n (keys)")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.colorbar(mesh, ax=axes, label="E[entropy] / ln n")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
