"""Sweep analysis on synthetic run dicts (the shape Store.runs(history=True) returns)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

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
    assert A.lr_sensitivity_by_seed(grid) == pytest.approx([7 / 4, 7 / 4])


def test_stable_lrs(grid):
    assert A.stable_lrs(grid) == [1e-3, 1e-2]
    assert A.stable_lr_range(grid) == (1e-3, 1e-2)
    assert A.stable_lr_range([run(1.0, 9.0)]) is None


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


def test_metric_and_loss_ci_by_lr(grid):
    m = A.metric_by_lr(grid)
    assert m[1e-1].n == 1  # the diverged seed has no metric
    assert m[1e-2].mean == pytest.approx(1 / 3) and m[1e-2].half_width == pytest.approx(0)
    assert A.loss_ci_by_lr(grid)[1e-1].mean == pytest.approx(3.0)


def test_initial_loss_from_first_history_row():
    r = run(1e-3, 1.0, loss0=4.2)
    assert A.initial_loss(r) == 4.2
    assert A.initial_loss({"history": []}) is None
    assert A.initial_loss({"history": [], "initial_loss": 3.5}) == 3.5
    with pytest.raises(ValueError, match="initialization"):
        A.loss_by_lr([{**r, "history": []}])


def test_group_keys():
    assert A.group_key(run(1e-3, 1.0, score="cosine", tau=10.0)) == "cosine tau=10"
    assert A.group_key(run(1e-3, 1.0, score="cosine", temperature="swin")) == "cosine swin"
    assert A.group_key(run(1e-3, 1.0, score="softcap", cap=None)) == "softcap"
    assert A.group_key(run(1e-3, 1.0, variant="my-variant")) == "my-variant"
    runs = [
        run(1e-3, 1.0, score="dot"),
        run(1e-3, 1.0, score="dot", d_model=128),
        run(1e-3, 1.0, score="mup", c=8.0),
        run(1e-3, 1.0, status="failed"),
    ]
    groups = A.group_runs(runs, by=["d_model"])
    assert list(groups) == [(64, "dot"), (128, "dot"), (64, "mup c=8")]


def test_max_logit_curves(grid):
    assert A.max_logit_curve(grid[0]) == [(0, 1.0), (10, pytest.approx(0.01))]
    curves = A.max_logit_curves(grid)
    assert curves[1.0] == [(0, 1.5), (10, 10.5)]  # mean over seeds 0 and 1
    assert A.peak_max_logit(grid[7]) == pytest.approx(11.0)
    assert A.row_max_logit({"layers_max_logit": [1.0, -30.0, math.nan], "step": 3}) == 30.0
    assert A.row_max_logit({"loss": 1.0}) is None


def test_layer_curves():
    r = {
        "history": [
            {"step": 0, "layers": [{"max_abs_logit": 1.0}, {"max_abs_logit": 2.0}]},
            {"step": 5, "layers": [{"max_abs_logit": 3.0}, {"max_abs_logit": None}]},
        ]
    }
    assert A.layer_curves(r) == {0: [(0, 1.0), (5, 3.0)], 1: [(0, 2.0)]}


def test_summarize(grid):
    rows = A.summarize([*grid, run(1e-3, 4.0, score="dot")])
    assert [r.key for r in rows] == [("mqar", 64, "scaled_dot"), ("mqar", 64, "dot")]
    s = rows[0]
    assert s.runs == 8 and s.best_loss == 2.0 and s.best_lr == 1e-2
    assert s.lr_sensitivity == pytest.approx(1.25) and s.stable_lr_range == (1e-3, 1e-2)
    assert s.divergence_rate == pytest.approx(1 / 8) and s.max_logit == pytest.approx(11.0)
    assert s.to_dict()["lr_sensitivity_ci"]["n"] == 2


@settings(max_examples=50, deadline=None)
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
