"""Cost of attnscale.monitor on all-MiniLM-L6-v2 with 128-token inputs, sampling every call.

    python benchmarks/monitor_overhead.py [--batch 8] [--repeats 10] [--compile] [--counterfactuals]

Forward passes with and without the monitor are interleaved in one process. Two figures of
the overhead (the target is ≤ 1.10): ``ratio``, best monitored time over best plain time, and
``paired_median``, the median over pairs of (monitored / the plain pass just before it), which is
steadier on a shared machine where the speed drifts between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from attnscale import native
from attnscale.inspection import _load, resolve_model_dir
from attnscale.monitor import Monitor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--counterfactuals", action="store_true")
    parser.add_argument("--compile", action="store_true", help="Monitor(compile=True)")
    args = parser.parse_args()
    model, _ = _load(resolve_model_dir("minilm"))
    g = torch.Generator().manual_seed(0)
    inputs = {
        "input_ids": torch.randint(1000, 20000, (args.batch, 128), generator=g),
        "attention_mask": torch.ones(args.batch, 128, dtype=torch.long),
    }
    plain, monitored = [], []
    load_before = os.getloadavg()
    mon = Monitor(model, counterfactuals=args.counterfactuals, compile=args.compile)
    with torch.no_grad():
        model(**inputs)
        with mon:  # warm-up, and the one-off compilation with --compile
            model(**inputs)
        mon.reset()
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            model(**inputs)
            plain.append(time.perf_counter() - t0)
            with mon:
                t0 = time.perf_counter()
                model(**inputs)
                monitored.append(time.perf_counter() - t0)
    result = {
        "batch": args.batch,
        "tokens": 128,
        "plain_ms": 1e3 * min(plain),
        "monitored_ms": 1e3 * min(monitored),
        "ratio": min(monitored) / min(plain),
        "paired_median": statistics.median(m / p for m, p in zip(monitored, plain, strict=True)),
        "counterfactuals": args.counterfactuals,
        "compile": args.compile,
        # how SDPA calls were answered (Monitor.sdpa): SDPA itself, or one fused pass
        "sdpa_path": ("sdpa" if not args.compile
                      else "native" if native.fused_kernel() is not None else "inductor"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_before": load_before,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
