"""C4: "Softmax needs unbounded inputs; cosine's [−1, 1] range limits it" (the Q&A thread "Why
do we use square root of key dimension for scaling?"; cosine attention with a temperature:
Henry et al. 2020, arXiv 2010.04245; Liu et al. 2022, arXiv 2111.09883).

Theory: logits in [−τ, τ] allow at most e^{2τ}/(e^{2τ}+n−1) of the weight on one of n keys.
Training: retrieval of one pair among fillers (n = 32 keys), paired clipped eval loss
cosine − scaled_dot at τ ∈ {1, 2, 4, 10, learned}, each arm at its tuned LR.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import family, mean
from attnscale.audit.evidence import Tau, tau_evidence
from attnscale.audit.figures import fig_arms, fig_forest
from attnscale.audit.interval import Comparison
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
from attnscale.lab.paired import GREATER

Evidence = Tau
RULE = ("Theory: logits in [−τ, τ] allow at most e^{2τ}/(e^{2τ}+n−1) weight on one of n keys "
        "(0.19 at τ=1, n=32; 0.5 at τ = ln(n−1)/2 = 1.72). Training (retrieval of one pair "
        "among fillers, n=32 keys, each arm at the LR its tuning seeds chose): paired "
        "differences of clipped eval loss cosine − scaled_dot for τ ∈ {1, 2, 4, 10, "
        "learned} (loss, not accuracy: accuracy saturates at 1 and hides how sure the model "
        "is). Supported if every τ reads greater (worse: the bound limits cosine whatever "
        "τ); depends (on τ) if τ=1 reads greater but some larger or learned τ is no worse "
        "(non-inferior within δ); refuted if τ=1 itself is no worse; inconclusive "
        "otherwise, or if scaled_dot did not learn the task (accuracy below twice chance). "
        "τ=1 is tested alone; Holm over the larger and learned τ (read through 'some')")
LAST = {SUPPORTED: "So the bound limits cosine attention at every τ tried.",
        DEPENDS: "So it depends on τ, fixed or learned, not on cosine similarity itself.",
        REFUTED: "Even τ=1 is enough on this task: the bound does not bind here.",
        INCONCLUSIVE: "The intervals are too wide to decide at this many seeds."}


def sentences(ev: Tau, comps: Mapping[str, Comparison], rescued: list[str],
              verdict: str) -> list[str]:
    """The plain sentences: τ=1's bound and loss gap, the bound at larger τ and which τ
    matched scaled_dot, and what the verdict means."""
    acc, b = ev.accuracy["all"], ev.bound
    accs = ", ".join(f"{a} {mean(acc.get(a)):.2f}" for a in ("scaled_dot", *comps))
    t1 = comps.get("cosine_tau1")
    return [f"At τ=1 no weight can exceed {b['cosine_tau1']:.3f} over {ev.n} keys; cosine "
            f"τ=1's loss is {t1.mean:+.3f} nats from scaled_dot's ({t1.reading}); accuracy "
            f"{accs}." if t1 else f"Accuracy {accs}.",
            f"A temperature lifts the bound e^{{2τ}}/(e^{{2τ}}+n−1) ({b['cosine_tau4']:.2f} at "
            f"τ=4, {b['cosine_tau10']:.4f} at τ=10); matched scaled_dot here: "
            f"{', '.join(rescued) or 'none'}.",
            LAST[verdict]]


def judge(ev: Tau) -> Verdict:
    """Retrieval loss of cosine attention at each temperature against scaled_dot: τ=1 alone,
    Holm over the larger and learned τ, δ = 0.02 nats."""
    acc, loss = ev.accuracy["all"], ev.loss["all"]
    base = acc.get("scaled_dot")
    kw = {"regime": f"retrieval among fillers, n = {ev.n} keys, GPT-2 init",
          "smallest": LOSS_WHY}
    if not learned(base, ev.chance):
        return not_learned("scaled_dot", base, ev.chance, RULE, **kw)
    pairs = {a: (loss.get(a), loss.get("scaled_dot")) for a in COSINES if a in loss}
    comps = family(pairs, LOSS_DELTA, holm_over=[[a for a in pairs if a != "cosine_tau1"]])
    t1 = comps.get("cosine_tau1")
    tau1 = t1.reading if t1 else INCONCLUSIVE
    rescued = [a for a, c in comps.items() if a != "cosine_tau1" and c.no_worse()]
    if t1 is not None and t1.no_worse():
        verdict = REFUTED
    elif tau1 == GREATER and rescued:
        verdict = DEPENDS
    elif tau1 == GREATER and all(c.greater() for c in comps.values()):
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    return Verdict(verdict, RULE, "; ".join(f"{a} {c.effect('nats')}" for a, c in
                                            comps.items()), comps,
                   headline=f"{verdict}: τ=1 {tau1}; matched by {', '.join(rescued) or 'none'}",
                   plain=sentences(ev, comps, rescued, verdict), **kw)


def bound_alt(ev: Mapping[str, Any]) -> str:
    """The arms figure's second sentence: the exact cap on one key's weight at τ = 1."""
    b = ev.get("bound", {})
    if not T.finite(b.get("cosine_tau1")):
        return ""
    more = f", {b['cosine_tau4']:.2f} at τ = 4" if T.finite(b.get("cosine_tau4")) else ""
    return (f"Theory caps one key's weight at e^(2τ)/(e^(2τ)+n−1) = {b['cosine_tau1']:.2f} at "
            f"τ = 1 over {ev['n']} keys{more}.")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Accuracy per arm with the cap at each τ (:func:`attnscale.audit.figures.fig_arms`),
    and the forest plot of the paired loss differences cosine − scaled_dot with ±δ when the
    rule compared them (not when scaled_dot did not learn the task)."""
    figs = [fig_arms(dict(ev), folder, "c4_tau", f"C4: retrieval among fillers, "
                     f"n = {ev['n']} keys, accuracy per arm", bound_alt(ev))]
    if numbers:
        n = T.n_seeds(numbers)
        figs.append(fig_forest(dict(numbers), folder, "c4_effects",
                               f"C4: cosine − scaled_dot clipped eval loss, {n} seeds, mean and "
                               "95% CI", "nats", "Cosine minus scaled_dot retrieval loss"))
    return figs


def gather(src: Sources) -> dict[str, Any]:
    return src.study("tau", tau_evidence)


CLAIM = register(Claim(
    id="C4", text="Softmax needs unbounded inputs; cosine's [−1, 1] range limits it.",
    measures="exact max-weight bound; retrieval at n = 32, cosine τ = 1, 2, 4, 10, learned",
    rule=RULE, evidence=Tau, gather=gather, judge=judge, draw=draw, studies=("tau",)))
