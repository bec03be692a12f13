"""The attention alarm's shipped defaults on runs it was not tuned on: Hugging Face GPT-2s
trained through ``transformers.Trainer`` with ``AttentionHealthCallback`` attached.

    python benchmarks/alarm_zoo_hf.py [--out benchmarks/recorded/alarm_zoo_hf_2core.json]
        [--every 5] [--workers 2] [--seeds 10 11 12 13 14]

The zoo of :mod:`attnscale.lab.runzoo_hf` (GPT-2 at the lab zoo's size on pydoc_data.topics
characters; scaled and unscaled attention × LR 3e-3 … 1e-1 × warmup 0 / 100 × ``--seeds``),
each run labelled from its loss alone against its group's LR-3e-3 run, and scored with the
thresholds ``HealthThresholds()`` ships (tuned on the lab zoo's seeds 0-9 by
``benchmarks/alarm_zoo.py``) and with the previous rules (1e4, entropy / ln n < 0.1). The
callback's own alarm step is checked against a replay of its recorded samples: a mismatch is a
bug and fails the benchmark.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from alarm_zoo import EARLIER, PREVIOUS, print_runs, summary

from attnscale.integrations.alarm import HealthThresholds
from attnscale.integrations.alarm_score import replay, score_runs
from attnscale.lab import runzoo, runzoo_hf
from attnscale.util.jsonio import jsonable
from attnscale.util.provenance import git_revision, machine, versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--every", type=int, default=5, help="sampled steps (every_n_steps)")
    parser.add_argument("--workers", type=int, default=2, help="training processes")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(runzoo.REPORT_SEEDS))
    args = parser.parse_args()
    start = time.perf_counter()
    runs = runzoo_hf.train_hf_zoo(runzoo.members(tuple(args.seeds)), every=args.every,
                                  workers=args.workers)
    train_s = time.perf_counter() - start
    runs = runzoo_hf.label_hf_zoo(runs, runzoo.REFERENCE_LR)
    shipped = HealthThresholds()
    for run in runs:  # the callback judged live what the replay judges from its record
        replayed = replay(run["samples"], shipped, args.every).first_step
        if replayed != run["callback"]["alarm_step"]:
            raise RuntimeError(f"{run['name']}: callback alarm at {run['callback']['alarm_step']}"
                               f", replay of its samples at {replayed}")
    results = {"shipped defaults | HF Trainer zoo": score_runs(runs, shipped, args.every),
               "previous rules | HF Trainer zoo": score_runs(runs, PREVIOUS, args.every)}
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
            "shipped": vars(shipped), "previous": vars(PREVIOUS), "results": results,
            "train_s": train_s, "wall_s": time.perf_counter() - start,
            "versions": versions(), "git_rev": git_revision(), "machine": machine(),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(jsonable(record), indent=1))


if __name__ == "__main__":
    main()
