"""Cost of attnscale.measure.monitor on all-MiniLM-L6-v2 with 128-token inputs, sampling every call.

    python benchmarks/monitor_overhead.py [--batch 8] [--repeats 10] [--compile [--no-native]]
                                          [--counterfactuals]

Forward passes with and without the monitor are interleaved in one process. Three figures of
the overhead (the target is ≤ 1.10): ``ratio``, best monitored time over best plain time;
``paired_median``, the median over pairs of (monitored / the plain pass just before it); and
``attention_share``, the extra time spent inside the model's attention function (median,
monitored minus plain) as a share of the plain forward pass. The monitor only adds work there,
so this last figure isolates its cost from the run-to-run drift of the whole pass (a few
percent on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from attnscale.measure import native
from attnscale.measure.inspection import load_model, resolve_model_dir
from attnscale.measure.monitor import Monitor


def parse_args() -> argparse.Namespace:
    """The command line: batch size, repeats and the monitor's mode."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--counterfactuals", action="store_true")
    parser.add_argument("--compile", action="store_true", help="Monitor(compile=True)")
    parser.add_argument("--no-native", action="store_true",
                        help="with --compile: the torch.compile path, as where the native "
                             "kernel cannot be built")
    return parser.parse_args()


def main() -> None:
    """Time plain and monitored passes, interleaved; print the result as JSON."""
    args = parse_args()
    if args.no_native:
        native.fused_kernel = lambda: None
    model, _ = load_model(resolve_model_dir("minilm"))
    g = torch.Generator().manual_seed(0)
    inputs = {
        "input_ids": torch.randint(1000, 20000, (args.batch, 128), generator=g),
        "attention_mask": torch.ones(args.batch, 128, dtype=torch.long),
    }
    plain, monitored = [], []
    inside = {"plain": [], "monitored": []}
    spent = _time_attention(model)
    load_before = os.getloadavg()
    mon = Monitor(model, counterfactuals=args.counterfactuals, compile=args.compile)
    with torch.no_grad():
        model(**inputs)
        with mon:  # warm-up, and the one-off compilation with --compile
            model(**inputs)
        mon.reset()
        for _ in range(args.repeats):
            spent[0] = 0.0
            t0 = time.perf_counter()
            model(**inputs)
            plain.append(time.perf_counter() - t0)
            inside["plain"].append(spent[0])
            with mon:
                spent[0] = 0.0
                t0 = time.perf_counter()
                model(**inputs)
                monitored.append(time.perf_counter() - t0)
                inside["monitored"].append(spent[0])
    median = statistics.median
    result = {
        "batch": args.batch,
        "tokens": 128,
        "plain_ms": 1e3 * min(plain),
        "monitored_ms": 1e3 * min(monitored),
        "ratio": min(monitored) / min(plain),
        "paired_median": median(m / p for m, p in zip(monitored, plain, strict=True)),
        "attention_ms_plain": 1e3 * median(inside["plain"]),
        "attention_ms_monitored": 1e3 * median(inside["monitored"]),
        "attention_share": (median(inside["monitored"]) - median(inside["plain"])) / median(plain),
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


def _time_attention(model) -> list[float]:
    """Accumulate the time spent in transformers' sdpa attention function into the returned
    one-element list. The monitor's registered function calls this same entry, so both passes
    are timed at the same place."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    spent = [0.0]
    inner = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    ALL_ATTENTION_FUNCTIONS["sdpa"] = timed
    return spent


if __name__ == "__main__":
    main()
