"""C10: "A saturated softmax gives vanishing gradients" (the thread; Vaswani et al. 2017,
arXiv 1706.03762, §3.2.1: "extremely small gradients"), decided from the law of the row norm.

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
from collections.abc import Mapping
from pathlib import Path
from statistics import NormalDist
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from pydantic import ConfigDict, Field

from attnscale.audit.claim import Claim, Figure, Measurement, Sources, register
from attnscale.audit.evidence import Model, head_dim_evidence, trained_saturation
from attnscale.audit.figure_text import finite
from attnscale.audit.interval import Interval
from attnscale.audit.scale import study_scale
from attnscale.audit.studies import Preset, studies
from attnscale.audit.theory_plots import save
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    REFUTED,
    SUPPORTED,
    MissingEvidence,
    Verdict,
)
from attnscale.measure import jacobian
from attnscale.measure.jacobian import VANISH, frac_key
from attnscale.measure.jacobian_law import decay_ratio, exponential_ratio

FRAC_KEY = frac_key(VANISH)  # "frac_below_1e-3"
EXPONENTIAL, POWER = "exponential", "power law"
CHECK_CONFIDENCE = 0.999  # the Monte Carlo check's Wilson level, per measured scale
CHECK_SLACK = 0.02  # the two-key law's own error in the fraction at s ≥ 3·s_c (measured ≤ 0.01)

RULE = (
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


class Saturation(Model):
    """Trained models' fraction of rows with max weight > 0.9 (mean and 95% CI over seeds)."""

    saturated_fraction: Interval


class Evidence(Model):
    """The Monte Carlo curves and the exact law per n, and the trained-model saturation
    (:func:`attnscale.audit.evidence.trained_saturation`, None without it)."""

    curves: list[Curve]
    law: list[Law] | None = None
    trained: dict[str, Saturation] | None = None


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


def g2(x: float) -> str:
    return f"{x:.2g}"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def headline(verdict: str, per_n: list[PerN]) -> str:
    """The verdict with the shapes of the two decays."""
    k_half = ", ".join(f"{r.crossing_s_over_sc:.1f}" for r in per_n)
    slope = ", ".join(f"{r.rms_slope:+.2f}" for r in per_n)
    med = {r.median_shape for r in per_n}
    if verdict == INCONCLUSIVE:
        return "inconclusive: the law was not computed"
    if med != {EXPONENTIAL}:
        return f"{verdict}: the median row's ‖J‖_F does not fall exponentially at every n"
    rms = {r.rms_shape for r in per_n}
    tail = ("the RMS also exponentially" if rms == {EXPONENTIAL} else
            f"the RMS as s^({slope})" if rms == {POWER} else
            "the RMS exponentially at some n, as a power of s at others")
    return (f"{verdict}: the median row's ‖J‖_F falls exponentially (below 1e-3 at "
            f"{k_half}·s_c), {tail}")


def plain(verdict: str, per_n: list[PerN], trained: dict[str, Saturation] | None,
          ) -> list[str]:
    """What the thread got right, what it missed toward uniform, and where rows vanish."""
    r = per_n[-1]
    ks = ", ".join(f"{k:g}" for k in r.ks)
    meds = ", ".join(g2(x) for x in r.law_median)
    fracs = ", ".join(pct(x) for x in r.law_frac)
    rms = ", ".join(g2(x) for x in r.law_rms)
    first = {
        SUPPORTED: f"Right: past saturation both the typical row's and the mean-square "
                   f"Jacobian vanish exponentially (n={r.n}, s = {ks}·s_c: median {meds}; "
                   f"RMS {rms}).",
        DEPENDS: f"Right for the typical row, not on average: at n={r.n} and s = {ks}·s_c "
                 f"the median row's ‖J‖_F is {meds} (exponential in s), but the RMS is "
                 f"{rms}, falling only like s^{r.rms_slope:+.2f}: the rows whose two "
                 f"largest logits nearly tie keep a live Jacobian, and only {fracs} of rows "
                 f"are below 1e-3.",
        REFUTED: f"Wrong as stated: even the median row's ‖J‖_F does not fall exponentially "
                 f"(n={r.n}: {meds} at s = {ks}·s_c).",
        INCONCLUSIVE: "Not decided: the law of the row norm was not computed.",
    }[verdict]
    unif = ", ".join(f"{x.uniform_limit:.3g} at n={x.n}" for x in per_n)
    second = (f"Missing: toward uniform ‖J‖_F does not vanish either; it levels off at "
              f"√(n−1)/n ≈ 1/√n ({unif}).")
    cross = ", ".join(f"n={x.n}: {x.crossing_s_over_sc:.1f}·s_c" for x in per_n)
    third = (f"Where the median row reaches 1e-3: {cross}, i.e. logits about ten times larger "
             f"than where the softmax starts to saturate; the Monte Carlo check agrees with "
             f"the law within {max(x.mc_gap for x in per_n):.3f} in the fraction. "
             + trained_text(trained))
    return [first, second, third]


