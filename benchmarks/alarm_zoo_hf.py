"""The attention alarm's shipped defaults on runs it was not tuned on: Hugging Face GPT-2s
trained through ``transformers.Trainer`` with ``AttentionHealthCallback`` attached.

    python benchmarks/alarm_zoo_hf.py [--out benchmarks/recorded/alarm_zoo_hf_2core.json]
        [--every 5] [--workers 2] [--seeds 10 11 12 13 14] [--cache /tmp/alarm_zoo_hf_runs.json]

The zoo of :mod:`attnscale.lab.runzoo_hf` (GPT-2 at the lab zoo's size on pydoc_data.topics
characters; scaled and unscaled attention × LR 3e-3 … 1e-1 × warmup 0 / 100 × ``--seeds``),
each run labelled from its loss alone against its group's LR-3e-3 run, and scored with the
thresholds ``HealthThresholds()`` ships (tuned on the lab zoo's seeds 0-9 by
``benchmarks/alarm_zoo.py``), with the defaults shipped before the ``frozen`` rule, and with the
previous rules (1e4, entropy / ln n < 0.1); the shipped ones also sampled every 10 and 25
steps. The callback's own alarm step is checked against a replay of its recorded samples with
the thresholds it ran with: a mismatch is a bug and fails the benchmark. ``--cache`` keeps the
trained runs (JSON), so a re-run re-scores them without training.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from alarm_zoo import EARLIER, PREVIOUS, SHIPPED_BEFORE, print_runs, summary

from attnscale.integrations.alarm import HealthThresholds
from attnscale.integrations.alarm_score import replay, score_runs
from attnscale.lab import runzoo, runzoo_hf
from attnscale.util.jsonio import jsonable
from attnscale.util.provenance import git_revision, machine, versions

# the lab tuning's pick on the retrained zoo, not shipped (docs/alarm.md, "The frozen rule")
RETUNED = HealthThresholds(growth_rate=0.2, growth_floor=10.0)


def load_or_train(cache: str | None, seeds: list[int], every: int, workers: int
                  ) -> list[dict]:
    """The HF zoo's runs for ``seeds`` at ``every``: those of ``cache`` when it holds every
    member, else trained now (and written to ``cache``)."""
    wanted = {m.name for m in runzoo.members(tuple(seeds))}
    if cache and Path(cache).is_file():
        cached = [r for r in json.loads(Path(cache).read_text())
                  if r["name"].removeprefix("hf-") in wanted and r["every"] == every]
        if len(cached) == len(wanted):
            return cached
    runs = runzoo_hf.train_hf_zoo(runzoo.members(tuple(seeds)), every=every, workers=workers)
    runs = [{**r, "git_rev": git_revision()} for r in runs]
    if cache:
        Path(cache).write_text(json.dumps(runs))  # NaN and inf kept, as the lab zoo cache
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--every", type=int, default=5, help="sampled steps (every_n_steps)")
    parser.add_argument("--workers", type=int, default=2, help="training processes")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(runzoo.REPORT_SEEDS))
    parser.add_argument("--cache", default=None, help="JSON file of trained runs to reuse")
    args = parser.parse_args()
    start = time.perf_counter()
    runs = load_or_train(args.cache, args.seeds, args.every, args.workers)
    train_s = time.perf_counter() - start
    runs = runzoo_hf.label_hf_zoo(runs, runzoo.REFERENCE_LR)
    shipped = HealthThresholds()
    for run in runs:  # the callback judged live what the replay judges from its record
        ran_with = HealthThresholds(**run["callback"]["thresholds"])
        replayed = replay(run["samples"], ran_with, args.every).first_step
        if replayed != run["callback"]["alarm_step"]:
            raise RuntimeError(f"{run['name']}: callback alarm at {run['callback']['alarm_step']}"
                               f", replay of its samples at {replayed}")
    results = {"shipped defaults | HF Trainer zoo": score_runs(runs, shipped, args.every),
               "shipped before (no frozen rule) | HF Trainer zoo": score_runs(
                   runs, SHIPPED_BEFORE, args.every),
               "previous rules | HF Trainer zoo": score_runs(runs, PREVIOUS, args.every),
               "lab tuning's re-pick, not shipped | HF Trainer zoo": score_runs(
                   runs, RETUNED, args.every)}
    for every in (10, 25):
        for name, rules in (("shipped defaults", shipped),
                            ("shipped before (no frozen rule)", SHIPPED_BEFORE)):
            results[f"{name} | HF Trainer zoo | every {every}"] = score_runs(runs, rules, every)
    for name, rules in EARLIER.items():
        results[f"{name} | HF Trainer zoo"] = score_runs(runs, rules, args.every)
    for name, res in results.items():
        print(summary(name, res))
    print_runs(results["shipped defaults | HF Trainer zoo"])
    if args.out:
        record = {
            "zoo": {"model": "transformers GPT2LMHeadModel", "base": runzoo.BASE,
                    "lrs": runzoo.LRS, "reference_lr": runzoo.REFERENCE_LR,
                    "warmups": runzoo.WARMUPS, "scores": runzoo.SCORES, "seeds": args.seeds,
                    "every_n_steps": args.every, "members": len(runs)},
            "labels": {r["name"]: r["outcome"] for r in runs},
            "final_losses": {r["name"]: sum(r["losses"][-30:]) / 30 for r in runs},
            "elapsed_s": {r["name"]: r["elapsed_s"] for r in runs},
            "shipped": vars(shipped), "shipped_before": vars(SHIPPED_BEFORE),
            "previous": vars(PREVIOUS), "results": results,
            "train_s": train_s, "wall_s": time.perf_counter() - start,
            "versions": versions(), "git_rev": git_revision(), "machine": machine(),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(jsonable(record), indent=1))


if __name__ == "__main__":
    main()
