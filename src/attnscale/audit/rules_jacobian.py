"""C10, "a saturated softmax gives vanishing gradients", judged on the per-row ‖J‖_F distribution.

J = diag(p) − ppᵀ is the softmax Jacobian of one attention row; every gradient that reaches
the logits passes through it. The RMS √(E‖J‖²) (:func:`attnscale.measure.theory.rms_jacobian_norm`)
is carried by rare near-ties deep in saturation, so this rule reads the distribution that
:mod:`attnscale.measure.jacobian` measures for n i.i.d. N(0, s²) logits (the Random Energy Model
softmax; s_c = √(2 ln n), Derrida 1981): does the MEDIAN row's ‖J‖_F fall below 1e-3 by 10·s_c?

The median is below 1e-3 exactly when more than half the rows are, so the rule decides on
f = the fraction of rows with ‖J‖_F < 1e-3 at the largest measured s ≤ 10·s_c, with a Wilson
score interval (Wilson 1927) at 95% family-wise confidence (Bonferroni over the n values), and
compares the interval with 1/2.
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
    Verdict,
    fmt_ci,
)
from attnscale.measure.jacobian import VANISH, frac_key

__all__ = ["C10_RULE", "HORIZON", "judge_c10", "wilson_interval"]

HORIZON = 10.0  # judge at the largest s ≤ HORIZON·s_c
FRAC_KEY = frac_key(VANISH)  # "frac_below_1e-3"
_VANISHES, _STAYS, _OPEN = "vanishes", "stays", "undecided"

C10_RULE = (
    "Per-row softmax Jacobian norm ‖J‖_F = ‖diag(p) − ppᵀ‖_F for n i.i.d. N(0, s²) logits, "
    "s up to 10·s_c (s_c = √(2 ln n)), n = each measured n. At the largest s ≤ 10·s_c take f = "
    "the fraction of rows with ‖J‖_F < 1e-3 and its Wilson 95% interval (Bonferroni over n). "
    "Per n: the median vanishes if the interval lies above 1/2, stays if it lies below 1/2 "
    "(and the curve reaches 10·s_c), else undecided. Supported if it vanishes for every n; "
    "refuted if it stays for every n; depends if the n disagree (some vanish, some stay); "
    "inconclusive otherwise")


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


def _nearest(curve: dict[str, Any], ratio: float) -> int:
    """Index of the scale nearest ratio·s_c (in log s)."""
    target = math.log(ratio * curve["s_c"])
    return min(range(len(curve["s"])),
               key=lambda i: abs(math.log(max(curve["s"][i], 1e-300)) - target))


def _crossing(curve: dict[str, Any]) -> float | None:
    """s/s_c where the fraction below 1e-3 first reaches 1/2 (log-linear interpolation), or
    None if it never does. Descriptive only: the verdict reads the interval, not this."""
    f, s = curve[FRAC_KEY], curve["s"]
    for i in range(1, len(s)):
        if f[i - 1] < 0.5 <= f[i] and s[i - 1] > 0:
            t = (0.5 - f[i - 1]) / (f[i] - f[i - 1])
            return math.exp(math.log(s[i - 1]) + t * math.log(s[i] / s[i - 1])) / curve["s_c"]
    return s[0] / curve["s_c"] if f and f[0] >= 0.5 else None


def _judge_curve(curve: dict[str, Any], confidence: float) -> dict[str, Any]:
    """One n's status and the numbers at its decision scale (largest s ≤ 10·s_c)."""
    sc = curve["s_c"]
    inside = [i for i, x in enumerate(curve["s"]) if x <= HORIZON * sc * (1 + 1e-9)]
    out: dict[str, Any] = {"n": curve["n"], "s_c": sc, "uniform_limit": curve["uniform_limit"],
                           "crossing_s_over_sc": _crossing(curve)}
    if not inside:
        return {**out, "status": _OPEN, "why": "no scale at or below 10·s_c"}
    i = max(inside, key=lambda j: curve["s"][j])
    frac = curve[FRAC_KEY][i]
    out.update(s_over_sc=curve["s"][i] / sc, median=curve["median"][i], q1=curve["q1"][i],
               q3=curve["q3"][i], frac=frac, rms=curve["rms"][i],
               peak_median=max(curve["median"]))
    i3 = _nearest(curve, 3.0)
    out.update(median_3sc=curve["median"][i3], s3_over_sc=curve["s"][i3] / sc)
    rows = curve.get("rows")
    if not rows:
        return {**out, "status": _OPEN, "why": "no row count, so no interval"}
    lo, hi = wilson_interval(frac, int(rows), confidence)
    out.update(lo=lo, hi=hi, rows=int(rows))
    if lo > 0.5:
        return {**out, "status": _VANISHES, "why": "more than half the rows below 1e-3"}
    reached = out["s_over_sc"] >= HORIZON * (1 - 1e-3)
    if hi < 0.5 and reached:
        return {**out, "status": _STAYS, "why": "fewer than half the rows below 1e-3"}
    why = ("the interval contains 1/2" if hi >= 0.5 else
           f"the curve stops at {out['s_over_sc']:.2g}·s_c, short of 10·s_c")
    return {**out, "status": _OPEN, "why": why}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _frac_text(r: dict[str, Any]) -> str:
    if "frac" not in r:
        return f"n={r['n']}: {r['why']}"
    ci = f" [{_pct(r['lo'])}, {_pct(r['hi'])}]" if "lo" in r else ""
    return (f"n={r['n']}: median {r['median']:.2g} at {r['s_over_sc']:.3g}·s_c, "
            f"{_pct(r['frac'])}{ci} of rows below 1e-3 ({r['status']})")


