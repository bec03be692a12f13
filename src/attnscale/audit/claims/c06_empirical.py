"""C6: "Empirical evidence favours the scaled dot product" (the Q&A thread "Why do we use square
root of key dimension for scaling?"; scaled dot-product attention: Vaswani et al. 2017, arXiv
1706.03762, §3.2.1; clipped loss: Wortsman et al. 2023, arXiv 2309.14322).

Measured as paired clipped-loss differences rival − scaled_dot for the thread's alternatives
(unscaled dot, cosine τ = 1) on character-level text at each width of the LR study and on
retrieval among fillers (the temperature study), Holm over all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import family
from attnscale.audit.evidence import LRText, Model, Tau, lr_text_evidence, tau_evidence
from attnscale.audit.figures import fig_forest
from attnscale.audit.readings import text_pairs
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

RIVALS = ("dot", "cosine_tau1")  # the thread's alternatives to the scaled dot product
RULE = ("Scaled dot product against the thread's alternatives (unscaled dot, cosine τ=1) on "
        "character-level text at each width (LR chosen leave-one-seed-out on the grid) and on "
        "retrieval among fillers at n=32 (LR chosen on tuning seeds): paired clipped-loss "
        "differences rival − scaled_dot, Holm-corrected over all of them (the rule's "
        "'depends' reads them through 'some'). Supported if every rival is worse by more "
        "than 0.02 nats; refuted if every rival is no worse (non-inferior within δ); "
        "depends if some are worse and some no worse; inconclusive otherwise")
LAST = {SUPPORTED: "Scaled dot product wins every comparison, each arm at its own LR.",
        REFUTED: "No comparison favours scaled dot product, each arm at its own LR.",
        DEPENDS: "Which alternative and which task decide it; each arm had its own LR.",
        INCONCLUSIVE: "Most comparisons are undecided at this many seeds."}


class Evidence(Model):
    """The text LR study (:func:`attnscale.audit.evidence.lr_text_evidence`) and the retrieval
    study of cosine's temperature (:func:`attnscale.audit.evidence.tau_evidence`)."""

    text: LRText
    retrieval: Tau


def judge(ev: Evidence) -> Verdict:
    """scaled_dot against dot and cosine τ=1 on every task and width: clipped loss
    rival − scaled_dot, Holm over every comparison, δ = 0.02 nats."""
    pairs = text_pairs(ev.text, RIVALS)
    retrieval = ev.retrieval.loss["all"]
    pairs.update({f"retrieval: {r}": (retrieval.get(r), retrieval.get("scaled_dot"))
                  for r in RIVALS})
    comps = family(pairs, LOSS_DELTA)
    marks = ["worse" if c.greater() else "fine" if c.no_worse() else INCONCLUSIVE
             for c in comps.values()]
    verdict = aggregate(marks, {"worse"}, {"fine"})
    lost = [k for k, c in comps.items() if c.greater()]
    held = [k for k, c in comps.items() if c.no_worse()]
    plain = [f"Scaled dot product beats {len(lost)} of {len(comps)} comparisons "
             f"({', '.join(lost) or 'none'}).",
             f"It is matched or beaten in {', '.join(held) or 'none'}.",
             LAST[verdict]]
    return Verdict(verdict, RULE, "; ".join(f"{k} {c.effect('nats')}"
                                            for k, c in comps.items()), comps,
                   headline=f"{verdict}: scaled better in {len(lost)}/{len(comps)}",
                   plain=plain, regime="GPT-2 init; text at two widths; retrieval at n = 32",
                   smallest=LOSS_WHY)


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The forest plot of the paired loss differences rival − scaled_dot, with ±δ."""
    n = T.n_seeds(numbers)
    return [fig_forest(dict(numbers), folder, "c6_effects",
                       f"C6: rival − scaled_dot clipped eval loss, {n} seeds, mean and 95% CI",
                       "nats", "Rival minus scaled_dot loss")]


def gather(src: Sources) -> dict[str, Any]:
    return {"text": src.study("lr_text", lr_text_evidence),
            "retrieval": src.study("tau", tau_evidence)}


CLAIM = register(Claim(
    id="C6", text="Empirical evidence favours the scaled dot product.",
    measures="text at two widths and retrieval, LRs chosen on other seeds: paired losses",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("lr_text", "tau")))
