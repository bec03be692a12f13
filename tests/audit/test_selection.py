"""Choosing each arm's LR on data that is not reported: tuning seeds pick it ("tuned"), or the
other seeds do (leave-one-seed-out, "grid"); a best LR at the edge of the grid is censored."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from attnscale.audit import selection as S
from attnscale.audit.evidence import missing_runs
from attnscale.audit.running import StudyRunner, study_runs
from attnscale.audit.studies import PRESETS, Study, studies
from attnscale.lab.records import Run
from attnscale.lab.store import Store

L0 = 5.0
LRS = (1e-3, 1e-2, 1e-1, 1.0)


def run(seed, lr, loss, arm="dot", status="done", loss0=L0, **cell):
    """A stored run as the runner writes it (final loss, loss at init), as a record."""
    return Run.from_row({"status": status, "variant": arm, "final_loss": loss,
                         "initial_loss": loss0, "final_metric": 1.0 - loss / 10,
                         "config": {"seed": seed, "lr": lr, **cell}})


def grid_runs(table, arm="dot", **cell):
    """Runs from {seed: {lr: loss}}."""
    return [run(s, lr, x, arm, **cell) for s, row in table.items() for lr, x in row.items()]


def study(lr_choice="grid", seeds=(0, 1, 2, 3, 4), lrs=LRS, cells=None):
    tuned = {"tune_seeds": (50, 51)} if lr_choice == "tuned" else {}
    return Study("s", {}, ("scaled_dot", "dot"), lrs, seeds, cells or {},
                 lr_choice=lr_choice, **tuned)


# Seed 0 is lucky at LR 0.1 (0.5 against everyone else's 2.1); 0.01 is the honest optimum.
# With seed 0 included, LR 0.1 has the lowest mean loss (1.78 < 2.0): choosing on all seeds
# would score seed 0 at its own lucky LR.
LUCKY = {s: {1e-3: 3.0, 1e-2: 2.0, 1e-1: 0.5 if s == 0 else 2.1, 1.0: 4.0} for s in range(5)}


def test_best_lr_and_its_edges():
    assert S.best_lr({1e-3: 2.0, 1e-2: 1.0, 1e-1: 3.0}) == (1e-2, False)
    assert S.best_lr({1e-3: 0.5, 1e-2: 1.0, 1e-1: 3.0}) == (1e-3, True)
    assert S.best_lr({1e-3: 2.0, 1e-2: 1.0, 1e-1: 0.3}) == (1e-1, True)
    assert S.best_lr({3e-2: 1.0}) == (3e-2, False)  # one point: nothing was chosen


def test_loo_never_scores_a_seed_at_an_lr_chosen_on_itself():
    chosen, edge, full = S.loo_choice(grid_runs(LUCKY))
    assert min(full, key=full.get) == 1e-1  # the all-seed choice: seed 0's luck decides it
    assert chosen[0] == 1e-2  # without seed 0, LR 0.1 is worse
    assert all(chosen[s] == 1e-1 for s in (1, 2, 3, 4))  # seed 0's luck does move the others
    assert edge is False
    v = S.arm_values(study(), grid_runs(LUCKY), (), "dot")
    assert v.lrs == {0: 1e-2, 1: 1e-1, 2: 1e-1, 3: 1e-1, 4: 1e-1}
    assert v.values == {0: 2.0, 1: 2.1, 2: 2.1, 3: 2.1, 4: 2.1}  # not seed 0's 0.5
    assert v.censored is False and v.curve == pytest.approx(full)


@pytest.mark.parametrize("rng_seed", range(8))
def test_a_seeds_own_losses_never_move_its_lr(rng_seed):
    """chosen[s] is the argmin of the mean over the other seeds (written out here), and
    rewriting seed s's own losses, however much, leaves it unchanged."""
    rng = np.random.default_rng(rng_seed)
    table = {s: dict(zip(LRS, rng.uniform(1.0, 4.0, len(LRS)), strict=True)) for s in range(5)}
    chosen, _, _ = S.loo_choice(grid_runs(table))
    for s in table:
        others = {lr: np.mean([table[t][lr] for t in table if t != s]) for lr in LRS}
        assert chosen[s] == min(others, key=others.get)
        rewritten = {**table, s: dict(zip(LRS, rng.uniform(0.0, 4.0, len(LRS)), strict=True))}
        assert S.loo_choice(grid_runs(rewritten))[0][s] == chosen[s]


