"""Q4 (QK-Clip on top of scaled dot, as Kimi K2 uses it, and on plain dot in place of 1/√d_k)
on evidence built by hand: the rule's known answers (each verdict, either half failing), a clip
that acted only early does not bind, a clip that never acted (arms identical) reads not
measurable with no seeds to plan, Holm over τ within each kind of comparison; its own training
study for the tiny, quick and standard presets; its gather on a few fake runs (late clips from
the history rows); its sentence in the page's short answers and its forest plot."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support import CLAIMS_MD, Draw, assert_reads_as, best_p, holm_by_hand, layouts, png_info

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Sources, get_claim, training_plan
from attnscale.audit.claims import q4_qkclip as M
from attnscale.audit.running import grid_spec
from attnscale.audit.studies import PRESETS, VARIANTS, Study, studies
from attnscale.audit.verdicts import LOSS_DELTA, seeds_sentence
from attnscale.lab.records import Run
from attnscale.lab.sweep import expand
from attnscale.util.jsonio import jsonable

N = 6  # the standard preset's reported seeds
TAUS = M.TAUS


def per_tau(x: float | dict[int, float]) -> dict[int, float]:
    return x if isinstance(x, dict) else dict.fromkeys(TAUS, x)


def flags(arm: dict[str, Any], k: int, late: int, clips: float = 40.0) -> tuple[dict, ...]:
    """The acted (1/0), clip-count and late clip-count arms of a clipped arm whose clip acted
    in ``k`` runs, in the second half of training in the first ``late`` of them."""
    seeds = list(arm["values"])
    act = {s: float(i < k) for i, s in enumerate(seeds)}
    lrs = dict(arm["lrs"])
    return ({"values": act, "lrs": lrs}, {"values": {s: clips * v for s, v in act.items()},
                                           "lrs": lrs},
            {"values": {s: 5.0 * float(i < min(k, late)) for i, s in enumerate(seeds)},
             "lrs": lrs})


def q4(draw: Draw, top: Any = 0.0, stand: Any = 0.0, gap: float = 0.3, acted: Any = None,
       noise: float = 0.002, late: Any = None) -> dict[str, Any]:
    """Evidence: scaled_dot at 2.0, dot ``gap`` above; scaled_qkclip τ ``top[τ]`` and
    dot_qkclip τ ``stand[τ]`` above scaled_dot; ``acted``: arm -> runs the clip acted in
    (default every run); ``late``: arm -> runs it acted in during the second half of training
    (default all it acted in)."""
    top, stand, acted, late = per_tau(top), per_tau(stand), acted or {}, late or {}
    loss = {"scaled_dot": draw.arm(2.0, noise), "dot": draw.arm(2.0 + gap, noise)}
    for t in TAUS:
        loss[f"scaled_qkclip{t}"] = draw.arm(2.0 + top[t], noise)
        loss[f"dot_qkclip{t}"] = draw.arm(2.0 + stand[t], noise)
    tables = {a: flags(loss[a], acted.get(a, N), late.get(a, N)) for a in M.CLIP_ARMS}
    return {"loss": loss, "acted": {a: t[0] for a, t in tables.items()},
            "clips": {a: t[1] for a, t in tables.items()},
            "late": {a: t[2] for a, t in tables.items()}, "d_k": 256, "steps": 150,
            "n_layers": 2}


def judge(ev):
    return M.CLAIM.decide(ev)


def test_q4_supported_where_the_clip_binds_and_both_halves_hold():
    v = judge(q4(Draw(3, n=N)))
    assert v.verdict == "supported"
    assert v.headline == ("supported: τ=10: on scaled dot holds, on dot holds; "
                          "τ=30: on scaled dot holds, on dot holds")
    assert v.plain[0].startswith("τ = 10 on top of scaled dot: the clip acted in 6 of 6 runs, "
                                 "in the second half of training in 6 (40 head clips per run); "
                                 "scaled_qkclip10 − scaled_dot")
    assert "recovering 100% of the unscaled gap" in v.plain[1]
    assert v.numbers["acted"]["dot_qkclip30"] == {"runs": 6, "late": 6, "of": 6,
                                                  "clips_per_run": 40.0}
    assert v.numbers["recovered"]["10"] == pytest.approx(1.0, abs=0.05)
    assert v.plain[-1].startswith("What it cannot show: this is 2 layers of one head at d_k = "
                                  "256, 150 steps of AdamW")
    # one τ is enough: the other idle on scaled dot and failing on dot
    one = judge(q4(Draw(3, n=N), stand={10: 0.0, 30: 0.2},
                   acted={"scaled_qkclip30": 0}))
    assert one.verdict == "supported"
    assert one.headline.endswith("τ=30: on scaled dot idle, on dot fails")


def test_q4_refuted_when_a_half_fails_at_every_binding_tau_and_the_other_holds_nowhere():
    # both halves fail
    v = judge(q4(Draw(3, n=N), top=0.2, stand=0.2))
    assert v.verdict == "refuted"
    assert v.headline.endswith("τ=30: on scaled dot fails, on dot fails")
    assert "cost more than δ" in v.plain[-2] and "does not stand in" in v.plain[-2]
    # (a) alone: on plain dot nothing to recover, so (b) is open; the clip on top of scaled dot
    # costing loss wherever it binds is a refutation of "free on top" (before: inconclusive)
    top = judge(q4(Draw(3, n=N), top=0.2, gap=0.0))
    assert top.verdict == "refuted"
    assert top.plain[-2] == f"So {M.TOP_FAILS}."
    # (b) alone: the clip on top of scaled dot never binds, so (a) is open
    dot = judge(q4(Draw(3, n=N), stand=0.2, late=dict.fromkeys(M.CLIP_ARMS[:2], 3)))
    assert dot.verdict == "refuted" and dot.plain[-2] == f"So {M.DOT_FAILS}."
    # a τ where the clip never acted is not one of them
    idle30 = judge(q4(Draw(3, n=N), top=0.2, stand={10: 0.2, 30: 0.0},
                      acted={"dot_qkclip30": 0}))
    assert idle30.verdict == "refuted"


def test_q4_depends_when_one_half_holds_and_the_other_fails_wherever_it_binds():
    # free on top of scaled dot, but on plain dot worse than scaled dot (before: refuted)
    v = judge(q4(Draw(3, n=N), stand=0.2))
    assert v.verdict == "depends"
    assert v.headline.endswith("on dot fails; τ=30: on scaled dot holds, on dot fails")
    assert v.plain[-2].startswith("So the clip cost nothing on top of 1/√d_k")
    # stands in on plain dot, but costs loss on top of scaled dot (before: inconclusive)
    for ev in (q4(Draw(3, n=N), top=0.2), q4(Draw(3, n=N), top=0.2, stand={10: 0.0, 30: 0.2})):
        r = judge(ev)
        assert r.verdict == "depends" and r.plain[-2].startswith("So on plain dot the clip")


def test_q4_inconclusive_otherwise():
    # plain dot is no worse either: nothing for the clip to recover, so (b) is not shown
    flat = judge(q4(Draw(3, n=N), gap=0.0))
    assert flat.verdict == "inconclusive" and flat.numbers["recovered"] == {"10": None,
                                                                              "30": None}
    # each half holds, but at different τ
    apart = judge(q4(Draw(3, n=N), top={10: 0.0, 30: 0.2}, stand={10: 0.2, 30: 0.0}))
    assert apart.verdict == "inconclusive"
    # the clip acted in some runs only: read and shown, but it decides nothing
    some = judge(q4(Draw(3, n=N), acted=dict.fromkeys(M.CLIP_ARMS, 3)))
    assert some.verdict == "inconclusive"
    assert some.headline == ("inconclusive: τ=10: on scaled dot partial, on dot partial; "
                             "τ=30: on scaled dot partial, on dot partial")
    assert "acted in 3 of 6 runs" in some.plain[0] and "decides nothing" in some.plain[0]
    # too few seeds, or a censored arm
    assert judge(q4(Draw(3, n=2))).verdict == "inconclusive"
    ev = q4(Draw(3, n=N))
    ev["loss"]["scaled_dot"]["censored"] = True
    assert judge(ev).verdict == "inconclusive"


def test_q4_a_clip_that_acted_only_early_does_not_bind():
    """The clip acted in every run, but never in the second half of training (e.g. once, at
    the first steps' logit growth): it does not bind, so "free on top" is not shown by a loss
    equal to scaled dot's (before: supported)."""
    v = judge(q4(Draw(3, n=N), late=dict.fromkeys(M.CLIP_ARMS, 0)))
    assert v.verdict == "inconclusive"
    assert v.headline == ("inconclusive: τ=10: on scaled dot partial, on dot partial; "
                          "τ=30: on scaled dot partial, on dot partial")
    assert "acted in 6 of 6 runs, in the second half of training in 0" in v.plain[0]
    assert "did not act in the second half of training in every run" in v.plain[0]
    assert v.numbers["acted"]["scaled_qkclip10"]["late"] == 0
    # late in all but one run: still not binding
    one = judge(q4(Draw(3, n=N), late=dict.fromkeys(M.CLIP_ARMS, N - 1)))
    assert one.verdict == "inconclusive"


def test_q4_a_clip_that_never_acted_is_not_measurable_without_seeds_to_plan():
    """The clip never acted: each clipped arm is its plain score, bitwise (the review's width
    128). Nothing is read, no seeds are advised, and no figure has anything to draw."""
    ev = q4(Draw(3, n=N), acted=dict.fromkeys(M.CLIP_ARMS, 0))
    for t in TAUS:  # identical runs
        ev["loss"][f"scaled_qkclip{t}"] = ev["loss"]["scaled_dot"]
        ev["loss"][f"dot_qkclip{t}"] = ev["loss"]["dot"]
    v = judge(ev)
    assert v.verdict == "inconclusive"
    assert v.headline == ("inconclusive: τ=10: on scaled dot idle, on dot idle; "
                          "τ=30: on scaled dot idle, on dot idle")
    comps = v.numbers["comparisons"]
    assert all(not c.decided() and c.why == M.NEVER for c in comps.values())
    # not measurable, as the rule and the sentences call it (before: read "inconclusive")
    assert all(c.reading == "not measurable" and not c.measurable() for c in comps.values())
    assert "not measurable — the clip never acted" in v.because
    assert seeds_sentence(jsonable(v.numbers)) is None
    assert not any("seeds" in s for s in v.plain)
    assert "never acted in any of 6 runs" in v.plain[0] and "not measurable" in v.plain[0]
    assert M.draw(ev, jsonable(v.numbers), Path("/nonexistent")) == []
    entry = {"verdict": v.verdict, "numbers": jsonable(v.numbers)}
    assert "τ = 10 never acted; τ = 30 never acted" in M.says_when(entry)[0]


def test_q4_identical_runs_where_the_clip_acted_are_not_measurable():
    """Arms bitwise identical though the clip is recorded as acting: the paired differences
    are all 0, so nothing is read and no seeds are planned."""
    ev = q4(Draw(3, n=N))
    for t in TAUS:
        ev["loss"][f"scaled_qkclip{t}"] = ev["loss"]["scaled_dot"]
    v = judge(ev)
    top = v.numbers["comparisons"]["τ=10: scaled_qkclip10 − scaled_dot"]
    assert not top.measurable() and not top.no_worse()
    assert v.verdict == "inconclusive"
    assert seeds_sentence(jsonable(v.numbers)) is None


def test_q4_holm_is_over_tau_within_each_kind():
    ev = q4(Draw(6, n=N), top={10: 0.005, 30: 0.01}, stand={10: 0.0, 30: 0.02}, noise=0.015)
    v = judge(ev)
    for kind, (score, base) in M.KINDS.items():
        raw = [best_p(list(ev["loss"][f"{score}_qkclip{t}"]["values"].values()),
                      list(ev["loss"][base]["values"].values()), LOSS_DELTA) for t in TAUS]
        got = [v.numbers["comparisons"][M.key(kind, t)].p_holm for t in TAUS]
        assert got == pytest.approx(holm_by_hand(raw), rel=1e-9), kind


CASES = {
    V.SUPPORTED: lambda: q4(Draw(3, n=N)),
    V.REFUTED: lambda: q4(Draw(3, n=N), top=0.2, stand=0.2),
    V.DEPENDS: lambda: q4(Draw(3, n=N), stand=0.2),
    V.INCONCLUSIVE: lambda: q4(Draw(3, n=N), gap=0.0),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(judge(CASES[verdict]()), verdict, "Q4")


@pytest.mark.parametrize(("preset", "d_k"), [("tiny", 16), ("quick", 64), ("standard", 256),
                                              ("deep", 256)])
def test_q4_study_builds_in_the_head_dim_setting_and_trains_only_in_the_deep_preset(preset,
                                                                                     d_k):
    p = PRESETS[preset]
    s = M.build(p)
    assert s.name == "qkclip" and s.arms == M.CLIP_ARMS
    assert all(a in VARIANTS for a in s.arms)
    assert {VARIANTS[a]["qk_clip"] for a in s.arms} == {10.0, 30.0}
    assert s.cells == {"init": ("unit",), "d_model": (d_k,)}
    assert (s.lrs, s.seeds, s.tune_seeds, s.lr_choice) == (
        p.tuned_lrs, p.seeds if preset == "deep" else (), p.tune_seeds[:1], "tuned")
    head_dim = studies(p)["head_dim"]
    assert head_dim.base == s.base  # same setting, same schedule
    assert d_k in head_dim.cells["d_model"] and "unit" in head_dim.cells["init"]
    assert (head_dim.lrs, head_dim.tune_seeds) == (s.lrs, s.tune_seeds)
    assert training_plan(p)["qkclip"] == s
    assert M.scale(p).startswith(f"2 layers of one head, d_k = {d_k}, unit init, {p.steps} ")


def test_q4_outside_the_deep_preset_reads_not_run():
    """Planned with no seeds, Q4's study trains nothing: the verdict says so, with no
    comparison, figure or takeaway (not a finding of no effect)."""
    p = PRESETS["standard"]
    plan = {"qkclip": M.build(p), "head_dim": studies(p)["head_dim"]}
    base = [fake_run(a, s, 2.0, (0, 0), 256, p.tuned_lrs[0], p.steps)
            for a in ("scaled_dot", "dot") for s in (*p.tune_seeds[:1], *p.seeds)]
    src = Sources(preset=p, studies=plan, runs={"qkclip": [], "head_dim": base}, measured={})
    ev = M.CLAIM.read(M.CLAIM.gather(src))
    v = M.CLAIM.decide(ev)
    assert v.verdict == "inconclusive" and v.headline == M.NOT_RUN and v.numbers == {"run": False}
    assert "make report-deep" in v.plain[0]
    entry = {"numbers": v.numbers}
    assert M.says_when(entry) == [] and M.draw({}, v.numbers, Path(".")) == []


def ids(study: Study) -> set[str]:
    """The config ids of every run a study may train (tuning and reported seeds, every LR)."""
    return {x.id for x in expand(grid_spec(study, study.tune_seeds + study.seeds, study.lrs))}


def test_q4_study_owns_its_runs_and_the_baselines_belong_to_head_dim():
    """Run ids are config hashes: a run of two studies is stored under the first one only, so
    the clipped arms must not share a config with another study, and scaled_dot and dot of
    this cell (which would) are read from head_dim."""
    p = PRESETS["deep"]  # the deep studies (Q4's among them) have seeds only there
    plan = training_plan(p)
    mine = ids(plan["qkclip"])
    for name, study in plan.items():
        if name != "qkclip" and study.seeds:
            assert not mine & ids(study), name
    base = Study("x", plan["qkclip"].base, ("scaled_dot", "dot"), p.tuned_lrs, p.seeds,
                 cells=plan["qkclip"].cells, lr_choice="tuned", tune_seeds=p.tune_seeds[:1])
    assert ids(base) <= ids(plan["head_dim"])


def fake_run(arm: str, seed: int, loss: float, clips: tuple[int, int], d: int, lr: float,
             steps: int) -> Run:
    """A run whose rows at steps/2 and at the last step count ``clips`` (early, late)."""
    history = [{"step": 0, "loss": 4.0, "qk_clipped": 0},
               {"step": steps // 2, "loss": 3.0, "qk_clipped": clips[0]},
               {"step": steps - 1, "loss": loss, "qk_clipped": clips[1]}]
    return Run.from_row({
        "id": f"{arm}-{seed}", "variant": arm, "status": "done", "final_loss": loss,
        "config": {"seed": seed, "lr": lr, "init": "unit", "d_model": d, "steps": steps,
                   **VARIANTS[arm]},
        "history": history})


def test_q4_gathers_a_few_fake_runs():
    p = replace(PRESETS["tiny"], deep=True)  # Q4's study trains in a deep preset
    plan = {"qkclip": M.build(p), "head_dim": studies(p)["head_dim"]}
    level = {"scaled_dot": 2.0, "dot": 2.3, "scaled_qkclip10": 2.0, "scaled_qkclip30": 2.0,
             "dot_qkclip10": 2.01, "dot_qkclip30": 2.05}
    clips = {"scaled_qkclip10": (3, 2), "scaled_qkclip30": (0, 0), "dot_qkclip10": (9, 0),
             "dot_qkclip30": (4, 1)}
    runs: dict[str, list[Run]] = {"qkclip": [], "head_dim": []}
    for arm, x in level.items():
        study = "qkclip" if arm in clips else "head_dim"
        for seed in (*p.tune_seeds, *p.seeds):
            runs[study].append(fake_run(arm, seed, x + 0.01 * seed + 0.001 * (seed % 2) * x,
                                        clips.get(arm, (0, 0)), 16, p.tuned_lrs[0], 100))
    src = Sources(preset=p, studies=plan, runs=runs, measured={})
    ev = M.CLAIM.read(M.CLAIM.gather(src))
    assert set(ev.loss) == {*level} and set(ev.acted) == set(ev.clips) == set(clips)
    assert ev.loss["dot"].source == ["head_dim", "init=unit d_model=16", "dot"]
    assert ev.acted["scaled_qkclip30"].values == {"0": 0.0, "1": 0.0, "2": 0.0}
    assert ev.clips["dot_qkclip10"].values == {"0": 9.0, "1": 9.0, "2": 9.0}
    # late: the last row's clips, whose previous row is at steps/2
    assert ev.late["dot_qkclip10"].values == {"0": 0.0, "1": 0.0, "2": 0.0}
    assert ev.late["dot_qkclip30"].values == {"0": 1.0, "1": 1.0, "2": 1.0}
    assert (ev.d_k, ev.steps, ev.n_layers) == (16, p.steps, 2)
    v = M.CLAIM.decide(ev)
    assert "on dot partial; τ=30: on scaled dot idle, on dot fails" in v.headline
    assert v.numbers["acted"]["scaled_qkclip10"] == {"runs": 3, "late": 3, "of": 3,
                                                     "clips_per_run": 5.0}


def test_late_clips_count_only_rows_after_the_midpoint():
    """A row counts the clips since the previous row: a row just past steps/2 whose previous
    row is before it may hold first-half clips, so it is left out."""
    row = {"id": "r", "status": "done", "variant": "dot_qkclip10",
           "config": {"steps": 100, **VARIANTS["dot_qkclip10"]}}
    hist = [{"step": 0}, {"step": 40, "qk_clipped": 7}, {"step": 60, "qk_clipped": 5},
            {"step": 80, "qk_clipped": 2}, {"step": 99, "qk_clipped": 1}]
    assert M.late_clips(Run.from_row({**row, "history": hist})) == 3.0
    assert M.late_clips(Run.from_row({**row, "history": hist[:3]})) == 0.0


def test_q4_says_when_from_its_numbers():
    v = judge(q4(Draw(3, n=N), acted={"scaled_qkclip30": 0}))
    (sentence,) = M.says_when({"verdict": v.verdict, "numbers": jsonable(v.numbers)})
    c = v.numbers["comparisons"]["τ=10: scaled_qkclip10 − scaled_dot"]
    assert sentence.startswith("QK-Clip, as Kimi K2 uses it (on top of 1/√d_k): at d_k = 256 "
                               f"with unit init, τ = 10 acted in 6 of 6 runs (6 in the second "
                               f"half) and cost "
                               f"{c.mean:+.3f} nats [")
    assert "τ = 30 acted in 0 of 6 runs (0 in the second half); on plain dot τ = 10 recovered" \
        in sentence
    assert "of the unscaled gap, ending" in sentence and sentence.endswith("(Q4).")


def test_q4_draws_its_forest_plot(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = q4(Draw(3, n=N), acted={"scaled_qkclip30": 0})
    figs = M.draw(ev, jsonable(judge(ev).numbers), tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["q4_effects.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    assert figs[0]["alt"].startswith("QK-Clip on scaled dot minus scaled dot")
    assert [problems for _, problems in saved] == [[]]


def test_q4_answers_and_registration():
    assert get_claim("Q4") is M.CLAIM and M.CLAIM.question
    assert set(M.CLAIM.answers) == set(V.VERDICTS)
    assert M.CLAIM.studies == ("head_dim", "qkclip")
    assert [t.name for t in M.CLAIM.trains] == ["qkclip"]
    assert [(s.section, s.rank) for s in M.CLAIM.says] == [("when", 25)]
    assert "### Q4" in CLAIMS_MD and "2507.20534" in CLAIMS_MD
