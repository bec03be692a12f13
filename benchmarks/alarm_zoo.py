"""Does the attention alarm lead? Tune its rules on a zoo of runs with known outcomes, report
on other seeds.

    python benchmarks/alarm_zoo.py [--out benchmarks/recorded/alarm_zoo_2core.json]
        [--every 5] [--workers 2] [--cache /tmp/alarm_zoo_runs.json] [--budget 0.025]
        [--frontier]

Trains the zoo of :mod:`attnscale.lab.runzoo` (byte-level GPTs on pydoc_data.topics, width 64,
2 layers; scaled and unscaled attention × LR 3e-3 … 1e-1 × warmup 0 / 100 × seeds), recording
each run's per-step loss and the attention statistics of every ``--every``-th training step;
labels each run from its loss alone (:func:`attnscale.integrations.outcome.label_run`, against
the LR-3e-3 run of the same score, warmup and seed); picks the alarm's thresholds on the tuning
seeds (:func:`attnscale.integrations.alarm_score.tune`) and scores them, and the previous rules
(max |logit| > 1e4, entropy / ln n < 0.1, no rate rule), on the report seeds: the share of
diverged runs caught before their divergence onset, the median lead in steps, and the share of
healthy runs with any alarm. The ``frozen`` rule's factor is chosen first, on the tuning seeds
(:func:`choose_frozen_factor`), and the tuning runs with it. Also scored: the shipped defaults
(``HealthThresholds()``: the tuning's choice, unless docs/alarm.md says why not), the defaults
shipped before the frozen rule, and those with the rule at ``attnscale check``'s 23·s_c.
``--cache`` keeps the trained runs (JSON) so a re-run only re-scores them (training only the
seeds it lacks). ``--budget`` is the tuning's false-alarm budget
(:func:`attnscale.integrations.alarm_score.tune`): half the issue's 5% target, since the rate on
held-out seeds came out above the tuning seeds' in every earlier round (docs/alarm.md).
``--frontier`` also fits the rules on the report seeds themselves, within the issue's 5%
false-alarm target: not a result (it is tuned on the set it is scored on, so it can only
overstate) but an upper bound on what this family of rules can reach on this zoo.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from attnscale.integrations.alarm import ONE_HOT_FACTOR, RULES, HealthThresholds
from attnscale.integrations.alarm_score import DEFAULT_GRID, score_runs, tune
from attnscale.lab import runzoo
from attnscale.util.jsonio import jsonable
from attnscale.util.provenance import git_revision, machine, versions

STALL_GAPS = (0.3, 0.4, 0.5)  # the label's stall cut is 0.25 nats; rescored at these
PREVIOUS = HealthThresholds(max_logit=1e4, entropy_floor=0.1, growth_rate=0.0, entropy_rate=0.0,
                            frozen_factor=0.0)
# the defaults shipped before the frozen rule (docs/alarm.md)
SHIPPED_BEFORE = HealthThresholds(max_logit=1e4, entropy_floor=0.0, growth_rate=0.15,
                                  growth_floor=20.0, growth_window=25, entropy_rate=0.0,
                                  frozen_factor=0.0)
# the frozen rule's factors tried on the tuning seeds (× s_c; 23 is `attnscale check`'s)
FROZEN_FACTORS = (ONE_HOT_FACTOR, 30.0, 40.0, 50.0, 55.0, 60.0, 70.0, 80.0, 100.0)
# the rules earlier tunings chose (docs/alarm.md, "History"), scored beside the current choice
EARLIER = {"first grid, seeds 0-1": HealthThresholds(growth_rate=0.08, growth_floor=20.0,
                                                     frozen_factor=0.0),
           "extended grid, seeds 0-1": HealthThresholds(growth_rate=0.12, growth_floor=10.0,
                                                        frozen_factor=0.0)}


def load_or_train(cache: str | None, every: int, workers: int,
                  seeds: tuple[int, ...]) -> tuple[list[dict], float]:
    """The zoo's runs for ``seeds`` (those of ``cache`` reused, the other seeds trained) and
    the seconds training took."""
    cached = json.loads(Path(cache).read_text()) if cache and Path(cache).is_file() else []
    missing = tuple(s for s in seeds if s not in {r["member"]["seed"] for r in cached})
    start = time.perf_counter()
    if missing:  # each run records its revision, so a cache says when its runs were trained
        new = runzoo.train_zoo(runzoo.members(missing), every=every, workers=workers)
        cached += [{**r, "git_rev": git_revision()} for r in new]
        if cache:
            Path(cache).write_text(json.dumps(cached))
    took = time.perf_counter() - start
    return [r for r in cached if r["member"]["seed"] in seeds], took


def first_rules(result: dict) -> dict[str, int]:
    """{rule: on how many runs it fired first (ties count every rule of that step)}."""
    out = dict.fromkeys(RULES, 0)
    for row in result["runs"]:
        if row["alarm_step"] is not None:
            for rule, step in row["rule_steps"].items():
                out[rule] += step == row["alarm_step"]
    return out


def summary(name: str, res: dict) -> str:
    return (f"{name}: caught {res['caught']}/{res['diverged']} diverged "
            f"({res['caught_catchable']}/{res['catchable']} of those diverging after the first "
            f"sample), median lead "
            f"{res['median_lead']} steps; false alarms {res['false_alarms']}/{res['healthy']} "
            f"healthy; first rule {first_rules(res)}")


def print_runs(result: dict, width: int = 31) -> None:
    """One line per scored run: its label, onset, first alarm, lead and rules' first steps."""
    for row in result["runs"]:
        print(f"  {row['name']:<{width}} {'DIVERGED' if row['diverged'] else 'healthy ':<8} "
              f"onset {row['diverged_step']!s:>4} {','.join(row['reasons']):<14} alarm "
              f"{row['alarm_step']!s:>4} lead {row['lead']!s:>4} {row['rule_steps']}")


