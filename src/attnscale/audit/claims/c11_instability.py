"""C11: "Training is unstable without scaling, especially for larger models" (the thread; the
attention-logit growth behind it is Wortsman et al. 2023, arXiv 2309.14322).

Read from the text LR sweep at two widths, GPT-2 init: per width, paired per-seed differences
dot − scaled_dot of LR sensitivity (mean clipped loss over the grid above a reference shared by
both arms) and of the unstable fraction of the grid (a divergence, or a loss that blew up and
stayed up), and the growth of the sensitivity excess from the smaller to the larger width.
Holm over the per-width comparisons (read through "or" and "somewhere"); the growth, only ever
read through "and", alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import Pair, family
from attnscale.audit.evidence import Arm, LRText, lr_text_evidence
from attnscale.audit.figure_text import finite, n_seeds, sci
from attnscale.audit.figures import fig_forest
from attnscale.audit.interval import Comparison
from attnscale.audit.sweep_readings import (
    GPT2,
    SweepKey,
    divergence_counts,
    sweep_arm,
    sweep_regime,
)
from attnscale.audit.theory_plots import below, save
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Verdict,
)
from attnscale.lab.paired import GREATER

RULE = ("LR sweep at two widths, GPT-2 init. Per width, paired "
        "per-seed differences dot − scaled_dot of LR sensitivity (mean clipped loss over "
        "the grid above a reference shared by both arms; smallest effect 0.02 nats) and "
        "of the unstable fraction of the grid (divergence, or a loss that blew up and "
        "stayed up; smallest effect 0.6/|grid|: one more unstable LR is real); and "
        "the growth of the sensitivity excess from the smaller to the larger width. "
        "Supported if dot is more sensitive or more unstable at the larger width AND the "
        "sensitivity excess grows with width; refuted if dot is no worse (non-inferior "
        "within δ) on both measures at every width; depends if dot is worse somewhere but "
        "the excess does not grow; inconclusive otherwise. Holm over the per-width "
        "comparisons (the rule reads them through 'or' and 'somewhere'); the growth, only "
        "ever read through 'and', alone")

Evidence = LRText  # the text LR study (evidence.lr_text_evidence), typed


def excess(ev: LRText, key: SweepKey, arm: str = "dot") -> Arm:
    """Per-seed ``arm`` − scaled_dot difference of ``key`` at the largest minus the smallest
    width, (a_L − s_L) − (a_S − s_S): does the excess grow with width?"""
    w = list(ev.sweep)
    if len(w) < 2:
        return Arm(values={})
    small, large = (ev.sweep[x] for x in (w[0], w[-1]))
    if arm not in small or arm not in large:
        return Arm(values={})
    a_s, a_l = getattr(small[arm], key), getattr(large[arm], key)
    s_s, s_l = getattr(small["scaled_dot"], key), getattr(large["scaled_dot"], key)
    seeds = sorted(set(a_s) & set(a_l) & set(s_s) & set(s_l))
    return Arm(values={s: (a_l[s] - s_l[s]) - (a_s[s] - s_s[s]) for s in seeds})


def unstable_delta(ev: LRText) -> float:
    """The smallest real difference of unstable fractions: 0.6/|grid|, under one LR (0.1 for
    a six-point grid, and for an empty one)."""
    return 0.6 / max(1, len(ev.lrs or range(6)))


def c11_family(ev: LRText) -> dict[str, Comparison]:
    """Sensitivity and instability comparisons per width (one Holm family), and the growth of
    the excess against zero (alone)."""
    pairs: dict[str, Pair] = {}
    deltas: dict[str, float] = {}
    for w in ev.sweep:
        key: SweepKey
        for key, delta in (("sensitivity", LOSS_DELTA), ("unstable", unstable_delta(ev))):
            pairs[f"{w} {key}"] = (sweep_arm(ev, w, "dot", key),
                                   sweep_arm(ev, w, "scaled_dot", key))
            deltas[f"{w} {key}"] = delta
    grow = excess(ev, "sensitivity")
    pairs["growth"] = (grow, Arm(values=dict.fromkeys(grow.values, 0.0)))
    deltas["growth"] = LOSS_DELTA
    return family(pairs, deltas, holm_over=[[k for k in pairs if k != "growth"]])


def verdict_of(comps: Mapping[str, Comparison], largest: str) -> str:
    """Supported, refuted, depends or inconclusive, as :data:`RULE` says."""
    large = [comps[f"{largest} {k}"].reading for k in ("sensitivity", "unstable")]
    per_width = [c for k, c in comps.items() if k != "growth"]
    growth = comps["growth"]
    if GREATER in large and growth.greater():
        return SUPPORTED
    if per_width and all(c.no_worse() for c in per_width):
        return REFUTED
    if any(c.greater() for c in per_width) and growth.no_worse():
        return DEPENDS
    return INCONCLUSIVE


def judge(ev: LRText) -> Verdict:
    """C11: instability and LR sensitivity of unscaled against scaled, and their growth."""
    widths = list(ev.sweep)
    if not widths:
        return Verdict(INCONCLUSIVE, RULE, "no LR sweep was run", regime=GPT2)
    comps = c11_family(ev)
    verdict = verdict_of(comps, widths[-1])
    sens, unst = comps[f"{widths[-1]} sensitivity"], comps[f"{widths[-1]} unstable"]
    peaks = {}
    for w in widths:
        dot = ev.sweep[w].get("dot")
        peaks[w] = max((v for v in (dot.peak_logit_by_lr if dot else {}).values()
                        if v is not None), default=math.nan)
    counts = divergence_counts(ev)
    plain = [
        f"At width {widths[-1]} unscaled attention's LR sensitivity differs from scaled by "
        f"{sens.mean:+.3f} nats (its mean loss over the grid, "
        f"against a shared reference) and its unstable share of the grid by "
        f"{unst.mean:+.2f} ({sens.reading}, {unst.reading}).",
        f"Its largest logits reach {', '.join(f'{v:.3g} (width {w})' for w, v in peaks.items())}"
        f"; {counts['past']} of {counts['runs']} runs passed 1e4, the growth Wortsman et al. "
        f"saw before divergence, and {counts['diverged']} diverged.",
        f"Growth with width: {comps['growth'].effect('nats')}; the answer depends on the LR "
        "range one is willing to tune over."]
    grid = ", ".join(f"{x:g}" for x in ev.lrs)
    return Verdict(verdict, RULE.replace("LR sweep", f"LR sweep ({grid})", 1),
                   "; ".join(f"{k}: {c.effect()}" for k, c in comps.items()), comps,
                   headline=f"{verdict}: width {widths[-1]} sensitivity {sens.mean:+.3f} nats",
                   plain=plain, regime=sweep_regime(ev, counts),
                   smallest=f"{LOSS_WHY}; instability: {unstable_delta(ev):.2g} of the grid, "
                   "so one more unstable LR counts")


def alt(ev: Mapping[str, Any]) -> str:
    """Per arm at the largest width, the first LR whose mean peak logit passes 1e4."""
    width = list(ev["sweep"])[-1]
    limit = ev["logit_limit"]
    parts = []
    for arm in ("dot", "scaled_dot", "qk_layernorm"):
        peaks = {float(lr): v for lr, v in ev["sweep"][width].get(arm, {})
                 .get("peak_logit_by_lr", {}).items() if finite(v)}
        if not peaks:
            continue
        past = [lr for lr, v in sorted(peaks.items()) if v > limit]
        parts.append(f"{arm} from LR {past[0]:g}" if past else
                     f"{arm} at no LR (largest {sci(max(peaks.values()))})")
    if not parts:
        raise ValueError("ev: no peak logits at the largest width")
    return (f"At {width.replace('d_model=', 'width ')} the mean peak max |logit| passes "
            f"Wortsman et al.'s {sci(limit)} instability marker for {', '.join(parts)}; larger "
            f"LRs give larger logits in every arm.")


def fig_logits(ev: Mapping[str, Any], folder: Path) -> Figure:
    """Max |logit| against step, one panel per (width, arm): unscaled, scaled and QK-LayerNorm
    (Wortsman et al. 2023's attention-logit growth, and its remedy); one colour per LR from
    one sequential colormap, one colorbar for every panel."""
    widths = list(ev["sweep"])
    arms = [a for a in ("dot", "scaled_dot", "qk_layernorm") if a in ev["sweep"][widths[-1]]]
    lrs = sorted(float(x) for x in ev["lrs"])
    norm = LogNorm(lrs[0], lrs[-1] * (1.0001 if len(lrs) == 1 else 1))  # one LR: vmin < vmax
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(len(widths), len(arms), figsize=(3.5 * len(arms) + 1.2,
                             2.6 * len(widths) + 0.9), sharex=True, sharey=True, squeeze=False,
                             layout="constrained")
    for (r, w), (col, arm) in ((x, y) for x in enumerate(widths) for y in enumerate(arms)):
        ax = axes[r, col]
        for lr, curve in ev["sweep"][w].get(arm, {}).get("logit_curves", {}).items():
            pts = [(s, v) for s, v in curve if finite(v) and v > 0]
            if pts:
                ax.plot(*zip(*pts, strict=True), color=cmap(norm(float(lr))), lw=1.4)
        ax.axhline(ev["logit_limit"], color="C3", ls="--", lw=0.9)
        ax.set_yscale("log")
        ax.set_title(f"{arm}, {w.replace('d_model=', 'width ')}", fontsize=10)
        if r == len(widths) - 1:
            ax.set_xlabel("step")
        if col == 0:
            ax.set_ylabel("max |logit|")
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="peak LR")
    bar.set_ticks(lrs, labels=[f"{x:g}" for x in lrs])
    bar.minorticks_off()
    fig.suptitle("C11: max |logit| during training, char-level text, GPT-2 init, first seed "
                 "at each LR", fontsize=11)
    below(fig, [Line2D([], [], color="C3", ls="--", label=f"{sci(ev['logit_limit'])}: "
                       "Wortsman et al. 2023's instability marker")], ncol=1)
    return save(fig, folder, "c11_max_logit", alt(ev))


def sweep_unit(key: str) -> str:
    """C11's comparisons: LR sensitivity (and its growth) in nats, instability as a share."""
    return "share of LR grid" if key.endswith("unstable") else "nats"


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Max |logit| against step per width and arm, and the forest plot of the rule's
    comparisons (sensitivity in nats, instability as a share of the grid)."""
    title = (f"C11: dot − scaled_dot, LR sweep, {n_seeds(numbers)} seeds, mean and 95% CI")
    return [fig_logits(ev, folder),
            fig_forest(dict(numbers), folder, "c11_effects", title, sweep_unit,
                       "Unscaled minus scaled LR sensitivity and instability")]


def gather(src: Sources) -> dict[str, Any]:
    """The text LR study's evidence (:func:`attnscale.audit.evidence.lr_text_evidence`)."""
    return src.study("lr_text", lr_text_evidence)


CLAIM = register(Claim(
    id="C11", text="Training is unstable without scaling, especially for larger models.",
    measures="LR sweeps at two widths: instability, LR sensitivity, max |logit|",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("lr_text",)))