def test_loo_censors_an_optimum_at_the_edge():
    table = {s: {1e-3: 3.0 + 0.1 * s, 1e-2: 2.0, 1e-1: 1.0} for s in range(4)}
    chosen, edge, _ = S.loo_choice(grid_runs(table))
    assert edge is True and set(chosen.values()) == {1e-1}
    assert S.arm_values(study(seeds=(0, 1, 2, 3)), grid_runs(table), (), "dot").censored


def test_tuned_choice_flags_an_edge():
    def tune(losses):
        return [run(s, lr, x + 0.01 * (s - 50)) for s in (50, 51) for lr, x in losses.items()]
    assert S.tuned_choice(tune({1e-3: 3.0, 1e-2: 1.0, 1e-1: 2.0}))[:2] == (1e-2, False)
    assert S.tuned_choice(tune({1e-3: 3.0, 1e-2: 2.0, 1e-1: 1.0}))[:2] == (1e-1, True)
    assert S.tuned_choice(tune({1e-3: 1.0, 1e-2: 2.0, 1e-1: 3.0}))[:2] == (1e-3, True)
    lr, edge, curve = S.tuned_choice(tune({3e-2: 1.0}))
    assert (lr, edge) == (3e-2, False) and curve == pytest.approx({3e-2: 1.005})


def test_tuned_choice_reads_clipped_losses():
    """A diverged run counts at its loss at init (Wortsman et al. 2023's clipped loss), so an LR
    that diverged on one tuning seed is not chosen on the other seed's luck."""
    runs = [run(50, 1e-1, 0.5), run(51, 1e-1, float("nan"), status="diverged"),
            run(50, 1e-2, 1.5), run(51, 1e-2, 1.6), run(50, 1e-3, 3.0), run(51, 1e-3, 3.0)]
    lr, edge, curve = S.tuned_choice(runs)
    assert curve[1e-1] == pytest.approx((0.5 + L0) / 2)
    assert (lr, edge) == (1e-2, False)
    assert S.tuned_choice([run(50, 1e-2, 9.0), run(51, 1e-2, 1.0)])[2] == {1e-2: (L0 + 1) / 2}
    with pytest.raises(ValueError, match="tune_runs"):
        S.tuned_choice([run(50, 1e-2, 1.0, status="running")])


def test_tuned_arm_is_read_at_the_tuning_seeds_lr_on_the_reported_seeds():
    tune = [run(s, lr, x) for s in (50, 51)
            for lr, x in {1e-3: 3.0, 1e-2: 1.0, 1e-1: 2.0}.items()]
    reported = [run(s, 1e-2, 1.2 + 0.1 * s) for s in range(5)]
    stray = [run(0, 1e-1, 0.1)]  # a reported seed at an LR that was not chosen: not read
    v = S.arm_values(study("tuned"), tune + reported + stray, (), "dot")
    assert v.values == pytest.approx({s: 1.2 + 0.1 * s for s in range(5)})
    assert v.lrs == dict.fromkeys(range(5), 1e-2) and v.censored is False
    assert 50 not in v.values and 51 not in v.values  # tuning seeds are never reported
    edge = [run(s, lr, x) for s in (50, 51) for lr, x in {1e-3: 3.0, 1e-2: 1.0}.items()]
    assert S.arm_values(study("tuned"), edge + reported, (), "dot").censored
    one = [run(s, 1e-2, 1.0) for s in (50, 51)]
    assert not S.arm_values(study("tuned", lrs=(1e-2,)), one + reported, (), "dot").censored


def test_tuned_arm_without_tuning_data_is_empty():
    reported = [run(s, 1e-2, 1.0) for s in range(5)]
    v = S.arm_values(study("tuned"), reported, (), "dot")
    assert (v.values, v.lrs, v.censored) == ({}, {}, False)


def test_arm_values_reads_a_cell_and_a_custom_value():
    cell = (("init", "unit"), ("d_model", 64))
    runs = (grid_runs(LUCKY, init="unit", d_model=64)
            + grid_runs({s: {1e-2: 0.1} for s in range(5)}, init="gpt2", d_model=64)
            + grid_runs({s: {1e-2: 0.1} for s in range(5)}, arm="scaled_dot", init="unit",
                        d_model=64))
    st = study(cells={"init": ("gpt2", "unit"), "d_model": (64,)})
    v = S.arm_values(st, runs, cell, "dot", value=lambda r: r.final_metric)
    assert v.values[0] == pytest.approx(1 - 2.0 / 10) and v.values[1] == pytest.approx(0.79)
    assert S.arm_values(st, runs, cell, "dot").values[1] == pytest.approx(2.1)