def trained_text(trained: dict[str, Saturation] | None) -> str:
    """The trained models' saturated-row fraction without and with 1/√d_k, when given."""
    if not trained or not all(trained.get(k) for k in ("dot", "scaled_dot")):
        return "No trained-model saturation was given, so this verdict rests on theory alone."
    dot, sd = (trained[k].saturated_fraction.fmt(sign=False) for k in ("dot", "scaled_dot"))
    return (f"In the trained models the fraction of rows saturated (max weight > 0.9) is "
            f"{dot} without 1/√d_k and {sd} with it.")


def smallest(per_n: list[PerN]) -> str:
    """Why the rule has no effect size, and how far below the alternatives 1e-3 sits."""
    ratios = ", ".join(f"{r.uniform_limit / VANISH:.0f}× at n={r.n}" for r in per_n)
    return ("No effect size: the verdict reads the shape of two exact decays, which the "
            "mathematics fixes (slope ratio 3.19 for an exponential over 10, 30, 100·s_c, 1 "
            "for a power law; the cutoff sits at their geometric middle, 1.79). ‖J‖_F < 1e-3, "
            "used to describe rows, is 500× below the largest ‖J‖_F a row can have (1/2, a "
            f"two-way tie), below the uniform value √(n−1)/n by {ratios}, and below "
            "bfloat16's unit roundoff 2⁻⁸ ≈ 3.9e-3")


def judge(ev: Evidence) -> Verdict:
    """C10: does the softmax Jacobian vanish in saturation, for the typical row and on
    average? (Rule: :data:`RULE`.)"""
    if not ev.curves:
        raise ValueError("evidence 'curves' must hold at least one n")
    laws = {law.n: law for law in ev.law or []}
    missing = [c.n for c in ev.curves if c.n not in laws]
    regime = (f"softmax of n i.i.d. N(0, s²) logits (exact law; Monte Carlo as its check), n = "
              f"{', '.join(str(c.n) for c in ev.curves)}, s up to 100·s_c"
              + ("; trained-model saturation from the report's runs" if ev.trained else
                 "; no trained-model data"))
    if missing:
        return Verdict(INCONCLUSIVE, RULE, f"missing evidence: no law for n={missing}",
                       {"per_n": []}, headline=headline(INCONCLUSIVE, []), regime=regime)
    per_n = [judge_n(c, laws[c.n]) for c in ev.curves]
    med = {r.median_shape for r in per_n}
    rms = {r.rms_shape for r in per_n}
    if med == rms == {EXPONENTIAL}:
        verdict = SUPPORTED
    elif med == {EXPONENTIAL} and rms == {POWER}:
        verdict = DEPENDS
    elif POWER in med:
        verdict = REFUTED
    else:
        verdict = DEPENDS  # the RMS's shape differs between n
    because = "; ".join(
        f"n={r.n}: median {r.median_shape} (slope ratio {r.median_ratio:.2f}), RMS "
        f"{r.rms_shape} (ratio {r.rms_ratio:.2f}, slope {r.rms_slope:+.2f}), "
        f"{pct(r.frac)} of rows below 1e-3 at 10·s_c, Monte Carlo within "
        f"{r.mc_gap:.3f}" for r in per_n)
    return Verdict(verdict, RULE, because, {"per_n": per_n},
                   headline=headline(verdict, per_n), plain=plain(verdict, per_n, ev.trained),
                   regime=regime, smallest=smallest(per_n))


