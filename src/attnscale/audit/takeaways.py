"""The page's first screen: short answers for practitioners, derived from the verdicts.

Like every verdict, each answer is computed from the rules' numbers (f-strings over the report
entries), so it changes with the data; a sentence whose numbers are missing is left out rather
than written from memory. A short answer first, then three longer ones:

0. the bottom line (C13, Q1, C4);
1. what 1/√d_k buys, and in which regime (C13, C7, C9, C8);
2. which alternatives held up, and at what cost (Q1, C4, C3, C5, C6);
3. when to reach for QK-norm, soft-capping, a learned temperature or log-length scaling
   (C11, Q1, C4, Q3).

Questions (Q1–Q3) get an answer instead of a verdict: :func:`answer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from attnscale.audit.claim import get_claim
from attnscale.audit.compare import no_worse
from attnscale.audit.verdicts import DEPENDS, ERROR, INCONCLUSIVE, REFUTED, SUPPORTED

Entry = dict[str, Any]
GREATER, LESS, EQUAL = "greater", "less", "equal"
MODERN_NAMES = {"qk_layernorm": "QK-LayerNorm", "qk_rmsnorm": "QK-RMSNorm",
                "softcap": "soft-capping", "cosine_learned": "cosine with a learned τ"}

def strip_verdict(headline: str, verdict: str) -> str:
    """A headline without its leading verdict word: "supported: gap +0.3" -> "gap +0.3"."""
    for sep in (": ", ", "):
        if headline.startswith(verdict + sep):
            return headline[len(verdict) + len(sep):]
    return "" if headline == verdict else headline


def answer(entry: Entry, words_for: Mapping[str, str]) -> str:
    """A question's answer: its verdict as words (``words_for``: the question's
    :attr:`attnscale.audit.claim.Claim.answers`), then the headline's numbers."""
    if entry["verdict"] == ERROR:
        return f"Not answered: {entry['error']}"
    words = words_for.get(entry["verdict"], entry["verdict"])
    rest = strip_verdict(entry.get("headline", ""), entry["verdict"]).replace("—", "none")
    return f"{words} ({rest})" if rest else words


def fx(c: dict[str, Any], unit: str = "nats", digits: int = 3) -> str:
    """``+0.33 nats [+0.25, +0.41]``: one comparison's mean and 95% interval."""
    return (f"{c['mean']:+.{digits}f} {unit} [{c['lo']:+.{digits}f}, {c['hi']:+.{digits}f}]"
            if c.get("lo") is not None and c.get("hi") is not None
            else f"{c['mean']:+.{digits}f} {unit}")


def _scale(e: dict[str, Entry]) -> list[str]:
    """What 1/√d_k buys, and in which regime."""
    out = []
    c13 = e["C13"]
    gaps, slope = c13["numbers"]["gaps"], c13["numbers"]["slope"]
    big = max(gaps, key=int)
    g = gaps[big]
    lead = {SUPPORTED: f"costs {fx(g)} of eval loss at d_k = {big}, and {slope['mean']:+.3f} "
                       f"nats more per doubling of d_k",
            DEPENDS: f"costs {fx(g)} at d_k = {big}, but the cost did not grow with d_k",
            REFUTED: f"cost nothing we could measure up to d_k = {big} ({fx(g)})",
            INCONCLUSIVE: f"had a cost we could not decide ({fx(g)} at d_k = {big})"}
    out.append(f"Where Vaswani et al.'s argument applies (q and k with unit-variance components"
               f"), dropping 1/√d_k {lead[c13['verdict']]} (C13).")
    for init, gs in c13["numbers"].get("context", {}).items():
        if big in gs and gs[big].get("n"):
            how = {EQUAL: "no measurable cost: the small init already keeps q·k small",
                   GREATER: "a cost there too, though the small init starts q·k far below 1",
                   LESS: "unscaled is better there"}.get(gs[big]["reading"], "undecided")
            out.append(f"With {'GPT-2' if init == 'gpt2' else init} init (weights of std 0.02) "
                       f"the gap at d_k = {big} is {fx(gs[big])}: {how}.")
    ev9 = e["C9"]["evidence"]
    out.append(f"The mechanism is exact (C9): at d_k = 64 over 512 keys, unscaled logits put "
               f"{ev9['max_weight_unscaled_64_512']:.2f} of the weight on one key on average, "
               f"scaled ones {ev9['max_weight_scaled_64_512']:.3f}.")
    ident = e["C7"]["numbers"].get("identity") or []
    if ident:
        out.append(f"A constant folded into W_q and W_k instead of the logits (init and LR × "
                   f"d_k^(−1/4), Adam's ε ÷ d_k^(−1/4), the clip on the scaled norm) is the "
                   f"same model: in float64 the two trained alike to "
                   f"{max(r['max_loss_diff'] for r in ident):.1g} nats (C7).")
    return out


