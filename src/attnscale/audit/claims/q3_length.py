"""Q3: "At long context does a fixed 1/√d_k spread attention too thin, and does log-n scaling
help length generalization?" (a question beyond the thread; log-length scaling: Nakanishi 2025,
"Scalable-Softmax Is Superior for Attention", arXiv 2501.19399).

Measured on the length study: retrieval among fillers with RoPE, trained at n and evaluated at
2n and 4n; paired eval loss log_length − scaled_dot at each longer length, each tested alone
(accuracy and the attention weight on the answer shown beside it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import family, mean
from attnscale.audit.evidence import Length, length_evidence
from attnscale.audit.task_readings import learned, not_learned
from attnscale.audit.theory_plots import outside, save, yerr
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Verdict,
)

Evidence = Length
RULE = ("Length task trained at n, evaluated at n, 2n, 4n; each arm at its tuned LR. Paired "
        "differences of eval loss log_length − scaled_dot at 2n and 4n (loss, not accuracy: "
        "scaled_dot's accuracy near its ceiling leaves less room than δ; accuracy and the "
        "attention weight on the answer are shown beside it). Supported if log_length's "
        "loss reads less (better by more than 0.02 nats) at 4n; refuted if it is no better "
        "(non-inferior the other way) at both 2n and 4n; depends otherwise when every length "
        "is decided; inconclusive if scaled_dot did not learn the task at n or a length is "
        "undecided. Each comparison is tested alone: the rule reads them only through 'at "
        "4n' and 'at both'")
ANSWERS = {SUPPORTED: "Yes: log-length scaling lowers the loss",
           REFUTED: "No measurable gain in loss",
           DEPENDS: "Partly", INCONCLUSIVE: "Not decided at this scale"}


def sentences(ev: Length) -> list[str]:
    """The plain sentences: eval loss, accuracy and attention on the answer at each length,
    per arm (mean over seeds)."""
    lengths = ev.lengths
    def at(table: Mapping[str, Any], arm: str, digits: int) -> str:
        return ", ".join(f"{mean(table.get(k, {}).get('all', {}).get(arm)):.{digits}f}"
                         for k in lengths)
    def weights(arm: str) -> str:
        return ", ".join(f"{k} {mean(ev.answer_weight.get(k, {}).get('all', {}).get(arm)):.2f}"
                         for k in lengths)
    return [f"Eval loss at {', '.join(lengths)}: scaled_dot {at(ev.loss, 'scaled_dot', 3)}; "
            f"log_length {at(ev.loss, 'log_length', 3)} nats.",
            f"Accuracy at {', '.join(lengths)}: scaled_dot {at(ev.accuracy, 'scaled_dot', 2)}; "
            f"log_length {at(ev.accuracy, 'log_length', 2)}.",
            f"Attention on the answer: scaled_dot {weights('scaled_dot')}; log_length "
            f"{weights('log_length')}.",
            "Whether fading matters depends on how far past the training length one goes."]


def judge(ev: Length) -> Verdict:
    """Length generalization of log-length scaling against a fixed 1/√d, on eval loss: each
    longer length alone, δ = 0.02 nats."""
    lengths = ev.lengths
    acc = {k: ev.accuracy[k]["all"] for k in lengths}
    loss = {k: ev.loss[k]["all"] for k in lengths}
    kw = {"regime": f"trained at {lengths[0] if lengths else '?'}, RoPE; the length task only",
          "smallest": LOSS_WHY}
    if not lengths or not learned(acc[lengths[0]].get("scaled_dot"), ev.chance):
        base = acc[lengths[0]].get("scaled_dot") if lengths else None
        return not_learned("scaled_dot", base, ev.chance, RULE, **kw)
    longer = lengths[1:]
    comps = family({k: (loss[k].get("log_length"), loss[k].get("scaled_dot")) for k in longer},
                   LOSS_DELTA, holm_over=[])
    last = comps[longer[-1]] if longer else None
    if last is not None and last.less():
        verdict = SUPPORTED
    elif comps and all(c.no_better() for c in comps.values()):
        verdict = REFUTED
    elif comps and all(c.decided() or c.no_better() for c in comps.values()):
        verdict = DEPENDS  # every length decided, and they differ
    else:
        verdict = INCONCLUSIVE
    return Verdict(verdict, RULE, "; ".join(f"{k} {c.effect('nats')}" for k, c in
                                            comps.items()), comps,
                   headline=f"{verdict}: at {longer[-1] if longer else '?'} log_length "
                   f"{last.mean if last is not None else math.nan:+.3f} nats",
                   plain=sentences(ev), **kw)


def alt(ev: Mapping[str, Any]) -> str:
    """Eval loss, accuracy and attention on the answer at the longest evaluation length, per
    arm."""
    lengths = ev["lengths"]
    if len(lengths) < 2:
        raise ValueError("ev: Q3 needs at least two evaluation lengths")
    last = lengths[-1]
    loss = {a: T.arm_ci(v) for a, v in ev["loss"][last]["all"].items()}
    acc = {a: T.arm_ci(v) for a, v in ev["accuracy"][last]["all"].items()}
    text = (f"Trained at {lengths[0]} and evaluated at {last}, eval loss is "
            + ", ".join(f"{a} {T.interval(c, 'nats', 3, False)}" for a, c in loss.items()
                        if c["n"])
            + "; accuracy is "
            + ", ".join(f"{a} {T.interval(c, '', 2, False)}" for a, c in acc.items() if c["n"])
            + ".")
    weight = {a: T.arm_ci(v) for a, v in ev.get("answer_weight", {}).get(last, {})
              .get("all", {}).items()}
    parts = [f"{a} {c['mean']:.2f}" for a, c in weight.items() if c["n"]]
    if parts:
        text += f" The attention weight on the answer at {last} is {', '.join(parts)}."
    return text


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Eval loss (what the rule reads), accuracy and attention weight on the answer against
    evaluation length, each arm's mean and 95% interval over seeds."""
    lengths = ev["lengths"]
    if len(lengths) < 2:
        raise ValueError("ev: Q3 needs at least two evaluation lengths")
    ns = [int(k.split("=")[1]) for k in lengths]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    arms = list(ev["accuracy"][lengths[0]]["all"])
    seeds = 0
    for ax, key, label in ((axes[0], "loss", "eval loss (nats)"),
                           (axes[1], "accuracy", "eval accuracy"),
                           (axes[2], "answer_weight", "attention weight on the answer")):
        for j, arm in enumerate(arms):
            cs = [T.arm_ci(ev[key].get(k, {}).get("all", {}).get(arm)) for k in lengths]
            seeds = max(seeds, *(c["n"] for c in cs))
            shift = 1 + 0.04 * (j - (len(arms) - 1) / 2)
            ax.errorbar([n * shift for n in ns], [c["mean"] for c in cs], yerr=yerr(cs),
                        marker="o", capsize=3, color=f"C{j}", label=f"{arm}, 95% CI")
        ax.set(xscale="log", xlabel="evaluation length (keys)", ylabel=label)
        ax.set_xticks(ns, [f"{n}\n(train)" if i == 0 else str(n) for i, n in enumerate(ns)])
        ax.minorticks_off()
    chance = axes[1].axhline(ev["chance"], color="grey", ls=":",
                             label=f"chance accuracy ({ev['chance']:.2f})")
    outside(axes[2], handles=[*axes[2].get_legend_handles_labels()[0], chance])
    fig.suptitle(f"Q3: length generalization, retrieval trained at n = {ns[0]}, RoPE, "
                 f"{seeds} seeds", fontsize=11)
    return [save(fig, folder, "q3_length", alt(ev))]


def gather(src: Sources) -> dict[str, Any]:
    return src.study("length", length_evidence)


CLAIM = register(Claim(
    id="Q3", text="At long context does a fixed 1/√d_k spread attention too thin, and does log-n "
    "scaling help length generalization?", measures="train at n, evaluate at 2n and 4n",
    rule=RULE, evidence=Length, gather=gather, judge=judge, draw=draw, studies=("length",),
    answers=ANSWERS))
