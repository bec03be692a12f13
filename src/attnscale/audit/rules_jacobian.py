"""C10, "a saturated softmax gives vanishing gradients", decided from the law of the row norm.

J = diag(p) − ppᵀ is the softmax Jacobian of one attention row; every gradient that reaches
the logits passes through it. For n i.i.d. N(0, s²) logits (the Random Energy Model softmax;
s_c = √(2 ln n), Derrida 1981) the question has two exact answers
(:mod:`attnscale.measure.jacobian_law`): the typical row's ‖J‖_F, set by the gap Δ between its
two largest logits (‖J‖_F = ½·sech²(Δ/2)), falls exponentially in s; the mean square E‖J‖_F²
(:func:`attnscale.measure.theory.rms_jacobian_norm`), carried by the share ≈ 1/k of rows whose
top two nearly tie at s = k·s_c, falls only like a power of s. The rule reads the SHAPE of each
decay over s = 10, 30, 100·s_c, a property the mathematics fixes, not a level: an earlier rule
compared the fraction of rows below 1e-3 at 10·s_c with 1/2, which is where that fraction
itself sits (≈ exp(−7.6/k)), so it could never decide.

The Monte Carlo distribution (:mod:`attnscale.measure.jacobian`) is the check: its fraction of
rows below 1e-3 must match the law at every measured s ≥ 3·s_c, within a Wilson interval
(Wilson 1927) plus the law's two-key approximation error; a mismatch raises, since a
disagreement between theory and simulation is a bug, never a verdict.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    REFUTED,
    SUPPORTED,
    Evidence,
    MissingEvidence,
    Verdict,
    fmt_ci,
)
from attnscale.measure.jacobian import VANISH, frac_key
from attnscale.measure.jacobian_law import decay_ratio, exponential_ratio

__all__ = ["C10_RULE", "CHECK_CONFIDENCE", "CHECK_SLACK", "judge_c10", "shape",
           "wilson_interval"]

FRAC_KEY = frac_key(VANISH)  # "frac_below_1e-3"
EXPONENTIAL, POWER = "exponential", "power law"
CHECK_CONFIDENCE = 0.999  # the Monte Carlo check's Wilson level, per measured scale
CHECK_SLACK = 0.02  # the two-key law's own error in the fraction at s ≥ 3·s_c (measured ≤ 0.01)

C10_RULE = (
    "Per-row softmax Jacobian norm ‖J‖_F = ‖diag(p) − ppᵀ‖_F for n i.i.d. N(0, s²) logits, "
    "s_c = √(2 ln n), each measured n. From the top-two-gap law (the gap's exact distribution "
    "by quadrature, ‖J‖_F = ½·sech²(Δ/2) for the two leading keys) the median row's ‖J‖_F, "
    "and from the exact Laplace integral the RMS √E‖J‖_F², at s = 10, 30, 100·s_c. A decay "
    "is exponential if its log-log slope steepens between the two spans by more than 1.79 "
    "(the geometric middle between a power law, 1, and an exponential, 3.19), else a power "
    "law. Supported if both decay exponentially for every n; depends if the median row's "
    "does and the RMS only as a power of s (the typical row's gradient vanishes, the "
    "mean-square gradient does not); refuted if the median row's does not decay "
    "exponentially; depends too if the RMS's shape differs between n; inconclusive if the "
    "law was not computed. With the exact law both shapes are fixed by the mathematics "
    "(the median exponential by construction, the RMS a power law), so the verdict is the "
    "mathematics' answer and the data can only disagree through the check: the Monte Carlo "
    "fraction of rows below 1e-3 must match the law at every measured s ≥ 3·s_c (99.9% "
    "Wilson interval plus 0.02), else the report fails")


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
    does not decrease is a power law of exponent ≤ 0 (ratio nan)."""
    try:
        ratio = decay_ratio(ks, values)
    except ValueError:
        return POWER, math.nan
    cut = math.sqrt(exponential_ratio(tuple(ks)))
    return (EXPONENTIAL if ratio > cut else POWER), ratio


