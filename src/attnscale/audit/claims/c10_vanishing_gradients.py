"""C10: "A saturated softmax gives vanishing gradients" (the thread; Vaswani et al. 2017,
arXiv 1706.03762, §3.2.1: "extremely small gradients"), judged at the logit scales the report's
studies reach.

J = diag(p) − ppᵀ is the softmax Jacobian of one attention row; every gradient that reaches
the logits passes through it. Without 1/√d_k, unit-variance q and k give logits of std
s = √d_k: at the studies' head dimensions (d_k = 16–256) and n = 32 keys that is s ≈ 1.5–6·s_c,
s_c = √(2 ln n) the softmax's freezing scale (Derrida 1981's Random Energy Model). The rule
evaluates the Jacobian there (Monte Carlo over rows of n keys and over causal rows of 2…n keys,
the exact RMS, :func:`attnscale.measure.theory.rms_jacobian_norm`) and measures the gradient
reaching q and k through attention without and with the scale; the verdict is read at the
largest scale a study reaches.

Deep saturation is context: for n i.i.d. N(0, s²) logits at s = 10, 30, 100·s_c the typical
row's ‖J‖_F, set by the gap Δ between its two largest logits (‖J‖_F = ½·sech²(Δ/2)), falls
exponentially in s, while the mean square E‖J‖_F², carried by the share ≈ 1/k of rows whose top
two nearly tie at s = k·s_c, falls only like a power of s (:mod:`attnscale.measure.jacobian_law`;
the shape of each decay is read, never a level set on the quantity itself). It says where
gradients would vanish: the median row reaches 1e-3 near 9·s_c, unscaled d_k ≈ 580 at n = 32
(≈ 380 over causal rows, whose short rows saturate sooner), beyond every study. The Monte
Carlo distribution (:mod:`attnscale.measure.jacobian`) checks that law: its fraction of rows
below 1e-3 must match at every measured s ≥ 3·s_c, within a Wilson interval (Wilson 1927) plus
the law's two-key approximation error; a mismatch raises, since a disagreement between theory
and simulation is a bug, never a verdict (:mod:`attnscale.audit.jacobian_readings`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from pydantic import Field

from attnscale.audit.claim import Claim, Figure, Measurement, Sources, register
from attnscale.audit.evidence import Model, Run, head_dim_evidence, trained_saturation
from attnscale.audit.figure_text import finite
from attnscale.audit.interval import Interval
from attnscale.audit.jacobian_readings import (  # C10's deep-saturation context
    Curve,
    Law,
    PerN,
    deep_reading,
    judge_n,
)
from attnscale.audit.scale import study_scale
from attnscale.audit.studies import Preset, Study, studies
from attnscale.audit.theory_plots import save
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.measure import jacobian
from attnscale.measure.jacobian import VANISH
from attnscale.measure.jacobian_scales import at_scales

RULE = (
    "Judged at the logit scales the studies reach: unscaled dot at init with unit-variance q, "
    "k has logits of std s = √d_k, for every d_k a study trains dot at, over the n keys of its "
    "sequences. At each such s: the per-row softmax Jacobian norm ‖J‖_F = ‖diag(p) − ppᵀ‖_F "
    "over rows of n keys and over causal rows of 2…n keys (Monte Carlo; the RMS √E‖J‖_F² also "
    "exactly), and the norm of the gradient reaching q and k through attention, unscaled over "
    "scaled. At the largest such s, a row's gradient has vanished where ‖J‖_F < 1e-3: "
    "supported if both the median row's and the RMS have (the lower of the full and causal "
    "rows); depends if only one has; refuted if the softmax is saturated there (s > s_c = "
    "√(2 ln n)) and neither has; inconclusive if no study's logits reach s_c or the scales "
    "were not evaluated. Context, not the verdict: where the median row would reach 1e-3 "
    "(the top-two-gap law, ‖J‖_F = ½·sech²(Δ/2)), and the shape of the decay deep in "
    "saturation (s = 10, 30, 100·s_c, n = 64–4096: exponential if the log-log slope steepens "
    "by more than 1.79, else a power law), whose Monte Carlo check must match the law at "
    "every measured s ≥ 3·s_c (99.9% Wilson interval plus 0.02), else the report fails")


class Saturation(Model):
    """Trained models' fraction of rows with max weight > 0.9 (mean and 95% CI over seeds)."""

    saturated_fraction: Interval