def _modern(e: dict[str, Entry]) -> dict[str, dict[str, tuple[str, str, dict]]]:
    """Q1's comparisons regrouped: score -> width -> (loss reading, sensitivity reading, loss)."""
    comps = e["Q1"]["numbers"]
    out: dict[str, dict[str, tuple[str, str, dict]]] = {}
    for key, c in comps.items():
        if not key.endswith(" loss"):
            continue
        width, score = key[:-len(" loss")].rsplit(" ", 1)
        sens = comps.get(f"{width} {score} sensitivity", {}).get("reading", INCONCLUSIVE)
        out.setdefault(score, {})[width] = (c["reading"], sens, c)
    return out


def reads(c: dict[str, Any]) -> str:
    """How a rival's loss compares with scaled dot's, in words; an interval past ±δ that
    Holm's correction leaves undecided says so."""
    word = {EQUAL: "matched", LESS: "beat", GREATER: "trailed"}.get(c["reading"])
    if word:
        return word
    if no_worse(c):
        return "was no worse (within δ) than"
    delta = c.get("smallest")
    if delta is not None and c.get("lo") is not None and (c["lo"] > delta or c["hi"] < -delta):
        return "was undecided after Holm's correction against"
    return "was undecided against"


def _alternatives(e: dict[str, Entry]) -> list[str]:
    """Which alternatives held up, and at what cost."""
    out = []
    for score, by_width in _modern(e).items():
        parts = [f"{reads(c)} scaled dot ({fx(c)})"
                 f"{' with lower LR sensitivity' if sens == LESS else ''} at {w}"
                 for w, (loss, sens, c) in by_width.items()]
        out.append(f"{MODERN_NAMES.get(score, score)}: {'; '.join(parts)} (Q1).")
    c4 = e["C4"]["numbers"]
    if "cosine_tau1" in c4:
        t1 = c4["cosine_tau1"]
        rescued = [a.replace("cosine_", "") for a, c in c4.items()
                   if a != "cosine_tau1" and no_worse(c)]
        lead = {GREATER: "Cosine attention needs a temperature: at τ = 1 its retrieval loss is",
                EQUAL: "Cosine attention at τ = 1 held up on retrieval: its loss is",
                LESS: "Cosine attention at τ = 1 beat scaled dot on retrieval: its loss is",
                }.get(t1["reading"], "Cosine attention at τ = 1 was no worse on retrieval: its "
                                     "loss is" if no_worse(t1) else "Whether cosine at τ = 1 "
                                     "falls behind on retrieval was not decided: its loss is")
        out.append(f"{lead} {fx(t1)} against scaled dot; "
                   f"{', '.join(rescued) or 'no other τ tried'} did no worse than scaled dot "
                   f"(C4).")
    c3 = e["C3"]["numbers"]
    if c3:
        best = max(c3.values(), key=lambda c: c["mean"])
        lead = {SUPPORTED: "It cannot see a cue carried by ‖k‖ alone",
                REFUTED: "It still found a cue carried by ‖k‖ alone"}.get(
            e["C3"]["verdict"], "Whether it loses a cue carried by ‖k‖ alone was not decided")
        out.append(f"{lead}: its best accuracy is {abs(best['mean']):.2f} "
                   f"{'below' if best['mean'] < 0 else 'above'} scaled dot's (C3).")
    by_n = e["C5"]["numbers"].get("by_n", {})
    if by_n:
        ns = sorted(by_n, key=int)
        cost = ", ".join(f"{(by_n[n]['ratio'] - 1) * 100:+.1f}% at N = {n}" for n in ns)
        out.append(f"Its extra time on CPU (forward + backward): {cost} (C5).")
    return out


def _peak(ev: dict[str, Any], width: str, arm: str) -> tuple[float, float] | None:
    """(LR, mean peak max |logit|) at the largest LR where ``arm`` logged logits."""
    peaks = ev["sweep"].get(width, {}).get(arm, {}).get("peak_logit_by_lr", {})
    pts = [(float(lr), v) for lr, v in peaks.items() if v is not None and math.isfinite(v)]
    return max(pts) if pts else None