def test_cells_and_labels():
    st = study(cells={"init": ("gpt2", "unit"), "d_model": (128, 256)})
    cells = S.cells(st)
    assert len(cells) == 4 and cells[-1] == (("init", "unit"), ("d_model", 256))
    assert S.cell_label(cells[-1]) == "init=unit d_model=256"
    assert S.cells(study()) == [()] and S.cell_label(()) == "all"
    r = run(0, 1e-2, 1.0, init="unit", d_model=256)
    assert S.in_cell(r, cells[-1], "dot") and not S.in_cell(r, cells[-1], "scaled_dot")
    assert not S.in_cell(r, cells[0], "dot")


def test_runs_that_measured_nothing_are_left_out():
    runs = [run(0, 1e-2, 1.0), run(1, 1e-2, 1.0, loss0=float("nan")),
            run(2, 1e-2, 1.0, status="failed")]
    assert S.clipped(runs) == {(1e-2, 0): 1.0}
    assert S.clipped([]) == {}


def test_to_dict_is_json_ready_with_string_keys():
    v = S.ArmValues({0: 1.5, 3: 2.0}, {0: 0.01, 3: 0.01}, True, {0.01: 1.75})
    d = json.loads(json.dumps(v.to_dict()))
    assert d == {"values": {"0": 1.5, "3": 2.0}, "lrs": {"0": 0.01, "3": 0.01},
                 "censored": True, "curve": {"0.01": 1.75}, "alt": {}, "alt_lrs": {}}


@pytest.mark.parametrize("lr_choice", ["grid", "tuned"])
def test_an_arm_whose_runs_measured_nothing_is_empty(lr_choice):
    """Every run without a finite loss at init: no LR can be chosen, and no value read (the
    grid study once raised ValueError from min() of an empty curve here)."""
    runs = [run(s, 1e-2, 1.0, loss0=float("nan")) for s in (0, 1, 2, 3, 4, 50, 51)]
    v = S.arm_values(study(lr_choice), runs, (), "dot")
    assert (v.values, v.lrs, v.censored, v.curve) == ({}, {}, False, {})
    assert S.loo_choice(runs) == ({}, False, {})


@pytest.mark.parametrize(("curve", "expected"), [
    ({0.01: 2.0, 0.03: 1.0}, 0.03 * 10 ** 0.5),  # best at the top edge: one step up
    ({0.01: 1.0, 0.03: 2.0}, 0.01 / 10 ** 0.5),  # best at the bottom edge: one step down
    ({0.01: 2.0, 0.03: 1.5, 0.0949: 1.2, 0.3: 1.0}, None),  # extended twice already: censored
    ({0.01: 2.0, 0.03: 1.0, 0.1: 1.5}, None),  # an interior optimum
])
def test_a_grid_extends_at_most_extend_times_even_across_reruns(curve, expected, tmp_path):
    from attnscale.audit.running import StudyRunner

    s = Study("s", {}, ("dot",), (0.01, 0.03), (0, 1, 2), lr_choice="tuned",
              tune_seeds=(50,), extend=2)
    runner = StudyRunner(tmp_path / "r.db", "local", 1, None)
    best = min(curve, key=curve.get)
    edge = best in (min(curve), max(curve))
    out = runner.extensions(s, {((), "dot"): (best, edge, curve)})
    if expected is None:
        assert out == {}
    else:
        assert out[(), "dot"] == pytest.approx(expected)


# ------------------------------------------------------------------ the runner-up LR


def test_runner_up_is_the_better_grid_neighbour():
    curve = {1e-3: 3.0, 1e-2: 1.0, 1e-1: 1.2, 1.0: 0.9}
    assert S.runner_up(curve, 1e-2) == 1e-1  # 1.2 beats 3.0; the far 0.9 is not a neighbour
    assert S.runner_up(curve, 1e-3) == 1e-2  # at an edge: the one neighbour
    assert S.runner_up({1e-2: 1.0}, 1e-2) is None


