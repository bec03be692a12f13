"""C4: "Softmax needs unbounded inputs; cosine's [−1, 1] range limits it" (the Q&A thread "Why
do we use square root of key dimension for scaling?"; cosine attention with a temperature:
Henry et al. 2020, arXiv 2010.04245; Liu et al. 2022, arXiv 2111.09883).

Theory: logits in [−τ, τ] allow at most e^{2τ}/(e^{2τ}+n−1) of the weight on one of n keys
(:func:`attnscale.measure.theory.max_weight_bound`), so the τ that lets one key take half the
weight, ½·ln(n−1) (:func:`attnscale.measure.theory.tau_for_max_weight`), grows with ln n.
Training: retrieval of one pair among fillers at each sequence length n of the temperature study
(its ``seq_len`` cells), paired clipped eval loss cosine − scaled_dot at τ ∈ {1, 2, 4, 10,
learned}, each arm at its tuned LR.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Says, Sources, register
from attnscale.audit.compare import Pair, family, mean, no_worse
from attnscale.audit.evidence import Model, Run, Tau, arms_table, chance, metric
from attnscale.audit.figures import fig_arms, fig_forest
from attnscale.audit.interval import Comparison
from attnscale.audit.selection import cell_label
from attnscale.audit.studies import VARIANTS, Study
from attnscale.audit.task_readings import COSINES, learned, not_learned
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Verdict,
)
from attnscale.audit.words import fx, reads
from attnscale.lab.paired import EQUAL, GREATER, LESS
from attnscale.measure import theory

RULE = ("Theory: logits in [−τ, τ] allow at most e^{2τ}/(e^{2τ}+n−1) weight on one of n keys "
        "(0.19 at τ=1, n=32; 0.10 at n=64), so the τ that lets one key take half the weight, "
        "½·ln(n−1), grows with ln n (1.72 at n=32, 2.07 at n=64). Training (retrieval of one "
        "pair among fillers at each length n of the study, each arm at the LR its tuning seeds "
        "chose): paired differences of clipped eval loss cosine − scaled_dot for τ ∈ {1, 2, 4, "
        "10, learned} at each n (loss, not accuracy: accuracy saturates at 1 and hides how "
        "sure the model is). Supported if every τ reads greater (worse) at every n: the bound "
        "limits cosine whatever τ; refuted if τ=1 is no worse (non-inferior within δ) at every "
        "n; depends if τ=1 reads greater at some n and either a larger or learned τ is no worse "
        "somewhere or τ=1 is no worse at another n (it depends on τ and n, not on cosine "
        "itself); inconclusive otherwise, or if scaled_dot did not learn the task at some n "
        "(accuracy below twice chance). Holm over τ=1 across n, and apart over the larger and "
        "learned τ across n (both read through 'some')")
LAST = {SUPPORTED: "So the bound limits cosine attention at every τ and n tried.",
        DEPENDS: "So it depends on τ (fixed or learned) against n, not on cosine similarity "
                 "itself.",
        REFUTED: "Even τ=1 is enough on this task at every n tried: the bound does not bind "
                 "here.",
        INCONCLUSIVE: "The intervals are too wide to decide at this many seeds."}


class Evidence(Model):
    """The temperature study at each of its sequence lengths, by ``"n=<n>"`` in increasing n:
    per length the accuracy and clipped loss per arm (table ``"all"``), the cap at each τ, n
    and chance (:func:`tau_by_length`)."""

    by_n: dict[str, Tau]


# ------------------------------------------------------------------------------ evidence


def lengths_of(study: Study) -> list[int]:
    """The study's sequence lengths: its ``seq_len`` cells, else its base ``seq_len``."""
    return sorted(study.cells.get("seq_len", ())) or [int(study.base["seq_len"])]


def tau_by_length(study: Study, runs: list[Run]) -> dict[str, Any]:
    """{"by_n": {"n=<n>": the study at length n}}: accuracy and clipped loss per arm (one table
    "all" each; each arm's ``source`` names its seq_len cell, so the LR reading of one length
    switches alone), the bound e^{2τ}/(e^{2τ}+n−1) at each τ, n and chance."""
    acc, loss = arms_table(study, runs, metric), arms_table(study, runs)
    taus = {a: VARIANTS[a]["tau"] for a in study.arms if "tau" in VARIANTS[a]}
    out = {}
    for n in lengths_of(study):
        label = cell_label((("seq_len", n),)) if "seq_len" in study.cells else "all"
        out[f"n={n}"] = {"accuracy": {"all": acc.get(label, {})},
                         "loss": {"all": loss.get(label, {})},
                         "bound": {a: float(theory.max_weight_bound(n, t)) for a, t in
                                   taus.items()},
                         "n": n, "chance": chance(study)}
    return {"by_n": out}


# ------------------------------------------------------------------------------ the rule


def key(first: str, n: str, arm: str) -> str:
    """A comparison's name: the arm at the first (training) length, ``n=64 arm`` beyond it."""
    return arm if n == first else f"{n} {arm}"


