"""Q3: "At long context does a fixed 1/√d_k spread attention too thin, and does log-n scaling
help length generalization?" (a question beyond the thread; attention scaling β_n ≍ log n: Chen
et al. 2025, "Critical attention scaling in long-context transformers", arXiv 2510.05554;
trained log-length scaling: Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv
2501.19399).

Measured on the length study (retrieval among fillers with RoPE, trained at n, evaluated at n, 2n
and 4n) in two parts:

1. (the verdict) the same trained scaled_dot models evaluated at each L > n plainly and with
   every logit multiplied by β = ln L / ln n (:mod:`attnscale.lab.evaluation`): paired eval
   loss with factor − plain, same run and seed, so no LR choice or training noise enters;
2. (context) the trained arms against scaled_dot at their own tuned LRs: ``log_length``
   (s·ln(i)·q·k/√d, s learned per head from 1, so its logits start ×ln 32 = 3.47 at the
   training length) and ``log_length_matched`` (s learned from 1/ln n, so it starts equal to
   scaled dot at the training length).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Says, Sources, register
from attnscale.audit.compare import Pair, family, mean
from attnscale.audit.evidence import ArmTable, Length, Run, arms_table, length_evidence
from attnscale.audit.interval import Comparison
from attnscale.audit.studies import Study
from attnscale.audit.task_readings import learned, not_learned
from attnscale.audit.theory_plots import outside, save, yerr
from attnscale.audit.verdicts import (
    CONTEXT,
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    MissingEvidence,
    Verdict,
)
from attnscale.audit.words import fx
from attnscale.lab.evaluation import log_n_factor, log_n_key

TRAINED = ("log_length", "log_length_matched")  # part 2: trained log-length arms (context)
FACTOR = "log-n factor"  # part 1's comparisons: f"{FACTOR} n=64"
RULE = ("Length task trained at n, evaluated at n, 2n and 4n. The verdict reads the same trained "
        "scaled_dot models at each longer length L twice, plainly and with every logit "
        "multiplied by ln L / ln n (log-n attention scaling at evaluation): paired differences "
        "of eval loss with factor − plain at 2n and 4n (same run, same seed: no LR choice "
        "enters), Holm over the lengths. Supported if the factor's loss reads less (better by "
        "more than 0.02 nats) at some longer length and greater at none; depends if it reads "
        "less at one and greater at another; refuted if it is no better (non-inferior the "
        "other way) at every longer length; inconclusive otherwise, or if scaled_dot did not "
        "learn the task at n. Context, not in the verdict (each arm at its own tuned LR, so the "
        "LR choice enters): trained log_length (s learned from 1) and log_length_matched (s "
        "learned from 1/ln n) − scaled_dot at 2n and 4n, one Holm family. Loss, not accuracy: "
        "scaled_dot's accuracy near its ceiling leaves less room than δ")
ANSWERS = {SUPPORTED: "Yes: a log-n factor at evaluation lowers the loss past the training length",
           REFUTED: "No measurable gain in loss",
           DEPENDS: "It depends on how far past the training length",
           INCONCLUSIVE: "Not decided at this scale"}
LAST = {SUPPORTED: "Sharpening a model trained with 1/√d_k by ln L / ln n helps it past its "
                   "training length.",
        REFUTED: "Sharpening a model trained with 1/√d_k by ln L / ln n does not lower its loss "
                 "past its training length: the fading is not what limits it here.",
        DEPENDS: "Whether the factor helps depends on how far past the training length one goes.",
        INCONCLUSIVE: "The paired intervals are too wide to say whether the factor helps."}


class Evidence(Length):
    """:class:`attnscale.audit.evidence.Length` (every arm, plainly, per length) and scaled_dot
    at each length past n with the log-n factor (``log_n_*``, the same runs) and that factor
    per length (:func:`q3_evidence`)."""

    log_n_loss: dict[str, ArmTable]
    log_n_accuracy: dict[str, ArmTable]
    log_n_answer_weight: dict[str, ArmTable]
    factors: dict[str, float]


# ------------------------------------------------------------------------------ evidence


def _at(key: str, field: str) -> Any:
    def read(r: Run) -> float | None:
        v = r.final_metrics.get(key)
        v = v.get(field) if isinstance(v, dict) else None
        return float(v) if v is not None and math.isfinite(v) else None
    return read


def q3_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """:func:`attnscale.audit.evidence.length_evidence`, plus scaled_dot's eval loss, accuracy
    and answer weight with the log-n factor at each length past n (the runs' ``log_n:n=<L>``
    final metrics) and the factor β = ln L / ln n. :class:`MissingEvidence` for a scaled_dot
    run stored without them (before they were measured: train again into a new database)."""
    ev = length_evidence(study, runs)
    n = int(study.base["seq_len"])
    longer = [k for k in ev["lengths"] if int(k.split("=")[1]) > n]
    for r in runs:
        have = r.final_metrics
        if r.variant == "scaled_dot" and have and any(log_n_key(k) not in have
                                                      for k in longer):
            raise MissingEvidence(f"run {r.id} has no log-n evaluation (stored before "
                                  "it was measured: train again into a new results database)")
    scaled = replace(study, arms=("scaled_dot",))
    def table(field: str) -> dict[str, Any]:
        return {k: arms_table(scaled, runs, _at(log_n_key(k), field)) for k in longer}
    return {**ev, "log_n_loss": table("loss"), "log_n_accuracy": table("metric"),
            "log_n_answer_weight": table("answer_weight"),
            "factors": {k: log_n_factor(int(k.split("=")[1]), n) for k in longer}}


# ------------------------------------------------------------------------------ the rule


def scaled(table: Mapping[str, Any], k: str) -> Any:
    """scaled_dot's arm at length ``k`` of a per-length table (None when missing)."""
    return table.get(k, {}).get("all", {}).get("scaled_dot")


