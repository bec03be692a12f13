"""Critical log-n scaling of attention: exact theory and Monte Carlo for one token's
self-weight among n tokens with pairwise cosine ρ (Chen, Lin, Polyanskiy & Rigollet 2025,
"Critical attention scaling in long-context transformers", arXiv 2510.05554: with logits scaled
by β_n = γ·ln n, attention neither flattens nor freezes only near γ_c = 1/(1−ρ)).

**Setting.** x_i = √ρ·e + √(1−ρ)·w_i for i = 1..n in d dimensions, e a unit vector every
token shares and w_i i.i.d. uniform on the unit sphere of e's orthogonal complement
(m = d − 1 dimensions). So ‖x_i‖ = 1 and ⟨x_i, x_j⟩ = ρ + (1−ρ)·c_ij, where c_ij = ⟨w_i, w_j⟩
is the cosine of two random directions in m dimensions: density ∝ (1−c²)^((m−3)/2), mean 0,
variance exactly 1/m (so the off-diagonal cosines have variance (1−ρ)²/m around ρ). For one
query i the c_ij, j ≠ i, are i.i.d. and independent of w_i (rotation invariance). Token i
attends to all n tokens, itself included, with logits β·⟨x_i, x_j⟩, β = γ·ln n (cosine-style
bounded logits with temperature τ = β); its self-weight is

    w_self = 1/(1 + S),  S = Σ_{j≠i} exp(−t·(1 − c_ij)),  t = β(1−ρ) = g·ln n,  g = γ(1−ρ).

It depends on ρ only through g: the crossing in γ is g*/(1−ρ). Three answers for g*, where
E[w_self] = 1/2 (L = ln n):

* **d → ∞** (c_ij → 0): S = (n−1)·n^(−g), w_self = 1/(1 + (n−1)·n^(−g)) (:func:`limit_self_weight`),
  crossing at g∞ = ln(n−1)/L → 1, i.e. γ* → 1/(1−ρ) (:func:`limit_crossing`; Chen et al.).
* **Second order in the fluctuations** (:func:`second_order_crossing`): with c Gaussian of
  variance 1/m, E[e^(t·c)] = e^(t²/(2m)), so E[S] = (n−1)·exp(−t + t²/(2m)); setting E[S] = 1
  gives g·L − g²L²/(2m) = ln(n−1), whose smaller root is
  g₂ = (m/L)·(1 − √(1 − 2 ln(n−1)/m)) = g∞ + g∞²·L/(2m) + O(L²/m²).
  Its leading order with g∞ → 1 and m → d is 1 + ln n/(2d), which drops both the ln(n−1)/ln n
  factor (0.991 at n = 32) and the quadratic term: at d = 64 it reads 1.027 at n = 32 where the
  exact crossing is 1.018.
* **Exact** at finite n and d (:func:`exact_self_weight`, :func:`exact_crossing`): from
  1/(1+S) = ∫₀^∞ e^(−s(1+S)) ds and the independence of the c_ij,
  E[w_self] = ∫₀^∞ e^(−s)·φ(s)^(n−1) ds with φ(s) = E[exp(−s·e^(−t(1−c)))], by Gauss–Laguerre
  over s and the trapezoid rule over c (doubling either changes E[w_self] by < 1e-12).

What g₂ drops: the Jensen gap E[1/(1+S)] > 1/(1+E[S]), about (e^(t²/m) − 1)/(2(n−1)L) in g, and
the cosine law's lighter-than-Gaussian tails (excess kurtosis −6/m³), about t⁴/(4m³L); against
the exact crossing g₂ is within 0.0017 for d ≥ 64 and n ≥ 16, within 0.009 at d = 32.

**Monte Carlo** (:func:`sample_gaps`, :func:`mc_crossing`): q query tokens per draw of n
tokens, their w drawn explicitly in m dimensions; every other token through its exact law
relative to the queries (its component in their span ~ N(0, I_q) and the squared norm of the
rest ~ χ²_(m−q), then normalized: rotation invariance of the Gaussian; the span's coordinates
come from the Cholesky factor of the queries' Gram matrix), which gives the same
joint law of the q × n cosine block as n explicit vectors at O(n·q) instead of O(n·d) cost.
The crossing of the mean self-weight is found by Brent's method, with a 95% t-interval over the
independent draws by the delta method (SE of the draws' mean self-weight over the slope);
:func:`widen` gives its half-width at another level (e.g. a Bonferroni one).
:func:`crossing_to` sizes the Monte Carlo in two stages: a pilot, then as many more draws as
the pilot's spread says a target half-width needs (capped), the interval from all draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
from scipy import optimize, special

from attnscale.util.validate import check_float, check_int

QUERIES = 32  # query tokens per draw (at most n and m − 1)
LAGUERRE = 80  # Gauss–Laguerre nodes over s
C_POINTS = 2001  # trapezoid points over the cosine c
C_WINDOW = 14.0  # the c grid spans ±C_WINDOW/√m (clipped to [−1, 1])
CONFIDENCE = 0.95  # the level of :func:`mc_crossing`'s interval
MAX_DRAWS = 2048  # draws per cell at most (:func:`crossing_to`)
MAX_GAPS = 2**24  # gaps held at once at most (draws × q × (n − 1) float64: 128 MiB)


def _check(n: int, d: int) -> tuple[int, int]:
    n = check_int("n", n, 2)
    d = check_int("d", d, 5)
    return n, d - 1


def limit_self_weight(n: int, g: float) -> float:
    """w_self = 1/(1 + (n−1)·n^(−g)) as d → ∞, with g = γ(1−ρ) (every off-diagonal cosine ρ)."""
    n = check_int("n", n, 2)
    return 1.0 / (1.0 + (n - 1) * math.exp(-float(g) * math.log(n)))


def limit_crossing(n: float) -> float:
    """g∞ = ln(n−1)/ln n, where :func:`limit_self_weight` is 1/2 (→ 1 as n → ∞); ``n`` may be
    any real number from 2 on (a curve over n)."""
    n = check_float("n", n, low=2.0, low_inclusive=True)
    return math.log(n - 1) / math.log(n)


def second_order_crossing(n: float, d: int) -> float:
    """g₂ = (m/L)·(1 − √(1 − 2 ln(n−1)/m)), L = ln n, m = d − 1: the root of E[S] = 1 with
    Gaussian cosines of variance 1/m (module docstring); ``n`` may be any real number from 2
    on. Needs m ≥ 2 ln(n−1)."""
    n = check_float("n", n, low=2.0, low_inclusive=True)
    m = check_int("d", d, 5) - 1
    disc = 1.0 - 2.0 * math.log(n - 1) / m
    if disc < 0:
        raise ValueError(f"second_order_crossing: d = {d} too small for n = {n:g} (needs "
                         f"d − 1 ≥ 2 ln(n−1) = {2 * math.log(n - 1):.1f})")
    return m / math.log(n) * (1.0 - math.sqrt(disc))


@cache
def _laguerre() -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Laguerre nodes and weights over s ∈ [0, ∞) with weight e^(−s)."""
    return np.polynomial.laguerre.laggauss(LAGUERRE)


