"""The rules for the claims the head-dimension and LR studies decide (C6, C7, C11, C12, C13,
Q1).

Each ``judge_*`` is a pure function of its claim's evidence (:mod:`attnscale.audit.evidence`):
paired per-seed differences, read against a stated smallest effect with Holm's correction
across the claim's comparisons (:mod:`attnscale.audit.compare`). A difference "a − b" of
losses is positive when a is worse. The claims are stated in docs/claims.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnscale.audit.compare import family, mean, readings
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


def gaps(ev: Evidence, init: str, arm: str = "dot") -> dict[str, Any]:
    """``arm`` − scaled_dot clipped loss at each d_k of one init regime (Holm within)."""
    loss = ev["loss"]
    return family({str(d): (loss.get(cell(init, d), {}).get(arm),
                            loss.get(cell(init, d), {}).get("scaled_dot"))
                   for d in ev["head_dims"]}, LOSS_DELTA)


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
           "d_k^(−1/4)), Holm-corrected. Supported (a constant the LR grid absorbs) if dot reads "
           "equal or better at every d_k; depends (absorbed only by rescaling q and k) if dot is "
           "worse at some d_k and dot_absorbed is equal or better there; refuted if dot_absorbed "
           "is also "
           "worse there; inconclusive otherwise")


def judge_c7(ev: Evidence) -> Verdict:
    """C7: whether a plain LR grid, or a q/k rescaling, absorbs the constant 1/√d_k."""
    dot, absorbed = gaps(ev, UNIT), gaps(ev, UNIT, "dot_absorbed")
    worse = [d for d, c in dot.items() if c["reading"] == GREATER]
    fine = [c["reading"] in (EQUAL, LESS) for c in dot.values()]
    if fine and all(fine):
        verdict = SUPPORTED
    elif worse and all(absorbed[d]["reading"] in (EQUAL, LESS) for d in worse):
        verdict = DEPENDS
    elif worse and any(absorbed[d]["reading"] == GREATER for d in worse):
        verdict = REFUTED
    else:
        verdict = INCONCLUSIVE
    big = str(ev["head_dims"][-1])
    plain = [
        f"Right: 1/√d_k is a constant, and rescaling q and k absorbs it — dot with q, k init "
        f"and LR × d_k^(−1/4) differs from scaled_dot by {absorbed[big]['mean']:+.3f} nats at "
        f"d_k={big} ({absorbed[big]['reading']}).",
        f"Wrong: the learning rate alone does not absorb it — plain dot at its own best LR is "
        f"{dot[big]['mean']:+.3f} nats from scaled_dot at d_k={big} ({dot[big]['reading']}).",
        "It depends on the init: with unit-variance q and k the unscaled logits start at std "
        "√d_k; with small (GPT-2) init they start near 0 and the constant matters less."]
    return Verdict(verdict, C7_RULE, f"dot − scaled: {gap_text(dot)}; dot_absorbed − scaled: "
                   f"{gap_text(absorbed)}", {"dot": dot, "absorbed": absorbed},
                   headline=f"{verdict}: at d_k={big} dot {dot[big]['mean']:+.3f} nats, "
                   f"absorbed {absorbed[big]['mean']:+.3f}", plain=plain,
                   regime=REGIMES[UNIT], smallest=LOSS_WHY)


def slope_family(ev: Evidence, init: str) -> dict[str, Any]:
    """Per seed, the least-squares slope of the dot − scaled gap against log2 d_k; the slope's
    paired comparison against 0 (smallest effect :data:`SLOPE_DELTA` nats per doubling)."""
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
    arm = {"values": per_seed, "censored": False}
    zero = {"values": dict.fromkeys(per_seed, 0.0), "censored": False}
    return family({"slope": (arm, zero)}, SLOPE_DELTA)["slope"]


C13_RULE = ("Same study, unit-variance regime. Supported if dot − scaled_dot clipped loss at the "
            "largest d_k reads greater (unscaled worse by more than 0.02 nats) AND the per-seed "
            "slope of the gap against log2 d_k reads greater than 0.01 nats per doubling; "
            "refuted if the gap at the largest d_k reads equal or less; depends if the gap is "
            "there but does not grow; inconclusive otherwise. The GPT-2-init regime is shown "
            "beside it")


def judge_c13(ev: Evidence) -> Verdict:
    """C13: unscaled attention's gap to scaled at the largest d_k, and its growth with d_k."""
    big = str(ev["head_dims"][-1])
    dot, slope = gaps(ev, UNIT), slope_family(ev, UNIT)
    last = dot[big]["reading"]
    if last == GREATER and slope["reading"] == GREATER:
        verdict = SUPPORTED
    elif last in (EQUAL, LESS):
        verdict = REFUTED
    elif last == GREATER and slope["reading"] in (EQUAL, LESS):
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    other = {init: gaps(ev, init) for init in ev["inits"] if init != UNIT}
    ctx = "; ".join(f"{init}: {gap_text(c)}" for init, c in other.items())
    plain = [
        f"In Vaswani's regime the unscaled gap at d_k={big} is {dot[big]['mean']:+.3f} nats "
        f"({last}) and grows by {slope['mean']:+.3f} nats per doubling of d_k "
        f"({slope['reading']}).",
        *(f"With {init} init the gap at d_k={big} is {c[big]['mean']:+.3f} nats "
          f"({c[big]['reading']}): there the logits start small whatever the scale."
          for init, c in other.items()),
        "So the paper's suspicion is about the init regime; dividing by √d_k fixes it there."]
    slope_text = fmt_effect(slope, "nats/doubling")
    entropy = "; ".join(entropy_text(ev, init, big) for init in ev["inits"])
    return Verdict(verdict, C13_RULE, f"unit: {gap_text(dot)}; slope {slope_text}; {entropy}; "
                   f"context {ctx}", {"gaps": dot, "slope": slope, "context": other},
                   headline=f"{verdict}: gap {dot[big]['mean']:+.3f} nats at d_k={big}, "
                   f"slope {slope['mean']:+.3f}/doubling", plain=plain[:3],
                   regime=REGIMES[UNIT], smallest=LOSS_WHY + "; slope: 0.01 nats per doubling")


