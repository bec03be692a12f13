"""Readings of the softmax Jacobian's law deep in saturation, C10's context: the Monte Carlo
distribution of the per-row norm ‖J‖_F, J = diag(p) − ppᵀ, for n i.i.d. N(0, s²) logits
(:mod:`attnscale.measure.jacobian`) and the exact law at s = 10, 30, 100·s_c, s_c = √(2 ln n)
(:mod:`attnscale.measure.jacobian_law`), typed; the shape of each decay (:func:`shape`: how
much its log-log slope steepens over 10–30–100·s_c, 1 for any power law, 3.19 for any
exponential); and the check that the simulation matches the law (:func:`check_monte_carlo`,
a Wilson interval, Wilson 1927, plus the two-key approximation's error), whose failure is a bug.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from pydantic import ConfigDict, Field

from attnscale.audit.evidence import Model
from attnscale.audit.verdicts import MissingEvidence
from attnscale.measure.jacobian import VANISH, frac_key
from attnscale.measure.jacobian_law import decay_ratio, exponential_ratio

FRAC_KEY = frac_key(VANISH)  # "frac_below_1e-3"
EXPONENTIAL, POWER = "exponential", "power law"
CHECK_CONFIDENCE = 0.999  # the Monte Carlo check's Wilson level, per measured scale
CHECK_SLACK = 0.02  # the two-key law's own error in the fraction at s ≥ 3·s_c (measured ≤ 0.01)


class Curve(Model):
    """One n's Monte Carlo distribution
    (:meth:`attnscale.measure.jacobian.JacobianCurve.to_dict`): per scale s the quartiles,
    RMS and fraction of rows with ‖J‖_F < 1e-3 (stored under "frac_below_1e-3")."""

    model_config = ConfigDict(serialize_by_alias=True)

    n: int
    s_c: float
    rows: int | None = None
    uniform_limit: float
    s: list[float]
    median: list[float]
    q1: list[float]
    q3: list[float]
    rms: list[float]
    vanished: list[float] = Field(alias=FRAC_KEY)
    seed: int | None = None
    threshold: float | None = None
    s_over_sc: list[float] = Field(default_factory=list)
    frac_below: list[float] = Field(default_factory=list)
    mean: list[float] = Field(default_factory=list)
    rms_se: list[float] = Field(default_factory=list)
    rms_exact: list[float] = Field(default_factory=list)
    rms_z: list[float] = Field(default_factory=list)


class Law(Model):
    """One n's exact law (:func:`attnscale.measure.jacobian_law.law_curve`) at s = k·s_c,
    with ``check_frac`` the law's fraction below 1e-3 at each of the curve's s (None below
    3·s_c)."""

    n: int
    k: list[float]
    median: list[float]
    rms: list[float]
    frac: list[float]
    k_half: float
    check_frac: list[float | None]
    s_c: float | None = None
    threshold: float | None = None
    gap_theta: float | None = None


class PerN(Model):
    """What the rule read at one n: the two decay shapes (:func:`shape`), the law at 10, 30,
    100·s_c, the RMS's log-log slope, and how far the Monte Carlo sits from the law."""

    n: int
    s_c: float
    uniform_limit: float
    median_shape: str
    median_ratio: float
    rms_shape: str
    rms_ratio: float
    rms_slope: float
    ks: list[float]
    law_median: list[float]
    law_frac: list[float]
    law_rms: list[float]
    s_over_sc: float
    median: float
    frac: float
    rms: float
    crossing_s_over_sc: float
    peak_median: float
    rows: int | None
    mc_gap: float