class Point(Model):
    """One logit scale s over n keys (:func:`attnscale.measure.jacobian_scales.at_scales`):
    ``d_k`` (None for scaled, s = 1), E[max weight] (exact), the median and fraction below
    1e-3 of ‖J‖_F over rows of n keys and over causal rows of 2…n keys (Monte Carlo), the RMS
    (exact for n keys, Monte Carlo for the causal rows) and the gradient norm reaching q and k,
    unscaled over scaled (1 for scaled)."""

    d_k: int | None
    s: float
    s_over_sc: float
    max_weight: float
    median: float
    frac: float
    rms: float
    causal_median: float
    causal_frac: float
    causal_rms: float
    grad_ratio: float

    def vanished(self) -> tuple[bool, bool]:
        """(the median row's ‖J‖_F, the RMS) below 1e-3, the lower of full and causal rows."""
        return (min(self.median, self.causal_median) < VANISH,
                min(self.rms, self.causal_rms) < VANISH)


class AtStudies(Model):
    """The Jacobian at the studies' scales: n keys, s_c, rows per s, the scaled reference, one
    :class:`Point` per d_k (unscaled, s = √d_k), and where the median row would reach 1e-3:
    ``vanish_k``·s_c over n keys (the top-two law), ``causal_vanish_k``·s_c over causal rows
    (None past 20·s_c), with the d_k = s² they mean."""

    n: int
    s_c: float
    rows: int
    scaled: Point
    points: list[Point]
    vanish_k: float
    vanish_d_k: float
    causal_vanish_k: float | None
    causal_vanish_d_k: float | None

    def top(self) -> Point:
        """The largest scale a study reaches."""
        return max(self.points, key=lambda x: x.s)


class Evidence(Model):
    """The Monte Carlo curves and the exact law per n (deep saturation), the Jacobian at the
    studies' scales per sequence length n (empty in an older measurement), the trained-model
    saturation (:func:`attnscale.audit.evidence.trained_saturation`, None without it) and the
    unscaled row logit std measured at step 0, init -> d_k -> the largest over seeds and
    layers."""

    curves: list[Curve]
    law: list[Law] | None = None
    studies: list[AtStudies] = Field(default_factory=list)
    trained: dict[str, Saturation] | None = None
    measured_std: dict[str, dict[str, float]] = Field(default_factory=dict)