def alt(ev: Mapping[str, Any], per_n: list[dict[str, Any]]) -> str:
    """The median row's ‖J‖_F at its peak and by 10·s_c, and the fraction below 1e-3."""
    judged = [r for r in per_n if finite(r.get("median"))]
    if not judged:
        raise ValueError("per_n: no n was judged")
    peak = max(r["peak_median"] for r in judged)
    cross = ", ".join(f"{r['crossing_s_over_sc']:.1f}·s_c at n = {r['n']}" for r in judged
                      if finite(r.get("crossing_s_over_sc")))
    ends = ", ".join(f"{r['frac']:.0%} at n = {r['n']}" for r in judged)
    where = f" and falls below 1e-3 only at {cross}" if cross else \
        " and does not fall below 1e-3 in the measured range"
    return (f"The median row's softmax Jacobian norm ‖J‖_F peaks near s_c at about {peak:.2f}"
            f"{where}; at {judged[0]['s_over_sc']:.0f}·s_c the share of rows below 1e-3 is "
            f"{ends}. Toward uniform it levels off at √(n−1)/n instead of vanishing."
            + "".join(f" By the law at 100·s_c the median row's norm is {r['law_median'][-1]:.0e}"
                      f" while the RMS is {r['law_rms'][-1]:.2g}, falling like "
                      f"s^{r['rms_slope']:+.2f} (n = {r['n']})." for r in judged[-1:]
                      if "law_rms" in r))


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Per-row ‖J‖_F median and quartiles (Monte Carlo), the RMS, and the law the verdict
    reads (median row and exact RMS at 10, 30, 100·s_c, ``numbers["per_n"]``), against
    s / s_c."""
    per_n = numbers["per_n"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, c in enumerate(ev["curves"]):
        x = [s / c["s_c"] for s in c["s"]]
        ax.plot(x, c["median"], color=f"C{i}", label=f"$n = {c['n']}$")
        ax.fill_between(x, np.maximum(c["q1"], 1e-12), c["q3"], color=f"C{i}", alpha=0.18)
        ax.plot(x, c["rms"], ls=":", color=f"C{i}")
    floor = 1e-14  # the law's median at 100·s_c (~1e-33) would squash the rest: noted instead
    for i, r in enumerate(per_n):  # the law the verdict reads, out to 100·s_c
        if "ks" in r:
            shown = [(k, m) for k, m in zip(r["ks"], r["law_median"], strict=True) if m > floor]
            ax.plot(*zip(*shown, strict=True), "x", color=f"C{i}", ms=6)
            ax.plot(r["ks"], r["law_rms"], "+", color=f"C{i}", ms=7)
    low = [m for r in per_n for m in r.get("law_median", []) if m <= floor]
    if low:
        ax.annotate(f"median row at 100·$s_c$: {min(low):.0e}–{max(low):.0e} (off scale)",
                    (0.98, 0.04), xycoords="axes fraction", ha="right", fontsize=8)
    ax.set_ylim(bottom=floor)
    ax.axhline(1e-3, color="grey", ls="--", lw=0.8)
    handles = [*ax.get_legend_handles_labels()[0],
               Line2D([], [], color="k", label="median row"),
               Patch(color="k", alpha=0.18, label="quartiles (middle half of rows)"),
               Line2D([], [], color="k", ls=":", label=r"RMS $\sqrt{\mathbb{E}\|J\|_F^2}$"),
               Line2D([], [], color="k", marker="x", ls="none",
                      label="median, top-two law (10, 30, 100 $s_c$)"),
               Line2D([], [], color="k", marker="+", ls="none", label="RMS, exact"),
               Line2D([], [], color="grey", ls="--", label="$10^{-3}$: vanished")]
    ax.set(yscale="log", xscale="log", xlabel=r"$s\,/\,s_c$,  $s_c=\sqrt{2\ln n}$",
           ylabel=r"$\|J\|_F$ per row, $J=\mathrm{diag}(p)-pp^\top$")
    rows = ev["curves"][0].get("rows")
    ax.set_title("C10: softmax Jacobian per row, $n$ i.i.d. $\\mathcal{N}(0,s^2)$ logits, "
                 f"Monte Carlo{f', {rows:,} rows per $s$' if rows else ''}", fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    return [save(fig, folder, "c10_jacobian", alt(ev, per_n))]


def gather(src: Sources) -> dict[str, Any]:
    return {**src.measured["jacobian"],
            "trained": trained_saturation(src.study("head_dim", head_dim_evidence))}


def scale(p: Preset) -> str:
    """The Monte Carlo rows per (n, s), and the head-dimension study the trained saturation
    comes from."""
    return (f"{p.jacobian_rows} random rows per (n, s) and "
            f"head_dim: {study_scale(studies(p)['head_dim'])}")


CLAIM = register(Claim(
    id="C10", text="A saturated softmax gives vanishing gradients.",
    measures="per-row softmax Jacobian norm distribution against s", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw, studies=("head_dim",),
    measurements=(Measurement("jacobian", lambda p: {"rows": p.jacobian_rows, "law": 1},
                              lambda p: jacobian.standard_measurement(rows=p.jacobian_rows)),),
    scale=scale))