def pairs_of(ev: Evidence) -> tuple[dict[str, Pair], list[str], list[str]]:
    """(cosine − scaled_dot pairs at every length, the τ=1 names, the other names)."""
    first = next(iter(ev.by_n))
    pairs: dict[str, Pair] = {}
    for n, t in ev.by_n.items():
        loss = t.loss["all"]
        pairs.update({key(first, n, a): (loss.get(a), loss.get("scaled_dot"))
                      for a in COSINES if a in loss})
    tau1 = [k for k in pairs if k.endswith("cosine_tau1")]
    return pairs, tau1, [k for k in pairs if k not in tau1]


def verdict_of(comps: Mapping[str, Comparison], tau1: list[str]) -> str:
    """The rule's verdict from the comparisons (RULE)."""
    t1 = [comps[k] for k in tau1]
    rescued = any(c.no_worse() for k, c in comps.items() if k not in tau1)
    if t1 and all(c.no_worse() for c in t1):
        return REFUTED
    if t1 and all(c.greater() for c in comps.values()):
        return SUPPORTED
    if any(c.greater() for c in t1) and (rescued or any(c.no_worse() for c in t1)):
        return DEPENDS
    return INCONCLUSIVE


def rescued_at(comps: Mapping[str, Comparison], first: str, n: str) -> list[str]:
    """The larger or learned τ no worse than scaled_dot at length ``n``, as ``tau4``."""
    return [a.replace("cosine_", "") for a in COSINES[1:]
            if (c := comps.get(key(first, n, a))) is not None and c.no_worse()]


def sentences(ev: Evidence, comps: Mapping[str, Comparison], verdict: str) -> list[str]:
    """The plain sentences: per length the cap at τ=1, τ=1's loss gap and which τ matched
    scaled_dot; the τ that half the weight needs at each n; what the verdict means."""
    first = next(iter(ev.by_n))
    out = []
    for n, t in ev.by_n.items():
        c = comps.get(key(first, n, "cosine_tau1"))
        acc = ", ".join(f"{a} {mean(t.accuracy['all'].get(a)):.2f}"
                        for a in ("scaled_dot", "cosine_tau1"))
        gap = (f"cosine τ=1's loss is {c.mean:+.3f} nats from scaled_dot's ({c.reading})"
               if c is not None else "cosine τ=1 was not measured")
        out.append(f"At {t.n} keys no weight can exceed {t.bound.get('cosine_tau1', 0.0):.3f} "
                   f"at τ=1; {gap}; accuracy {acc}; no worse than scaled_dot: "
                   f"{', '.join(rescued_at(comps, first, n)) or 'none'}.")
    half = ", ".join(f"{float(theory.tau_for_max_weight(t.n, 0.5)):.2f} at n = {t.n}"
                     for t in ev.by_n.values())
    out.append(f"For one key to take half the weight τ must reach ½·ln(n−1): {half}.")
    return [*out, LAST[verdict]]


def judge(ev: Evidence) -> Verdict:
    """Retrieval loss of cosine attention at each temperature against scaled_dot at each
    sequence length: Holm over τ=1 across lengths, apart over the larger and learned τ across
    lengths, δ = 0.02 nats."""
    ns = [t.n for t in ev.by_n.values()]
    kw = {"regime": f"retrieval among fillers, n = {' and '.join(map(str, ns)) or '?'} keys, "
          "unit-variance q, k at init", "smallest": LOSS_WHY}
    for t in ev.by_n.values():
        base = t.accuracy["all"].get("scaled_dot")
        if not learned(base, t.chance):
            return not_learned(f"scaled_dot at n = {t.n}", base, t.chance, RULE, **kw)
    if not ev.by_n:
        return not_learned("scaled_dot", None, 0.0, RULE, **kw)
    pairs, tau1, others = pairs_of(ev)
    comps = family(pairs, LOSS_DELTA, holm_over=[g for g in (tau1, others) if g])
    verdict = verdict_of(comps, tau1)
    first = next(iter(ev.by_n))
    t1 = ", ".join(f"{n} {comps[k].reading}" for n in ev.by_n
                   if (k := key(first, n, "cosine_tau1")) in comps)
    matched = "; ".join(f"{n} {', '.join(rescued_at(comps, first, n)) or 'none'}"
                        for n in ev.by_n)
    return Verdict(verdict, RULE, "; ".join(f"{a} {c.effect('nats')}" for a, c in
                                            comps.items()), comps,
                   headline=f"{verdict}: τ=1 {t1 or INCONCLUSIVE}; matched by {matched}",
                   plain=sentences(ev, comps, verdict), **kw)


# ------------------------------------------------------------------------------ figures