def _when(e: dict[str, Entry]) -> list[str]:
    """When to reach for QK-norm, soft-capping, a learned temperature or log-length."""
    out = []
    ev = e["C11"]["evidence"]
    width = list(ev["sweep"])[-1]
    sd, qk = _peak(ev, width, "scaled_dot"), _peak(ev, width, "qk_layernorm")
    if sd and qk:
        diverged = sum(a.get("n_diverged", 0) for arms in ev["sweep"].values()
                       for a in arms.values())
        here = ("here no run of the sweep diverged" if not diverged
                else f"here {diverged} runs diverged")
        out.append(f"QK-norm, when logits grow during training: at width {width} and the "
                   f"largest LRs scaled dot's max |logit| reached {sd[1]:.3g} (lr {sd[0]:g}), "
                   f"QK-LayerNorm's {qk[1]:.3g} (lr {qk[0]:g}) (C11). Wortsman et al. 2023 "
                   f"saw divergence in longer runs once it passes about 1e4; {here}.")
    cap = _modern(e).get("softcap")
    if cap:
        sens = [s for _, s, _ in cap.values()]
        did = ("lowered LR sensitivity" if LESS in sens else
               "did not lower LR sensitivity" if all(x in (EQUAL, GREATER) for x in sens) else
               "left it undecided whether it lowers LR sensitivity")
        out.append(f"Soft-capping bounds every logit by construction (a guard against runaway "
                   f"logits rather than a better score); here it {did} (Q1).")
    c4 = e["C4"]["numbers"].get("cosine_learned")
    if c4:
        out.append(f"A learned temperature, whenever logits are bounded (cosine, QK-norm): a "
                   f"learned τ {'did no worse than' if no_worse(c4) else 'did not match'}"
                   f" scaled dot on retrieval ({fx(c4)}), where τ = 1 fails (C4).")
    q3 = e["Q3"]
    w = q3["evidence"].get("answer_weight", {})
    if w:
        far = max(w, key=lambda k: int(k.split("=")[1]))
        arms = w[far]["all"]

        def mean(a: str) -> float:
            vals = list(arms.get(a, {}).get("values", {}).values())
            return sum(vals) / len(vals) if vals else math.nan
        out.append(f"Log-length scaling, for inputs longer than training: at {far} it put "
                   f"{mean('log_length'):.2f} of the attention on the answer against "
                   f"{mean('scaled_dot'):.2f}; lower loss there? "
                   f"{get_claim('Q3').answers[q3['verdict']].lower()} (Q3).")
    return out


def _standing(by_width: dict[str, tuple[str, str, dict]]) -> str:
    """One modern score over the widths: "held up", "trailed", "mixed" or "undecided"."""
    losses = [loss for loss, _, _ in by_width.values()]
    good, bad = any(no_worse(c) for _, _, c in by_width.values()), GREATER in losses
    return "mixed" if good and bad else "held up" if good else "trailed" if bad else "undecided"


def _bottom_line(e: dict[str, Entry]) -> list[str]:
    """The answer in three sentences: keep the scale or not, and which alternatives held up."""
    c13 = e["C13"]["verdict"]
    out = [{SUPPORTED: "Keep 1/√d_k, or something that does its job (QK-norm, a tuned "
                       "temperature): without it, unscaled logits saturate the softmax and the "
                       "loss gap grows with d_k when q and k have unit-variance components.",
            DEPENDS: "Keep 1/√d_k: without it the loss was worse at large d_k, though the gap "
                     "did not grow with d_k here.",
            REFUTED: "At this scale dropping 1/√d_k cost nothing measurable.",
            INCONCLUSIVE: "Whether dropping 1/√d_k costs loss was not decided at this scale."
            }[c13]]
    groups: dict[str, list[str]] = {}
    for score, by_width in _modern(e).items():
        groups.setdefault(_standing(by_width), []).append(MODERN_NAMES.get(score, score))
    said = [f"{', '.join(v)} {k}" for k, v in groups.items() if k != "undecided"]
    if groups.get("undecided"):
        said.append(f"{', '.join(groups['undecided'])} could not be told apart from it")
    if said:
        out.append(f"Against scaled dot product on text, at this scale: {'; '.join(said)} "
                   f"(Q1).")
    t1 = e["C4"]["numbers"].get("cosine_tau1", {})
    if t1.get("reading") == GREATER:
        out.append("Cosine attention only with a temperature (τ ≥ 2, or learned): at τ = 1 "
                   "its bounded logits cannot focus the softmax (C4).")
    return out


TAKEAWAYS: list[tuple[str, str, tuple[str, ...], Callable[[dict[str, Entry]], list[str]]]] = [
    ("answer", "In short: should I change my model's attention scaling?",
     ("C13", "Q1", "C4"), _bottom_line),
    ("scale", "What does dividing by √d_k buy, and when?", ("C13", "C7", "C9"), _scale),
    ("alternatives", "Which alternatives held up, and at what cost?",
     ("Q1", "C4", "C3", "C5"), _alternatives),
    ("when", "When should I reach for QK-norm, soft-capping or a learned temperature?",
     ("C11", "Q1", "C4", "Q3"), _when),
]


def takeaways(entries: list[Entry]) -> list[dict[str, Any]]:
    """The page's answers, each ``{"id", "question", "answer": [sentences], "sources"}``; an
    answer whose evidence is missing says so instead of guessing."""
    by_id = {x["id"]: x for x in entries}
    out = []
    for key, question, sources, build in TAKEAWAYS:
        failed = [s for s in sources if by_id.get(s, {}).get("verdict") == ERROR]
        if failed:  # an answer is never built around a failed rule
            sentences = [f"Not answered: the rule{'s' if len(failed) > 1 else ''} of "
                         f"{', '.join(failed)} failed (the error is shown there)."]
        elif any(s not in by_id for s in sources):
            sentences = []  # said below: the report lacks what this answer is built from
        else:
            sentences = build(by_id)  # a bug here fails the report: it is not an answer
        if not sentences:
            sentences = [f"This report lacks the measurements to answer this "
                         f"({', '.join(sources)})."]
        out.append({"id": key, "question": question, "answer": sentences,
                    "sources": list(sources),
                    "verdicts": {s: by_id[s]["verdict"] for s in sources if s in by_id}})
    return out

