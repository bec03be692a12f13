"""Q4: "Is QK-Clip free on top of 1/√d_k, as Kimi K2 uses it, and can it stand in for 1/√d_k?"
(beyond the thread: Kimi Team 2025, "Kimi K2: Open Agentic Intelligence", arXiv:2507.20534,
§2.1, MuonClip; :mod:`attnscale.integrations.qkclip`).

QK-Clip: after each optimizer step, a head h whose largest logit S_h on the step's batch passed
τ has W_q[h] and W_k[h] scaled by √γ_h with γ_h = min(1, τ/S_h), so its logits shrink by γ_h.
K2 keeps 1/√d_k and adds the clip on top (τ = 100). Q4 asks it that way round:

* (a) on top of scaled dot: scaled_qkclip τ − scaled_dot clipped loss is no worse (within δ);
* (b) on plain dot, in place of 1/√d_k: dot_qkclip τ − scaled_dot is no worse AND
  dot_qkclip τ − dot is less (the clip recovers the unscaled gap).

A τ *binds* for an arm when the clip acted in the second half of training in every reported
run (:func:`late_clips`): one that acted only in the first steps' logit growth from unit init
leaves the rest of training unclipped, and "no worse" would then say nothing of the clip.

Its own study ("qkclip", :func:`build`, in the deep preset) trains the four clipped arms where
unscaled dot is worst (unit init, one head, d_k 256) at τ = 10 and 30, which bind there (τ = 100
did not); scaled_dot and dot are the head_dim study's runs of that cell (same configs, same ids).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Claim, Figure, Says, Sources, Training, register
from attnscale.audit.compare import family
from attnscale.audit.evidence import Arm, Model, Run, arms_table, clip_acted, head_dim_evidence
from attnscale.audit.figure_text import finite, n_seeds
from attnscale.audit.figures import fig_forest
from attnscale.audit.interval import Comparison, Interval
from attnscale.audit.selection import cell_label, cells
from attnscale.audit.studies import TEXT, Preset, Study, schedule
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.audit.words import fx
from attnscale.lab.paired import NOT_MEASURABLE

STUDY = "qkclip"
SCALED, DOT = "scaled_dot", "dot"
TAUS = (10, 30)  # τ of the clipped arms (attnscale.audit.studies.VARIANTS)
CLIP_ARMS = ("scaled_qkclip10", "scaled_qkclip30", "dot_qkclip10", "dot_qkclip30")
D_K = 256  # the head dimension of the deep preset's study
# kind -> (the clipped arm's score, the arm it is compared with); Holm over τ within a kind
KINDS = {"top": ("scaled", SCALED), "stand": ("dot", SCALED), "recover": ("dot", DOT)}
NEVER = "the clip never acted in any reported run"
IDLE, PARTIAL, HOLDS, FAILS, OPEN = "idle", "partial", "holds", "fails", "open"

RULE = ("Own study in C13's setting where unscaled dot is worst: one head at the preset's "
        "largest d_k (256 in the deep preset), q, k of unit variance at init, each arm at "
        "its LR tuned on one tuning seed; QK-Clip at τ = 10 and 30. Paired per-seed "
        "differences of clipped loss, δ = 0.02 nats. (a) As Kimi K2 uses it, on top of scaled "
        "dot: holds if scaled_qkclip τ − scaled_dot is no worse (non-inferior), fails if it "
        "reads greater. (b) On plain dot, in place of 1/√d_k: holds if dot_qkclip τ − "
        "scaled_dot is no worse AND dot_qkclip τ − dot less, fails if dot_qkclip τ − "
        "scaled_dot reads greater. A τ binds for an arm when the clip acted in every reported "
        "run of it AND in the second half of training in each (some history row after one at "
        "step ≥ steps/2 has qk_clipped > 0); a comparison whose clip acted in no run is not "
        "measurable (the clip never acted), one whose clip did not bind is shown but decides "
        "nothing. Holm over τ within each kind of comparison (the rule asks whether SOME τ "
        "works). Supported if at some τ that binds for both clipped arms (a) and (b) hold; "
        "depends if one half holds at some binding τ and the other fails at every τ where it "
        "binds; refuted if (a) fails at every τ where it binds, or (b) does, and the other "
        "half holds at none; inconclusive otherwise")
ANSWERS = {SUPPORTED: "Yes, where it binds: free on top of 1/√d_k, and on plain dot as good "
                      "as scaled dot",
           REFUTED: "No: wherever it bound, QK-Clip cost loss on top of scaled dot, or on "
                    "plain dot was worse than scaled dot, and the other half held nowhere",
           DEPENDS: "Partly: one half held where the clip bound and the other failed wherever "
                    "it bound (free on top of 1/√d_k but no stand-in for it, or the reverse)",
           INCONCLUSIVE: "Not decided"}
NOT_RUN = "not run in this preset: the deep preset trains its study (make report-deep)"


def head_dim_of(p: Preset) -> int:
    """The study's d_k (= d_model, one head): 256, or the preset's largest head dimension where
    256 is not one of them (the tests' tiny and quick presets)."""
    return D_K if D_K in p.head_dims else p.head_dims[-1]


def build(p: Preset) -> Study:
    """Q4's study: the clipped arms in head_dim's setting (one head, d_model = d_k, unit init),
    LR tuned on one seed over ``p.tuned_lrs``; trained in the deep preset only (its ~60 s did
    not fit the standard 12 min), planned with no seeds elsewhere (:data:`NOT_RUN`)."""
    return Study(STUDY, {**TEXT, **schedule(p.steps), "n_heads": 1}, CLIP_ARMS, p.tuned_lrs,
                 p.seeds if p.deep else (),
                 cells={"init": ("unit",), "d_model": (head_dim_of(p),)},
                 lr_choice="tuned", tune_seeds=p.tune_seeds[:1])


class Evidence(Model):
    """Per arm in the study's one cell: the clipped loss per reported seed (scaled_dot and dot
    from the head_dim study's same cell), and for the clipped arms whether the clip acted
    (1 or 0), how many (step, head) clips it made, and how many of them in the second half of
    training (:func:`late_clips`), per seed at the same LR."""

    loss: dict[str, Arm]
    acted: dict[str, Arm]
    clips: dict[str, Arm]
    late: dict[str, Arm]
    d_k: int
    steps: int
    n_layers: int


def clip_count(run: Run) -> float:
    """The (step, head) clips QK-Clip made in the run (its history rows' ``qk_clipped``)."""
    return float(sum(row.get("qk_clipped") or 0 for row in run.history))


def late_clips(run: Run) -> float:
    """The clips QK-Clip made in the second half of training: the ``qk_clipped`` of history
    rows whose previous row is at step ``steps``/2 or later. A row counts the clips made after
    the updates since the previous row (:mod:`attnscale.lab.train`), so every clip counted here
    came at step steps/2 or later (a row that straddles the midpoint is left out)."""
    half = run.config.optim.steps / 2
    rows = [r for r in run.history if r.get("step") is not None]
    return float(sum(b.get("qk_clipped") or 0 for a, b in pairwise(rows) if a["step"] >= half))


def qkclip_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """The study's one cell: per arm the clipped loss, whether the clip acted
    (:func:`attnscale.audit.evidence.clip_acted`), its clip count and its late clip count
    (:func:`late_clips`), per reported seed."""
    label = cell_label(cells(study)[0])
    tables = {"loss": arms_table(study, runs),
              "acted": arms_table(study, runs, lambda r: float(clip_acted(r))),
              "clips": arms_table(study, runs, clip_count),
              "late": arms_table(study, runs, late_clips)}
    return {k: t.get(label, {}) for k, t in tables.items()}


def gather(src: Sources) -> dict[str, Any]:
    """The clipped arms from Q4's study, scaled_dot and dot from the head_dim study's cell of
    the same (init, d_k)."""
    study = src.studies[STUDY]
    mine = src.study(STUDY, qkclip_evidence)
    base = src.study("head_dim", head_dim_evidence)["loss"].get(cell_label(cells(study)[0]), {})
    return {"loss": {**{a: base[a] for a in (SCALED, DOT) if a in base}, **mine["loss"]},
            "acted": mine["acted"], "clips": mine["clips"], "late": mine["late"],
            "d_k": study.cells["d_model"][0], "steps": study.base["steps"],
            "n_layers": study.base["n_layers"]}


def clip_arm(score: str, tau: int) -> str:
    """The clipped arm of ``score`` ("scaled" or "dot") at ``tau``."""
    return f"{score}_qkclip{tau}"


def key(kind: str, tau: int) -> str:
    """A comparison's name: ``τ=10: dot_qkclip10 − scaled_dot``."""
    score, base = KINDS[kind]
    return f"τ={tau}: {clip_arm(score, tau)} − {base}"


def acted(ev: Evidence, arm: str) -> tuple[int, int, int] | None:
    """(reported runs the clip acted in, those it acted in during the second half of training,
    reported runs) of a clipped arm; None when unknown."""
    a, late = ev.acted.get(arm), ev.late.get(arm)
    if a is None or not a.values:
        return None
    k_late = sum((late.values.get(s) or 0) > 0 for s in a.values) if late is not None else 0
    return sum(v > 0 for v in a.values.values()), k_late, len(a.values)


def binding(ev: Evidence, arm: str) -> str:
    """"every" (it binds: the clip acted in the second half of training in every reported
    run), "none" (it acted in no run), "some" otherwise, "unknown" (not recorded)."""
    k = acted(ev, arm)
    return "unknown" if k is None else "none" if k[0] == 0 else "every" if k[1] == k[2] else "some"


def never() -> Comparison:
    """A comparison of a clipped arm whose clip never acted: the arm trained as its plain score,
    so there is nothing of the clip to measure (:data:`NOT_MEASURABLE`, no seeds to plan)."""
    nan = math.nan
    return Comparison(mean=nan, lo=nan, hi=nan, n=0, reading=NOT_MEASURABLE,
                      smallest=V.LOSS_DELTA, why=NEVER)


def effect(c: Comparison) -> str:
    """A comparison as the sentences quote it (one never read has no number to show)."""
    return c.effect("nats") if finite(c.mean) else f"{c.reading} — {c.why}"


def q4_family(ev: Evidence) -> dict[str, Comparison]:
    """Every comparison of the rule, by τ: a clipped arm whose clip never acted is not read
    (:func:`never`); the others are read with Holm over τ within each kind."""
    pairs, groups, idle = {}, {}, []
    for kind, (score, base) in KINDS.items():
        for tau in TAUS:
            arm, k = clip_arm(score, tau), key(kind, tau)
            if binding(ev, arm) == "none":
                idle.append(k)
                continue
            pairs[k] = (ev.loss.get(arm), ev.loss.get(base))
            groups.setdefault(kind, []).append(k)
    comps = family(pairs, V.LOSS_DELTA, holm_over=list(groups.values())) if pairs else {}
    comps.update({k: never() for k in idle})
    return {key(kind, tau): comps[key(kind, tau)] for tau in TAUS for kind in KINDS}


def marks(ev: Evidence, comps: Mapping[str, Comparison]) -> dict[int, tuple[str, str]]:
    """τ -> (on top of scaled dot, on plain dot): "idle" (the clip never acted), "partial" (it
    did not bind: decides nothing), "holds", "fails" or "open" (undecided)."""
    out = {}
    for tau in TAUS:
        top, stand, recover = (comps[key(k, tau)] for k in KINDS)
        pair = []
        for score, holds, fails in (("scaled", top.no_worse(), top.greater()),
                                    ("dot", stand.no_worse() and recover.less(),
                                     stand.greater())):
            b = binding(ev, clip_arm(score, tau))
            pair.append(IDLE if b == "none" else PARTIAL if b == "some" else
                        HOLDS if holds and b == "every" else FAILS if fails and b == "every"
                        else OPEN)
        out[tau] = (pair[0], pair[1])
    return out


def half_of(xs: list[str]) -> str:
    """One half of the question over τ: HOLDS at some τ where it binds, FAILS at every τ where
    it binds (binding somewhere), OPEN otherwise."""
    bound = [x for x in xs if x in (HOLDS, FAILS, OPEN)]
    if HOLDS in bound:
        return HOLDS
    return FAILS if bound and all(x == FAILS for x in bound) else OPEN


def halves(m: Mapping[int, tuple[str, str]]) -> tuple[str, str]:
    """(on top of scaled dot, on plain dot), each over τ (:func:`half_of`)."""
    return half_of([a for a, _ in m.values()]), half_of([d for _, d in m.values()])


def verdict_of(m: Mapping[int, tuple[str, str]]) -> str:
    """Supported if both halves hold at one τ; depends if one half holds somewhere and the
    other fails wherever it binds; refuted if a half fails wherever it binds (the other
    holding nowhere); inconclusive otherwise."""
    if any(x == (HOLDS, HOLDS) for x in m.values()):
        return SUPPORTED
    h = halves(m)
    if set(h) == {HOLDS, FAILS}:
        return DEPENDS
    return REFUTED if FAILS in h else INCONCLUSIVE


def gap_of(ev: Evidence) -> Interval | None:
    """The unscaled gap dot − scaled_dot per seed (C13's comparison at this d_k), as an
    interval; None without three shared seeds."""
    dot, scaled = ev.loss.get(DOT), ev.loss.get(SCALED)
    seeds = sorted(set(dot.values) & set(scaled.values)) if dot and scaled else []
    if len(seeds) < 3:
        return None
    return Interval.of([dot.values[s] - scaled.values[s] for s in seeds])


def recovered(ev: Evidence, tau: int) -> float | None:
    """The share of the unscaled gap the clip on dot recovered at ``tau``:
    mean(dot − dot_qkclip) / mean(dot − scaled_dot) over the seeds all three share; None
    where the clip never acted or the gap is within δ (nothing to recover)."""
    arms = [ev.loss.get(a) for a in (DOT, clip_arm("dot", tau), SCALED)]
    if any(a is None for a in arms) or binding(ev, clip_arm("dot", tau)) == "none":
        return None
    seeds = sorted(set.intersection(*(set(a.values) for a in arms)))
    dot, clip, scaled = ([a.values[s] for s in seeds] for a in arms)
    gap = float(np.mean(dot)) - float(np.mean(scaled)) if seeds else math.nan
    if not gap > V.LOSS_DELTA:
        return None
    return (float(np.mean(dot)) - float(np.mean(clip))) / gap


def acted_numbers(ev: Evidence) -> dict[str, dict[str, Any]]:
    """arm -> {"runs": runs the clip acted in, "late": runs it acted in during the second half
    of training, "of": reported runs, "clips_per_run"}."""
    out = {}
    for arm in CLIP_ARMS:
        k, clips = acted(ev, arm), ev.clips.get(arm)
        if k is not None:
            per_run = float(np.mean(list(clips.values.values()))) if clips and clips.values \
                else math.nan
            out[arm] = {"runs": k[0], "late": k[1], "of": k[2], "clips_per_run": per_run}
    return out


UNBOUND = ("read, but the clip did not act in the second half of training in every run, so "
           "this τ decides nothing")
TOP_SAID = {HOLDS: "no worse than scaled dot (within δ)", PARTIAL: UNBOUND,
            FAILS: "worse than scaled dot by more than δ",
            OPEN: "neither shown no worse nor worse than scaled dot"}
DOT_SAID = {HOLDS: "it stands in for 1/√d_k there", PARTIAL: UNBOUND,
            FAILS: "worse than scaled dot by more than δ: it does not stand in there",
            OPEN: "not shown to stand in for 1/√d_k nor to fall short"}


def tau_sentences(ev: Evidence, comps: Mapping[str, Comparison], tau: int,
                  m: tuple[str, str]) -> list[str]:
    """What the clip did at ``tau``, on top of scaled dot and on plain dot."""
    nums, out = acted_numbers(ev), []
    for score, mark in zip(("scaled", "dot"), m, strict=True):
        arm = clip_arm(score, tau)
        where = "on top of scaled dot" if score == "scaled" else "on plain dot"
        a = nums.get(arm)
        if a is None:
            out.append(f"τ = {tau} {where}: no record of the clip ({arm} has no runs).")
            continue
        if mark == IDLE:
            out.append(f"τ = {tau} {where}: the clip never acted in any of {a['of']} runs, "
                       f"so {arm} trained as the plain score and says nothing of the clip "
                       "(not measurable).")
            continue
        head = (f"τ = {tau} {where}: the clip acted in {a['runs']} of {a['of']} runs, in "
                f"the second half of training in {a['late']} ({a['clips_per_run']:.0f} head "
                "clips per run)")
        if score == "scaled":
            c = comps[key("top", tau)]
            out.append(f"{head}; {arm} − scaled_dot {effect(c)}: {TOP_SAID[mark]}.")
            continue
        share = recovered(ev, tau)
        rec = f", recovering {share:.0%} of the unscaled gap" if share is not None else ""
        out.append(f"{head}; against scaled dot {effect(comps[key('stand', tau)])}, "
                   f"against plain dot {effect(comps[key('recover', tau)])}{rec}: "
                   f"{DOT_SAID[mark]}.")
    return out


TOP_FAILS = ("wherever the clip bound on top of scaled dot it cost more than δ: as K2 uses it, "
             "it was not free here")
DOT_FAILS = ("wherever the clip bound on plain dot it was worse than scaled dot by more than "
             "δ: here it does not stand in for 1/√d_k")


def last(verdict: str, m: Mapping[int, tuple[str, str]]) -> str:
    """The sentence that sums the verdict up, naming the half that failed."""
    top, dot = halves(m)
    if verdict == SUPPORTED:
        return ("So, used as Kimi K2 uses it, the clip cost nothing on top of 1/√d_k at a τ "
                "where it bound, and at that τ it stood in for 1/√d_k on plain dot.")
    if verdict == DEPENDS and top == HOLDS:
        return f"So the clip cost nothing on top of 1/√d_k at a τ where it bound, but {DOT_FAILS}."
    if verdict == DEPENDS:
        return (f"So on plain dot the clip stood in for 1/√d_k at a τ where it bound, but "
                f"{TOP_FAILS}.")
    if verdict == REFUTED:
        said = [s for s, h in ((TOP_FAILS, top), (DOT_FAILS, dot)) if h == FAILS]
        return f"So {'; and '.join(said)}."
    return ("At no τ where both clipped arms bound did both halves hold, and neither half "
            "failed at every τ where it bound.")


def caveat(ev: Evidence) -> str:
    """What the study cannot show."""
    return (f"What it cannot show: this is {ev.n_layers} layers of one head at d_k = "
            f"{ev.d_k}, {ev.steps} steps of AdamW, with τ set where the clip binds at this "
            "scale; K2 clips at τ = 100 under the Muon optimizer in a 1T-parameter model, where "
            "the logit growth the clip guards against is Muon's.")


def judge(ev: Evidence) -> Verdict:
    """Q4: QK-Clip on top of scaled dot, and on plain dot in place of 1/√d_k, per τ."""
    if not any(ev.loss[a].values for a in CLIP_ARMS if a in ev.loss):  # no clipped arm trained
        return Verdict(INCONCLUSIVE, RULE, NOT_RUN, {"run": False}, headline=NOT_RUN,
                       plain=[f"Q4 was {NOT_RUN}."], regime="not run", smallest=V.LOSS_WHY)
    comps = q4_family(ev)
    m = marks(ev, comps)
    verdict = verdict_of(m)
    gap = gap_of(ev)
    plain = [s for tau in TAUS for s in tau_sentences(ev, comps, tau, m[tau])]
    plain += [last(verdict, m), caveat(ev)]
    nums = acted_numbers(ev)
    because = "; ".join(f"{k}: {effect(c)}" for k, c in comps.items())
    because += "; clip acted (in the second half): " + ", ".join(
        f"{a} {n['runs']}/{n['of']} ({n['late']}/{n['of']})" for a, n in nums.items())
    numbers = {"comparisons": comps, "acted": nums, "d_k": ev.d_k,
               "gap": gap.model_dump() if gap is not None else None,
               "recovered": {str(t): recovered(ev, t) for t in TAUS}}
    headline = f"{verdict}: " + "; ".join(f"τ={t}: on scaled dot {a}, on dot {d}"
                                          for t, (a, d) in m.items())
    regime = (f"q, k components of unit variance at init, d_k = {ev.d_k} (C13's regime, where "
              "unscaled dot is worst); QK-Clip acts only on a head whose max |logit| on the "
              "step's batch passes τ")
    return Verdict(verdict, RULE, because, numbers, headline=headline, plain=plain,
                   regime=regime, smallest=V.LOSS_WHY)


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The forest plot of the rule's comparisons with ±δ (none when the clip never acted)."""
    names = {"top": "scaled+clip−scaled", "stand": "dot+clip−scaled", "recover": "dot+clip−dot"}
    if "comparisons" not in numbers:  # not run in this preset
        return []
    comps = {f"τ={t} {names[kind]}": numbers["comparisons"][key(kind, t)]
             for t in TAUS for kind in KINDS}  # tick labels without spaces (figures.short)
    if not any(finite(c.get("mean")) for c in comps.values()):
        return []
    title = (f"Q4: QK-Clip at d_k = {ev['d_k']}, unit init, char-level text, "
             f"{n_seeds(comps)} seeds, mean and 95% CI")
    return [fig_forest(comps, folder, "q4_effects", title, "nats",
                       "QK-Clip on scaled dot minus scaled dot (scaled+clip−scaled), and on "
                       "plain dot minus scaled dot and minus plain dot")]


def says_when(e: dict[str, Any]) -> list[str]:
    """QK-Clip as K2 uses it: per τ how often it acted and what it cost on top of scaled dot,
    then how much of the unscaled gap it recovered on plain dot."""
    nums = e["numbers"]  # {"run": False} where the preset did not train Q4's study
    comps, acts, rec = (nums.get(k, {}) for k in ("comparisons", "acted", "recovered"))
    top, on_dot = [], []
    for tau in TAUS:
        a, c = acts.get(clip_arm("scaled", tau)), comps.get(key("top", tau))
        if a is not None:
            top.append(f"τ = {tau} acted in {a['runs']} of {a['of']} runs ({a['late']} in "
                       "the second half)" +
                       (f" and cost {fx(c)}" if a["runs"] and finite(c.get("mean")) else ""))
        a, c = acts.get(clip_arm("dot", tau)), comps.get(key("stand", tau))
        if a is None:
            continue
        if not a["runs"]:
            on_dot.append(f"τ = {tau} never acted")
        elif rec.get(str(tau)) is not None:
            on_dot.append(f"τ = {tau} recovered {rec[str(tau)]:.0%} of the unscaled gap, "
                          f"ending {fx(c)} from scaled dot")
        else:
            on_dot.append(f"τ = {tau} ended {fx(c)} from scaled dot")
    if not top and not on_dot:
        return []
    return [f"QK-Clip, as Kimi K2 uses it (on top of 1/√d_k): at d_k = {nums['d_k']} with "
            f"unit init, {'; '.join(top) or 'no run recorded'}; on plain dot "
            f"{'; '.join(on_dot) or 'no run recorded'} (Q4)."]


def scale(p: Preset) -> str:
    """The one-line scale caveat: the study's size, and K2's."""
    s = build(p)
    return (f"{s.base['n_layers']} layers of one head, d_k = {s.cells['d_model'][0]}, unit "
            f"init, {s.base['steps']} steps of AdamW, {len(s.seeds)} seeds (LR tuned on "
            f"{len(s.tune_seeds)} other); K2: τ = 100, Muon, 1T parameters")


CLAIM = register(Claim(
    id="Q4", text="Is QK-Clip free on top of 1/√d_k, as Kimi K2 uses it, and can it stand in "
    "for 1/√d_k?",
    measures="QK-Clip at τ = 10 and 30 on scaled and on plain dot, one head at the largest "
    "d_k, unit init", rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("head_dim",), trains=(Training(STUDY, build),), scale=scale, answers=ANSWERS,
    says=(Says("when", says_when, rank=25),)))
