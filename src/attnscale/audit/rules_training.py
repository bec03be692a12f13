"""The rules for the claims the head-dimension and LR studies decide (C6, C7, C11, C12, C13,
Q1).

Each ``judge_*`` is a pure function of its claim's evidence (:mod:`attnscale.audit.evidence`):
paired per-seed differences, read against a stated smallest effect with Holm's correction
over the comparisons the rule combines through "some" or "or" (:mod:`attnscale.audit.compare`);
"equal or better" is a non-inferiority reading (:func:`attnscale.audit.compare.no_worse`).
A difference "a − b" of losses is positive when a is worse. The claims are stated in docs/claims.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnscale.audit.compare import family, mean, no_worse
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Evidence,
    Verdict,
    aggregate,
    fmt_effect,
)
from attnscale.lab.paired import EQUAL, GREATER, LESS

UNIT = "unit"  # Vaswani's regime: q and k components of unit variance at init
REGIMES = {"unit": "q, k components of unit variance at init (Vaswani's assumption)",
           "gpt2": "GPT-2 init (weights std 0.02 behind LayerNorm: q·k ≪ 1 at init)"}
SLOPE_DELTA = 0.01  # nats per doubling of d_k


def cell(init: str, d: Any) -> str:
    """The head-dimension study's cell label."""
    return f"init={init} d_model={d}"


def gap_pairs(ev: Evidence, init: str, arm: str = "dot") -> dict[str, Any]:
    """d_k -> (``arm``, scaled_dot) per-seed clipped losses in one init regime."""
    loss = ev["loss"]
    return {str(d): (loss.get(cell(init, d), {}).get(arm),
                     loss.get(cell(init, d), {}).get("scaled_dot")) for d in ev["head_dims"]}


def gaps(ev: Evidence, init: str, arm: str = "dot") -> dict[str, Any]:
    """``arm`` − scaled_dot clipped loss at each d_k of one init regime (Holm within)."""
    return family(gap_pairs(ev, init, arm), LOSS_DELTA)