def text_pairs(ev: Evidence, rivals: tuple[str, ...], base: str = "scaled_dot") -> dict:
    """rival − base clipped loss in every width cell of the LR study."""
    return {f"{cell_}: {r}": (row.get(r), row.get(base))
            for cell_, row in ev["loss"].items() for r in rivals if r in row}


C6_RULE = ("Scaled dot product against the thread's alternatives (unscaled dot, cosine τ=1) on "
           "character-level text at each width (LR chosen leave-one-seed-out on the grid) and on "
           "retrieval among fillers at n=32 (LR chosen on tuning seeds): paired clipped-loss "
           "differences rival − scaled_dot, Holm-corrected. Supported if every rival is worse "
           "by more than 0.02 nats; refuted if every rival is equal or better; depends if some "
           "are worse and some are not; inconclusive otherwise")


def judge_c6(ev: Evidence) -> Verdict:
    """C6: scaled_dot against dot and cosine τ=1 on every task and width."""
    pairs = text_pairs(ev["text"], ("dot", "cosine_tau1"))
    pairs.update({f"retrieval: {r}": (ev["retrieval"]["loss"]["all"].get(r),
                                      ev["retrieval"]["loss"]["all"].get("scaled_dot"))
                  for r in ("dot", "cosine_tau1")})
    comps = family(pairs, LOSS_DELTA)
    verdict = aggregate(readings(comps), {GREATER}, {EQUAL, LESS})
    lost = [k for k, c in comps.items() if c["reading"] == GREATER]
    held = [k for k, c in comps.items() if c["reading"] in (EQUAL, LESS)]
    plain = [f"Scaled dot product beats {len(lost)} of {len(comps)} comparisons "
             f"({', '.join(lost) or 'none'}).",
             f"It is matched or beaten in {', '.join(held) or 'none'}.",
             "Which alternative and which task decide it; each arm had its own tuned LR."]
    return Verdict(verdict, C6_RULE, "; ".join(f"{k} {fmt_effect(c, 'nats')}"
                                               for k, c in comps.items()), comps,
                   headline=f"{verdict}: scaled better in {len(lost)}/{len(comps)}",
                   plain=plain, regime="GPT-2 init; text at two widths; retrieval at n = 32",
                   smallest=LOSS_WHY)
