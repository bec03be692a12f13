"""Q4: "Can QK-Clip stand in for 1/√d_k?" (beyond the thread: Kimi K2's QK-Clip, Kimi Team
2025, arXiv:2507.20534, rescales a head's W_q and W_k after each optimizer step once its max
logit passes τ = 100; :mod:`attnscale.integrations.qkclip`).

Read from the text LR sweep at two widths: unscaled dot with QK-Clip at τ = 100 against scaled
dot, paired per seed on clipped loss (each arm at its LR chosen leave-one-seed-out), Holm over
the widths. Against plain dot and QK-LayerNorm as context, each kind its own Holm family.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import family
from attnscale.audit.evidence import LRText, lr_text_evidence
from attnscale.audit.figure_text import n_seeds
from attnscale.audit.figures import fig_forest
from attnscale.audit.interval import Comparison
from attnscale.audit.sweep_readings import divergence_counts, sweep_regime
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

ARM = "dot_qkclip"  # unscaled dot, QK-Clip at τ = 100 (attnscale.audit.studies.VARIANTS)
CONTEXT = ("dot", "qk_layernorm")  # what the clip is also compared with, outside the rule
RULE = ("Unscaled dot with QK-Clip (τ = 100, Kimi K2) against scaled_dot at each width of the "
        "LR sweep: paired per-seed differences of clipped loss, each arm at its LR chosen "
        "leave-one-seed-out, Holm over the widths. It stands in at a width if its loss is no "
        "worse (non-inferior within δ) and fails there if it is worse by more than δ; a width "
        "where the clip never acted at the arm's chosen LRs is undecided (the arm was plain "
        "dot there). "
        "Supported if it stands in at every width; refuted if it fails at every width; "
        "depends if it stands in at some and fails at others; inconclusive otherwise. "
        "Against plain dot and QK-LayerNorm as context, not part of the verdict")
ANSWERS = {SUPPORTED: "Yes: no worse than scaled dot at every width",
           REFUTED: "No: worse than scaled dot at every width",
           DEPENDS: "At some widths only",
           INCONCLUSIVE: "Not decided: at some width the clip never acted at the LRs chosen, "
                         "or its arm was shown neither no worse nor worse than scaled dot"}
WORDS = {"greater": "higher loss, by more than δ", "less": "lower loss, by more than δ",
         "equal": "within ±δ", INCONCLUSIVE: "undecided"}

Evidence = LRText  # the text LR study (evidence.lr_text_evidence), typed


def q4_family(ev: LRText) -> dict[str, Comparison]:
    """Per width: dot_qkclip − scaled_dot (the rule's, Holm over widths), and dot_qkclip − dot,
    dot_qkclip − qk_layernorm (context, each kind Holm over widths)."""
    pairs, groups = {}, {}
    for base in ("scaled_dot", *CONTEXT):
        for w, row in ev.loss.items():
            if ARM in row:
                pairs[f"{w}: {ARM} − {base}"] = (row[ARM], row.get(base))
                groups.setdefault(base, []).append(f"{w}: {ARM} − {base}")
    return family(pairs, LOSS_DELTA, holm_over=list(groups.values())) if pairs else {}


def clip_acted(ev: LRText, width: str) -> bool:
    """Whether QK-Clip acted in some run of the clipped arm at one of the LRs its reported
    seeds were read at (the sweep's ``clipped_by_lr``); False when that is not recorded."""
    arm, sweep = ev.loss.get(width, {}).get(ARM), ev.sweep.get(width, {}).get(ARM)
    if arm is None or sweep is None:
        return False
    return any(sweep.clipped_by_lr.get(str(lr), 0.0) > 0 for lr in set(arm.lrs.values()))


def stands_in(ev: LRText, comps: Mapping[str, Comparison]) -> dict[str, str]:
    """width -> "idle" (the clip never acted at the chosen LRs: the arm was plain dot there),
    "holds" (no worse than scaled_dot), "fails" (worse by more than δ) or INCONCLUSIVE
    (neither shown, or the arm is missing)."""
    out = {}
    for w in ev.loss:
        c = comps.get(f"{w}: {ARM} − scaled_dot")
        out[w] = (INCONCLUSIVE if c is None else "idle" if not clip_acted(ev, w) else
                  "holds" if c.no_worse() else "fails" if c.greater() else INCONCLUSIVE)
    return out


def sentences(comps: Mapping[str, Comparison], marks: Mapping[str, str]) -> list[str]:
    """One sentence per width from the rule's reading, one per context comparison."""
    said = {"holds": "is no worse than scaled_dot (within δ or better)",
            "fails": "is worse than scaled_dot by more than δ",
            INCONCLUSIVE: "is neither shown no worse nor worse than scaled_dot",
            "idle": "never clipped a head at the LRs chosen for it, so there it trained as "
                    "plain dot and says nothing of the clip"}
    out = [f"{w}: dot with QK-Clip {said[m]}." for w, m in marks.items()]
    for key, c in comps.items():
        if not key.endswith("scaled_dot"):
            base = key.rsplit(" − ", 1)[1]
            out.append(f"{key.split(':')[0]}: against {base}, {WORDS[c.reading]} (context).")
    return out


def judge(ev: LRText) -> Verdict:
    """Q4: does unscaled dot with QK-Clip match scaled_dot's loss, per width."""
    comps = q4_family(ev)
    marks = stands_in(ev, comps)
    verdict = aggregate(list(marks.values()), {"holds"}, {"fails"})
    regime = (sweep_regime(ev, divergence_counts(ev)) + "; QK-Clip at τ = 100 acts only on "
              "heads whose max |logit| on the step's batch passes 100, so at LRs where none "
              "does the arm trains as plain dot")
    return Verdict(verdict, RULE, "; ".join(f"{k}: {c.effect('nats')}" for k, c in comps.items()),
                   comps, headline=f"{verdict}: " + "; ".join(f"{w}: {m}"
                                                              for w, m in marks.items()),
                   plain=sentences(comps, marks), regime=regime, smallest=LOSS_WHY)


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The forest plot of the paired loss differences dot_qkclip − each arm, with ±δ."""
    title = (f"Q4: dot + QK-Clip (τ = 100) − other arms, char-level text, {n_seeds(numbers)} "
             "seeds, mean and 95% CI")
    return [fig_forest(dict(numbers), folder, "q4_effects", title, "nats",
                       "Unscaled dot with QK-Clip minus scaled dot, plain dot, QK-LayerNorm")]


def gather(src: Sources) -> dict[str, Any]:
    """The text LR study's evidence (:func:`attnscale.audit.evidence.lr_text_evidence`)."""
    return src.study("lr_text", lr_text_evidence)


CLAIM = register(Claim(
    id="Q4", text="Can QK-Clip stand in for 1/√d_k?",
    measures="unscaled dot with QK-Clip on the LR sweep at two widths", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw, studies=("lr_text",),
    answers=ANSWERS))