def test_separated_needs_every_seed_past_delta():
    d = S.SEPARATION
    table = {(1e-2, 0): 1.0, (1e-1, 0): 1.0 + 2 * d, (1e-2, 1): 1.0, (1e-1, 1): 1.0 + 2 * d}
    assert S.separated(table, 1e-2, 1e-1, (0, 1))
    assert not S.separated({**table, (1e-1, 1): 1.0 + d / 2}, 1e-2, 1e-1, (0, 1))
    assert not S.separated({**table, (1e-1, 1): 1.0 + 0.99 * d}, 1e-2, 1e-1, (0, 1))
    assert not S.separated(table, 1e-2, 1e-1, (7,))  # no seed ran both: nothing separates


def test_tuned_lrs_keeps_a_near_tie_and_drops_a_separated_neighbour():
    def tune(c50, c51):
        return [run(50, lr, x) for lr, x in c50.items()] + [run(51, lr, x) for lr, x in
                                                             c51.items()]
    # Q3's tie: both LRs solve the task, 0.009 against 0.011 (offset 2 of the length study)
    lr, other, edge, _ = S.tuned_lrs(tune({1e-3: 3.9, 1e-2: 0.009, 1e-1: 0.04},
                                          {1e-3: 3.9, 1e-2: 0.030, 1e-1: 0.011}))
    assert (lr, other, edge) == (1e-2, 1e-1, False)
    lr, other, _, _ = S.tuned_lrs(tune({1e-3: 3.9, 1e-2: 1.0, 1e-1: 1.5},
                                       {1e-3: 3.9, 1e-2: 1.0, 1e-1: 1.3}))
    assert (lr, other) == (1e-2, None)  # both tuning seeds put 0.1 far above
    assert S.tuned_lrs(tune({1e-2: 1.0}, {1e-2: 1.1}))[1] is None  # one LR: nothing to swap


def test_arm_values_reads_the_reported_seeds_at_the_runner_up():
    tune = [run(s, lr, x) for s in (50, 51) for lr, x in {1e-3: 3.0, 1e-2: 1.0,
                                                          1e-1: 1.01, 1.0: 4.0}.items()]
    reported = [run(s, 1e-2, 1.0 + s / 10) for s in range(5)]
    tied = [run(s, 1e-1, 1.0 + s / 10 + (-1) ** s * 0.03) for s in range(5)]
    st = study("tuned")
    assert S.reported_lrs(st, tune, (), "dot") == (1e-2, 1e-1)
    v = S.arm_values(st, tune + reported + tied, (), "dot")
    assert v.values == pytest.approx({s: 1.0 + s / 10 for s in range(5)})
    assert v.alt == pytest.approx({s: 1.0 + s / 10 + (-1) ** s * 0.03 for s in range(5)})
    assert set(v.alt_lrs.values()) == {1e-1} and set(v.lrs.values()) == {1e-2}
    # C3's case: the tuning seeds disagree, but with the reported seeds the runner-up is
    # clearly worse (every seed that ran both puts it ~1 nat above): not read
    worse = [run(s, 1e-1, 2.0 + s / 10) for s in range(5)]
    assert S.arm_values(st, tune + reported + worse, (), "dot").alt == {}
    far = [run(s, lr, x) for s in (50, 51) for lr, x in {1e-3: 3.0, 1e-2: 1.0, 1e-1: 1.5,
                                                         1.0: 4.0}.items()]
    assert S.reported_lrs(st, far, (), "dot") == (1e-2,)  # not even trained
    assert S.arm_values(st, far + reported + tied, (), "dot").alt == {}


def test_a_context_cell_trains_no_runner_up():
    """A context cell's comparisons enter no verdict, so nothing reads them again at a
    runner-up: its reported seeds run at the choice only; a deciding cell keeps both."""
    st = replace(study("tuned", cells={"init": ("gpt2", "unit")}), context={"init": ("gpt2",)})
    table = {1e-3: 3.0, 1e-2: 1.0, 1e-1: 1.01, 1.0: 4.0}
    tune = [run(s, lr, x, init=i) for i in ("gpt2", "unit") for s in (50, 51)
            for lr, x in table.items()]
    assert S.reported_lrs(st, tune, (("init", "unit"),), "dot") == (1e-2, 1e-1)
    assert S.reported_lrs(st, tune, (("init", "gpt2"),), "dot") == (1e-2,)


