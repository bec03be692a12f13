"""C3: "Cosine similarity throws away magnitude information the dot product keeps" (the Q&A
thread "Why do we use square root of key dimension for scaling?"; cosine attention: Henry et
al. 2020, arXiv 2010.04245).

Measured on the salience study: the relevant key is marked only by its norm (scaled after W_k,
past LayerNorm), with two controls that must stay at chance (uniform attention, no cue); paired
accuracy cosine − scaled_dot at τ = 1, τ = 10 and learned τ, Holm over all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Says, Sources, register
from attnscale.audit.compare import family, mean
from attnscale.audit.evidence import Accuracy, Run, accuracy_evidence
from attnscale.audit.evidence import chance as task_chance
from attnscale.audit.figures import fig_arms, fig_forest
from attnscale.audit.studies import Study
from attnscale.audit.task_readings import COSINES, learned, not_learned
from attnscale.audit.verdicts import (
    ACC_DELTA,
    ACC_WHY,
    DEPENDS,
    INCONCLUSIVE,
    REFUTED,
    SUPPORTED,
    Verdict,
)
from attnscale.lab.paired import LESS

Evidence = Accuracy
CONTROLS = ("uniform", "cue_none")  # arms expected at chance: no attention, no cue
RULE = ("Salience task with the cue on ‖k‖ only (the relevant key's vector is scaled after "
        "W_k, so LayerNorm cannot turn it into a direction); controls: uniform attention and "
        "no cue, both expected at chance. Paired accuracy differences cosine − scaled_dot "
        "(τ=1, τ=10, learned τ), Holm-corrected over all (the rule's 'depends' reads them "
        "through 'some'). Supported if every cosine variant reads less (it cannot see the "
        "norm); refuted if every one is no worse (non-inferior within 0.05); depends if "
        "some read less and some no worse; inconclusive if scaled_dot did not learn the "
        "task or a control beat chance by 0.05 (the cue leaked)")


def judge(ev: Accuracy) -> Verdict:
    """Cosine variants against scaled_dot when only ‖k‖ marks the relevant key: paired
    accuracy differences, Holm over every cosine variant, δ = 0.05."""
    acc = ev.accuracy["all"]
    base, chance = acc.get("scaled_dot"), ev.chance
    kw = {"regime": "cue on ‖k‖ after the key projection", "smallest": ACC_WHY}
    if not learned(base, chance):
        return not_learned("scaled_dot", base, chance, RULE, **kw)
    missing = [c for c in ev.controls if acc.get(c) is None or not acc[c].values]
    leaks = [c for c in ev.controls if c not in missing
             and mean(acc.get(c)) > chance + ACC_DELTA]
    if missing or leaks:
        return Verdict(INCONCLUSIVE, RULE, f"controls missing: {missing or 'none'}; above "
                       f"chance: {leaks or 'none'} — without both controls at chance the task "
                       "cannot show that only ‖k‖ carries the cue", **kw)
    comps = family({a: (acc.get(a), base) for a in COSINES if a in acc}, ACC_DELTA)
    reads = [c.reading for c in comps.values()]
    if reads and all(c.less() for c in comps.values()):
        verdict = SUPPORTED
    elif reads and all(c.no_better() for c in comps.values()):
        verdict = REFUTED
    elif LESS in reads and any(c.no_better() for c in comps.values()):
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    plain = [f"scaled_dot reads the norm cue ({mean(base):.2f} accuracy, chance {chance:.2f}); "
             + ", ".join(f"{a} {mean(acc.get(a)):.2f}" for a in comps) + ".",
             "Cosine divides ‖k‖ out exactly, so a cue carried only by a key's length is "
             "invisible to it, whatever its temperature.",
             "In a full model the same information can also travel as a direction (before "
             "LayerNorm), where cosine can still use it."]
    return Verdict(verdict, RULE, "; ".join(f"{a} {c.effect()}" for a, c in comps.items()),
                   comps, headline=f"{verdict}: scaled {mean(base):.2f}, cosine best "
                   f"{max((mean(acc.get(a)) for a in comps), default=math.nan):.2f}",
                   plain=plain, **kw)


def controls_alt(ev: Mapping[str, Any]) -> str:
    """The arms figure's second sentence: the controls, which must sit at chance."""
    acc = ev["accuracy"]["all"]
    parts = [f"{c} {T.arm_ci(acc.get(c))['mean']:.2f}" for c in ev.get("controls", ())
             if T.arm_ci(acc.get(c))["n"]]
    return f"The controls stay near chance: {', '.join(parts)}." if parts else ""


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Accuracy per arm with chance (:func:`attnscale.audit.figures.fig_arms`), and the forest
    plot of the paired differences cosine − scaled_dot with ±δ when the rule compared them (not
    when scaled_dot did not learn the task or a control failed: the arms figure shows why)."""
    figs = [fig_arms(dict(ev), folder, "c3_salience",
                     r"C3: salience, cue on $\|k\|$ only, accuracy per arm", controls_alt(ev))]
    if numbers:
        n = T.n_seeds(numbers)
        figs.append(fig_forest(dict(numbers), folder, "c3_effects",
                               f"C3: cosine − scaled_dot accuracy, {n} seeds, mean and 95% CI",
                               "accuracy", "Cosine minus scaled_dot accuracy with the cue on ‖k‖"))
    return figs


def salience_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """Accuracy per arm of the salience study, its control arms and its chance level."""
    return accuracy_evidence(study, runs, controls=[a for a in study.arms if a in CONTROLS],
                             chance=task_chance(study))


def gather(src: Sources) -> dict[str, Any]:
    return src.study("salience", salience_evidence)


def says_alternatives(e: dict[str, Any]) -> list[str]:
    """Whether cosine loses a cue carried by ‖k‖ alone."""
    c3 = e["numbers"]
    if not c3:
        return []
    best = max(c3.values(), key=lambda c: c["mean"])
    lead = {SUPPORTED: "Cosine attention cannot see a cue carried by ‖k‖ alone",
            REFUTED: "Cosine attention still found a cue carried by ‖k‖ alone"}.get(
        e["verdict"], "Whether cosine attention loses a cue carried by ‖k‖ alone was not decided")
    return [f"{lead}: its best accuracy is {abs(best['mean']):.2f} "
            f"{'below' if best['mean'] < 0 else 'above'} scaled dot's (C3)."]


CLAIM = register(Claim(
    id="C3", text="Cosine similarity throws away magnitude information the dot product keeps.",
    measures="salience with the cue on ‖k‖ only, and two controls: paired accuracy",
    rule=RULE, evidence=Accuracy, gather=gather, judge=judge, draw=draw,
    studies=("salience",),
    says=(Says("alternatives", says_alternatives, rank=30),)))
