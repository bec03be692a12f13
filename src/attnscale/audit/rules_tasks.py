"""The rules the task studies decide: C3 (salience), C4 (the temperature of cosine attention
on retrieval) and Q3 (length).

Differences are paired per seed and read against a smallest effect (0.02 nats of loss, 5
accuracy points), with Holm's correction over the comparisons a rule reads through "some"
(:mod:`attnscale.audit.compare`); "equal or better" is a non-inferiority reading. A task the
baseline did not learn (its mean accuracy below twice chance) gives ``inconclusive``: it
cannot tell the scores apart.
"""

from __future__ import annotations

import math
from typing import Any

from attnscale.audit.compare import family, mean, no_better, no_worse
from attnscale.audit.verdicts import (
    ACC_DELTA,
    ACC_WHY,
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Evidence,
    Verdict,
    fmt_effect,
)
from attnscale.lab.paired import GREATER, LESS

COSINES = ("cosine_tau1", "cosine_tau2", "cosine_tau4", "cosine_tau10", "cosine_learned")


def learned(arm: dict[str, Any] | None, chance: float) -> bool:
    """The arm's mean accuracy is at least twice chance."""
    return mean(arm) >= 2 * chance


def not_learned(name: str, arm: dict[str, Any] | None, chance: float, rule: str,
                **kw: Any) -> Verdict:
    """The inconclusive verdict of a task that ``name`` did not learn."""
    return Verdict(INCONCLUSIVE, rule, f"{name} reached {mean(arm):.3g} accuracy (chance "
                   f"{chance:.3g}): this budget did not learn the task", **kw)


C4_RULE = ("Theory: logits in [−τ, τ] allow at most e^{2τ}/(e^{2τ}+n−1) weight on one of n keys "
           "(0.19 at τ=1, n=32; 0.5 at τ = ln(n−1)/2 = 1.72). Training (retrieval of one pair "
           "among fillers, n=32 keys, each arm at the LR its tuning seeds chose): paired "
           "differences of clipped eval loss cosine − scaled_dot for τ ∈ {1, 2, 4, 10, "
           "learned} (loss, not accuracy: accuracy saturates at 1 and hides how sure the model "
           "is). Supported if every τ reads greater (worse: the bound limits cosine whatever "
           "τ); depends (on τ) if τ=1 reads greater but some larger or learned τ is no worse "
           "(non-inferior within δ); refuted if τ=1 itself is no worse; inconclusive "
           "otherwise, or if scaled_dot did not learn the task (accuracy below twice chance). "
           "τ=1 is tested alone; Holm over the larger and learned τ (read through 'some')")