def study_scales(p: Preset) -> dict[int, list[int]]:
    """n -> the d_k values a study trains unscaled dot at over n keys: each such study's
    sequence lengths (a cell axis or its base) and d_model/n_heads over its widths."""
    out: dict[int, set[int]] = {}
    for study in studies(p).values():
        if "dot" not in study.arms:
            continue
        heads = int(study.base.get("n_heads", 1))
        widths = study.cells.get("d_model", (study.base.get("d_model"),))
        for n in study.cells.get("seq_len") or (study.base["seq_len"],):
            out.setdefault(int(n), set()).update(int(w) // heads for w in widths if w)
    return {n: sorted(d) for n, d in sorted(out.items())}


def measure(p: Preset) -> dict[str, Any]:
    """The deep-saturation curves and law (:func:`attnscale.measure.jacobian.
    standard_measurement`) and, per n, the Jacobian and q/k gradient at the studies' scales
    (:func:`attnscale.measure.jacobian_scales.at_scales`)."""
    return {**jacobian.standard_measurement(rows=p.jacobian_rows),
            "studies": [at_scales(n, dks, p.jacobian_rows)
                        for n, dks in study_scales(p).items()]}


def params(p: Preset) -> dict[str, Any]:
    """The measurement's cache key: rows, the law's version and the studies' n and d_k."""
    return {"rows": p.jacobian_rows, "law": 1,
            "studies": {str(n): d for n, d in study_scales(p).items()}}


def deciding(sts: list[AtStudies]) -> AtStudies | None:
    """The sequence length whose largest unscaled scale sits deepest past s_c (None: none)."""
    with_points = [st for st in sts if st.points]
    return max(with_points, key=lambda st: st.top().s_over_sc, default=None)


def g2(x: float) -> str:
    return f"{x:.2g}"


def decide(st: AtStudies | None) -> str:
    """The verdict at the largest scale a study reaches (:data:`RULE`; ``st``:
    :func:`deciding`)."""
    if st is None or st.top().s_over_sc <= 1:
        return INCONCLUSIVE
    typical, mean_square = st.top().vanished()
    if typical and mean_square:
        return SUPPORTED
    return DEPENDS if typical or mean_square else REFUTED


def first(verdict: str, st: AtStudies | None) -> str:
    """What the thread got right or wrong at the studies' scales."""
    if st is None:
        return "Not decided: the Jacobian at the studies' logit scales was not measured."
    t, ref = st.top(), st.scaled
    where = (f"unscaled dot at init with unit-variance q, k has logits of std s = √d_k up to "
             f"{t.s:.3g} = {t.s_over_sc:.1f}·s_c over n = {st.n} keys (d_k = {t.d_k})")
    jac = (f"the median row's ‖J‖_F is {g2(t.median)} ({g2(t.causal_median)} over causal rows "
           f"of 2–{st.n} keys) and the RMS {g2(t.rms)}, against {g2(ref.rms)} scaled, and the "
           f"gradient reaching q and k is {t.grad_ratio:.3g}× the scaled one")
    return {
        SUPPORTED: f"Right: at the scales the studies reach the gradient vanishes: {where}; "
                   f"{jac}.",
        DEPENDS: f"Partly: at the scales the studies reach only one of the typical row and the "
                 f"mean square has vanished: {where}; {jac}.",
        REFUTED: f"Wrong at the scales the studies reach: {where}, where the softmax is "
                 f"saturated (the top key takes {t.max_weight:.2f} of the weight on average) "
                 f"but the gradient has not vanished: {jac}"
                 f"{', larger without the scale, not smaller' if t.grad_ratio > 1 else ''}.",
        INCONCLUSIVE: f"Not decided: no study's unscaled logits reach the freezing scale "
                      f"(largest s = {t.s:.3g} = {t.s_over_sc:.2f}·s_c over n = {st.n} keys).",
    }[verdict]


def where_vanish(sts: list[AtStudies], per_n: list[PerN]) -> str:
    """Where the gradient would vanish per n, whether a study gets there, deep saturation."""
    r = per_n[-1]
    deep = (f"Deeper, for n = {', '.join(str(x.n) for x in per_n)} at s = 10, 30, 100·s_c, "
            f"{deep_reading(per_n)} (median {g2(r.law_median[-1])}, RMS {g2(r.law_rms[-1])} "
            f"at 100·s_c, n = {r.n}).")
    st = deciding(sts)
    if st is None:
        return deep
    parts = []
    for x in (x for x in sts if x.points):
        causal = (f", causal rows from {x.causal_vanish_k:.1f}·s_c (d_k ≈ "
                  f"{x.causal_vanish_d_k:.0f})" if x.causal_vanish_k is not None else "")
        parts.append(f"from {x.vanish_k:.1f}·s_c over n = {x.n} keys (s = "
                     f"{x.vanish_k * x.s_c:.3g}, unscaled d_k ≈ {x.vanish_d_k:.0f}{causal})")
    reached = [f"d_k = {p.d_k} at n = {x.n}" for x in sts for p in x.points
               if p.s >= min(x.vanish_k, x.causal_vanish_k or math.inf) * x.s_c]
    reach = (f"the studies reach it at {', '.join(reached)}" if reached else
             "no study goes there")
    t = st.top()
    return (f"Where gradients would vanish: the median row's ‖J‖_F falls below 1e-3 only "
            f"{'; '.join(parts)}; the studies reach {t.s_over_sc:.1f}·s_c (d_k = {t.d_k}, n = "
            f"{st.n}), so {reach}. " + deep)


def context(ev: Evidence, per_n: list[PerN]) -> str:
    """Toward uniform, the measured step-0 logit spreads, the Monte Carlo check, training."""
    unif = ", ".join(f"{x.uniform_limit:.3g} at n={x.n}" for x in per_n)
    out = (f"Toward uniform ‖J‖_F does not vanish either; it levels off at √(n−1)/n ({unif}); "
           f"the Monte Carlo check agrees with the law within "
           f"{max(x.mc_gap for x in per_n):.3f} in the fraction.")
    st, gpt2 = deciding(ev.studies), ev.measured_std.get("gpt2")
    unit = ev.measured_std.get("unit")
    if st and gpt2:
        top = max(gpt2.values())
        out += (f" With GPT-2 init unscaled logits start at a row std of at most {top:.2g} "
                f"({top / st.s_c:.2g}·s_c): not saturated at all.")
    if unit:
        d = max(unit, key=int)
        out += f" Measured at step 0 with unit init: {unit[d]:.3g} at d_k = {d} (√d_k = " \
               f"{math.sqrt(int(d)):.3g})."
    return out + " " + trained_text(ev.trained)


def trained_text(trained: dict[str, Saturation] | None) -> str:
    """The trained models' saturated-row fraction without and with 1/√d_k, when given."""
    if not trained or not all(trained.get(k) for k in ("dot", "scaled_dot")):
        return "No trained-model saturation was given."
    dot, sd = (trained[k].saturated_fraction.fmt(sign=False) for k in ("dot", "scaled_dot"))
    return (f"In the trained models the fraction of rows saturated (max weight > 0.9) is "
            f"{dot} without 1/√d_k and {sd} with it.")


def headline(verdict: str, st: AtStudies | None) -> str:
    """The verdict with the studies' largest scale and where vanishing starts."""
    if st is None:
        return f"{verdict}: the studies' logit scales were not evaluated"
    t = st.top()
    return (f"{verdict}: at the studies' largest unscaled scale (d_k = {t.d_k}, "
            f"{t.s_over_sc:.1f}·s_c, n = {st.n}) median ‖J‖_F {g2(t.median)}, RMS {g2(t.rms)}, "
            f"q/k gradient {t.grad_ratio:.3g}× scaled; vanishing starts at {st.vanish_k:.1f}·s_c "
            f"(d_k ≈ {st.vanish_d_k:.0f})")


def smallest(per_n: list[PerN]) -> str:
    """Why the rule has no effect size, and how far below the alternatives 1e-3 sits."""
    ratios = ", ".join(f"{r.uniform_limit / VANISH:.0f}× at n={r.n}" for r in per_n)
    return ("No effect size: vanished means ‖J‖_F < 1e-3, 500× below the largest ‖J‖_F a row "
            f"can have (1/2, a two-way tie), below the uniform value √(n−1)/n by {ratios}, and "
            "below bfloat16's unit roundoff 2⁻⁸ ≈ 3.9e-3; deep saturation's shapes are fixed by "
            "the mathematics (slope ratio 3.19 for an exponential over 10, 30, 100·s_c, 1 for a "
            "power law; the cutoff sits at their geometric middle, 1.79)")


def judge(ev: Evidence) -> Verdict:
    """C10: does the softmax Jacobian vanish at the logit scales the studies reach? (Rule:
    :data:`RULE`; deep saturation and its Monte Carlo check are context.)"""
    if not ev.curves:
        raise ValueError("evidence 'curves' must hold at least one n")
    laws = {law.n: law for law in ev.law or []}
    missing = [c.n for c in ev.curves if c.n not in laws]
    st = deciding(ev.studies)
    at = "; ".join(f"d_k = {', '.join(str(p.d_k) for p in x.points)} over n = {x.n} keys"
                   for x in ev.studies if x.points) or "not evaluated"
    regime = (f"the studies' scales decide: unscaled dot at init with unit-variance q, k "
              f"(s = √d_k; {at}); deep saturation (n = "
              f"{', '.join(str(c.n) for c in ev.curves)}, 10–100·s_c) and GPT-2 init are "
              "context" + ("; trained-model saturation from the report's runs" if ev.trained
                           else "; no trained-model data"))
    if missing:
        return Verdict(INCONCLUSIVE, RULE, f"missing evidence: no law for n={missing}",
                       {"per_n": []}, headline=f"{INCONCLUSIVE}: the law was not computed",
                       plain=["Not decided: the law of the row norm was not computed."],
                       regime=regime)
    per_n = [judge_n(c, laws[c.n]) for c in ev.curves]
    verdict = decide(st)
    because = "; ".join(
        f"n={r.n}: median {r.median_shape} (slope ratio {r.median_ratio:.2f}), RMS "
        f"{r.rms_shape} (ratio {r.rms_ratio:.2f}, slope {r.rms_slope:+.2f}), Monte Carlo "
        f"within {r.mc_gap:.3f}" for r in per_n)
    points = "; ".join(f"n={x.n} d_k={p.d_k}: {p.s_over_sc:.2f}·s_c, median {g2(p.median)}, "
                       f"RMS {g2(p.rms)}, q/k ×{p.grad_ratio:.3g}"
                       for x in ev.studies for p in x.points)
    because = f"studies: {points or 'not evaluated'} | deep: {because}"
    return Verdict(verdict, RULE, because,
                   {"per_n": per_n, "studies": ev.studies, "deep": deep_reading(per_n)},
                   headline=headline(verdict, st),
                   plain=[first(verdict, st), where_vanish(ev.studies, per_n),
                          context(ev, per_n)],
                   regime=regime, smallest=smallest(per_n))


def alt(ev: Mapping[str, Any], per_n: list[dict[str, Any]]) -> str:
    """Where the studies' unscaled logits sit against s_c and their ‖J‖_F; where the median
    row falls below 1e-3; the fraction below 1e-3 at 10·s_c."""
    judged = [r for r in per_n if finite(r.get("median"))]
    if not judged:
        raise ValueError("per_n: no n was judged")
    cross = ", ".join(f"{r['crossing_s_over_sc']:.1f}·s_c at n = {r['n']}" for r in judged
                      if finite(r.get("crossing_s_over_sc")))
    ends = ", ".join(f"{r['frac']:.0%} at n = {r['n']}" for r in judged)
    text = (f"The median row's softmax Jacobian norm ‖J‖_F falls below 1e-3 only at {cross}; "
            f"at {judged[0]['s_over_sc']:.0f}·s_c the share of rows below 1e-3 is {ends}, and "
            f"the RMS falls only like s^{judged[-1]['rms_slope']:+.2f}.")
    pts = [(x["n"], p) for x in ev.get("studies") or [] for p in x["points"]]
    if pts:
        n, t = max(pts, key=lambda np_: np_[1]["s_over_sc"])
        text += (f" The studies' unscaled logits reach only {t['s_over_sc']:.1f}·s_c (d_k = "
                 f"{t['d_k']}, n = {n}), where the median row's ‖J‖_F is {t['median']:.2g} and "
                 f"the RMS {t['rms']:.2g}.")
    return text


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Per-row ‖J‖_F median and quartiles (Monte Carlo), the RMS, the law at 10, 30, 100·s_c
    (``numbers["per_n"]``) and the studies' unscaled scales over their n keys, against
    s / s_c."""
    per_n = numbers["per_n"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, c in enumerate(ev["curves"]):
        x = [s / c["s_c"] for s in c["s"]]
        ax.plot(x, c["median"], color=f"C{i}", label=f"$n = {c['n']}$")
        ax.fill_between(x, np.maximum(c["q1"], 1e-12), c["q3"], color=f"C{i}", alpha=0.18)
        ax.plot(x, c["rms"], ls=":", color=f"C{i}")
    floor = 1e-14  # the law's median at 100·s_c (~1e-33) would squash the rest: noted instead
    for i, r in enumerate(per_n):  # the law, out to 100·s_c
        if "ks" in r:
            kept = [(k, m) for k, m in zip(r["ks"], r["law_median"], strict=True) if m > floor]
            ax.plot(*zip(*kept, strict=True), "x", color=f"C{i}", ms=6)
            ax.plot(r["ks"], r["law_rms"], "+", color=f"C{i}", ms=7)
    low = [m for r in per_n for m in r.get("law_median", []) if m <= floor]
    if low:
        ax.annotate(f"median row at 100·$s_c$: {min(low):.0e}–{max(low):.0e} (off scale)",
                    (0.98, 0.04), xycoords="axes fraction", ha="right", fontsize=8)
    pts = [p for x in ev.get("studies") or [] for p in x["points"]]
    handles = []
    if pts:
        ks = [p["s_over_sc"] for p in pts]
        ns = ", ".join(str(x["n"]) for x in ev["studies"] if x["points"])
        ax.axvspan(min(ks), max(ks), color="k", alpha=0.07)
        ax.plot(ks, [p["median"] for p in pts], "kD", ms=5)
        handles = [Patch(color="k", alpha=0.07, label=f"the studies' unscaled logits "
                         f"($n = {ns}$)"),
                   Line2D([], [], color="k", marker="D", ls="none", ms=5,
                          label="their median row")]
    ax.set_ylim(bottom=floor)
    ax.axhline(1e-3, color="grey", ls="--", lw=0.8)
    handles = [*ax.get_legend_handles_labels()[0],
               Line2D([], [], color="k", label="median row"),
               Patch(color="k", alpha=0.18, label="quartiles (middle half of rows)"),
               Line2D([], [], color="k", ls=":", label=r"RMS $\sqrt{\mathbb{E}\|J\|_F^2}$"),
               Line2D([], [], color="k", marker="x", ls="none",
                      label="median, top-two law (10, 30, 100 $s_c$)"),
               Line2D([], [], color="k", marker="+", ls="none", label="RMS, exact"),
               Line2D([], [], color="grey", ls="--", label="$10^{-3}$: vanished"), *handles]
    ax.set(yscale="log", xscale="log", xlabel=r"$s\,/\,s_c$,  $s_c=\sqrt{2\ln n}$",
           ylabel=r"$\|J\|_F$ per row, $J=\mathrm{diag}(p)-pp^\top$")
    rows = ev["curves"][0].get("rows")
    ax.set_title("C10: softmax Jacobian per row, $n$ i.i.d. $\\mathcal{N}(0,s^2)$ logits, "
                 f"Monte Carlo{f', {rows:,} rows per $s$' if rows else ''}", fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    return [save(fig, folder, "c10_jacobian", alt(ev, per_n))]


def step0_std(study: Study, runs: list[Run]) -> dict[str, dict[str, float]]:
    """init -> d_k -> unscaled dot's largest step-0 row logit std (over reported seeds and
    layers) in a one-head study; runs that logged none are left out."""
    out: dict[str, dict[str, float]] = {}
    for r in runs:
        history = r.history
        if r.variant != "dot" or r.seed not in study.seeds or not history:
            continue
        vals = [x.get("row_logit_std") for x in history[0].get("layers") or []]
        vals = [float(v) for v in vals if v is not None and math.isfinite(v)]
        if vals:
            row = out.setdefault(str(r.config.model.init), {})
            d = str(r.config.model.d_model)
            row[d] = max(row.get(d, 0.0), *vals)
    return out


def gather(src: Sources) -> dict[str, Any]:
    """The measurement, the head-dimension study's trained saturation and its step-0 spreads."""
    return {**src.measured["jacobian"],
            "trained": trained_saturation(src.study("head_dim", head_dim_evidence)),
            "measured_std": src.study("head_dim", step0_std)}


def scale(p: Preset) -> str:
    """The Monte Carlo rows per (n, s), the studies' scales, and the head-dimension study the
    trained saturation comes from."""
    at = "; ".join(f"d_k = {', '.join(map(str, dks))} over n = {n} keys"
                   for n, dks in study_scales(p).items())
    return (f"{p.jacobian_rows} random rows per (n, s); the studies' unscaled scales s = √d_k "
            f"({at}); head_dim: {study_scale(studies(p)['head_dim'])}")


CLAIM = register(Claim(
    id="C10", text="A saturated softmax gives vanishing gradients.",
    measures="the per-row softmax Jacobian and the q/k gradient at the studies' logit scales; "
             "the law of the row norm deep in saturation as context", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw, studies=("head_dim",),
    measurements=(Measurement("jacobian", params, measure),), scale=scale))