def choose_frozen_factor(tuning: list[dict], every: int, budget: float
                         ) -> tuple[float, dict[str, dict]]:
    """The smallest factor of :data:`FROZEN_FACTORS` whose false alarms on the tuning runs, with
    the growth and level rules shipped before, stay within ``budget`` (a fraction of healthy
    runs), and every factor's score there. The rule is there to catch attention frozen before
    the growth rule can see it, which the lab zoo's step-0 sample hides (the growth rule sees
    init to the first trained sample); so the most sensitive factor the budget allows."""
    scores = {f"frozen factor {f:g} | tuning set": score_runs(
        tuning, replace(SHIPPED_BEFORE, frozen_factor=f), every) for f in FROZEN_FACTORS}
    within = [f for f, res in zip(FROZEN_FACTORS, scores.values(), strict=True)
              if res["false_alarms"] <= budget * res["healthy"] + 1e-9]
    if not within:
        raise RuntimeError(f"no frozen factor of {FROZEN_FACTORS} is within the budget")
    return min(within), scores


def frozen_rows(tuning: list[dict], report: list[dict], every: int) -> dict[str, dict]:
    """The defaults shipped before the frozen rule, the shipped ones (``HealthThresholds()``),
    and the ones before with the frozen rule at check's 23, on both seed sets, and on the
    report set sampled every 10 and 25 steps."""
    out = {}
    for name, rules in (("shipped before (no frozen rule)", SHIPPED_BEFORE),
                        ("shipped defaults", HealthThresholds()),
                        ("shipped before + frozen rule at check's 23",
                         replace(SHIPPED_BEFORE, frozen_factor=ONE_HOT_FACTOR))):
        for where, runs in (("tuning set", tuning), ("report set", report)):
            out[f"{name} | {where}"] = score_runs(runs, rules, every)
        for sparse in (10, 25):
            out[f"{name} | report set | every {sparse}"] = score_runs(report, rules, sparse)
    return out


