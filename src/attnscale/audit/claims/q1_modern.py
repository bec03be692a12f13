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

from attnscale.audit.claim import Claim, Figure, Says, Sources, register
from attnscale.audit.compare import Pair, family, no_worse
from attnscale.audit.evidence import LRText, lr_text_evidence
from attnscale.audit.figure_text import n_seeds
from attnscale.audit.figures import fig_forest
from attnscale.audit.interval import Comparison
from attnscale.audit.readings import GPT2, UNIT, text_evidence
from attnscale.audit.sweep_readings import divergence_counts, grid_of, sweep_arm, sweep_regime
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
from attnscale.audit.words import fx, name, reads
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
CONTEXT = "GPT-2 init (context)"


def q1_family(ev: LRText, init: str = UNIT) -> dict[str, Comparison]:
    """Per width of init regime ``init`` and modern score: score − scaled_dot clipped loss and
    LR sensitivity; Holm over one width's loss comparisons and, apart, over its sensitivity
    comparisons. Keys: ``"<width> <score> loss"`` / ``"... sensitivity"``."""
    pairs: dict[str, Pair] = {}
    label = {w: full for full in ev.loss for w in [width_of(full)] if init_of(full) == init}
    for w, row in ev.cells_of(init).items():
        for m in (m for m in MODERN if m in row):
            pairs[f"{w} {m} loss"] = (row[m], row.get("scaled_dot"))
            pairs[f"{w} {m} sensitivity"] = (sweep_arm(ev, label[w], m, "sensitivity"),
                                             sweep_arm(ev, label[w], "scaled_dot",
                                                       "sensitivity"))
    groups = [[k for k in pairs if k.startswith(f"{w} ") and k.endswith(f" {kind}")]
              for w in ev.cells_of(init) for kind in ("loss", "sensitivity")]
    return family(pairs, LOSS_DELTA, holm_over=[g for g in groups if g]) if pairs else {}


def init_of(label: str) -> str:
    """The init regime of a cell label (``init=unit d_model=32`` -> unit; none: gpt2)."""
    parts = dict(x.split("=", 1) for x in label.split())
    return parts.get("init", GPT2)


def width_of(label: str) -> str:
    """A cell label without its init (``init=unit d_model=32`` -> ``d_model=32``)."""
    return " ".join(x for x in label.split() if not x.startswith("init="))


def matches(ev: LRText, comps: Mapping[str, Comparison],
            init: str = UNIT) -> dict[str, list[str] | None]:
    """width -> the modern scores that match scaled_dot's loss with lower sensitivity; [] when
    every score there is decided not to (one half shown to fail is enough); None when open."""
    per_width: dict[str, list[str] | None] = {}
    for w, row in ev.cells_of(init).items():
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


def width_sentences(per_width: Mapping[str, list[str] | None]) -> list[str]:
    """One sentence per width: which scores match scaled_dot with lower LR sensitivity."""
    return [f"{w}: {', '.join(g)} {'matches' if len(g) == 1 else 'match'} scaled_dot with "
            "lower LR sensitivity." if g else
            f"{w}: no modern score matches scaled_dot with lower LR sensitivity." if g == []
            else f"{w}: no score was shown to match scaled_dot with lower LR sensitivity, and "
            "some comparisons there stay undecided." for w, g in per_width.items()]


def judge(ev: LRText) -> Verdict:
    """Q1: which modern scores match scaled_dot's loss with lower LR sensitivity, per width,
    with unit-variance q, k at init; the GPT-2-init sweep as context (own families)."""
    comps = q1_family(ev, UNIT)
    per_width = matches(ev, comps, UNIT)
    context = q1_family(ev, GPT2)
    marks = [SUPPORTED if g else REFUTED if g == [] else INCONCLUSIVE for g in per_width.values()]
    verdict = aggregate(marks, {SUPPORTED}, {REFUTED})
    plain = [f"Unit init, {s}" for s in width_sentences(per_width)]
    if context:
        plain += [f"Context (GPT-2 init{grid_of(ev, GPT2)}, not in the verdict), {s}"
                  for s in width_sentences(matches(ev, context, GPT2))]
    plain.append("What 'better' means here depends on the grid: sensitivity averages the loss "
                 "over LRs nobody would choose, which rewards scores that tolerate large LRs.")
    numbers = {**{f"unit init {k}": c for k, c in comps.items()},
               **{f"{CONTEXT} {k}": c for k, c in context.items()}}
    return Verdict(verdict, RULE, "; ".join(f"{k}: {c.effect()}" for k, c in numbers.items()),
                   numbers,
                   headline=f"{verdict}: " + "; ".join(
                       f"{w}: {', '.join(g) if g else '—' if g == [] else 'open'}"
                       for w, g in per_width.items()),
                   plain=plain, regime="unit-variance q, k at init decides; "
                   + sweep_regime(ev, divergence_counts(ev)) + " (context)",
                   smallest=LOSS_WHY)


