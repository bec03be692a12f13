"""The law of the typical row's softmax Jacobian norm in saturation, from the top-two gap.

For n i.i.d. N(0, s²) logits let Δ = s·G be the gap between the two largest, G the top spacing
of n standard normals. A row with only those two keys has p = (1, e^{−Δ})/(1 + e^{−Δ}) and

    ‖J‖_F = 2·p₁p₂ = 2e^{−Δ}/(1 + e^{−Δ})² = ½·sech²(Δ/2)          (two-key identity)

exactly (J = p₁p₂·[[1, −1], [−1, 1]]). With n keys the others add terms of relative size
R₃ = Σ_{j≥3} e^{−s(x₁ − x_j)}, which vanish once the row saturates; :mod:`attnscale.measure.
jacobian`'s Monte Carlo is the check (agreement within 0.01 in the fraction at s ≥ 3·s_c).

The gap's law is one integral (the largest at x, every other below x − g):

    P(G > g) = n ∫ φ(x)·Φ(x − g)^{n−1} dx,

so the fraction of rows with ‖J‖_F < θ is P(G > Δ_θ/s), Δ_θ = 2·arccosh(1/√(2θ)) (7.600 for
θ = 1e-3), and the median row's norm is ½·sech²(s·g½/2), g½ the median of G. For large n,
s_c·G → Exp(1) (the spacing of Gumbel extremes; s_c = √(2 ln n); the error falls only like
1/ln n), so at s = k·s_c:

    fraction below θ ≈ exp(−Δ_θ/k)       (1/2 near k = Δ_θ/ln 2 ≈ 11 for θ = 1e-3),
    median ‖J‖_F    ≈ 2·2^{−k},          (exponential in s)

while E‖J‖_F² (exact: :func:`attnscale.measure.theory.rms_jacobian_norm`) is carried by the
rows whose gap is O(1), a share ≈ 1/k of them: the RMS decays only like s^{−1/2}.
:func:`decay_ratio` tells the two shapes apart from three scales.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnscale.measure import theory
from attnscale.util.validate import check_float, check_int

__all__ = ["LAW_KS", "decay_ratio", "exponential_ratio", "gap_quantile", "gap_survival",
           "law_curve", "two_key_gap", "two_key_norm"]

LAW_KS = (10.0, 30.0, 100.0)  # s / s_c at which the decay's shape is read


def two_key_norm(gap: float) -> float:
    """‖J‖_F of a two-key softmax whose logits differ by ``gap``: ½·sech²(gap/2)."""
    g = abs(float(gap))
    e = math.exp(-g)
    return 2.0 * e / (1.0 + e) ** 2


def two_key_gap(threshold: float) -> float:
    """The gap Δ_θ at which :func:`two_key_norm` equals ``threshold`` (< 1/2):
    Δ_θ = 2·arccosh(1/√(2θ))."""
    threshold = check_float("threshold", threshold, low=0.0, high=0.5)
    return 2.0 * math.acosh(1.0 / math.sqrt(2.0 * threshold))


def gap_survival(n: int, g: float) -> float:
    """P(G > g) for G the largest minus the second largest of n i.i.d. N(0, 1):
    n ∫ φ(x)·Φ(x − g)^{n−1} dx, by scipy's adaptive quadrature in log space."""
    import scipy.integrate  # scipy loads on first use (module docstring of lab.paired)
    import scipy.special

    n = check_int("n", n, 2)
    g = check_float("g", g, low=0.0, low_inclusive=True)

    def integrand(x: float) -> float:
        log = (math.log(n) - 0.5 * x * x - 0.5 * math.log(2 * math.pi)
               + (n - 1) * float(scipy.special.log_ndtr(x - g)))
        return math.exp(log)
    # the largest of n normals sits near √(2 ln n); the mass lies well inside ±10 of it
    centre = math.sqrt(2.0 * math.log(n))
    value, _ = scipy.integrate.quad(integrand, centre - 10.0, centre + 10.0, points=[centre],
                                    limit=200, epsabs=1e-13, epsrel=1e-10)
    return min(1.0, max(0.0, value))


def gap_quantile(n: int, q: float) -> float:
    """The g with P(G ≤ g) = q (brentq on :func:`gap_survival`)."""
    import scipy.optimize

    q = check_float("q", q, low=0.0, high=1.0)
    hi = 1.0
    while gap_survival(n, hi) > 1.0 - q:
        hi *= 2.0
    return float(scipy.optimize.brentq(lambda g: gap_survival(n, g) - (1.0 - q), 0.0, hi,
                                       xtol=1e-12))


def law_curve(n: int, ks: tuple[float, ...] = LAW_KS, threshold: float = 1e-3) -> dict[str, Any]:
    """At s = k·s_c for each k: the fraction of rows with ‖J‖_F < ``threshold`` and the median
    row's ‖J‖_F by the top-two law, and the exact RMS; ``k_half`` = the s/s_c where the median
    row reaches ``threshold`` (Δ_θ/(g½·s_c))."""
    n = check_int("n", n, 2)
    sc = float(theory.rem_critical_scale(n))
    half, d_theta = gap_quantile(n, 0.5), two_key_gap(threshold)
    ss = [k * sc for k in ks]
    return {"n": n, "s_c": sc, "threshold": threshold, "gap_theta": d_theta, "k": list(ks),
            "frac": [gap_survival(n, d_theta / s) for s in ss],
            "median": [two_key_norm(s * half) for s in ss],
            "rms": [float(theory.rms_jacobian_norm(n, s)) for s in ss],
            "k_half": d_theta / (half * sc)}


def exponential_ratio(ks: tuple[float, ...] = LAW_KS) -> float:
    """:func:`decay_ratio` of an exact exponential e^{−a·k} over ``ks`` (any a > 0): the
    log-log slope over a span [k₁, k₂] is −a(k₂ − k₁)/ln(k₂/k₁). A power law gives 1."""
    (a, b, c) = ks
    return ((c - b) / math.log(c / b)) / ((b - a) / math.log(b / a))


def decay_ratio(ks: list[float], values: list[float]) -> float:
    """How a decay's log-log slope grows from [k₁, k₂] to [k₂, k₃]: slope₂/slope₁. A power law
    k^{−a} gives 1 for every a; an exponential gives :func:`exponential_ratio` (3.19 over 10,
    30, 100). Values must be positive and decreasing."""
    if len(ks) != 3 or len(values) != 3:
        raise ValueError(f"decay_ratio needs three scales and three values, got {ks}, {values}")
    v = np.asarray(values, dtype=float)
    if not (np.all(v > 0) and v[1] < v[0] and v[2] < v[1]):
        raise ValueError(f"values must be positive and decreasing, got {values}")
    lk, lv = np.log(np.asarray(ks, dtype=float)), np.log(v)
    first = (lv[1] - lv[0]) / (lk[1] - lk[0])
    return float(((lv[2] - lv[1]) / (lk[2] - lk[1])) / first)