def check_monte_carlo(curve: dict[str, Any], law: dict[str, Any]) -> float:
    """The largest |Monte Carlo − law| fraction below 1e-3 over the measured s ≥ 3·s_c;
    ValueError (a bug, not a verdict) where it exceeds the Wilson half-width plus slack."""
    worst = 0.0
    if not curve.get("rows"):
        raise MissingEvidence(f"C10: the Monte Carlo curve at n={curve['n']} has no row count, "
                              "so it cannot check the law")
    for s, f_mc, f_law in zip(curve["s"], curve[FRAC_KEY], law["check_frac"], strict=True):
        if f_law is None:
            continue
        lo, hi = wilson_interval(f_mc, int(curve["rows"]), CHECK_CONFIDENCE)
        if not lo - CHECK_SLACK <= f_law <= hi + CHECK_SLACK:
            raise ValueError(
                f"C10: at n={curve['n']}, s={s:.3g} the Monte Carlo fraction of rows below 1e-3 "
                f"is {f_mc:.3f} [{lo:.3f}, {hi:.3f}] but the top-two law gives {f_law:.3f}: "
                "theory and simulation disagree, which is a bug")
        worst = max(worst, abs(f_mc - f_law))
    return worst


def _judge_n(curve: dict[str, Any], law: dict[str, Any]) -> dict[str, Any]:
    """One n: the two shapes, the numbers at 10·s_c, and the Monte Carlo check."""
    med_shape, med_ratio = shape(law["k"], law["median"])
    rms_shape, rms_ratio = shape(law["k"], law["rms"])
    lk = [math.log(k) for k in law["k"]]
    rms_slope = (math.log(law["rms"][-1]) - math.log(law["rms"][0])) / (lk[-1] - lk[0])
    return {"n": curve["n"], "s_c": curve["s_c"], "uniform_limit": curve["uniform_limit"],
            "median_shape": med_shape, "median_ratio": med_ratio, "rms_shape": rms_shape,
            "rms_ratio": rms_ratio, "rms_slope": rms_slope, "ks": law["k"],
            "law_median": law["median"], "law_frac": law["frac"], "law_rms": law["rms"],
            "s_over_sc": law["k"][0], "median": law["median"][0], "frac": law["frac"][0],
            "rms": law["rms"][0], "crossing_s_over_sc": law["k_half"],
            "peak_median": max(curve["median"]), "rows": curve.get("rows"),
            "mc_gap": check_monte_carlo(curve, law)}


def _g(x: float) -> str:
    return f"{x:.2g}"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _headline(verdict: str, per_n: list[dict[str, Any]]) -> str:
    k_half = ", ".join(f"{r['crossing_s_over_sc']:.1f}" for r in per_n)
    slope = ", ".join(f"{r['rms_slope']:+.2f}" for r in per_n)
    med = {r["median_shape"] for r in per_n}
    if verdict == INCONCLUSIVE:
        return "inconclusive: the law was not computed"
    if med != {EXPONENTIAL}:
        return f"{verdict}: the median row's ‖J‖_F does not fall exponentially at every n"
    rms = {r["rms_shape"] for r in per_n}
    tail = ("the RMS also exponentially" if rms == {EXPONENTIAL} else
            f"the RMS as s^({slope})" if rms == {POWER} else
            "the RMS exponentially at some n, as a power of s at others")
    return (f"{verdict}: the median row's ‖J‖_F falls exponentially (below 1e-3 at "
            f"{k_half}·s_c), {tail}")


def _plain(verdict: str, per_n: list[dict[str, Any]], trained: Any) -> list[str]:
    r = per_n[-1]
    ks = ", ".join(f"{k:g}" for k in r["ks"])
    meds = ", ".join(_g(x) for x in r["law_median"])
    fracs = ", ".join(_pct(x) for x in r["law_frac"])
    rms = ", ".join(_g(x) for x in r["law_rms"])
    first = {
        SUPPORTED: f"Right: past saturation both the typical row's and the mean-square "
                   f"Jacobian vanish exponentially (n={r['n']}, s = {ks}·s_c: median {meds}; "
                   f"RMS {rms}).",
        DEPENDS: f"Right for the typical row, not on average: at n={r['n']} and s = {ks}·s_c "
                 f"the median row's ‖J‖_F is {meds} (exponential in s), but the RMS is "
                 f"{rms}, falling only like s^{r['rms_slope']:+.2f}: the rows whose two "
                 f"largest logits nearly tie keep a live Jacobian, and only {fracs} of rows "
                 f"are below 1e-3.",
        REFUTED: f"Wrong as stated: even the median row's ‖J‖_F does not fall exponentially "
                 f"(n={r['n']}: {meds} at s = {ks}·s_c).",
        INCONCLUSIVE: "Not decided: the law of the row norm was not computed.",
    }[verdict]
    unif = ", ".join(f"{x['uniform_limit']:.3g} at n={x['n']}" for x in per_n)
    second = (f"Missing: toward uniform ‖J‖_F does not vanish either; it levels off at "
              f"√(n−1)/n ≈ 1/√n ({unif}).")
    cross = ", ".join(f"n={x['n']}: {x['crossing_s_over_sc']:.1f}·s_c" for x in per_n)
    third = (f"Where the median row reaches 1e-3: {cross}, i.e. logits about ten times larger "
             f"than where the softmax starts to saturate; the Monte Carlo check agrees with "
             f"the law within {max(x['mc_gap'] for x in per_n):.3f} in the fraction. "
             + _trained_text(trained))
    return [first, second, third]