def wilson_interval(frac: float, rows: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927, no continuity correction).

    With k = round(frac·rows) successes, p̂ = k/rows, z the two-sided normal quantile:
    (p̂ + z²/2m ± z√(p̂(1 − p̂)/m + z²/4m²)) / (1 + z²/m), m = rows.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1); got {confidence}")
    if rows < 1:
        raise ValueError(f"rows must be >= 1; got {rows}")
    p = round(frac * rows) / rows
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    den = 1.0 + z * z / rows
    mid = (p + z * z / (2 * rows)) / den
    half = z * math.sqrt(p * (1 - p) / rows + z * z / (4 * rows * rows)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def shape(ks: list[float], values: list[float]) -> tuple[str, float]:
    """(EXPONENTIAL or POWER, the slope ratio of :func:`decay_ratio`); the cutoff is the
    geometric middle √(:func:`exponential_ratio`) between the two ideal shapes. A curve that
    does not decrease is a power law of exponent ≤ 0 (ratio nan); a law at other than three
    scales, or with a non-positive value, is a bug (ValueError), never a shape."""
    if len(ks) == len(values) == 3 and not (values[2] < values[1] < values[0]):
        return POWER, math.nan
    ratio = decay_ratio(ks, values)
    cut = math.sqrt(exponential_ratio(tuple(ks)))
    return (EXPONENTIAL if ratio > cut else POWER), ratio


def check_monte_carlo(curve: Curve, law: Law) -> float:
    """The largest |Monte Carlo − law| fraction below 1e-3 over the measured s ≥ 3·s_c;
    ValueError (a bug, not a verdict) where it exceeds the Wilson half-width plus slack."""
    worst = 0.0
    if not curve.rows:
        raise MissingEvidence(f"C10: the Monte Carlo curve at n={curve.n} has no row count, "
                              "so it cannot check the law")
    for s, f_mc, f_law in zip(curve.s, curve.vanished, law.check_frac, strict=True):
        if f_law is None:
            continue
        lo, hi = wilson_interval(f_mc, curve.rows, CHECK_CONFIDENCE)
        if not lo - CHECK_SLACK <= f_law <= hi + CHECK_SLACK:
            raise ValueError(
                f"C10: at n={curve.n}, s={s:.3g} the Monte Carlo fraction of rows below 1e-3 "
                f"is {f_mc:.3f} [{lo:.3f}, {hi:.3f}] but the top-two law gives {f_law:.3f}: "
                "theory and simulation disagree, which is a bug")
        worst = max(worst, abs(f_mc - f_law))
    return worst


def judge_n(curve: Curve, law: Law) -> PerN:
    """One n: the two shapes, the numbers at 10·s_c, and the Monte Carlo check."""
    med_shape, med_ratio = shape(law.k, law.median)
    rms_shape, rms_ratio = shape(law.k, law.rms)
    lk = [math.log(k) for k in law.k]
    rms_slope = (math.log(law.rms[-1]) - math.log(law.rms[0])) / (lk[-1] - lk[0])
    return PerN(n=curve.n, s_c=curve.s_c, uniform_limit=curve.uniform_limit,
                median_shape=med_shape, median_ratio=med_ratio, rms_shape=rms_shape,
                rms_ratio=rms_ratio, rms_slope=rms_slope, ks=law.k, law_median=law.median,
                law_frac=law.frac, law_rms=law.rms, s_over_sc=law.k[0], median=law.median[0],
                frac=law.frac[0], rms=law.rms[0], crossing_s_over_sc=law.k_half,
                peak_median=max(curve.median), rows=curve.rows,
                mc_gap=check_monte_carlo(curve, law))


def deep_reading(per_n: list[PerN]) -> str:
    """Deep saturation's shapes, in words (context)."""
    med, rms = {r.median_shape for r in per_n}, {r.rms_shape for r in per_n}
    if med != {EXPONENTIAL}:
        return "the median row's ‖J‖_F does not fall exponentially at every n"
    slope = ", ".join(f"{r.rms_slope:+.2f}" for r in per_n)
    return ("both fall exponentially" if rms == {EXPONENTIAL} else
            f"the median row's falls exponentially, the RMS only as s^({slope})"
            if rms == {POWER} else "the RMS's shape differs between n")
