"""Record one run of the kernel benchmark as JSON (rows, run facts, versions, git revision).

python benchmarks/attention_bench.py --out results/bench.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from attnscale.measure import bench
from attnscale.util.provenance import git_revision, machine, versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="N = 1024 only")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.time()
    rows, facts = bench.run(
        n_values=[1024] if args.quick else [256, 1024, 2048],
        repeats=args.repeats,
        progress=lambda msg: print(msg, flush=True),
    )
    record = {
        "rows": [r.to_dict() for r in rows],
        "facts": facts,
        "versions": versions(),
        "git_rev": git_revision(),
        "machine": machine(),
        "started": started,
        "elapsed_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