def factor_pairs(ev: Evidence) -> dict[str, Pair]:
    """Part 1: scaled_dot with the log-n factor − plain, at each length past n."""
    return {f"{FACTOR} {k}": (scaled(ev.log_n_loss, k), scaled(ev.loss, k))
            for k in ev.lengths[1:]}


def trained_pairs(ev: Evidence) -> dict[str, Pair]:
    """Part 2: each trained log-length arm − scaled_dot, at each length past n."""
    return {f"{a} {k} {CONTEXT}": (ev.loss[k]["all"].get(a), scaled(ev.loss, k))
            for a in TRAINED for k in ev.lengths[1:] if a in ev.loss.get(k, {}).get("all", {})}


def verdict_of(comps: Mapping[str, Comparison]) -> str:
    """Part 1's verdict (RULE)."""
    cs = list(comps.values())
    less, greater = any(c.less() for c in cs), any(c.greater() for c in cs)
    if less and not greater:
        return SUPPORTED
    if less and greater:
        return DEPENDS
    if cs and all(c.no_better() for c in cs):
        return REFUTED
    return INCONCLUSIVE


def sentences(ev: Evidence, trained: Mapping[str, Comparison], verdict: str) -> list[str]:
    """The plain sentences: scaled_dot's loss and answer weight at each length, plainly and
    with the factor; the trained arms at the longest length; what the verdict means."""
    longer = ev.lengths[1:]
    def row(table: Mapping[str, Any], ks: list[str], digits: int) -> str:
        return ", ".join(f"{mean(scaled(table, k)):.{digits}f}" for k in ks)
    factors = ", ".join(f"×{ev.factors.get(k, math.nan):.2f} at {k}" for k in longer)
    out = [f"scaled_dot's eval loss at {', '.join(ev.lengths)}: {row(ev.loss, ev.lengths, 3)} "
           f"nats; with the log-n factor ({factors}) {row(ev.log_n_loss, longer, 3)}.",
           f"Its attention on the answer at {', '.join(longer)}: plain "
           f"{row(ev.answer_weight, longer, 2)}, with the factor "
           f"{row(ev.log_n_answer_weight, longer, 2)}."]
    far = longer[-1] if longer else None
    said = [f"{a} {fx(c.model_dump())}" for k, c in trained.items()
            for a in TRAINED if k == f"{a} {far} {CONTEXT}"]
    if said:
        out.append(f"Context, each arm at its own LR: trained log-length scaling against "
                   f"scaled_dot at {far}: {'; '.join(said)}.")
    return [*out, LAST[verdict]]


def judge(ev: Evidence) -> Verdict:
    """The log-n factor at evaluation against plain scaled_dot on the same runs, on eval loss
    at each longer length, Holm over the lengths, δ = 0.02 nats; the trained log-length arms
    against scaled_dot as context, in their own Holm family."""
    lengths = ev.lengths
    kw = {"regime": f"trained at {lengths[0] if lengths else '?'}, RoPE; the length task only",
          "smallest": LOSS_WHY}
    base = ev.accuracy[lengths[0]]["all"].get("scaled_dot") if lengths else None
    if not lengths or not learned(base, ev.chance):
        return not_learned("scaled_dot", base, ev.chance, RULE, **kw)
    comps = family(factor_pairs(ev), LOSS_DELTA)
    trained = family(tp, LOSS_DELTA) if (tp := trained_pairs(ev)) else {}
    verdict = verdict_of(comps)
    last = comps.get(f"{FACTOR} {lengths[-1]}")
    return Verdict(verdict, RULE, "; ".join(f"{k} {c.effect('nats')}" for k, c in
                                            {**comps, **trained}.items()), {**comps, **trained},
                   headline=f"{verdict}: at {lengths[-1]} the log-n factor "
                   f"{last.mean if last is not None else math.nan:+.3f} nats",
                   plain=sentences(ev, trained, verdict), **kw)