def test_clearly_worse_is_a_one_sided_t_bound_past_delta():
    d = S.SEPARATION
    gaps = [0.5, 0.6, 0.4, 0.55]
    table = {(1.0, s): 0.0 for s in range(4)} | {(2.0, s): g for s, g in enumerate(gaps)}
    low = np.mean(gaps) - stats.t.ppf(0.95, 3) * np.std(gaps, ddof=1) / 2
    assert low > d and S.clearly_worse(table, 1.0, 2.0, range(4))
    half = {k: v / 25 for k, v in table.items()}  # the same gaps / 25: bound just below δ
    assert low / 25 < d < low / 20 and not S.clearly_worse(half, 1.0, 2.0, range(4))
    noisy = table | {(2.0, 0): -2.0}  # one seed prefers the runner-up by far: not clearly
    assert not S.clearly_worse(noisy, 1.0, 2.0, range(4))
    assert not S.clearly_worse(table, 1.0, 2.0, range(1))  # one seed: no bound
    flat = {(1.0, s): 0.0 for s in range(3)} | {(2.0, s): 2 * d for s in range(3)}
    assert S.clearly_worse(flat, 1.0, 2.0, range(3))  # no spread: every gap past δ


def test_grid_runner_ups_come_from_the_other_seeds():
    """Seeds 0-3 put 0.01 and 0.1 within δ of each other; seed 4 alone puts 0.1 far above. Each
    seed's runner-up is decided by the OTHER seeds: seed 4's stays (0-3 put it 0.005 above),
    every other seed's does too (with seed 4 among them the gap's lower bound is below δ)."""
    table = {s: {1e-3: 3.0, 1e-2: 1.0, 1e-1: 1.005 if s < 4 else 1.9, 1.0: 4.0}
             for s in range(5)}
    runs = grid_runs(table)
    chosen, _, _ = S.loo_choice(runs)
    assert set(chosen.values()) == {1e-2}
    assert S.loo_runner_ups(runs, chosen) == dict.fromkeys(range(5), 1e-1)
    v = S.arm_values(study(), runs, (), "dot")
    assert v.alt == pytest.approx({s: table[s][1e-1] for s in range(5)})
    # leave-one-out: seed 0 alone puts 0.1 far below (a lucky seed) and is never its own judge;
    # the other seeds all put it 0.5 above, so seed 0's runner-up is clearly worse, while for
    # every other seed, seed 0 is among the judges and breaks the bound
    lucky = {s: {**row, 1e-1: 0.5 if s == 0 else 1.5} for s, row in table.items()}
    chosen = {s: 1e-2 for s in range(5)}
    assert S.loo_runner_ups(grid_runs(lucky), chosen) == dict.fromkeys(range(1, 5), 1e-1)
    apart = {s: {**row, 1e-1: 1.5} for s, row in table.items()}
    assert S.loo_runner_ups(grid_runs(apart), chosen) == {}
    assert S.arm_values(study(), grid_runs(apart), (), "dot").alt == {}


def test_the_runner_trains_the_reported_seeds_at_the_runner_up(tmp_path):
    """A tuned study whose two LRs the 3-step tuning cannot separate: the runner trains every
    reported seed at both, the evidence reads both, and a runner-up run removed from the
    database is named as missing (an error, never a smaller reading)."""
    st = replace(studies(PRESETS["tiny"])["length"], lrs=(1e-3, 1.1e-3), extend=0)
    db = tmp_path / "r.db"
    with StudyRunner(db, "local", 1, None) as runner:
        runner.run(st)
    with Store(db) as store:
        runs = study_runs(store, st)
    assert missing_runs(st, runs) == []
    for arm in st.arms:
        assert S.reported_lrs(st, runs, (), arm) == (
            S.tuned_choice([r for r in runs if S.in_cell(r, (), arm)
                            and r.seed in st.tune_seeds])[0],
            *[x for x in st.lrs if x != S.reported_lrs(st, runs, (), arm)[0]])
        v = S.arm_values(st, runs, (), arm)
        assert set(v.alt) == set(v.values) == set(st.seeds)
    drop = next(r for r in runs if r.seed == st.seeds[0]
                and r.lr == S.reported_lrs(st, runs, (), st.arms[0])[1]
                and r.variant == st.arms[0])
    lost = missing_runs(st, [r for r in runs if r is not drop])
    assert len(lost) == 1 and lost[0].endswith(f"seed {st.seeds[0]} at LR "
                                               f"{drop.lr:g}")
