"""Record one run of the kernel benchmark as JSON: every score's time against SDPA as ratios with
95% intervals from interleaved repeats, a noise-floor row (SDPA against itself) per block, the
config, versions, git revision and machine (the record of ``attnscale.measure.bench``).

python benchmarks/attention_bench.py --out results/bench.json [--quick] [--repeats R] [--naive]
                                    [--threads T]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from attnscale.measure import bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true",
                        help=f"the quick preset {bench.QUICK}")
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved repeats per cell (default: the preset's)")
    parser.add_argument("--naive", action=argparse.BooleanOptionalAction, default=None,
                        help="time the naive formula too (default: the preset's)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's)")
    args = parser.parse_args()
    preset = bench.QUICK if args.quick else bench.STANDARD
    started = time.time()
    rows, facts = bench.run(
        n_values=preset["n_values"],
        batch=preset["batch"],
        repeats=args.repeats or preset["repeats"],
        naive_repeats=preset["naive_repeats"],
        naive=preset["naive"] if args.naive is None else args.naive,
        threads=args.threads,
        progress=lambda msg: print(msg, flush=True),
    )
    record = {**bench.to_record(rows, facts), "preset": "quick" if args.quick else "standard",
              "started": started, "elapsed_s": time.time() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
