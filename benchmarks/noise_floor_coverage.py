"""How often C5's noise-floor interval holds 1, its known answer, on this machine.

The noise floor times scaled_dot's forward+backward against itself (identical work, separate
closures on separate copies of q, k, v), so its true ratio is 1 and a 95% interval should
exclude 1 in about 5% of measurements. Each trial measures it at every N (in a rotated order)
by two procedures, with C5's standard settings (target half-width 1%, a pilot of 80 repeats,
15 s budget, one thread):

- ``fresh``: :func:`attnscale.measure.overhead.measure_fresh_ratio`, the study's procedure:
  fresh closures every epoch of 10 repeats, batch means over epochs;
- ``one_pair``: :func:`attnscale.measure.overhead.measure_ratio` on one pair of closures for
  the whole measurement, moving-block interval (``block=None``), same plan.

Each procedure's miss count gets an exact (Clopper-Pearson) 95% interval for its rate
(``scipy.stats.binomtest``). Run from the repository root::

    python benchmarks/noise_floor_coverage.py --out benchmarks/recorded/noise_floor_2core.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch
from scipy import stats

from attnscale.measure import overhead as O
from attnscale.util.provenance import git_revision, versions

PROCEDURES = ("fresh", "one_pair")


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-values", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--target", type=float, default=0.01)
    parser.add_argument("--min-repeats", type=int, default=80)
    parser.add_argument("--budget", type=float, default=15.0, help="seconds per measurement")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return parser.parse_args()


def floor(procedure: str, n: int, seed: int, args: argparse.Namespace) -> dict:
    """One noise-floor measurement at ``n`` by ``procedure``: its interval and whether it
    misses 1."""
    b, h = O.batch_heads(n, 1 << 20)
    g = torch.Generator().manual_seed(seed)
    inputs = tuple(torch.randn(b, h, n, 64, generator=g) for _ in range(3))  # (B, H, N, D)
    opts = {"target": args.target, "min_repeats": args.min_repeats, "budget_s": args.budget}
    if procedure == "fresh":
        rng = random.Random(seed)
        est = O.measure_fresh_ratio(O.fresh_calls("scaled_dot", inputs, {}, rng),
                                    O.fresh_calls("scaled_dot", inputs, {}, rng), **opts)
    else:
        est = O.measure_ratio(O.fwdbwd_call("scaled_dot", inputs, {}),
                              O.fwdbwd_call("scaled_dot", inputs, {}), block=None, **opts)
    row = {"procedure": procedure, "length": n, "seed": seed, **est.to_dict()}  # n: repeats
    row["misses"] = not (est.lo <= 1.0 <= est.hi)
    return row


def summary(rows: list[dict]) -> dict:
    """Per procedure: misses of 1 out of measurements, the rate's exact 95% interval, per-N
    misses and the median seconds a measurement took."""
    out = {}
    for proc in PROCEDURES:
        mine = [r for r in rows if r["procedure"] == proc]
        if not mine:
            continue
        k = sum(r["misses"] for r in mine)
        ci = stats.binomtest(k, len(mine)).proportion_ci(0.95)
        by_n = {str(n): sum(r["misses"] for r in mine if r["length"] == n)
                for n in sorted({r["length"] for r in mine})}
        secs = sorted(r["seconds"] for r in mine)
        out[proc] = {"misses": k, "measurements": len(mine), "rate": k / len(mine),
                     "rate_ci": [ci.low, ci.high], "misses_by_n": by_n,
                     "median_seconds": secs[len(secs) // 2]}
    return out


def main() -> None:
    """Measure, print the JSON record and write it to ``--out``."""
    args = parse_args()
    torch.set_num_threads(1)
    started, load_before = time.perf_counter(), os.getloadavg()
    rows = []
    for trial in range(args.trials):
        order = [(p, n) for n in args.n_values for p in PROCEDURES]
        k = trial % len(order)
        for proc, n in order[k:] + order[:k]:  # rotated: no N or procedure always first
            row = floor(proc, n, 1000 * trial + n, args)
            rows.append(row)
            print(f"trial {trial} {proc} N={n}: {row['ratio']:.4f} [{row['lo']:.4f}, "
                  f"{row['hi']:.4f}] {row['epochs'] or row['n']} "
                  f"{'MISS' if row['misses'] else ''}", file=sys.stderr, flush=True)
    record = {
        "command": "python benchmarks/noise_floor_coverage.py " + " ".join(sys.argv[1:]),
        "what": "C5's noise floor (scaled_dot / scaled_dot fwd+bwd, identical work): how often "
                "its 95% interval excludes 1 (nominal 5%)",
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "git": git_revision(), "versions": versions(), "threads": 1,
        "settings": {"target": args.target, "min_repeats": args.min_repeats,
                     "budget_s": args.budget, "epoch": O.EPOCH, "n_values": args.n_values},
        "load_before": load_before, "load_after": os.getloadavg(),
        "summary": summary(rows), "rows": rows, "seconds": time.perf_counter() - started,
    }
    text = json.dumps(record, indent=2)
    print(json.dumps(record["summary"], indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
