"""C13: "For large d_k, unscaled dot products grow large, push the softmax into regions with
small gradients, and so underperform; 1/√d_k counteracts this" (Vaswani et al. 2017, arXiv
1706.03762, §3.2.1, footnote 4).

Read from the head-dimension study in the paper's own regime (q, k components of unit
variance at init): the unscaled gap at the largest d_k, and its growth per doubling of d_k.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Says, Sources, register
from attnscale.audit.compare import family
from attnscale.audit.evidence import Arm, HeadDim, head_dim_evidence
from attnscale.audit.figures import fig_head_dim
from attnscale.audit.readings import REGIMES, UNIT, entropy_text, gap_pairs, gap_text, gaps, split
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Verdict,
)
from attnscale.audit.words import fx
from attnscale.lab.paired import EQUAL, GREATER, LESS, NOT_MEASURABLE

SLOPE_DELTA = 0.01  # nats per doubling of d_k
RULE = ("Same study, unit-variance regime. Supported if dot − scaled_dot clipped loss at the "
        "largest d_k reads greater (unscaled worse by more than 0.02 nats) AND the per-seed "
        "slope of the gap against log2 d_k reads greater than 0.01 nats per doubling; "
        "refuted if the gap at the largest d_k is no larger than 0.02 nats (non-inferior); "
        "depends if the gap is there but does not grow; inconclusive otherwise. The rule "
        "reads the two comparisons only through 'and', so each is tested alone; the gaps "
        "at smaller d_k and the GPT-2-init regime are shown beside it")


def slope_pair(ev: HeadDim, init: str) -> tuple[Arm, Arm]:
    """Per seed, the least-squares slope of the dot − scaled gap against log2 d_k, paired with
    0 (censored if any cell's arm is)."""
    per_seed: dict[str, float] = {}
    for s in map(str, ev.seeds):
        pts = []
        for d in ev.head_dims:
            a, b = ev.arm(init, d, "dot"), ev.arm(init, d, "scaled_dot")
            if a and b and s in a.values and s in b.values:
                pts.append((math.log2(d), a.values[s] - b.values[s]))
        if len(pts) == len(ev.head_dims) and len(ev.head_dims) > 1:
            per_seed[s] = float(np.polyfit(*zip(*pts, strict=True), 1)[0])
    censored = any(arm.censored for d in ev.head_dims
                   for arm in (ev.arm(init, d, "dot"), ev.arm(init, d, "scaled_dot")) if arm)
    return (Arm(values=per_seed, censored=censored),
            Arm(values=dict.fromkeys(per_seed, 0.0)))


def judge(ev: HeadDim) -> Verdict:
    """Unscaled attention's gap to scaled at the largest d_k, and its growth with d_k."""
    big = str(ev.head_dims[-1])
    pairs = {**{f"gap {d}": p for d, p in gap_pairs(ev, UNIT).items()},
             "slope": slope_pair(ev, UNIT)}
    context = [[k for k in pairs if k.startswith("gap ") and k != f"gap {big}"]]
    comps = family(pairs, {k: SLOPE_DELTA if k == "slope" else LOSS_DELTA for k in pairs},
                   holm_over=[g for g in context if g])
    dot, slope = split(comps, "gap "), comps["slope"]
    last = dot[big].reading
    if dot[big].greater() and slope.greater():
        verdict = SUPPORTED
    elif dot[big].no_worse():
        verdict = REFUTED
    elif dot[big].greater() and slope.no_worse():
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    other = {init: gaps(ev, init) for init in ev.inits if init != UNIT}
    ctx = "; ".join(f"{init}: {gap_text(c)}" for init, c in other.items())
    how = {EQUAL: "the small init keeps unscaled logits small there",
           LESS: "unscaled is better there", GREATER: "the gap shows there too",
           INCONCLUSIVE: "undecided there",
           NOT_MEASURABLE: "the two arms trained identically there"}
    last_line = {
        SUPPORTED: "So the paper's suspicion holds in its own regime: without 1/√d_k the loss "
                   "gap grows with d_k.",
        REFUTED: "So in its own regime the paper's suspicion does not show at this budget.",
        DEPENDS: "The gap is there, but it does not grow with d_k at this budget.",
        INCONCLUSIVE: "The intervals are too wide to decide at this many seeds.",
    }[verdict]
    plain = [
        f"In Vaswani's regime the unscaled gap at d_k={big} is {dot[big].mean:+.3f} nats "
        f"({last}) and changes by {slope.mean:+.3f} nats per doubling of d_k "
        f"({slope.reading}).",
        *(f"With {init} init the gap at d_k={big} is {c[big].mean:+.3f} nats "
          f"({c[big].reading}): {how[c[big].reading]}." for init, c in other.items()),
        last_line]
    entropy = "; ".join(entropy_text(ev, init, big) for init in ev.inits)
    return Verdict(verdict, RULE, f"unit: {gap_text(dot)}; slope "
                   f"{slope.effect('nats/doubling')}; {entropy}; context {ctx}",
                   {"gaps": dot, "slope": slope, "context": other},
                   headline=f"{verdict}: gap {dot[big].mean:+.3f} nats at d_k={big}, "
                   f"slope {slope.mean:+.3f}/doubling", plain=plain,
                   regime=REGIMES[UNIT], smallest=LOSS_WHY + "; slope: 0.01 nats per doubling")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The head-dimension figure, captioned with the gap, its slope and the GPT-2 regime."""
    other = numbers["context"].get("gpt2", {})
    alt = T.head_dim_alt(ev, numbers["gaps"], other, numbers["slope"])
    return [fig_head_dim(ev, folder, alt, "c13_head_dim")]


def gather(src: Sources) -> dict[str, Any]:
    return src.study("head_dim", head_dim_evidence)


def says_scale(e: dict[str, Any]) -> list[str]:
    """What 1/√d_k buys, and in which regime: the gap at the largest d_k, then each context."""
    gaps, slope = e["numbers"]["gaps"], e["numbers"]["slope"]
    big = max(gaps, key=int)
    g = gaps[big]
    lead = {SUPPORTED: f"costs {fx(g)} of eval loss at d_k = {big}, and {slope['mean']:+.3f} "
                       f"nats more per doubling of d_k",
            DEPENDS: f"costs {fx(g)} at d_k = {big}, but the cost did not grow with d_k",
            REFUTED: f"cost nothing we could measure up to d_k = {big} ({fx(g)})",
            INCONCLUSIVE: f"had a cost we could not decide ({fx(g)} at d_k = {big})"}
    out = [f"Where Vaswani et al.'s argument applies (q and k with unit-variance components), "
           f"dropping 1/√d_k {lead[e['verdict']]} (C13)."]
    for init, gs in e["numbers"].get("context", {}).items():
        if big in gs and gs[big].get("n"):
            how = {EQUAL: "no measurable cost: the small init already keeps q·k small",
                   GREATER: "a cost there too, though the small init starts q·k far below 1",
                   LESS: "unscaled is better there"}.get(gs[big]["reading"], "undecided")
            out.append(f"With {'GPT-2' if init == 'gpt2' else init} init (weights of std 0.02) "
                       f"the gap at d_k = {big} is {fx(gs[big])}: {how}.")
    return out


def says_answer(e: dict[str, Any]) -> list[str]:
    """Keep the scale or not, in one sentence from the verdict."""
    return [{SUPPORTED: "Keep 1/√d_k (or a score that sets the logit scale another way; the "
                        "alternatives below say which held up): with q and k of unit-variance "
                        "components at init, dropping it costs loss, and more the larger d_k "
                        "(C13).",
             DEPENDS: "Keep 1/√d_k: without it the loss was worse at large d_k, though the gap "
                      "did not grow with d_k here (C13).",
             REFUTED: "At this scale dropping 1/√d_k cost nothing measurable (C13).",
             INCONCLUSIVE: "Whether dropping 1/√d_k costs loss was not decided at this scale "
                           "(C13)."}[e["verdict"]]]


CLAIM = register(Claim(
    id="C13", text="(Paper) For large d_k unscaled attention underperforms; 1/√d_k "
    "counteracts it.", measures="unscaled vs scaled over d_k: the gap and its slope",
    rule=RULE, evidence=HeadDim, gather=gather, judge=judge, draw=draw,
    studies=("head_dim",),
    says=(Says("answer", says_answer, rank=10), Says("scale", says_scale, rank=10))))
