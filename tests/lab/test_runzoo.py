"""attnscale.lab.runzoo: a small real slice of the alarm zoo, labelled and scored."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from attnscale.integrations.alarm import HealthThresholds
from attnscale.integrations.alarm_score import score_runs, tune
from attnscale.lab import runzoo

RECORDED = Path(__file__).parents[2] / "benchmarks" / "recorded" / "alarm_zoo_2core.json"


@pytest.fixture(scope="module")
def slice_runs():
    """Unscaled attention: a healthy reference and a run at 10× its LR (no warmup), 120
    steps, seed 0 (the first 120 steps of two zoo members)."""
    zoo = [runzoo.Member("dot", lr, 0, 0) for lr in (runzoo.REFERENCE_LR, 3e-2)]
    return runzoo.label_zoo(runzoo.train_zoo(zoo, every=5, workers=1, steps=120))


def test_the_slice_is_labelled_from_its_loss(slice_runs):
    ref, hot = slice_runs
    assert len(ref["losses"]) == len(hot["losses"]) == 120
    assert [s for s, _ in ref["samples"]] == list(range(0, 120, 5))
    assert not ref["outcome"]["diverged"]
    assert hot["outcome"]["diverged"] and "stall" in hot["outcome"]["reasons"]
    assert hot["outcome"]["final_gap"] > 0.25


def test_the_slice_logs_per_head_max_logits(slice_runs):
    for run in slice_runs:
        for _, stats in run["samples"]:
            layers = {k.rsplit("/", 1)[0] for k in stats}
            assert len(layers) == 2
            for layer in layers:
                heads = [stats[f"{layer}/max_abs_logit_head{h}"] for h in (0, 1)]
                assert max(heads) == pytest.approx(stats[f"{layer}/max_abs_logit"], rel=1e-6)


def test_the_default_alarm_leads_on_the_slice_and_is_silent_on_the_reference(slice_runs):
    result = score_runs(slice_runs, HealthThresholds(), every=5)
    ref, hot = result["runs"]
    assert ref["alarm_step"] is None
    assert hot["diverged_step"] == 25 and hot["alarm_step"] == 5  # as in the recorded zoo
    assert hot["lead"] == 20 and hot["rule_steps"]["logit_growth"] == 5
    assert result["false_alarms"] == 0 and result["caught"] == 1


def test_tuning_prefers_no_false_alarm():
    """A toy pair: a rule that fires on the healthy run loses to one that does not."""
    calm = [[s, {"L/max_abs_logit": 50.0, "L/entropy_normalized": 0.5}] for s in range(0, 100, 5)]
    hot = [[s, {"L/max_abs_logit": 50.0 * math.exp(0.05 * s), "L/entropy_normalized": 0.5}]
           for s in range(0, 100, 5)]
    runs = [{"name": "calm", "samples": calm, "outcome": {"diverged": False, "step": None,
                                                          "reasons": []}},
            {"name": "hot", "samples": hot, "outcome": {"diverged": True, "step": 90,
                                                        "reasons": ["stall"]}}]
    grid = {"max_logit": (40.0, 1e4), "growth_rate": (0.0, 0.02), "growth_floor": (10.0,),
            "entropy_floor": (0.0,), "entropy_rate": (0.0,), "growth_window": (25,)}
    chosen, result = tune(runs, grid, every=5)
    assert chosen.max_logit == 1e4 and chosen.growth_rate == 0.02
    assert result["false_alarms"] == 0 and result["caught"] == 1 and result["median_lead"] == 85


def test_the_defaults_are_the_recorded_ones():
    """The record scores what HealthThresholds() ships; its frozen factor is the one the
    benchmark chose on the tuning seeds, and the growth and level rules are those shipped
    before it (the tuning's re-pick on the retrained zoo is recorded beside them, not shipped:
    docs/alarm.md says why)."""
    record = json.loads(RECORDED.read_text())
    shipped = asdict(HealthThresholds())
    assert record["shipped"] == shipped
    assert record["frozen_factor"] == shipped["frozen_factor"] == record["chosen"]["frozen_factor"]
    assert {**record["shipped_before"], "frozen_factor": shipped["frozen_factor"]} == shipped
    assert tuple(record["zoo"]["tune_seeds"]) == runzoo.TUNE_SEEDS
    assert not set(runzoo.TUNE_SEEDS) & set(record["zoo"]["report_seeds"])


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="every"):
        runzoo.train_member(runzoo.Member("dot", 1e-3, 0, 0), every=0)
    with pytest.raises(ValueError, match="workers"):
        runzoo.train_zoo([], workers=0)


def toy_run(name: str, rate: float, diverged: bool) -> dict:
    """A run whose max |logit| grows from 50 at ``rate`` per step, sampled every 5 steps."""
    samples = [[s, {"L/max_abs_logit": 50.0 * math.exp(rate * s), "L/entropy_normalized": 0.5}]
               for s in range(0, 100, 5)]
    return {"name": name, "samples": samples,
            "outcome": {"diverged": diverged, "step": 90 if diverged else None,
                        "reasons": ["stall"] if diverged else []}}


TOY_GRID = {"max_logit": (1e4,), "growth_rate": (0.02, 0.04), "growth_floor": (10.0,),
            "entropy_floor": (0.0,), "entropy_rate": (0.0,), "growth_window": (25,)}


def test_a_false_alarm_budget_buys_catches_and_workers_do_not_change_the_choice():
    """39 calm runs and one healthy run growing at 0.03/step; diverged runs growing at 0.03 and
    0.05. Rate 0.04 fires on no healthy run and catches one; 0.02 fires on 1 of 40 (2.5%) and
    catches both. Fewest-first takes 0.04; a 5% budget takes 0.02, a 2% budget 0.04."""
    runs = ([toy_run(f"calm{i}", 0.0, False) for i in range(39)]
            + [toy_run("brisk", 0.03, False), toy_run("slow", 0.03, True),
               toy_run("fast", 0.05, True)])
    assert tune(runs, TOY_GRID)[0].growth_rate == 0.04
    chosen, result = tune(runs, TOY_GRID, false_alarm_budget=0.05)
    assert chosen.growth_rate == 0.02 and result["caught"] == 2 and result["false_alarms"] == 1
    assert tune(runs, TOY_GRID, false_alarm_budget=0.02)[0].growth_rate == 0.04
    assert tune(runs, TOY_GRID, false_alarm_budget=0.05, workers=2)[0] == chosen
    # full ties (windows 10 / 25 / 50 score alike here): the first in grid order, however the
    # grid is split between processes
    tied = {**TOY_GRID, "growth_window": (50, 10, 25)}
    picks = {tune(runs, tied, false_alarm_budget=0.05, workers=w)[0].growth_window
             for w in (1, 2, 3)}
    assert picks == {50}
    with pytest.raises(ValueError, match="false_alarm_budget"):
        tune(runs, TOY_GRID, false_alarm_budget=1.0)
    with pytest.raises(ValueError, match="workers"):
        tune(runs, TOY_GRID, workers=0)