# ------------------------------------------------------------------------------ figures


def alt(ev: Mapping[str, Any]) -> str:
    """Eval loss, accuracy and attention on the answer at the longest evaluation length, per
    arm and for scaled_dot with the log-n factor."""
    lengths = ev["lengths"]
    if len(lengths) < 2:
        raise ValueError("ev: Q3 needs at least two evaluation lengths")
    last = lengths[-1]
    def cis(key: str) -> dict[str, Any]:
        out = {a: T.arm_ci(v) for a, v in ev[key][last]["all"].items()}
        factor = ev.get(f"log_n_{key}", {}).get(last, {}).get("all", {}).get("scaled_dot")
        return {**out, "scaled_dot with log-n factor": T.arm_ci(factor)} if factor else out
    loss, acc = cis("loss"), cis("accuracy")
    text = (f"Trained at {lengths[0]} and evaluated at {last}, eval loss is "
            + ", ".join(f"{a} {T.interval(c, 'nats', 3, False)}" for a, c in loss.items()
                        if c["n"])
            + "; accuracy is "
            + ", ".join(f"{a} {T.interval(c, '', 2, False)}" for a, c in acc.items() if c["n"])
            + ".")
    weight = cis("answer_weight") if last in ev.get("answer_weight", {}) else {}
    parts = [f"{a} {c['mean']:.2f}" for a, c in weight.items() if c["n"]]
    if parts:
        text += f" The attention weight on the answer at {last} is {', '.join(parts)}."
    return text


def series(ev: Mapping[str, Any], key: str) -> dict[str, list[dict[str, Any]]]:
    """label -> one mean ± CI per length: every arm, and scaled_dot with the log-n factor (its
    plain value at n, where the factor is 1)."""
    lengths = ev["lengths"]
    arms = list(ev["accuracy"][lengths[0]]["all"])
    out = {a: [T.arm_ci(ev[key].get(k, {}).get("all", {}).get(a)) for k in lengths]
           for a in arms}
    logn = ev.get(f"log_n_{key}", {})
    if "scaled_dot" in arms and logn:
        out["scaled_dot, log-n factor at eval"] = [out["scaled_dot"][0]] + [
            T.arm_ci(logn.get(k, {}).get("all", {}).get("scaled_dot")) for k in lengths[1:]]
    return out


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Eval loss (what the rule reads), accuracy and attention weight on the answer against
    evaluation length, each arm's mean and 95% interval over seeds, with scaled_dot under the
    log-n factor dashed."""
    lengths = ev["lengths"]
    if len(lengths) < 2:
        raise ValueError("ev: Q3 needs at least two evaluation lengths")
    ns = [int(k.split("=")[1]) for k in lengths]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    seeds = 0
    for ax, key, label in ((axes[0], "loss", "eval loss (nats)"),
                           (axes[1], "accuracy", "eval accuracy"),
                           (axes[2], "answer_weight", "attention weight on the answer")):
        lines = series(ev, key)
        for j, (name, cs) in enumerate(lines.items()):
            seeds = max(seeds, *(c["n"] for c in cs))
            shift = 1 + 0.04 * (j - (len(lines) - 1) / 2)
            ax.errorbar([n * shift for n in ns], [c["mean"] for c in cs], yerr=yerr(cs),
                        marker="o", capsize=3, color=f"C{j}", label=f"{name}, 95% CI",
                        ls="--" if "log-n" in name else "-")
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
    return src.study("length", q3_evidence)


def says_when(e: dict[str, Any]) -> list[str]:
    """Log-n scaling for inputs longer than training: the factor at evaluation, at the
    longest length."""
    ev, numbers = e["evidence"], e.get("numbers", {})
    w = ev.get("log_n_answer_weight", {})
    if not w:
        return []
    far = max(w, key=lambda k: int(k.split("=")[1]))
    plain = mean(scaled(ev.get("answer_weight", {}), far))
    sharp = mean(scaled(w, far))
    c = numbers.get(f"{FACTOR} {far}")
    loss = f", loss {fx(c)} against plain" if c and c.get("mean") is not None else ""
    return [f"Log-n scaling, for inputs longer than training: at {far}, multiplying scaled "
            f"dot's logits by ln L / ln n ({ev.get('factors', {}).get(far, math.nan):.2f}) at "
            f"evaluation put {sharp:.2f} of the attention on the answer against {plain:.2f}"
            f"{loss}; {ANSWERS[e['verdict']].lower()} (Q3)."]


CLAIM = register(Claim(
    id="Q3", text="At long context does a fixed 1/√d_k spread attention too thin, and does log-n "
    "scaling help length generalization?",
    measures="train at n; evaluate at 2n and 4n plainly and with a log-n factor",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw, studies=("length",),
    answers=ANSWERS,
    says=(Says("when", says_when, rank=40),)))