def _headline(verdict: str, per_n: list[dict[str, Any]]) -> str:
    judged = [r for r in per_n if "frac" in r]
    if not judged:
        return f"{verdict}: no scale to judge"
    worst = min(judged, key=lambda r: r["frac"])
    best = max(judged, key=lambda r: r["frac"])
    if verdict == SUPPORTED:
        return (f"supported: median ‖J‖ < 1e-3 by 10·s_c for every n (least: n={worst['n']}, "
                f"{_pct(worst['frac'])} of rows below)")
    if verdict == REFUTED:
        return (f"refuted: median ‖J‖ ≥ 1e-3 out to 10·s_c (most: n={best['n']}, "
                f"{_pct(best['frac'])} of rows below)")
    if verdict == DEPENDS:
        yes = ", ".join(str(r["n"]) for r in per_n if r["status"] == _VANISHES)
        no = ", ".join(str(r["n"]) for r in per_n if r["status"] == _STAYS)
        return f"depends on n: median ‖J‖ < 1e-3 by 10·s_c at n={yes}, not at n={no}"
    open_n = ", ".join(str(r["n"]) for r in per_n if r["status"] == _OPEN)
    return (f"inconclusive: {_pct(worst['frac'])}–{_pct(best['frac'])} of rows below 1e-3 at "
            f"the largest s ≤ 10·s_c (undecided at n={open_n})")


def _plain(verdict: str, per_n: list[dict[str, Any]], trained: Any) -> list[str]:
    judged = [r for r in per_n if "frac" in r] or per_n
    r0 = max(judged, key=lambda r: r.get("frac", 0.0))
    meds = "; ".join(f"n={r['n']}: {r['median']:.2g} at {r['s_over_sc']:.3g}·s_c, "
                     f"{_pct(r['frac'])} of rows below 1e-3" for r in judged if "frac" in r)
    if verdict == SUPPORTED:
        right = (f"Right: deep in saturation most rows' Jacobian is ~0 — median ‖J‖_F "
                 f"{meds}.")
    elif verdict == REFUTED:
        right = (f"Only the direction is right: ‖J‖_F does fall past its peak near s_c, but out "
                 f"to 10·s_c the median row keeps a live Jacobian ({meds}).")
    else:
        right = (f"Partly right: past s_c most rows head to one-hot and ‖J‖_F falls, but the "
                 f"median only reaches 1e-3 around 10·s_c ({meds}).")
    ends = [r for r in judged if "rms" in r]
    rms = "; ".join(f"RMS {r['rms']:.2g} vs median {r['median']:.2g} (n={r['n']})" for r in ends)
    unif = ", ".join(f"{r['uniform_limit']:.3g} at n={r['n']}" for r in per_n)
    wrong = (f"Missing: toward uniform ‖J‖_F does not vanish, it levels off at √(n−1)/n ≈ 1/√n "
             f"({unif}); and a mean-square summary hides the split — deep in saturation "
             f"{rms}, because rare near-ties (‖J‖ up to 1/2) carry E‖J‖²." if ends else
             f"Missing: toward uniform ‖J‖_F levels off at √(n−1)/n ≈ 1/√n ({unif}).")
    cross = ", ".join(
        f"n={r['n']}: " + (f"{r['crossing_s_over_sc']:.3g}·s_c" if r["crossing_s_over_sc"]
                           else "beyond the measured range") for r in per_n)
    scs = ", ".join(f"{r['s_c']:.2f}" for r in per_n)
    depends = (f"It depends on where the logits sit relative to s_c = √(2 ln n) "
               f"({scs}): the median ‖J‖_F crosses 1e-3 "
               f"at about {cross}; at 3·s_c it is still {r0.get('median_3sc', float('nan')):.2g} "
               f"(n={r0['n']}).")
    return [right, wrong, depends + " " + _trained_text(trained)]