def judge_c4(ev: Evidence) -> Verdict:
    """C4: retrieval loss of cosine attention at each temperature against scaled_dot."""
    acc, loss = ev["accuracy"]["all"], ev["loss"]["all"]
    base = acc.get("scaled_dot")
    kw = {"regime": f"retrieval among fillers, n = {ev['n']} keys, GPT-2 init",
          "smallest": LOSS_WHY}
    if not learned(base, ev["chance"]):
        return not_learned("scaled_dot", base, ev["chance"], C4_RULE, **kw)
    pairs = {a: (loss.get(a), loss.get("scaled_dot")) for a in COSINES if a in loss}
    comps = family(pairs, LOSS_DELTA, holm_over=[[a for a in pairs if a != "cosine_tau1"]])
    tau1 = comps.get("cosine_tau1", {}).get("reading", INCONCLUSIVE)
    rescued = [a for a, c in comps.items() if a != "cosine_tau1" and no_worse(c)]
    if "cosine_tau1" in comps and no_worse(comps["cosine_tau1"]):
        verdict = REFUTED
    elif tau1 == GREATER and rescued:
        verdict = DEPENDS
    elif tau1 == GREATER and all(c["reading"] == GREATER for c in comps.values()):
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    b = ev["bound"]
    accs = ", ".join(f"{a} {mean(acc.get(a)):.2f}" for a in ("scaled_dot", *comps))
    t1 = comps.get("cosine_tau1")
    plain = [f"At τ=1 no weight can exceed {b['cosine_tau1']:.3f} over {ev['n']} keys; cosine "
             f"τ=1's loss is {t1['mean']:+.3f} nats from scaled_dot's ({tau1}); accuracy "
             f"{accs}." if t1 else f"Accuracy {accs}.",
             f"A temperature lifts the bound e^{{2τ}}/(e^{{2τ}}+n−1) ({b['cosine_tau4']:.2f} at "
             f"τ=4, {b['cosine_tau10']:.4f} at τ=10); matched scaled_dot here: "
             f"{', '.join(rescued) or 'none'}.",
             {SUPPORTED: "So the bound limits cosine attention at every τ tried.",
              DEPENDS: "So it depends on τ, fixed or learned, not on cosine similarity itself.",
              REFUTED: "Even τ=1 is enough on this task: the bound does not bind here.",
              INCONCLUSIVE: "The intervals are too wide to decide at this many seeds."}[verdict]]
    return Verdict(verdict, C4_RULE, "; ".join(f"{a} {fmt_effect(c, 'nats')}" for a, c in
                                               comps.items()), comps,
                   headline=f"{verdict}: τ=1 {tau1}; matched by {', '.join(rescued) or 'none'}",
                   plain=plain, **kw)


C3_RULE = ("Salience task with the cue on ‖k‖ only (the relevant key's vector is scaled after "
           "W_k, so LayerNorm cannot turn it into a direction); controls: uniform attention and "
           "no cue, both expected at chance. Paired accuracy differences cosine − scaled_dot "
           "(τ=1, τ=10, learned τ), Holm-corrected over all (the rule's 'depends' reads them "
           "through 'some'). Supported if every cosine variant reads less (it cannot see the "
           "norm); refuted if every one is no worse (non-inferior within 0.05); depends if "
           "some read less and some no worse; inconclusive if scaled_dot did not learn the "
           "task or a control beat chance by 0.05 (the cue leaked)")


def judge_c3(ev: Evidence) -> Verdict:
    """C3: cosine variants against scaled_dot when only ‖k‖ marks the relevant key."""
    acc = ev["accuracy"]["all"]
    base, chance = acc.get("scaled_dot"), ev["chance"]
    kw = {"regime": "cue on ‖k‖ after the key projection", "smallest": ACC_WHY}
    if not learned(base, chance):
        return not_learned("scaled_dot", base, chance, C3_RULE, **kw)
    missing = [c for c in ev.get("controls", ()) if not (acc.get(c) or {}).get("values")]
    leaks = [c for c in ev.get("controls", ()) if c not in missing
             and mean(acc.get(c)) > chance + ACC_DELTA]
    if missing or leaks:
        return Verdict(INCONCLUSIVE, C3_RULE, f"controls missing: {missing or 'none'}; above "
                       f"chance: {leaks or 'none'} — without both controls at chance the task "
                       "cannot show that only ‖k‖ carries the cue", **kw)
    comps = family({a: (acc.get(a), base) for a in COSINES if a in acc}, ACC_DELTA)
    reads = [c["reading"] for c in comps.values()]
    if reads and all(r == LESS for r in reads):
        verdict = SUPPORTED
    elif reads and all(no_better(c) for c in comps.values()):
        verdict = REFUTED
    elif LESS in reads and any(no_better(c) for c in comps.values()):
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    plain = [f"scaled_dot reads the norm cue ({mean(base):.2f} accuracy, chance {chance:.2f}); "
             + ", ".join(f"{a} {mean(acc.get(a)):.2f}" for a in comps) + ".",
             "Cosine divides ‖k‖ out exactly, so a cue carried only by a key's length is "
             "invisible to it, whatever its temperature.",
             "In a full model the same information can also travel as a direction (before "
             "LayerNorm), where cosine can still use it."]
    return Verdict(verdict, C3_RULE, "; ".join(f"{a} {fmt_effect(c)}" for a, c in
                                               comps.items()), comps,
                   headline=f"{verdict}: scaled {mean(base):.2f}, cosine best "
                   f"{max((mean(acc.get(a)) for a in comps), default=math.nan):.2f}",
                   plain=plain, **kw)


