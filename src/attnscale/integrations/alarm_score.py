"""Scoring and tuning the attention alarm on recorded runs with known outcomes (the zoo of
:mod:`attnscale.lab.runzoo`; ``benchmarks/alarm_zoo.py``). Pure Python on JSON-ready records.

A run record holds ``samples`` [[step, {"layer/statistic": float}], ...] (statistics of sampled
steps) and ``outcome`` (:class:`attnscale.integrations.outcome.Outcome` as a dict). Replaying a
run feeds its samples at the steps that are multiples of ``every`` to a fresh
:class:`AttentionAlarm`. Scores:

* caught: a diverged run whose first alarm step a satisfies a < d, d its divergence onset;
  lead = d − a (steps). A run whose alarm came at or after d, or never, is missed.
* catchable: a diverged run whose onset d comes after the first sampled step past 0
  (d > every): one that blows up before the alarm has seen a trained step cannot be led.
* false alarm: a healthy run on which any rule fired at any sampled step.

Tuning (:func:`tune`) picks, over a grid of :class:`HealthThresholds`, the rules with the fewest
false alarms on the tuning runs, then the most caught, then the longest median lead; ties go to
the most conservative rules (higher levels and rates), so what is reported on other seeds is not
an edge case of the tuning seeds. With a false-alarm budget b it picks the most caught among the
rules that fire on at most a fraction b of the healthy tuning runs (then fewer false alarms, the
longer lead, the conservative rule), and the fewest false alarms only when none is within b:
"fewest first" buys a false alarm fewer on the tuning runs at any cost in catches.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from typing import Any

from attnscale.integrations.alarm import AttentionAlarm, HealthThresholds
from attnscale.util.validate import check_int

__all__ = ["DEFAULT_GRID", "replay", "score_runs", "tune"]

# The grid searched on the tuning seeds (benchmarks/alarm_zoo.py).
DEFAULT_GRID: dict[str, tuple[float, ...]] = {
    "max_logit": (300.0, 1e3, 3e3, 1e4),
    "entropy_floor": (0.0, 0.02, 0.05, 0.1),
    # the first grid ended at 0.08, where the tuned rate sat: extended past it, 10-step window added
    "growth_rate": (0.0, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2),
    "growth_floor": (10.0, 20.0, 50.0, 100.0, 150.0, 200.0),
    "growth_window": (10, 25, 50),
    "entropy_rate": (0.0, 0.01, 0.02),
}


def replay(samples: Sequence[Sequence[Any]], thresholds: HealthThresholds,
           every: int = 1) -> AttentionAlarm:
    """A fresh :class:`AttentionAlarm` (no warnings) fed the ``samples`` whose step is a
    multiple of ``every``, in order."""
    every = check_int("every", every, minimum=1)
    alarm = AttentionAlarm(thresholds, warn=False)
    for step, stats in samples:
        if step % every == 0:
            alarm.update(step, stats)
    return alarm


def _median(values: list[int]) -> float | None:
    return float(statistics.median(values)) if values else None


def score_runs(runs: Iterable[Mapping[str, Any]], thresholds: HealthThresholds,
               every: int = 5) -> dict[str, Any]:
    """Caught, lead times and false alarms of ``thresholds`` over ``runs`` (module
    docstring); per run its name, label, first alarm step, lead and first step of each rule."""
    rows, leads, all_leads = [], [], []
    for run in runs:
        alarm = replay(run["samples"], thresholds, every)
        outcome = run["outcome"]
        first, onset = alarm.first_step, outcome["step"]
        lead = None if first is None or onset is None else onset - first
        rows.append({"name": run.get("name"), "diverged": outcome["diverged"],
                     "diverged_step": onset, "reasons": outcome["reasons"],
                     "alarm_step": first, "lead": lead, "rule_steps": dict(alarm.rule_steps)})
        if outcome["diverged"] and lead is not None:
            all_leads.append(lead)
            if lead > 0:
                leads.append(lead)
    diverged = [r for r in rows if r["diverged"]]
    healthy = [r for r in rows if not r["diverged"]]
    false_alarms = sum(r["alarm_step"] is not None for r in healthy)
    # a run that diverged by the first sampled step after step 0 cannot be led by any alarm
    catchable = [r for r in diverged if r["diverged_step"] > every]
    caught_catchable = sum((r["lead"] or 0) > 0 for r in catchable)
    return {
        "thresholds": asdict(thresholds), "every_n_steps": every,
        "diverged": len(diverged), "caught": len(leads),
        "caught_fraction": len(leads) / len(diverged) if diverged else None,
        "catchable": len(catchable), "caught_catchable": caught_catchable,
        "median_lead": _median(leads), "median_lead_all_fired": _median(all_leads),
        "healthy": len(healthy), "false_alarms": false_alarms,
        "false_alarm_rate": false_alarms / len(healthy) if healthy else None,
        "runs": rows,
    }


def _grid(grid: Mapping[str, Sequence[float]]) -> list[HealthThresholds]:
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        params = dict(zip(names, values, strict=True))
        if params.get("growth_rate", 1.0) == 0 and params.get("growth_floor") != min(
                grid.get("growth_floor", (None,))):
            continue  # growth rule off: its floor does not matter, keep one
        out.append(replace(HealthThresholds(), **params))
    return out


def _key(result: Mapping[str, Any], t: HealthThresholds, budget: float | None) -> tuple:
    lead = result["median_lead"] or 0.0
    conservative = (t.max_logit, -t.entropy_floor, t.growth_rate, t.growth_floor,
                    -t.entropy_rate)
    if budget is None:
        return (-result["false_alarms"], result["caught"], lead, *conservative)
    within = result["false_alarms"] <= budget * result["healthy"] + 1e-9  # 0.29·100 < 29
    return (within, result["caught"] if within else 0, -result["false_alarms"], lead,
            *conservative)


def _best(args: tuple[list[tuple[int, HealthThresholds]], Sequence[Mapping[str, Any]], int,
                      float | None]) -> tuple[tuple, HealthThresholds, dict[str, Any]] | None:
    grid, runs, every, budget = args
    best = None
    for index, t in grid:
        result = score_runs(runs, t, every)
        key = (*_key(result, t, budget), -index)  # full ties: the first in grid order
        if best is None or key > best[0]:
            best = (key, t, result)
    return best


def tune(runs: Sequence[Mapping[str, Any]], grid: Mapping[str, Sequence[float]] | None = None,
         every: int = 5, false_alarm_budget: float | None = None, workers: int = 1,
         ) -> tuple[HealthThresholds, dict[str, Any]]:
    """The thresholds of ``grid`` (default :data:`DEFAULT_GRID`) that do best on ``runs``
    (module docstring; ``false_alarm_budget`` a fraction in [0, 1) or None), and their score
    there; ``workers`` processes share the grid."""
    workers = check_int("workers", workers, minimum=1)
    if false_alarm_budget is not None and not 0 <= false_alarm_budget < 1:
        raise ValueError(f"false_alarm_budget must be in [0, 1) or None, "
                         f"got {false_alarm_budget!r}")
    combos = list(enumerate(_grid(DEFAULT_GRID if grid is None else grid)))
    chunks = [(combos[i::workers], list(runs), every, false_alarm_budget)
              for i in range(workers)]
    if workers == 1:
        found = [_best(chunks[0])]
    else:
        with ProcessPoolExecutor(workers) as pool:
            found = list(pool.map(_best, chunks))
    best = max((f for f in found if f is not None), key=lambda f: f[0], default=None)
    if best is None:
        raise ValueError("grid must hold at least one combination of thresholds")
    return best[1], best[2]