def _trained_text(trained: Any) -> str:
    if not trained or not all(trained.get(k) for k in ("dot", "scaled_dot")):
        return "No trained-model saturation was given, so this verdict rests on theory alone."
    dot, sd = trained["dot"]["saturated_fraction"], trained["scaled_dot"]["saturated_fraction"]
    return (f"In the trained models the fraction of rows saturated (max weight > 0.9) is "
            f"{fmt_ci(dot)} without 1/√d_k and {fmt_ci(sd)} with it.")


def _smallest(per_n: list[dict[str, Any]]) -> str:
    ratios = ", ".join(f"{r['uniform_limit'] / VANISH:.0f}× at n={r['n']}" for r in per_n)
    return ("‖J‖_F < 1e-3 counts as vanished: 500× below the largest ‖J‖_F a row can have (1/2, a "
            f"two-way tie), below the uniform value √(n−1)/n by {ratios}, and below bfloat16's "
            "unit roundoff 2⁻⁸ ≈ 3.9e-3, so such a row's share of an O(1) gradient sum is "
            "rounded away in bfloat16. "
            "'Most rows' means more than half (the median), decided by the fraction's Wilson "
            "interval lying wholly above or below 1/2")


def judge_c10(ev: Evidence) -> Verdict:
    """C10: does the median row's softmax Jacobian norm fall below 1e-3 by 10·s_c, for every n?

    ``ev``: {"curves": [per n: {"n", "s_c", "rows", "s": [...], "median", "q1", "q3",
    "frac_below_1e-3", "rms": [...], "uniform_limit"}], "trained": optional {"dot":
    {"saturated_fraction": mean ± CI}, "scaled_dot": {...}} or None}. ``rows`` (rows per scale)
    sets the interval; without it that n is undecided.
    """
    curves = ev["curves"]
    if not curves:
        raise ValueError("evidence 'curves' must hold at least one n")
    confidence = 1.0 - 0.05 / len(curves)
    per_n = [_judge_curve(c, confidence) for c in curves]
    status = {r["status"] for r in per_n}
    if status == {_VANISHES}:
        verdict = SUPPORTED
    elif status == {_STAYS}:
        verdict = REFUTED
    elif {_VANISHES, _STAYS} <= status:
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    trained = ev.get("trained")
    because = ("; ".join(_frac_text(r) for r in per_n)
               + f" (Wilson {100 * confidence:.1f}% intervals)")
    strong = [r["n"] for r in per_n if r.get("q3", math.inf) < VANISH]
    if verdict == SUPPORTED:
        because += (f"; upper quartile also below 1e-3 at n={strong}" if strong else
                    "; the upper quartile stays above 1e-3")
    regime = (f"softmax of n i.i.d. N(0, s²) logits (theory, Monte Carlo), n = "
              f"{', '.join(str(r['n']) for r in per_n)}, s up to 10·s_c"
              + ("; trained-model saturation from the report's runs" if trained else
                 "; no trained-model data"))
    return Verdict(verdict, C10_RULE, because, {"per_n": per_n, "confidence": confidence},
                   headline=_headline(verdict, per_n), plain=_plain(verdict, per_n, trained),
                   regime=regime, smallest=_smallest(per_n))