@cache
def _cosine_grid(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Trapezoid points over c and the cosine law's density there, normalized on the grid."""
    half = min(1.0, C_WINDOW / math.sqrt(m))
    c = np.linspace(-half, half, C_POINTS)
    with np.errstate(divide="ignore"):
        logp = 0.5 * (m - 3) * np.log1p(-c * c)
    p = np.exp(logp - logp.max())
    return c, p / np.trapezoid(p, c)


def exact_self_weight(n: int, d: int, t: float) -> float:
    """E[w_self] at t = γ(1−ρ)·ln n, exactly for finite n and d:
    ∫₀^∞ e^(−s)·φ(s)^(n−1) ds, φ(s) = E[exp(−s·e^(−t(1−c)))] (module docstring)."""
    n, m = _check(n, d)
    c, p = _cosine_grid(m)
    s, ws = _laguerre()
    y = np.exp(-float(t) * (1.0 - c))
    miss = np.trapezoid(p * -np.expm1(-s[:, None] * y[None, :]), c, axis=1)  # 1 − φ(s)
    with np.errstate(divide="ignore"):
        return float(np.sum(ws * np.exp((n - 1) * np.log1p(-miss))))


def exact_crossing(n: int, d: int) -> float:
    """The g = γ(1−ρ) where :func:`exact_self_weight` is 1/2 (Brent's method in t)."""
    n, _ = _check(n, d)
    big = math.log(n)
    t = optimize.brentq(lambda x: exact_self_weight(n, d, x) - 0.5, 0.2 * big, 4.0 * big,
                        xtol=1e-12)
    return t / big


def sample_gaps(n: int, rho: float, d: int, samples: int, seed: int | Sequence[int]
                ) -> np.ndarray:
    """⟨x_i, x_i⟩ − ⟨x_i, x_j⟩ for the q = min(n, 32, d − 2) query tokens of ``samples``
    independent draws of n tokens, j over the n − 1 others: shape (samples, q, n − 1),
    float64 (the sampler is in the module docstring)."""
    n, m = _check(n, d)
    rho = check_float("rho", rho, low=0.0, high=1.0, low_inclusive=True)
    samples = check_int("samples", samples, 2)
    q = min(n, QUERIES, m - 1)
    rng = np.random.default_rng(seed)
    off = torch.from_numpy(~np.eye(q, n, dtype=bool))
    out = np.empty((samples, q, n - 1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small products: extra threads only contend (up to 50x slower)
    try:
        for k in range(samples):
            w = torch.from_numpy(rng.standard_normal((q, m)))
            w /= w.norm(dim=1, keepdim=True)
            gram = w @ w.T
            frame = torch.linalg.cholesky(gram)  # w = frame·Bᵀ, B orthonormal (m × q)
            a = torch.from_numpy(rng.standard_normal((n - q, q)))
            norm = torch.sqrt((a * a).sum(dim=1) + torch.from_numpy(rng.chisquare(m - q, n - q)))
            cos_x = rho + (1.0 - rho) * torch.cat([gram, frame @ a.T / norm], dim=1)  # (q, n)
            out[k] = (torch.diagonal(cos_x)[:, None] - cos_x)[off].reshape(q, n - 1).numpy()
    finally:
        torch.set_num_threads(threads)
    return out


def self_weights(gaps: np.ndarray, beta: float) -> np.ndarray:
    """Each query's self-weight 1/(1 + Σ_j e^(−β·gap_j)) at logit scale β (last axis: j)."""
    return 1.0 / (1.0 + np.exp(-beta * gaps).sum(axis=-1))


def t_quantile(draws: int, confidence: float) -> float:
    """The two-sided t quantile at ``confidence`` with draws − 1 degrees of freedom."""
    draws = check_int("draws", draws, 2)
    confidence = check_float("confidence", confidence, low=0.0, high=1.0)
    return float(special.stdtrit(draws - 1, 0.5 + confidence / 2))


def widen(half: float, draws: int, confidence: float) -> float:
    """The half-width at ``confidence`` of a :func:`mc_crossing` interval over ``draws`` draws
    whose 95% half-width is ``half`` (the same SE, another t quantile)."""
    return float(half) * t_quantile(draws, confidence) / t_quantile(draws, CONFIDENCE)


def mc_crossing(gaps: np.ndarray, n: int, rho: float) -> dict[str, float]:
    """The Monte Carlo crossing g = γ̂(1−ρ) where the mean self-weight over every query of
    ``gaps`` (:func:`sample_gaps`) is 1/2, and its 95% interval: t quantile over the draws
    (axis 0) × SE of the draws' mean self-weight at γ̂ ÷ the mean self-weight's slope in γ."""
    big = math.log(check_int("n", n, 2))
    draws = gaps.shape[0]
    if draws < 2:
        raise ValueError("mc_crossing: needs at least two draws for an interval")

    def excess(gamma: float) -> float:
        return float(self_weights(gaps, gamma * big).mean()) - 0.5

    hi = 2.0 / (1.0 - rho)
    while excess(hi) < 0:
        hi *= 2.0
    gamma = optimize.brentq(excess, 0.0, hi, xtol=1e-12)
    e = np.exp(-gamma * big * gaps)
    r = e.sum(axis=-1)
    slope = float(np.mean(big * (gaps * e).sum(axis=-1) / (1.0 + r) ** 2))
    per_draw = (1.0 / (1.0 + r)).mean(axis=1)
    se = float(per_draw.std(ddof=1)) / math.sqrt(draws)
    half = t_quantile(draws, CONFIDENCE) * se / slope
    scale = 1.0 - rho
    return {"g": gamma * scale, "lo": (gamma - half) * scale, "hi": (gamma + half) * scale}


def crossing_to(n: int, rho: float, d: int, pilot: int, confidence: float, target: float,
                seed: Sequence[int]) -> dict[str, float]:
    """:func:`mc_crossing` with its draws sized in two stages: ``pilot`` draws (seed ``seed``),
    then, where the pilot's half-width at ``confidence`` (:func:`widen`) exceeds ``target``,
    enough more (seed ``seed`` + [1]) for the spread it measured to reach it, capped by
    :data:`MAX_DRAWS` and :data:`MAX_GAPS`; the crossing and its 95% interval from all draws,
    with ``draws``, the number used."""
    n, m = _check(n, d)
    q = min(n, QUERIES, m - 1)
    cap = max(pilot, min(MAX_DRAWS, MAX_GAPS // (q * (n - 1))))
    gaps = sample_gaps(n, rho, d, pilot, seed=list(seed))
    c = mc_crossing(gaps, n, rho)
    half = widen((c["hi"] - c["lo"]) / 2, pilot, confidence)
    need = min(cap, math.ceil(pilot * (half / check_float("target", target, low=0.0)) ** 2))
    if need - pilot >= 2:
        more = sample_gaps(n, rho, d, need - pilot, seed=[*seed, 1])
        gaps = np.concatenate([gaps, more])
        c = mc_crossing(gaps, n, rho)
    return {**c, "draws": int(gaps.shape[0])}