def _standing(by_width: list[dict[str, Any]]) -> str:
    """One modern score over the widths: "held up", "trailed", "mixed" or "undecided"."""
    good = any(no_worse(c) for c in by_width)
    bad = any(c["reading"] == GREATER for c in by_width)
    return "mixed" if good and bad else "held up" if good else "trailed" if bad else "undecided"


def _by_score(e: dict[str, Any], prefix: str = "unit init ") -> dict[str, dict[str, tuple]]:
    """score -> width -> (loss comparison, sensitivity reading), from the entry's numbers."""
    nums = e["numbers"]
    out: dict[str, dict[str, tuple]] = {}
    for key, c in nums.items():
        if key.startswith(prefix) and key.endswith(" loss"):
            width, score = key[len(prefix):-len(" loss")].rsplit(" ", 1)
            sens = nums.get(f"{prefix}{width} {score} sensitivity", {}).get("reading")
            out.setdefault(score, {})[width] = (c, sens)
    return out


def says_answer(e: dict[str, Any]) -> list[str]:
    """The modern scores' standing against scaled dot at unit init, in one sentence."""
    groups: dict[str, list[str]] = {}
    for score, by_width in _by_score(e).items():
        groups.setdefault(_standing([c for c, _ in by_width.values()]), []).append(name(score))
    said = [f"{', '.join(v)} {k}" for k, v in groups.items() if k != "undecided"]
    if groups.get("undecided"):
        said.append(f"{', '.join(groups['undecided'])} undecided against it")
    return [f"Against scaled dot product on text with unit-variance q, k at init: "
            f"{'; '.join(said)} (Q1)."] if said else []


def says_alternatives(e: dict[str, Any]) -> list[str]:
    """Each modern score against scaled dot at unit init, per width, then GPT-2 context."""
    out = []
    for score, by_width in _by_score(e).items():
        parts = [f"{reads(c)} scaled dot ({fx(c)})"
                 f"{' with lower LR sensitivity' if sens == LESS else ''} at {w}"
                 for w, (c, sens) in by_width.items()]
        out.append(f"{name(score)}: {'; '.join(parts)} (Q1, unit init).")
    return out


def says_when(e: dict[str, Any]) -> list[str]:
    """Soft-capping as a guard, with what the sweep showed of its LR sensitivity."""
    cap = _by_score(e).get("softcap")
    if not cap:
        return []
    sens = [s for _, s in cap.values()]
    did = ("lowered LR sensitivity" if LESS in sens else
           "did not lower LR sensitivity" if all(x in (EQUAL, GREATER) for x in sens) else
           "left it undecided whether it lowers LR sensitivity")
    return [f"Soft-capping bounds every logit by construction (a guard against runaway logits "
            f"rather than a better score); here it {did} (Q1)."]


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The forest plot of the rule's comparisons: modern score − scaled_dot loss and LR
    sensitivity per width, in nats."""
    title = (f"Q1: modern score − scaled_dot, char-level text, {n_seeds(numbers)} seeds, "
             "mean and 95% CI")
    return [fig_forest(dict(numbers), folder, "q1_effects", title, "nats",
                       "Modern scores minus scaled_dot (loss and LR sensitivity)")]


def gather(src: Sources) -> dict[str, Any]:
    """The text LR study's evidence (:func:`attnscale.audit.evidence.lr_text_evidence`)."""
    return text_evidence(src.study("lr_text", lr_text_evidence),
                         src.study("lr_text_gpt2", lr_text_evidence))


CLAIM = register(Claim(
    id="Q1", text="Which alternatives do modern models use, and how do they compare?",
    measures="modern scores on the same LR sweep at two widths", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw, studies=("lr_text", "lr_text_gpt2"),
    answers=ANSWERS,
    says=(Says("answer", says_answer, rank=20), Says("alternatives", says_alternatives, rank=10),
          Says("when", says_when, rank=20))))