def sensitivity_rows(report: list[dict], chosen: HealthThresholds, every: int
                     ) -> dict[str, dict]:
    """The tuned rules on the report set relabelled at other stall cuts (how much the label's
    cut decides, docs/alarm.md) and sampled every 10, 25 and 50 steps."""
    out = {}
    for gap in STALL_GAPS:
        relabelled = runzoo.label_zoo(report, gap=gap)
        out[f"tuned rules | report set | stall gap {gap}"] = score_runs(relabelled, chosen, every)
    for sparse in (10, 25, 50):
        if sparse % every == 0:
            out[f"tuned rules | report set | every {sparse}"] = score_runs(report, chosen, sparse)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--every", type=int, default=5, help="sampled steps (every_n_steps)")
    parser.add_argument("--workers", type=int, default=2, help="training processes")
    parser.add_argument("--cache", default=None, help="JSON file of trained runs to reuse")
    parser.add_argument("--budget", type=float, default=0.025,
                        help="false-alarm budget of the tuning (a fraction of healthy runs)")
    parser.add_argument("--frontier", action="store_true",
                        help="also fit the rules on the report seeds (an upper bound)")
    args = parser.parse_args()
    start = time.perf_counter()
    runs, train_s = load_or_train(args.cache, args.every, args.workers,
                                  runzoo.TUNE_SEEDS + runzoo.REPORT_SEEDS)
    runs = runzoo.label_zoo(runs)
    tuning = [r for r in runs if r["member"]["seed"] in runzoo.TUNE_SEEDS]
    report = [r for r in runs if r["member"]["seed"] in runzoo.REPORT_SEEDS]
    factor, factor_scores = choose_frozen_factor(tuning, args.every, args.budget)
    grid = {**DEFAULT_GRID, "frozen_factor": (factor,)}  # growth and levels tuned beside it
    chosen, tuned = tune(tuning, grid, args.every, false_alarm_budget=args.budget,
                         workers=args.workers)
    results = {"tuned rules | tuning set": tuned,
               "tuned rules | report set": score_runs(report, chosen, args.every),
               "previous rules | tuning set": score_runs(tuning, PREVIOUS, args.every),
               "previous rules | report set": score_runs(report, PREVIOUS, args.every)}
    for name, rules in EARLIER.items():
        results[f"{name} | report set"] = score_runs(report, rules, args.every)
    results.update(factor_scores)
    results.update(frozen_rows(tuning, report, args.every))
    if args.frontier:
        _, results["frontier: fit on the report set, 5% budget | report set"] = tune(
            report, DEFAULT_GRID, args.every, false_alarm_budget=0.05, workers=args.workers)
    results.update(sensitivity_rows(report, chosen, args.every))
    print(f"chosen on seeds {runzoo.TUNE_SEEDS}: {chosen}")
    for name, res in results.items():
        print(summary(name, res))
    if factor != HealthThresholds().frozen_factor:
        print(f"NOTE: the frozen factor chosen here, {factor:g}, is not the shipped one")
    print_runs(results["shipped defaults | report set"])
    if args.out:
        record = {
            "zoo": {"base": runzoo.BASE, "lrs": runzoo.LRS, "reference_lr": runzoo.REFERENCE_LR,
                    "warmups": runzoo.WARMUPS, "scores": runzoo.SCORES,
                    "tune_seeds": runzoo.TUNE_SEEDS, "report_seeds": runzoo.REPORT_SEEDS,
                    "false_alarm_budget": args.budget,
                    "every_n_steps": args.every, "members": len(runs)},
            "labels": {r["name"]: r["outcome"] for r in runs},
            "final_losses": {r["name"]: sum(r["losses"][-30:]) / 30 for r in runs},
            "elapsed_s": {r["name"]: r["elapsed_s"] for r in runs},
            "grid": grid, "chosen": vars(chosen), "previous": vars(PREVIOUS),
            "shipped": vars(HealthThresholds()),
            "shipped_before": vars(SHIPPED_BEFORE), "frozen_factors": FROZEN_FACTORS,
            "frozen_factor": factor,
            "results": results, "train_s": train_s, "wall_s": time.perf_counter() - start,
            "versions": versions(), "git_rev": git_revision(), "machine": machine(),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(jsonable(record), indent=1))


if __name__ == "__main__":
    main()