def _trained_text(trained: Any) -> str:
    if not trained or not all(trained.get(k) for k in ("dot", "scaled_dot")):
        return "No trained-model saturation was given, so this verdict rests on theory alone."
    dot, sd = trained["dot"]["saturated_fraction"], trained["scaled_dot"]["saturated_fraction"]
    return (f"In the trained models the fraction of rows saturated (max weight > 0.9) is "
            f"{fmt_ci(dot)} without 1/√d_k and {fmt_ci(sd)} with it.")


def _smallest(per_n: list[dict[str, Any]]) -> str:
    ratios = ", ".join(f"{r['uniform_limit'] / VANISH:.0f}× at n={r['n']}" for r in per_n)
    return ("No effect size: the verdict reads the shape of two exact decays, which the "
            "mathematics fixes (slope ratio 3.19 for an exponential over 10, 30, 100·s_c, 1 "
            "for a power law; the cutoff sits at their geometric middle, 1.79). ‖J‖_F < 1e-3, "
            "used to describe rows, is 500× below the largest ‖J‖_F a row can have (1/2, a "
            f"two-way tie), below the uniform value √(n−1)/n by {ratios}, and below "
            "bfloat16's unit roundoff 2⁻⁸ ≈ 3.9e-3")


def judge_c10(ev: Evidence) -> Verdict:
    """C10: does the softmax Jacobian vanish in saturation, for the typical row and on average?

    ``ev``: {"curves": [per n: Monte Carlo, :meth:`attnscale.measure.jacobian.JacobianCurve.
    to_dict`], "law": [per n: :func:`attnscale.measure.jacobian_law.law_curve` with
    "check_frac" aligned with the curve's s (None below 3·s_c)], "trained": optional {"dot":
    {"saturated_fraction": mean ± CI}, "scaled_dot": {...}} or None}.
    """
    curves = ev["curves"]
    if not curves:
        raise ValueError("evidence 'curves' must hold at least one n")
    laws = {law["n"]: law for law in ev.get("law") or []}
    missing = [c["n"] for c in curves if c["n"] not in laws]
    trained = ev.get("trained")
    regime = (f"softmax of n i.i.d. N(0, s²) logits (exact law; Monte Carlo as its check), n = "
              f"{', '.join(str(c['n']) for c in curves)}, s up to 100·s_c"
              + ("; trained-model saturation from the report's runs" if trained else
                 "; no trained-model data"))
    if missing:
        return Verdict(INCONCLUSIVE, C10_RULE, f"missing evidence: no law for n={missing}",
                       {"per_n": []}, headline=_headline(INCONCLUSIVE, []), regime=regime)
    per_n = [_judge_n(c, laws[c["n"]]) for c in curves]
    med = {r["median_shape"] for r in per_n}
    rms = {r["rms_shape"] for r in per_n}
    if med == rms == {EXPONENTIAL}:
        verdict = SUPPORTED
    elif med == {EXPONENTIAL} and rms == {POWER}:
        verdict = DEPENDS
    elif POWER in med:
        verdict = REFUTED
    else:
        verdict = DEPENDS  # the RMS's shape differs between n
    because = "; ".join(
        f"n={r['n']}: median {r['median_shape']} (slope ratio {r['median_ratio']:.2f}), RMS "
        f"{r['rms_shape']} (ratio {r['rms_ratio']:.2f}, slope {r['rms_slope']:+.2f}), "
        f"{_pct(r['frac'])} of rows below 1e-3 at 10·s_c, Monte Carlo within "
        f"{r['mc_gap']:.3f}" for r in per_n)
    return Verdict(verdict, C10_RULE, because, {"per_n": per_n},
                   headline=_headline(verdict, per_n), plain=_plain(verdict, per_n, trained),
                   regime=regime, smallest=_smallest(per_n))
