"""Sweep throughput: local workers=1 vs workers=2, and the Ray executor's per-run overhead.

Usage::

    .venv/bin/python benchmarks/sweep_throughput.py            # both measurements
    .venv/bin/python benchmarks/sweep_throughput.py --runs 12 --steps 200 --no-ray

Throughput: the same grid (``--runs`` seeds of one small MQAR config, ``--steps`` steps each)
runs into a fresh SQLite store with 1 and then 2 local workers. Reported per setting: the
steady-state rate (runs / seconds from the pool being ready to the last result, so the
one-off pool start-up is excluded and reported separately) and the end-to-end rate.

Ray overhead: a grid of very short runs goes through the local and the Ray executor (2
workers each, after start-up). A run's overhead is the wall time from hand-off to result minus
the trainer's own ``elapsed_s``; the first run of each worker (warm-up) is left out.

The load average before and after is printed: the machine is shared, so the figures are only
meaningful when the load is low.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from attnscale.lab.store import Store
from attnscale.lab.sweep import Point, expand, make_executor, parse_spec, plan, record_outcome

GRID = """
name = "throughput"
[base]
task = "mqar"
seq_len = 32
num_kv_pairs = 4
d_model = 32
n_heads = 2
n_layers = 2
batch_size = 16
warmup_steps = 5
log_every = 25
steps = {steps}
[axes]
seed = {seeds}
"""


def grid(runs: int, steps: int) -> list[Point]:
    """``runs`` seeds of one small config."""
    return expand(parse_spec(GRID.format(steps=steps, seeds=list(range(runs)))))


def timed_sweep(points: list[Point], kind: str, workers: int, db: Path) -> dict:
    """Run ``points`` into a new store; times for start-up, each hand-off and each result."""
    starts: dict[str, float] = {}
    overheads: list[float] = []
    t0 = time.perf_counter()
    with Store(db) as store:
        tasks, counts = plan(store, points, "bench", retry_failed=False)

        def on_start(run_id: str, worker: str | None) -> None:
            starts[run_id] = time.perf_counter()
            store.mark_running(run_id, worker)

        with make_executor(kind, workers) as pool:
            ready = time.perf_counter()
            for outcome in pool.run(tasks, on_start):
                if outcome.result is None:
                    raise RuntimeError(outcome.error)
                wall = time.perf_counter() - starts[outcome.id]
                overheads.append(wall - outcome.result["elapsed_s"])
                record_outcome(store, outcome, counts)
            end = time.perf_counter()
    n = len(tasks)
    return {
        "executor": kind,
        "workers": workers,
        "runs": n,
        "startup_s": ready - t0,
        "steady_s": end - ready,
        "steady_runs_per_s": n / (end - ready),
        "end_to_end_runs_per_s": n / (end - t0),
        "overhead_s": overheads,
    }


def throughput(runs: int, steps: int, tmp: Path) -> dict:
    """workers=1 vs workers=2 on the same grid."""
    points = grid(runs, steps)
    one = timed_sweep(points, "local", 1, tmp / "w1.db")
    two = timed_sweep(points, "local", 2, tmp / "w2.db")
    for r in (one, two):
        r.pop("overhead_s")
    return {
        "workers_1": one,
        "workers_2": two,
        "speedup_steady": two["steady_runs_per_s"] / one["steady_runs_per_s"],
        "speedup_end_to_end": two["end_to_end_runs_per_s"] / one["end_to_end_runs_per_s"],
    }


def ray_overhead(runs: int, tmp: Path) -> dict:
    """Per-run overhead (wall − trainer time) of local and Ray, warm-up runs left out."""
    points = grid(runs, steps=5)
    out = {}
    for kind in ("local", "ray"):
        r = timed_sweep(points, kind, 2, tmp / f"{kind}.db")
        warm = r["overhead_s"][2:]  # the first run on each of the two workers is warm-up
        out[kind] = {
            "startup_s": r["startup_s"],
            "mean_overhead_s": statistics.mean(warm),
            "median_overhead_s": statistics.median(warm),
            "max_overhead_s": max(warm),
            "runs": len(warm),
        }
    for stat in ("mean", "median"):
        key = f"{stat}_overhead_s"
        out[f"ray_minus_local_{stat}_s"] = out["ray"][key] - out["local"][key]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12, help="runs in the throughput grid")
    parser.add_argument("--steps", type=int, default=150, help="steps per throughput run")
    parser.add_argument("--ray-runs", type=int, default=20, help="runs in the overhead grid")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray measurement")
    args = parser.parse_args()
    report: dict = {"cpus": os.cpu_count(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        report["throughput"] = throughput(args.runs, args.steps, Path(tmp))
        if not args.no_ray:
            try:
                import ray  # noqa: F401
            except ImportError:
                report["ray"] = "ray is not installed"
            else:
                report["ray"] = ray_overhead(args.ray_runs, Path(tmp))
    report["load_after"] = os.getloadavg()
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    t = report["throughput"]
    print(
        f"load {report['load_before'][0]:.2f} -> {report['load_after'][0]:.2f}; "
        f"1 worker {t['workers_1']['steady_runs_per_s']:.3f} runs/s, "
        f"2 workers {t['workers_2']['steady_runs_per_s']:.3f} runs/s: "
        f"{t['speedup_steady']:.2f}x steady, {t['speedup_end_to_end']:.2f}x end to end",
        file=sys.stderr,
    )
    if isinstance(report.get("ray"), dict):
        r = report["ray"]
        print(
            f"per-run overhead, mean (median): local {r['local']['mean_overhead_s'] * 1e3:.0f} "
            f"({r['local']['median_overhead_s'] * 1e3:.0f}) ms, "
            f"ray {r['ray']['mean_overhead_s'] * 1e3:.0f} "
            f"({r['ray']['median_overhead_s'] * 1e3:.0f}) ms; "
            f"ray start-up {r['ray']['startup_s']:.1f} s",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