def bound_alt(ev: Mapping[str, Any]) -> str:
    """The arms figure's second sentence: the exact cap on one key's weight at τ = 1."""
    b = ev.get("bound", {})
    if not T.finite(b.get("cosine_tau1")):
        return ""
    more = f", {b['cosine_tau4']:.2f} at τ = 4" if T.finite(b.get("cosine_tau4")) else ""
    return (f"Theory caps one key's weight at e^(2τ)/(e^(2τ)+n−1) = {b['cosine_tau1']:.2f} at "
            f"τ = 1 over {ev['n']} keys{more}.")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Accuracy per arm with the cap at each τ, one figure per length
    (:func:`attnscale.audit.figures.fig_arms`; ``c4_tau`` at the first, ``c4_tau_n<n>``
    beyond), and the forest plot of the paired loss differences cosine − scaled_dot at every
    length with ±δ when the rule compared them (not when scaled_dot did not learn the task)."""
    figs = []
    for i, t in enumerate(ev["by_n"].values()):
        figs.append(fig_arms(dict(t), folder, "c4_tau" if i == 0 else f"c4_tau_n{t['n']}",
                             f"C4: retrieval among fillers, n = {t['n']} keys, accuracy per "
                             "arm", bound_alt(t)))
    if numbers:
        n = T.n_seeds(numbers)
        figs.append(fig_forest(dict(numbers), folder, "c4_effects",
                               f"C4: cosine − scaled_dot clipped eval loss, {n} seeds, mean and "
                               "95% CI", "nats", "Cosine minus scaled_dot retrieval loss"))
    return figs


def gather(src: Sources) -> dict[str, Any]:
    """The temperature study at n = 32 and its second length (:func:`tau_by_length`)."""
    return {"by_n": {**src.study("tau", tau_by_length)["by_n"],
                     **src.study("tau_n64", tau_by_length)["by_n"]}}


# ------------------------------------------------------------------------------ the answers


def says_answer(e: dict[str, Any]) -> list[str]:
    """Cosine only with a temperature, when τ = 1 trails."""
    t1 = e["numbers"].get("cosine_tau1", {})
    if t1.get("reading") != GREATER:
        return []
    c4 = e["numbers"]
    held = {n: [a.split(" ")[-1].replace("cosine_", "") for a, c in c4.items()
                if (a.startswith(f"{n} ") if n else " " not in a)
                and not a.endswith("tau1") and no_worse(c)]
            for n in ["", *sorted({a.split(" ")[0] for a in c4 if " " in a},
                                  key=lambda k: int(k[2:]))]}
    where = "; ".join(f"{', '.join(v) or 'no τ'} at {n[2:] if n else 'the training'}"
                      f"{' keys' if n else ' length'}" for n, v in held.items())
    return [f"Cosine attention only with a temperature, and one that grows with the number of "
            f"keys: at τ = 1 its bounded logits cannot focus the softmax; scaled dot was matched "
            f"by {where} (C4)."]


def says_alternatives(e: dict[str, Any]) -> list[str]:
    """Cosine at τ = 1 against scaled dot on retrieval at the training length, which τ did no
    worse, and the same at a larger n."""
    c4 = e["numbers"]
    if "cosine_tau1" not in c4:
        return []
    t1 = c4["cosine_tau1"]
    rescued = [a.replace("cosine_", "") for a, c in c4.items()
               if " " not in a and a != "cosine_tau1" and no_worse(c)]
    lead = {GREATER: "Cosine attention needs a temperature: at τ = 1 its retrieval loss is",
            EQUAL: "Cosine attention at τ = 1 held up on retrieval: its loss is",
            LESS: "Cosine attention at τ = 1 beat scaled dot on retrieval: its loss is",
            }.get(t1["reading"], "Cosine attention at τ = 1 was no worse on retrieval: its "
                                 "loss is" if no_worse(t1) else "Whether cosine at τ = 1 "
                                 "falls behind on retrieval was not decided: its loss is")
    out = (f"{lead} {fx(t1)} against scaled dot; "
           f"{', '.join(rescued) or 'no other τ tried'} did no worse than scaled dot")
    for n in sorted({a.split(" ")[0] for a in c4 if " " in a}, key=lambda k: int(k[2:])):
        more = [a.split(" ")[1].replace("cosine_", "") for a, c in c4.items()
                if a.startswith(f"{n} ") and not a.endswith("tau1") and no_worse(c)]
        out += f"; at {n[2:]} keys, {', '.join(more) or 'none'}"
    return [out + " (C4)."]


def says_when(e: dict[str, Any]) -> list[str]:
    """A learned temperature for bounded logits."""
    c4 = e["numbers"].get("cosine_learned")
    if not c4:
        return []
    t1 = e["numbers"].get("cosine_tau1", {})
    where = (", where τ = 1 trails it" if t1.get("reading") == GREATER else
             ", and so did τ = 1" if t1 and no_worse(t1) else "")
    return [f"A learned temperature, whenever logits are bounded (cosine, QK-norm): a learned "
            f"τ {reads(c4)} scaled dot on retrieval ({fx(c4)}){where} (C4)."]


CLAIM = register(Claim(
    id="C4", text="Softmax needs unbounded inputs; cosine's [−1, 1] range limits it.",
    measures="exact max-weight bound; retrieval at two lengths n, cosine τ = 1, 2, 4, 10, "
    "learned", rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("tau", "tau_n64"),
    says=(Says("answer", says_answer, rank=30), Says("alternatives", says_alternatives, rank=20),
          Says("when", says_when, rank=30))))
