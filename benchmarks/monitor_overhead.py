"""Cost of attnscale.measure.monitor on all-MiniLM-L6-v2, sampling every call, as ratios with 95%
intervals.

    python benchmarks/monitor_overhead.py [--batch 8] [--tokens 128 512] [--repeats 20]
        [--modes floor default counterfactuals ...] [--threads N] [--out FILE.json [--append]]

For each length, every repeat runs one forward pass of each mode once, in an order rotated from
repeat to repeat (so drift and position cancel), always with a plain pass (no monitor) among
them. Per repeat and mode r_i = t_mode / t_plain of that repeat; the estimate is their geometric
mean with a Student-t interval on ln r_i
(:func:`attnscale.measure.ratio_interval.log_ratio_interval`):

    ratio = exp(m),  m = mean(ln r_i),  95% interval exp(m ± t_{0.975, n−1} · s / √n).

Modes: ``floor``, a second plain pass (the noise floor: its interval should straddle 1.00);
``default``, ``Monitor(model)``; ``counterfactuals``, ``Monitor(model, counterfactuals=True)``;
``python`` and ``python_cf``, the same with ``compile=False`` (SDPA runs, logits recomputed);
``compiled``, ``compile=True`` with the native kernel switched off (``torch.compile``). Each
monitored row records which path computed its statistics (``Monitor.paths``). ``--out`` writes
``{"runs": [run]}``; with ``--append`` the run is added to the file's list. The machine's
load average before and after is recorded: on a shared machine, figures taken under load are
noisier (wider intervals), not biased, since both sides of a ratio share the load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnscale.measure import native
from attnscale.measure.inspection import load_model, resolve_model_dir
from attnscale.measure.monitor import Monitor
from attnscale.measure.ratio_interval import log_ratio_interval
from attnscale.util.provenance import git_revision

MODES: dict[str, dict] = {
    "floor": {},  # a second plain pass
    "default": {},
    "counterfactuals": {"counterfactuals": True},
    "python": {"compile": False},
    "python_cf": {"compile": False, "counterfactuals": True},
    "compiled": {"compile": True},
}


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--modes", nargs="+", choices=list(MODES),
                        default=["floor", "default", "counterfactuals"])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument("--out", type=Path, default=None,
                        help='also write {"runs": [this run]} to this JSON file')
    parser.add_argument("--append", action="store_true",
                        help="with --out: add this run to the runs already in the file")
    return parser.parse_args()


def main() -> None:
    """Time every mode against the plain pass at each length; print (and write) JSON."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_model(resolve_model_dir("minilm"))
    load_before = os.getloadavg()
    started = time.perf_counter()
    rows = []
    for tokens in args.tokens:
        rows += measure_length(model, args.batch, tokens, args.modes, args.repeats)
    record = {
        "command": "python benchmarks/monitor_overhead.py " + " ".join(_argv(args)),
        "model": f"all-MiniLM-L6-v2, {args.batch} x tokens, float32, every call sampled",
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU "
                   f"({torch.backends.cpu.get_cpu_capability()}), no GPU",
        "native_kernel": native.ensure_built(),
        "date": datetime.date.today().isoformat(),
        "git_base": git_revision(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }
    print(json.dumps(record, indent=2))
    if args.out:
        runs = json.loads(args.out.read_text())["runs"] if args.append else []
        args.out.write_text(json.dumps({"runs": [*runs, record]}, indent=2) + "\n")


def measure_length(model, batch: int, tokens: int, modes: list[str],
                   repeats: int) -> list[dict]:
    """One row per mode at ``tokens`` tokens: ratio to the plain pass with its interval."""
    g = torch.Generator().manual_seed(tokens)
    inputs = {
        "input_ids": torch.randint(1000, 20000, (batch, tokens), generator=g),
        "attention_mask": torch.ones(batch, tokens, dtype=torch.long),
    }
    monitors = {m: Monitor(model, **MODES[m]) for m in modes if m != "floor"}
    passes = {"plain": _plain(model, inputs), "floor": _plain(model, inputs)}
    passes |= {m: _monitored(model, inputs, mon) for m, mon in monitors.items()}
    names = ["plain", *modes]
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for name in names:  # warm-up: first-call allocations, the kernel's load or compile
            passes[name]()
        for mon in monitors.values():
            mon.reset()
        for i in range(repeats):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                times[name].append(passes[name]())
    out = []
    for mode in modes:
        est = log_ratio_interval(times[mode], times["plain"])
        out.append({
            "tokens": tokens, "batch": batch, "mode": mode, **MODES[mode],
            "ratio": est["ratio"], "lo": est["lo"], "hi": est["hi"], "n": repeats,
            "ms": 1e3 * statistics.median(times[mode]),
            "plain_ms": 1e3 * statistics.median(times["plain"]),
            "paths": dict(monitors[mode].paths) if mode in monitors else {},
        })
    return out


def _plain(model, inputs) -> Callable[[], float]:
    def run() -> float:
        t0 = time.perf_counter()
        model(**inputs)
        return time.perf_counter() - t0

    return run


def _monitored(model, inputs, mon: Monitor) -> Callable[[], float]:
    def run() -> float:
        with mon:
            t0 = time.perf_counter()
            model(**inputs)
            return time.perf_counter() - t0

    if mon.compile is True:  # the torch.compile path: switch the native kernel off for it
        original = native.fused_kernel

        def compiled() -> float:
            native.fused_kernel = lambda isa=None: None
            try:
                return run()
            finally:
                native.fused_kernel = original

        return compiled
    return run


def _argv(args: argparse.Namespace) -> list[str]:
    out = ["--batch", str(args.batch), "--tokens", *map(str, args.tokens),
           "--repeats", str(args.repeats), "--modes", *args.modes]
    return out + (["--threads", str(args.threads)] if args.threads else [])


if __name__ == "__main__":
    main()