def split(comps: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The comparisons named ``prefix`` + key, keyed by what follows the prefix."""
    return {k[len(prefix):]: c for k, c in comps.items() if k.startswith(prefix)}


def entropy_text(ev: Evidence, init: str, d: Any) -> str:
    """Layer-1 attention entropy / ln n at init and at the end, dot and scaled_dot, one cell."""
    parts = []
    for arm in ("dot", "scaled_dot"):
        start = mean(ev["entropy_init"].get(cell(init, d), {}).get(arm))
        end = mean(ev["entropy_end"].get(cell(init, d), {}).get(arm))
        parts.append(f"{arm} {start:.2f} → {end:.2f}")
    return f"layer-1 entropy/ln n at d_k={d} ({init} init): " + ", ".join(parts)


def gap_text(c: dict[str, Any]) -> str:
    return ", ".join(f"d_k={d}: {fmt_effect(x, 'nats')}" for d, x in c.items())


C7_RULE = ("Head-dimension study, one head, d_model = d_k, in the unit-variance regime; each arm "
           "at the LR its tuning seeds chose. Per d_k, the paired difference of clipped eval "
           "loss dot − scaled_dot and dot_absorbed − scaled_dot (dot with q, k init and LR × "
           "d_k^(−1/4)). Supported (a constant the LR grid absorbs) if dot is no worse "
           "(non-inferior within δ) at every d_k; depends (absorbed only by rescaling q and k) "
           "if dot is worse at some d_k and dot_absorbed is no worse there; refuted if "
           "dot_absorbed is also worse there; inconclusive otherwise. Holm over the dot "
           "comparisons (read through 'some d_k'); each dot_absorbed comparison alone")


def judge_c7(ev: Evidence) -> Verdict:
    """C7: whether a plain LR grid, or a q/k rescaling, absorbs the constant 1/√d_k."""
    pairs = {**{f"dot {d}": p for d, p in gap_pairs(ev, UNIT).items()},
             **{f"absorbed {d}": p for d, p in gap_pairs(ev, UNIT, "dot_absorbed").items()}}
    comps = family(pairs, LOSS_DELTA, holm_over=[[k for k in pairs if k.startswith("dot ")]])
    dot, absorbed = split(comps, "dot "), split(comps, "absorbed ")
    worse = [d for d, c in dot.items() if c["reading"] == GREATER]
    fine = [no_worse(c) for c in dot.values()]
    if fine and all(fine):
        verdict = SUPPORTED
    elif worse and all(no_worse(absorbed[d]) for d in worse):
        verdict = DEPENDS
    elif worse and any(absorbed[d]["reading"] == GREATER for d in worse):
        verdict = REFUTED
    else:
        verdict = INCONCLUSIVE
    big = str(ev["head_dims"][-1])
    d_, a_ = dot[big], absorbed[big]
    at = f"at d_k={big}: plain dot {d_['mean']:+.3f} nats ({d_['reading']}), dot with q, k init " \
         f"and LR × d_k^(−1/4) {a_['mean']:+.3f} ({a_['reading']}) against scaled_dot"
    first = {
        SUPPORTED: f"Right: at its own tuned LR plain dot matches scaled_dot at every d_k ({at}).",
        DEPENDS: f"Partly right: the constant can be absorbed, but by rescaling q and k, not by "
                 f"the LR alone ({at}); plain dot is worse at d_k = {', '.join(worse)}.",
        REFUTED: f"Wrong: unscaled attention stays worse even with q and k rescaled ({at}).",
        INCONCLUSIVE: f"Undecided: the intervals are too wide to call ({at}).",
    }[verdict]
    context = [f"With {init} init plain dot is {c[big]['mean']:+.3f} nats from scaled_dot at "
               f"d_k={big} ({c[big]['reading']})." for init, c in
               ((i, gaps(ev, i)) for i in ev["inits"] if i != UNIT)]
    plain = [first, *context, "The absorbed arm is exact under Adam only without gradient "
             "clipping and with ε → 0; the report trains with clipping at 1."]
    return Verdict(verdict, C7_RULE, f"dot − scaled: {gap_text(dot)}; dot_absorbed − scaled: "
                   f"{gap_text(absorbed)}", {"dot": dot, "absorbed": absorbed},
                   headline=f"{verdict}: at d_k={big} dot {dot[big]['mean']:+.3f} nats, "
                   f"absorbed {absorbed[big]['mean']:+.3f}", plain=plain,
                   regime=REGIMES[UNIT], smallest=LOSS_WHY)


def slope_pair(ev: Evidence, init: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per seed, the least-squares slope of the dot − scaled gap against log2 d_k, paired with
    0 (censored if any cell's arm is)."""
    loss, dks = ev["loss"], ev["head_dims"]
    per_seed: dict[str, float] = {}
    for s in map(str, ev["seeds"]):
        pts = []
        for d in dks:
            row = loss.get(cell(init, d), {})
            a, b = row.get("dot"), row.get("scaled_dot")
            if a and b and s in a["values"] and s in b["values"]:
                pts.append((math.log2(d), a["values"][s] - b["values"][s]))
        if len(pts) == len(dks) and len(dks) > 1:
            per_seed[s] = float(np.polyfit(*zip(*pts, strict=True), 1)[0])
    censored = any(arm.get("censored") for d in dks for arm in (
        loss.get(cell(init, d), {}).get("dot"), loss.get(cell(init, d), {}).get("scaled_dot"))
        if arm)
    return ({"values": per_seed, "censored": censored},
            {"values": dict.fromkeys(per_seed, 0.0), "censored": False})


C13_RULE = ("Same study, unit-variance regime. Supported if dot − scaled_dot clipped loss at the "
            "largest d_k reads greater (unscaled worse by more than 0.02 nats) AND the per-seed "
            "slope of the gap against log2 d_k reads greater than 0.01 nats per doubling; "
            "refuted if the gap at the largest d_k is no larger than 0.02 nats (non-inferior); "
            "depends if the gap is there but does not grow; inconclusive otherwise. The rule "
            "reads the two comparisons only through 'and', so each is tested alone; the gaps "
            "at smaller d_k and the GPT-2-init regime are shown beside it")


def judge_c13(ev: Evidence) -> Verdict:
    """C13: unscaled attention's gap to scaled at the largest d_k, and its growth with d_k."""
    big = str(ev["head_dims"][-1])
    pairs = {**{f"gap {d}": p for d, p in gap_pairs(ev, UNIT).items()},
             "slope": slope_pair(ev, UNIT)}
    context = [[k for k in pairs if k.startswith("gap ") and k != f"gap {big}"]]
    comps = family(pairs, {k: SLOPE_DELTA if k == "slope" else LOSS_DELTA for k in pairs},
                   holm_over=[g for g in context if g])
    dot, slope = split(comps, "gap "), comps["slope"]
    last = dot[big]["reading"]
    if last == GREATER and slope["reading"] == GREATER:
        verdict = SUPPORTED
    elif no_worse(dot[big]):
        verdict = REFUTED
    elif last == GREATER and no_worse(slope):
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    other = {init: gaps(ev, init) for init in ev["inits"] if init != UNIT}
    ctx = "; ".join(f"{init}: {gap_text(c)}" for init, c in other.items())
    how = {EQUAL: "the small init keeps unscaled logits small there",
           LESS: "unscaled is better there", GREATER: "the gap shows there too",
           INCONCLUSIVE: "undecided there"}
    last_line = {
        SUPPORTED: "So the paper's suspicion holds in its own regime: without 1/√d_k the loss "
                   "gap grows with d_k.",
        REFUTED: "So in its own regime the paper's suspicion does not show at this budget.",
        DEPENDS: "The gap is there, but it does not grow with d_k at this budget.",
        INCONCLUSIVE: "The intervals are too wide to decide at this many seeds.",
    }[verdict]
    plain = [
        f"In Vaswani's regime the unscaled gap at d_k={big} is {dot[big]['mean']:+.3f} nats "
        f"({last}) and changes by {slope['mean']:+.3f} nats per doubling of d_k "
        f"({slope['reading']}).",
        *(f"With {init} init the gap at d_k={big} is {c[big]['mean']:+.3f} nats "
          f"({c[big]['reading']}): {how[c[big]['reading']]}." for init, c in other.items()),
        last_line]
    slope_text = fmt_effect(slope, "nats/doubling")
    entropy = "; ".join(entropy_text(ev, init, big) for init in ev["inits"])
    return Verdict(verdict, C13_RULE, f"unit: {gap_text(dot)}; slope {slope_text}; {entropy}; "
                   f"context {ctx}", {"gaps": dot, "slope": slope, "context": other},
                   headline=f"{verdict}: gap {dot[big]['mean']:+.3f} nats at d_k={big}, "
                   f"slope {slope['mean']:+.3f}/doubling", plain=plain,
                   regime=REGIMES[UNIT], smallest=LOSS_WHY + "; slope: 0.01 nats per doubling")


def text_pairs(ev: Evidence, rivals: tuple[str, ...], base: str = "scaled_dot") -> dict:
    """rival − base clipped loss in every width cell of the LR study."""
    return {f"{cell_}: {r}": (row.get(r), row.get(base))
            for cell_, row in ev["loss"].items() for r in rivals if r in row}


C6_RULE = ("Scaled dot product against the thread's alternatives (unscaled dot, cosine τ=1) on "
           "character-level text at each width (LR chosen leave-one-seed-out on the grid) and on "
           "retrieval among fillers at n=32 (LR chosen on tuning seeds): paired clipped-loss "
           "differences rival − scaled_dot, Holm-corrected over all of them (the rule's "
           "'depends' reads them through 'some'). Supported if every rival is worse by more "
           "than 0.02 nats; refuted if every rival is no worse (non-inferior within δ); "
           "depends if some are worse and some no worse; inconclusive otherwise")


def judge_c6(ev: Evidence) -> Verdict:
    """C6: scaled_dot against dot and cosine τ=1 on every task and width."""
    pairs = text_pairs(ev["text"], ("dot", "cosine_tau1"))
    pairs.update({f"retrieval: {r}": (ev["retrieval"]["loss"]["all"].get(r),
                                      ev["retrieval"]["loss"]["all"].get("scaled_dot"))
                  for r in ("dot", "cosine_tau1")})
    comps = family(pairs, LOSS_DELTA)
    marks = ["worse" if c["reading"] == GREATER else "fine" if no_worse(c) else INCONCLUSIVE
             for c in comps.values()]
    verdict = aggregate(marks, {"worse"}, {"fine"})
    lost = [k for k, c in comps.items() if c["reading"] == GREATER]
    held = [k for k, c in comps.items() if no_worse(c)]
    plain = [f"Scaled dot product beats {len(lost)} of {len(comps)} comparisons "
             f"({', '.join(lost) or 'none'}).",
             f"It is matched or beaten in {', '.join(held) or 'none'}.",
             {SUPPORTED: "Scaled dot product wins every comparison, each arm at its own LR.",
              REFUTED: "No comparison favours scaled dot product, each arm at its own LR.",
              DEPENDS: "Which alternative and which task decide it; each arm had its own LR.",
              INCONCLUSIVE: "Most comparisons are undecided at this many seeds."}[verdict]]
    return Verdict(verdict, C6_RULE, "; ".join(f"{k} {fmt_effect(c, 'nats')}"
                                               for k, c in comps.items()), comps,
                   headline=f"{verdict}: scaled better in {len(lost)}/{len(comps)}",
                   plain=plain, regime="GPT-2 init; text at two widths; retrieval at n = 32",
                   smallest=LOSS_WHY)
