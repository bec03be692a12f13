"""C6: "Empirical evidence favours the scaled dot product" (the Q&A thread "Why do we use square
root of key dimension for scaling?"; scaled dot-product attention: Vaswani et al. 2017, arXiv
1706.03762, §3.2.1; clipped loss: Wortsman et al. 2023, arXiv 2309.14322).

Measured as paired clipped-loss differences rival − scaled_dot for the thread's alternatives
(unscaled dot, cosine τ = 1) on character-level text at each width of the LR study and on
retrieval among fillers (the temperature study), Holm over all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import Pair, family, mean
from attnscale.audit.deep_readings import LongText, long_text_evidence
from attnscale.audit.evidence import LRText, Model, Tau, lr_text_evidence, tau_evidence
from attnscale.audit.figures import fig_forest
from attnscale.audit.interval import Comparison
from attnscale.audit.readings import GPT2, UNIT, text_evidence
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
from attnscale.audit.words import fx, reads

RIVALS = ("dot", "cosine_tau1")  # the thread's alternatives to the scaled dot product
RULE = ("Scaled dot product against the thread's alternatives (unscaled dot, cosine τ=1), "
        "decided where q and k start with unit-variance components (the regime the thread's "
        "argument is about): character-level text at each width (LR chosen leave-one-seed-out "
        "on the grid) and retrieval among fillers at n=32 (LR chosen on tuning seeds); paired "
        "clipped-loss differences rival − scaled_dot, Holm-corrected over all of them (the "
        "rule's 'depends' reads them through 'some'). Supported if every rival is worse by "
        "more than 0.02 nats; refuted if every rival is no worse (non-inferior within δ); "
        "depends if some are worse and some no worse; inconclusive otherwise. The same text "
        "comparisons under GPT-2's init (q·k near 0 at init) are shown as context, in their "
        "own Holm family, and do not enter the verdict. With --deep, the 1,500-step text "
        "study's unit-init comparisons at width 128 join the deciding family (its GPT-2 ones "
        "the context), and the page says what the verdict would read without them")
LAST = {SUPPORTED: "Scaled dot product wins every comparison, each arm at its own LR.",
        REFUTED: "No comparison favours scaled dot product, each arm at its own LR.",
        DEPENDS: "Which alternative and which task decide it; each arm had its own LR.",
        INCONCLUSIVE: "Most comparisons are undecided at this many seeds."}
CONTEXT = "GPT-2 init (context)"


class Evidence(Model):
    """The text LR study (:func:`attnscale.audit.evidence.lr_text_evidence`) and the retrieval
    study of cosine's temperature (:func:`attnscale.audit.evidence.tau_evidence`)."""

    text: LRText
    retrieval: Tau
    long: LongText | None = None  # the deep preset's 1,500-step text study


def text_pairs_in(ev: LRText, init: str, label: str) -> dict[str, Pair]:
    """rival − scaled_dot clipped loss at each width of one init regime."""
    return {f"{label} {w}: {r}": (row.get(r), row.get("scaled_dot"))
            for w, row in ev.cells_of(init).items() for r in RIVALS if r in row}


def context_sentence(comps: Mapping[str, Comparison]) -> str:
    """The GPT-2-init comparisons in words: what the small init does to the ranking."""
    if not comps:
        return "No GPT-2-init comparison was measured."
    said = "; ".join(f"{k[len(CONTEXT) + 1:]} {reads(d)} scaled dot ({fx(d)})"
                     for k, d in ((k, c.model_dump()) for k, c in comps.items()))
    return (f"Context, not in the verdict — with GPT-2's init, where q·k starts near 0 and "
            f"arms that enlarge logits learn faster: {said}.")


def levels_sentence(text: LRText) -> str:
    """How far training went: scaled dot's eval loss in bits/char (nats / ln 2) per cell,
    against the corpus' unigram and bigram levels."""
    ends = [f"{mean(row.get('scaled_dot')) / math.log(2):.2f} at {w} ({init})"
            for init in (UNIT, GPT2) for w, row in text.cells_of(init).items()
            if row.get("scaled_dot")]
    lv = text.levels
    if not ends or not lv:
        return ""
    return (f"How far the text models got: scaled dot ends at {', '.join(ends)} bits/char, "
            f"against {lv.get('unigram', math.nan):.2f} for the corpus' unigram model and "
            f"{lv.get('bigram', math.nan):.2f} for its bigram model.")


