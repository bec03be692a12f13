"""The rules the LR sweep at two widths decides (C11, C12, Q1), in the style of Wortsman et al.
2023 (arXiv 2309.14322): per seed, LR sensitivity against a shared reference (mean over the
grid of the clipped loss, minus the lowest clipped loss any arm reached on that seed and width:
two arms' difference is the difference of their grid means, where Wortsman's own-best
reference would reward the deeper single minimum) and the fraction of the grid that was
unstable (a divergence, or a loss that blew up and stayed more than 1 nat above its own low;
never under-training, never a large logit alone). Comparisons are paired per seed, with Holm's
correction over the comparisons each rule reads through "some" or "or" and none over those it
only reads through "every" or "and" (:mod:`attnscale.audit.compare`); "equal or better" is a
non-inferiority reading.
"""

from __future__ import annotations

import math
from typing import Any

from attnscale.audit.compare import family, no_worse
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

GPT2 = "GPT-2 init (weights std 0.02), character-level text"


def sweep_arm(ev: Evidence, width: str, arm: str, key: str) -> dict[str, Any] | None:
    """Per-seed values of ``key`` ("sensitivity" or "unstable") for one arm at one width."""
    a = ev["sweep"].get(width, {}).get(arm)
    return {"values": a[key], "censored": False} if a else None


def excess(ev: Evidence, key: str, arm: str = "dot") -> dict[str, Any]:
    """Per-seed ``arm`` − scaled_dot difference of ``key`` at the largest minus the smallest
    width: does the excess grow with width?"""
    w = list(ev["sweep"])
    if len(w) < 2:
        return {"values": {}, "censored": False}
    small, large = (ev["sweep"][x] for x in (w[0], w[-1]))
    if arm not in small or arm not in large:
        return {"values": {}, "censored": False}
    seeds = set(small[arm][key]) & set(large[arm][key]) & set(small["scaled_dot"][key]) \
        & set(large["scaled_dot"][key])
    return {"values": {s: (large[arm][key][s] - large["scaled_dot"][key][s])
                       - (small[arm][key][s] - small["scaled_dot"][key][s]) for s in seeds},
            "censored": False}


