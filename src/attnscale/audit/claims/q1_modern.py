"""Q1: "Which alternatives do modern models use, and how do they compare?" (beyond the thread:
QK-LayerNorm, Dehghani et al. 2023; QK-RMSNorm; cosine attention with a learned temperature,
Henry et al. 2020; logit soft-capping, Gemma Team 2024; Wortsman et al. 2023, arXiv 2309.14322,
report that such scores match the baseline's loss with lower LR sensitivity; docs/claims.md).

Read from the text LR sweep at two widths: each modern score against scaled_dot, paired per
seed, on clipped loss (LR chosen leave-one-seed-out) and on LR sensitivity (mean clipped loss
over the grid above a reference shared by every arm). Holm over one width's loss comparisons
and, separately, over its sensitivity comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import Pair, family
from attnscale.audit.evidence import LRText, lr_text_evidence
from attnscale.audit.figure_text import n_seeds
from attnscale.audit.figures import fig_forest
from attnscale.audit.interval import Comparison
from attnscale.audit.sweep_readings import divergence_counts, sweep_arm, sweep_regime
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Verdict,
    aggregate,
)
from attnscale.lab.paired import EQUAL, GREATER, LESS

RULE = ("The modern scores (qk_layernorm, softcap, learned-τ cosine) against scaled_dot at "
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

# How each verdict reads as an answer on the page (the rule tests a hypothesis).
ANSWERS = {SUPPORTED: "Some match scaled dot's loss with lower LR sensitivity",
           REFUTED: "None matched scaled dot's loss with lower LR sensitivity",
           DEPENDS: "At some widths only",
           INCONCLUSIVE: "Not decided at every width: where no modern score was shown to "
                         "match scaled dot's loss with lower LR sensitivity, comparisons stay "
                         "open"}

Evidence = LRText  # the text LR study (evidence.lr_text_evidence), typed


def q1_family(ev: LRText) -> dict[str, Comparison]:
    """Per width and modern score: score − scaled_dot clipped loss and LR sensitivity; Holm
    over one width's loss comparisons and, apart, over its sensitivity comparisons."""
    pairs: dict[str, Pair] = {}
    deltas: dict[str, float] = {}
    for w, row in ev.loss.items():
        for m in (m for m in MODERN if m in row):
            pairs[f"{w} {m} loss"] = (row[m], row.get("scaled_dot"))
            pairs[f"{w} {m} sensitivity"] = (sweep_arm(ev, w, m, "sensitivity"),
                                             sweep_arm(ev, w, "scaled_dot", "sensitivity"))
            deltas[f"{w} {m} loss"] = deltas[f"{w} {m} sensitivity"] = LOSS_DELTA
    groups = [[k for k in pairs if k.startswith(f"{w} ") and k.endswith(f" {kind}")]
              for w in ev.loss for kind in ("loss", "sensitivity")]
    return family(pairs, deltas, holm_over=[g for g in groups if g]) if pairs else {}


def matches(ev: LRText, comps: Mapping[str, Comparison]) -> dict[str, list[str] | None]:
    """width -> the modern scores that match scaled_dot's loss with lower sensitivity; [] when
    every score there is decided not to (one half shown to fail is enough); None when open."""
    per_width: dict[str, list[str] | None] = {}
    for w, row in ev.loss.items():
        good, decided = [], True
        for m in (m for m in MODERN if m in row):
            loss, sens = comps[f"{w} {m} loss"], comps[f"{w} {m} sensitivity"].reading
            if loss.no_worse() and sens == LESS:
                good.append(m)
            decided &= (loss.no_worse() and sens == LESS) or loss.reading == GREATER \
                or sens in (EQUAL, GREATER)
        has_modern = any(m in row for m in MODERN)
        per_width[w] = good or ([] if decided and has_modern else None)
    return per_width


def judge(ev: LRText) -> Verdict:
    """Q1: which modern scores match scaled_dot's loss with lower LR sensitivity, per width."""
    comps = q1_family(ev)
    per_width = matches(ev, comps)
    marks = [SUPPORTED if g else REFUTED if g == [] else INCONCLUSIVE for g in per_width.values()]
    verdict = aggregate(marks, {SUPPORTED}, {REFUTED})
    plain = [f"{w}: {', '.join(g)} {'matches' if len(g) == 1 else 'match'} scaled_dot with "
             "lower LR sensitivity." if g else
             f"{w}: no modern score matches scaled_dot with lower LR sensitivity." if g == []
             else f"{w}: no score was shown to match scaled_dot with lower LR sensitivity, and "
             "some comparisons there stay undecided." for w, g in per_width.items()]
    plain.append("What 'better' means here depends on the grid: sensitivity averages the loss "
                 "over LRs nobody would choose, which rewards scores that tolerate large LRs.")
    return Verdict(verdict, RULE, "; ".join(f"{k}: {c.effect()}" for k, c in comps.items()),
                   comps,
                   headline=f"{verdict}: " + "; ".join(
                       f"{w}: {', '.join(g) if g else '—' if g == [] else 'open'}"
                       for w, g in per_width.items()),
                   plain=plain, regime=sweep_regime(ev, divergence_counts(ev)),
                   smallest=LOSS_WHY)


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The forest plot of the rule's comparisons: modern score − scaled_dot loss and LR
    sensitivity per width, in nats."""
    title = (f"Q1: modern score − scaled_dot, char-level text, {n_seeds(numbers)} seeds, "
             "mean and 95% CI")
    return [fig_forest(dict(numbers), folder, "q1_effects", title, "nats",
                       "Modern scores minus scaled_dot (loss and LR sensitivity)")]


def gather(src: Sources) -> dict[str, Any]:
    """The text LR study's evidence (:func:`attnscale.audit.evidence.lr_text_evidence`)."""
    return src.study("lr_text", lr_text_evidence)


CLAIM = register(Claim(
    id="Q1", text="Which alternatives do modern models use, and how do they compare?",
    measures="modern scores on the same LR sweep at two widths", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw, studies=("lr_text",),
    answers=ANSWERS))