def long_pairs(long: LongText | None, init: str, label: str) -> dict[str, Pair]:
    """rival − scaled_dot clipped loss in the 1,500-step study's cell of ``init``."""
    if long is None:
        return {}
    row = long.loss.get(f"init={init}", {})
    return {f"{label}: {r}": (row.get(r), row.get("scaled_dot")) for r in RIVALS if r in row}


def decide(comps: Mapping[str, Comparison]) -> str:
    """Every rival worse: supported; every one no worse: refuted; some of each: depends."""
    marks = ["worse" if c.greater() else "fine" if c.no_worse() else INCONCLUSIVE
             for c in comps.values()]
    return aggregate(marks, {"worse"}, {"fine"})


def judge(ev: Evidence) -> Verdict:
    """scaled_dot against dot and cosine τ=1 at unit init, on text at every width (and, with
    --deep, after 1,500 steps) and on retrieval: clipped loss rival − scaled_dot, Holm over
    every comparison, δ = 0.02 nats."""
    pairs = text_pairs_in(ev.text, UNIT, "unit init")
    retrieval = ev.retrieval.loss["all"]
    pairs.update({f"retrieval: {r}": (retrieval.get(r), retrieval.get("scaled_dot"))
                  for r in RIVALS})
    steps = ev.long.steps if ev.long else 0
    long = long_pairs(ev.long, UNIT, f"unit init, {steps} steps")
    comps = family({**pairs, **long}, LOSS_DELTA)
    context = {**text_pairs_in(ev.text, GPT2, CONTEXT),
               **long_pairs(ev.long, GPT2, f"{CONTEXT}, {steps} steps")}
    ctx = family(context, LOSS_DELTA) if context else {}
    verdict = decide(comps)
    lost = [k for k, c in comps.items() if c.greater()]
    held = [k for k, c in comps.items() if c.no_worse()]
    plain = [f"With unit-variance q, k at init, scaled dot product beats {len(lost)} of "
             f"{len(comps)} comparisons ({', '.join(lost) or 'none'}).",
             f"It is matched or beaten in {', '.join(held) or 'none'}.",
             LAST[verdict], context_sentence(ctx)]
    plain += [x for x in [levels_sentence(ev.text)] if x]
    if long:  # say what the longer study changes
        without = decide(family(pairs, LOSS_DELTA))
        plain.append(f"Without the {steps}-step study this verdict would read {without}"
                     f"{' too' if without == verdict else ''}.")
    return Verdict(verdict, RULE, "; ".join(f"{k} {c.effect('nats')}"
                                            for k, c in {**comps, **ctx}.items()),
                   {**comps, **ctx},
                   headline=f"{verdict}: scaled better in {len(lost)}/{len(comps)}",
                   plain=plain, regime="unit-variance q, k at init: text at two widths and "
                   "retrieval at n = 32 (GPT-2-init text as context)",
                   smallest=LOSS_WHY)


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The forest plot of the paired loss differences rival − scaled_dot, with ±δ (the
    GPT-2-init context rows included, labelled)."""
    ns = sorted({int(c.get("n") or 0) for c in numbers.values()} - {0})
    n = f"{ns[0]}–{ns[-1]}" if len(ns) > 1 else f"{ns[0] if ns else 0}"
    return [fig_forest(dict(numbers), folder, "c6_effects",
                       f"C6: rival − scaled_dot clipped eval loss, {n} seeds per comparison, "
                       "mean and 95% CI",
                       "nats", "Rival minus scaled_dot loss")]


def gather(src: Sources) -> dict[str, Any]:
    return {"text": text_evidence(src.study("lr_text", lr_text_evidence),
                                  src.study("lr_text_gpt2", lr_text_evidence)),
            "retrieval": src.study("tau", tau_evidence),
            "long": src.study("long_text", long_text_evidence)}


CLAIM = register(Claim(
    id="C6", text="Empirical evidence favours the scaled dot product.",
    measures="text at two widths and retrieval, LRs chosen on other seeds: paired losses",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("lr_text", "lr_text_gpt2", "tau", "long_text")))