C11_RULE = ("LR sweep at two widths, GPT-2 init. Per width, paired "
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


def unstable_delta(ev: Evidence) -> float:
    """The smallest real difference of unstable fractions: 0.6/|grid|, under one LR (0.1 for
    a six-point grid)."""
    return 0.6 / max(1, len(ev.get("lrs") or range(6)))


def c11_family(ev: Evidence) -> dict[str, Any]:
    """Sensitivity and instability comparisons per width, and the growth of the excess."""
    pairs, deltas = {}, {}
    for w in ev["sweep"]:
        for key, delta in (("sensitivity", LOSS_DELTA), ("unstable", unstable_delta(ev))):
            pairs[f"{w} {key}"] = (sweep_arm(ev, w, "dot", key),
                                   sweep_arm(ev, w, "scaled_dot", key))
            deltas[f"{w} {key}"] = delta
    grow = excess(ev, "sensitivity")
    pairs["growth"] = (grow, {"values": dict.fromkeys(grow["values"], 0.0)})
    deltas["growth"] = LOSS_DELTA
    return family(pairs, deltas, holm_over=[[k for k in pairs if k != "growth"]])


def divergence_counts(ev: Evidence) -> dict[str, int]:
    """Over every arm and width of the sweep: runs, divergences, runs past 1e4."""
    arms = [a for by_arm in ev["sweep"].values() for a in by_arm.values()]
    return {"runs": sum(a.get("n_runs", 0) for a in arms),
            "diverged": sum(a.get("n_diverged", 0) for a in arms),
            "past": sum(a.get("n_past_logit_limit", 0) for a in arms)}


def sweep_regime(ev: Evidence, counts: dict[str, int]) -> str:
    """The regime line, with what the study cannot show."""
    widths = ", ".join(w.split("=")[-1] for w in ev["sweep"])
    line = f"{GPT2}; widths {widths}; {counts['diverged']} of {counts['runs']} runs diverged"
    if counts["diverged"] == 0:
        line += (", so this sweep shows logit growth and LR sensitivity, not divergence, and "
                 "says nothing of the long runs where Wortsman et al. saw it")
    return line


def judge_c11(ev: Evidence) -> Verdict:
    """C11: instability and LR sensitivity of unscaled against scaled, and their growth."""
    widths = list(ev["sweep"])
    if not widths:
        return Verdict(INCONCLUSIVE, C11_RULE, "no LR sweep was run", regime=GPT2)
    comps = c11_family(ev)
    large = [comps[f"{widths[-1]} {k}"]["reading"] for k in ("sensitivity", "unstable")]
    per_width = [c["reading"] for k, c in comps.items() if k != "growth"]
    growth = comps["growth"]["reading"]
    if GREATER in large and growth == GREATER:
        verdict = SUPPORTED
    elif per_width and all(no_worse(c) for k, c in comps.items() if k != "growth"):
        verdict = REFUTED
    elif GREATER in per_width and no_worse(comps["growth"]):
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    peaks = {w: max((v for v in ev["sweep"][w].get("dot", {}).get("peak_logit_by_lr", {})
                     .values() if v is not None), default=math.nan) for w in widths}
    counts = divergence_counts(ev)
    plain = [
        f"At width {widths[-1]} unscaled attention's LR sensitivity differs from scaled by "
        f"{comps[f'{widths[-1]} sensitivity']['mean']:+.3f} nats (its mean loss over the grid, "
        f"against a shared reference) and its unstable share of the grid by "
        f"{comps[f'{widths[-1]} unstable']['mean']:+.2f} ({large[0]}, {large[1]}).",
        f"Its largest logits reach {', '.join(f'{v:.3g} (width {w})' for w, v in peaks.items())}"
        f"; {counts['past']} of {counts['runs']} runs passed 1e4, the growth Wortsman et al. "
        f"saw before divergence, and {counts['diverged']} diverged.",
        f"Growth with width: {fmt_effect(comps['growth'], 'nats')}; the answer depends on the LR "
        "range one is willing to tune over."]
    grid = ", ".join(f"{x:g}" for x in ev.get("lrs", []))
    return Verdict(verdict, C11_RULE.replace("LR sweep", f"LR sweep ({grid})", 1),
                   "; ".join(f"{k}: {fmt_effect(c)}" for k, c in comps.items()), comps,
                   headline=f"{verdict}: width {widths[-1]} sensitivity "
                   f"{comps[f'{widths[-1]} sensitivity']['mean']:+.3f} nats",
                   plain=plain, regime=sweep_regime(ev, counts),
                   smallest=f"{LOSS_WHY}; instability: {unstable_delta(ev):.2g} of the grid, "
                   "so one more unstable LR counts")


C12_RULE = ("Step 0: scaled_dot's logit std measured in the model itself (layer 1), every seed, "
            "in each init regime; O(1) means between 0.25 and 4. After training: scaled_dot's "
            "final max |logit| for every seed at EVERY LR of the sweep, against 4·s_c(n) (s_c = "
            "√(2 ln n), where softmax saturates); a diverged run counts as past it. An LR is "
            "'past' if any seed passes 4·s_c, 'below' if every seed stays under it. Supported "
            "if every unit-variance seed is O(1) at init and every LR is below; depends if init "
            "is O(1) but some LR is past; refuted if some unit-variance seed is not O(1) at "
            "init; inconclusive without data. Every seed is checked, so no mean can hide one")


def judge_c12(ev: Evidence) -> Verdict:
    """C12: scaled_dot's logit size at init (both regimes) and after training at every LR."""
    init = ev["init_std"]  # regime -> d_k -> {seed: logit std}
    unit = [v for by_seed in init.get("unit", {}).values() for v in by_seed.values()]
    limit = 4 * math.sqrt(2 * math.log(ev["n"]))
    trained: dict[float, list[float]] = {}  # LR -> every seed's final max |logit|, all widths
    for by_lr in ev["final_logit"].values():
        for lr, by_seed in by_lr.items():
            trained.setdefault(float(lr), []).extend(by_seed.values())
    past = sorted(lr for lr, xs in trained.items() if any(x > limit for x in xs))
    init_ok = bool(unit) and all(0.25 <= v <= 4 for v in unit)
    if not unit or not trained:
        verdict = INCONCLUSIVE
    elif not init_ok:
        verdict = REFUTED
    else:
        verdict = DEPENDS if past else SUPPORTED
    def span(xs: list[float]) -> str:
        return f"{min(xs):.3g}–{max(xs):.3g}" if xs else "n/a"
    plain = [f"At init, with unit-variance q and k, q·k/√d_k has std {span(unit)} over every "
             f"d_k and seed: {'O(1), as the thread says' if init_ok else 'not O(1)'}."]
    small = [v for by_seed in init.get("gpt2", {}).values() for v in by_seed.values()]
    if small:
        size = ("far below 1, set by the init rather than the division" if max(small) < 0.25
                else "of order one")
        plain.append(f"With GPT-2 init the model's own logits start at std {span(small)}: "
                     f"{size}.")
    worst = max((max(xs) for xs in trained.values()), default=math.nan)
    below = sorted(set(trained) - set(past))
    plain.append(f"After training, the largest final logit is {worst:.3g} against 4·s_c = "
                 f"{limit:.1f}: below it at LR {', '.join(f'{x:g}' for x in below) or 'none'}, "
                 f"past it at LR {', '.join(f'{x:g}' for x in past) or 'none'}.")
    words = {SUPPORTED: "O(1) at init and after training", REFUTED: "not O(1) at init",
             INCONCLUSIVE: "no data", DEPENDS: f"O(1) at init; past 4·s_c after training at "
             f"LR ≥ {min(past) if past else 0:g}"}
    return Verdict(verdict, C12_RULE, f"init logit std per seed: unit {span(unit)}, gpt2 "
                   f"{span(small)}; trained max |logit| by LR (largest seed) "
                   f"{ {f'{k:g}': round(max(v), 2) for k, v in sorted(trained.items())} } "
                   f"(limit {limit:.1f})", {"past": past, "limit": limit},
                   headline=f"{verdict}: {words[verdict]}", plain=plain,
                   regime="both init regimes; text LR sweep",
                   smallest="O(1) = within a factor 4 of 1; saturation from 4·s_c(n)")


Q1_RULE = ("The modern scores (qk_layernorm, softcap, learned-τ cosine) against scaled_dot at "
           "each width of the LR sweep: paired per-seed differences of clipped loss (LR chosen "
           "leave-one-seed-out) and of LR sensitivity (mean clipped loss over the grid above a "
           "reference shared by every arm). A score 'matches with lower sensitivity' if its "
           "loss is no worse (non-inferior within δ) AND its sensitivity reads less; it does "
           "not if either half is shown to fail. Holm over the loss comparisons of one width "
           "and, separately, over its sensitivity comparisons (the rule asks whether SOME "
           "score does). "
           "Supported (Wortsman et al. 2023) if at every width some modern score does (not "
           "necessarily the same one); refuted if at every width every score is decided and "
           "none does; depends if it holds at some widths only; inconclusive otherwise")
MODERN = ("qk_layernorm", "softcap", "cosine_learned", "qk_rmsnorm")


def judge_q1(ev: Evidence) -> Verdict:
    """Q1: which modern scores match scaled_dot's loss with lower LR sensitivity, per width."""
    pairs, deltas = {}, {}
    for w, row in ev["loss"].items():
        for m in (m for m in MODERN if m in row):
            pairs[f"{w} {m} loss"] = (row[m], row.get("scaled_dot"))
            pairs[f"{w} {m} sensitivity"] = (sweep_arm(ev, w, m, "sensitivity"),
                                             sweep_arm(ev, w, "scaled_dot", "sensitivity"))
            deltas[f"{w} {m} loss"] = deltas[f"{w} {m} sensitivity"] = LOSS_DELTA
    groups = [[k for k in pairs if k.startswith(f"{w} ") and k.endswith(f" {kind}")]
              for w in ev["loss"] for kind in ("loss", "sensitivity")]
    comps = family(pairs, deltas, holm_over=[g for g in groups if g]) if pairs else {}
    per_width = {}
    for w, row in ev["loss"].items():
        good, decided = [], True
        for m in (m for m in MODERN if m in row):
            loss, sens = comps[f"{w} {m} loss"], comps[f"{w} {m} sensitivity"]["reading"]
            if no_worse(loss) and sens == LESS:
                good.append(m)
            # decided not to match: one half shown to fail is enough
            decided &= (no_worse(loss) and sens == LESS) or loss["reading"] == GREATER \
                or sens in (EQUAL, GREATER)
        has_modern = any(m in row for m in MODERN)
        per_width[w] = good or ([] if decided and has_modern else None)
    marks = [SUPPORTED if g else REFUTED if g == [] else INCONCLUSIVE for g in per_width.values()]
    verdict = aggregate(marks, {SUPPORTED}, {REFUTED})
    plain = [f"{w}: {', '.join(g)} {'matches' if len(g) == 1 else 'match'} scaled_dot with "
             "lower LR sensitivity." if g else
             f"{w}: no modern score matches scaled_dot with lower LR sensitivity." if g == []
             else f"{w}: no score was shown to match scaled_dot with lower LR sensitivity, and "
             "some comparisons there stay undecided." for w, g in per_width.items()]
    plain.append("What 'better' means here depends on the grid: sensitivity averages the loss "
                 "over LRs nobody would choose, which rewards scores that tolerate large LRs.")
    return Verdict(verdict, Q1_RULE, "; ".join(f"{k}: {fmt_effect(c)}" for k, c in
                                               comps.items()), comps,
                   headline=f"{verdict}: " + "; ".join(
                       f"{w}: {', '.join(g) if g else '—' if g == [] else 'open'}"
                       for w, g in per_width.items()),
                   plain=plain, regime=sweep_regime(ev, divergence_counts(ev)),
                   smallest=LOSS_WHY)
