"""Sweep analysis on synthetic run dicts (the shape Store.runs(history=True) returns)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from attnscale.core.scores import SCORES
from attnscale.lab import analysis as A


def run(lr, loss, seed=0, status="done", loss0=5.0, score="scaled_dot", variant=None, **cfg):
    history = [
        {"step": 0, "loss": loss0, "max_abs_logit": 1.0 + seed},
        {
            "step": 10,
            "loss": loss0 / 2,
            "max_abs_logit": 10.0 * lr + seed,
            "layers": [{"max_abs_logit": 1.0}],
        },
    ]
    return {
        "id": f"{score}-{lr}-{seed}",
        "status": status,
        "variant": variant,
        "config": {"score": score, "lr": lr, "seed": seed, "task": "mqar", "d_model": 64, **cfg},
        "final_loss": loss,
        "final_metric": None if loss is None else 1.0 / (1.0 + loss),
        "diverged_step": 5 if status == "diverged" else None,
        "history": history,
    }


@pytest.fixture
def grid():
    # loss0 = 5; lr 1e-3 -> 3, 1e-2 -> 2 (best), 1e-1 -> one seed diverged, 1 -> above loss0
    return [
        run(1e-3, 3.0, 0), run(1e-3, 3.0, 1),
        run(1e-2, 2.0, 0), run(1e-2, 2.0, 1),
        run(1e-1, 1.0, 0), run(1e-1, 9.0, 1, status="diverged"),
        run(1.0, 6.0, 0), run(1.0, 7.0, 1),
        run(1e-2, None, 2, status="failed"), run(1e-3, None, 3, status="queued"),
    ]  # fmt: skip


def test_loss_by_lr_clips_and_counts_divergence_as_loss0(grid):
    assert A.loss_by_lr(grid) == {1e-3: 3.0, 1e-2: 2.0, 1e-1: 3.0, 1.0: 5.0}


def test_best_loss(grid):
    assert A.best_loss(grid) == (2.0, 1e-2)


def test_lr_sensitivity_wortsman(grid):
    # mean over the grid of [min(loss, loss0) - best] = (1 + 0 + 1 + 3) / 4
    assert A.lr_sensitivity(grid) == pytest.approx(5 / 4)
    # seed 0: losses 3, 2, 1, 5 -> best 1 -> (2 + 1 + 0 + 4) / 4; seed 1: 3, 2, 5, 5 -> 7/4
    seed0 = [r for r in grid if r["config"]["seed"] == 0]
    assert A.lr_sensitivity(seed0) == pytest.approx(7 / 4)


def test_stable_lrs(grid):
    assert A.stable_lrs(grid) == [1e-3, 1e-2]
    assert A.stable_lrs([run(1.0, 9.0)]) == []


def test_divergence_rate_ignores_unfinished(grid):
    assert A.divergence_rate(grid) == pytest.approx(1 / 8)
    assert A.divergence_by_lr(grid) == {1e-3: 0.0, 1e-2: 0.0, 1e-1: 0.5, 1.0: 0.0}
    assert A.divergence_rate([run(1e-3, None, status="failed")]) is None


def test_mean_ci_matches_scipy():
    xs = [1.0, 2.0, 4.0, 7.0]
    ci = A.mean_ci(xs)
    low, high = stats.t.interval(0.95, len(xs) - 1, loc=3.5, scale=stats.sem(xs))
    assert ci.mean == pytest.approx(3.5)
    assert (ci.low, ci.high) == pytest.approx((low, high))
    assert "±" in str(ci)


def test_mean_ci_small_and_non_finite():
    assert A.mean_ci([2.0]) == A.MeanCI(2.0, None, None, 1)
    assert A.mean_ci([2.0, math.nan, None]).n == 1
    assert math.isnan(A.mean_ci([]).mean)


def test_loss_ci_by_lr_and_best_loss_ci(grid):
    ci = A.loss_ci_by_lr(grid)
    assert ci[1e-1].mean == pytest.approx(3.0) and ci[1e-1].n == 2  # 1.0 and the diverged 5.0
    assert ci[1e-2].half_width == pytest.approx(0)
    best, lr = A.best_loss_ci(grid)
    assert lr == 1e-2 and best.to_dict() == {"mean": 2.0, "lo": 2.0, "hi": 2.0, "n": 2}


def test_each_run_is_clipped_at_its_own_loss0():
    # L0 = 4 and 6, final 5 for both: clipped min(5, 4) = 4 and min(5, 6) = 5
    runs = [run(1e-3, 5.0, 0, loss0=4.0), run(1e-3, 5.0, 1, loss0=6.0)]
    assert A.loss_by_lr(runs) == {1e-3: 4.5}
    assert A.stable_lrs(runs) == [1e-3]  # 4.5 < mean L0 = 5
    # a run with neither history nor initial_loss takes the group's mean L0 (5)
    bare = {**run(1e-3, 9.0, 2), "history": []}
    assert A.clipped_losses_by_lr([*runs, bare]) == {1e-3: [4.0, 5.0, 5.0]}


def test_metric_ci_counts_missing_metrics():
    runs = [run(1e-3, 1.0, 0), run(1e-3, None, 1, status="diverged"), run(1e-3, 1.0, 2,
                                                                           status="failed")]
    ci = A.metric_ci(runs)
    assert ci.n == 2 and ci.mean == pytest.approx(0.25)  # 0.5 and the diverged run's 0
    assert A.metric_ci(runs, missing=0.5).mean == pytest.approx(0.5)


def test_initial_loss_from_first_history_row():
    r = run(1e-3, 1.0, loss0=4.2)
    assert A.initial_loss(r) == 4.2
    assert A.initial_loss({"history": []}) is None
    assert A.initial_loss({"history": [], "initial_loss": 3.5}) == 3.5
    with pytest.raises(ValueError, match="initialization"):
        A.loss_by_lr([{**r, "history": []}])


def test_score_knobs_come_from_the_registry():
    for name, score in SCORES.items():
        knobs = A.score_knobs(name)
        assert set(knobs) == set(score.defaults) | ({"scale"} if score.uses_scale else set())
    assert A.score_knobs("no-such-score") == ()


def test_group_keys_are_the_score_name_and_its_non_default_settings():
    assert A.group_key(run(1e-3, 1.0, score="cosine", tau=10.0)) == "cosine tau=10"
    assert A.group_key(run(1e-3, 1.0, score="cosine", tau=10)) == "cosine tau=10"
    assert A.group_key(run(1e-3, 1.0, score="cosine", tau=1.0)) == "cosine"  # the default
    assert A.group_key(run(1e-3, 1.0, score="cosine", temperature="swin")) == "cosine swin"
    assert A.group_key(run(1e-3, 1.0, score="softcap", cap=None)) == "softcap"
    assert A.group_key(run(1e-3, 1.0, score="softcap", cap=5.0, scale=0.5)) == (
        "softcap cap=5 scale=0.5"
    )
    assert A.group_key(run(1e-3, 1.0, score="dot", scale=0.5)) == "dot"  # no scale knob
    assert A.group_key(run(1e-3, 1.0, score="log_length", score_params={"s": 2.0})) == (
        "log_length s=2"
    )
    assert A.group_key(run(1e-3, 1.0, score="no-such-score", tau=3.0)) == "no-such-score"
    assert A.group_key(run(1e-3, 1.0, variant="my-variant")) == "my-variant"
    runs = [
        run(1e-3, 1.0, score="dot"),
        run(1e-3, 1.0, score="dot", d_model=128),
        run(1e-3, 1.0, score="mup", c=8.0),
        run(1e-3, 1.0, score="mup", c=4.0),
        run(1e-3, 1.0, status="failed"),
    ]
    groups = A.group_runs(runs, by=["d_model"])
    assert list(groups) == [(64, "dot"), (128, "dot"), (64, "mup"), (64, "mup c=4")]


def test_group_keys_ignore_the_display_label(monkeypatch):
    """Relabelling a score for tables and figures must not regroup stored runs."""
    relabelled = dataclasses.replace(SCORES["cosine"], label="something else")
    monkeypatch.setitem(SCORES, "cosine", relabelled)
    assert A.group_key(run(1e-3, 1.0, score="cosine", tau=10.0)) == "cosine tau=10"


def test_max_logit_curve_and_peak(grid):
    assert A.max_logit_curve(grid[0]) == [(0, 1.0), (10, pytest.approx(0.01))]
    assert A.peak_max_logit(grid[7]) == pytest.approx(11.0)
    assert A.peak_max_logit({"history": [{"step": 0, "loss": 1.0}]}) is None
    assert A.row_max_logit({"layers_max_logit": [1.0, -30.0, math.nan], "step": 3}) == 30.0
    assert A.row_max_logit({"loss": 1.0}) is None


@settings(deadline=None)  # examples: the hypothesis profile (tests/conftest.py)
@given(
    st.lists(
        st.tuples(st.sampled_from([1e-3, 1e-2, 1e-1, 1.0]), st.floats(0, 20), st.booleans()),
        min_size=1,
        max_size=12,
    )
)
def test_sensitivity_bounds(points):
    runs = [
        run(lr, loss, seed=i, status="diverged" if d else "done")
        for i, (lr, loss, d) in enumerate(points)
    ]
    sens = A.lr_sensitivity(runs)
    best, _ = A.best_loss(runs)
    assert 0.0 <= sens <= 5.0 - best + 1e-12
    assert best <= 5.0