Q3_RULE = ("Length task trained at n, evaluated at n, 2n, 4n; each arm at its tuned LR. Paired "
           "differences of eval loss log_length − scaled_dot at 2n and 4n (loss, not accuracy: "
           "scaled_dot's accuracy near its ceiling leaves less room than δ; accuracy and the "
           "attention weight on the answer are shown beside it). Supported if log_length's "
           "loss reads less (better by more than 0.02 nats) at 4n; refuted if it is no better "
           "(non-inferior the other way) at both 2n and 4n; depends otherwise when every length "
           "is decided; inconclusive if scaled_dot did not learn the task at n or a length is "
           "undecided. Each comparison is tested alone: the rule reads them only through 'at "
           "4n' and 'at both'")


def judge_q3(ev: Evidence) -> Verdict:
    """Q3: length generalization of log-length scaling against a fixed 1/√d, on eval loss."""
    lengths = ev["lengths"]
    acc = {k: ev["accuracy"][k]["all"] for k in lengths}
    loss = {k: ev["loss"][k]["all"] for k in lengths}
    kw = {"regime": f"trained at {lengths[0] if lengths else '?'}, RoPE; the length task only",
          "smallest": LOSS_WHY}
    if not lengths or not learned(acc[lengths[0]].get("scaled_dot"), ev["chance"]):
        base = acc[lengths[0]].get("scaled_dot") if lengths else None
        return not_learned("scaled_dot", base, ev["chance"], Q3_RULE, **kw)
    longer = lengths[1:]
    comps = family({k: (loss[k].get("log_length"), loss[k].get("scaled_dot")) for k in longer},
                   LOSS_DELTA, holm_over=[])
    last = comps[longer[-1]]["reading"] if longer else INCONCLUSIVE
    if last == LESS:
        verdict = SUPPORTED
    elif comps and all(no_better(c) for c in comps.values()):
        verdict = REFUTED
    elif comps and all(c["reading"] != INCONCLUSIVE or no_better(c) for c in comps.values()):
        verdict = DEPENDS  # every length decided, and they differ
    else:
        verdict = INCONCLUSIVE
    w = ev.get("answer_weight", {})
    def weights(arm: str) -> str:
        return ", ".join(f"{k} {mean(w.get(k, {}).get('all', {}).get(arm)):.2f}"
                         for k in lengths)
    plain = [f"Eval loss at {', '.join(lengths)}: scaled_dot "
             + ", ".join(f"{mean(loss[k].get('scaled_dot')):.3f}" for k in lengths)
             + "; log_length " + ", ".join(f"{mean(loss[k].get('log_length')):.3f}"
                                          for k in lengths) + " nats.",
             f"Accuracy at {', '.join(lengths)}: scaled_dot "
             + ", ".join(f"{mean(acc[k].get('scaled_dot')):.2f}" for k in lengths)
             + "; log_length " + ", ".join(f"{mean(acc[k].get('log_length')):.2f}"
                                          for k in lengths) + ".",
             f"Attention on the answer: scaled_dot {weights('scaled_dot')}; log_length "
             f"{weights('log_length')}.",
             "Whether fading matters depends on how far past the training length one goes."]
    return Verdict(verdict, Q3_RULE, "; ".join(f"{k} {fmt_effect(c, 'nats')}" for k, c in
                                               comps.items()), comps,
                   headline=f"{verdict}: at {longer[-1] if longer else '?'} log_length "
                   f"{comps[longer[-1]]['mean'] if longer else math.nan:+.3f} nats",
                   plain=plain, **kw)
