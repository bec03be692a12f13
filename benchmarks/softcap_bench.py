"""Soft-capped attention against PyTorch's SDPA: forward + backward time ratios with 95%
intervals, and peak memory at N = 8192.

    python benchmarks/softcap_bench.py [--threads 2] [--budget 60] [--min-repeats 20]
        [--paths native chunked floor] [--memory-n 8192] [--out FILE.json]

Time. For each shape (B, H, N, D = 64, causal or not; float32) every path runs forward +
backward of ``attnscale.attention(score="softcap", cap=50)`` (Gemma 2's cap) against
``F.scaled_dot_product_attention`` on the same inputs, in interleaved repeats (A B, B A, ...:
:func:`attnscale.measure.overhead.measure_ratio`). Per repeat r_i = t_path / t_SDPA; the
estimate is their geometric mean with a Student-t interval on ln r_i:

    ratio = exp(m),  m = mean(ln r_i),  95% interval exp(m ± t_{0.975, n−1} · s / √n).

Paths: ``native`` (the C++ kernel, attnscale.core.native), ``chunked`` (the query-chunked
fallback, forced) and ``floor`` (SDPA against itself: the noise floor, whose interval should hold
1.00). The load average before and after is recorded: the 2-core machine is shared, and load
widens the intervals (both sides of a ratio share it).

Memory. Each path runs forward + backward once at B = 1, H = 8, N = ``--memory-n``, D = 64 in a
fresh subprocess, after a small warm-up call has loaded everything and the inputs exist; the
figure is the peak resident set during the call minus the resident set before it (Linux:
writing 5 to /proc/self/clear_refs resets the peak, VmHWM in /proc/self/status, to the current
size). It counts every allocation, the kernels' own scratch included: the output, the three
gradients and the saved logsumexp are O(N·D) (8 MiB each at N = 8192); one (N, N) float32
score matrix would be 256 MiB per head (2 GiB for H = 8).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from attnscale import attention
from attnscale.core import native
from attnscale.core.scores import get_score
from attnscale.measure.overhead import measure_ratio
from attnscale.util.provenance import git_revision, versions

CAP = float(get_score("softcap").defaults["cap"])  # Gemma 2's attention cap
SHAPES = [  # the targets: ≤ 1.20× SDPA at each
    {"batch": 4, "heads": 8, "n": 1024, "head_dim": 64, "causal": False},
    {"batch": 4, "heads": 8, "n": 1024, "head_dim": 64, "causal": True},
    {"batch": 1, "heads": 8, "n": 4096, "head_dim": 64, "causal": False},
]
PATHS = ("native", "chunked", "floor")

MEMORY_SCRIPT = """
import json, re, sys, torch
import torch.nn.functional as F
from attnscale import attention
from attnscale.core import native
path, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
def status(field):
    return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))
def run(n):
    q, k, v = (torch.randn(1, 8, n, 64, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 8, n, 64)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # peak RSS (VmHWM) := current RSS
    before = status("VmRSS")
    if path == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v)
    elif path == "chunked":
        with native.forced_fallback():
            out = attention(q, k, v, score="softcap", cap=50.0)
    else:
        out = attention(q, k, v, score="softcap", cap=50.0)
    out.backward(grad)
    ran = native.last_path() if path != "sdpa" else "sdpa"
    return (status("VmHWM") - before) / 1024, ran
run(256)  # warm-up: libraries, kernel, thread pool
grown, ran = run(n)
print(json.dumps({"peak_growth_mib": grown, "ran": ran}))
"""


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per ratio at most")
    parser.add_argument("--min-repeats", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.02,
                        help="plan the repeats for this relative half-width (from a pilot)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--memory-n", type=int, default=8192, help="0 skips the memory part")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return parser.parse_args()


def fwdbwd(path: str, inputs: tuple[torch.Tensor, ...], causal: bool) -> Callable[[], None]:
    """Forward + backward of one path on its own copies of (q, k, v)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1))

    def call() -> None:
        for t in leaves:
            t.grad = None
        if path in ("sdpa", "floor"):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        elif path == "chunked":
            with native.forced_fallback():
                out = attention(*leaves, is_causal=causal, score="softcap", cap=CAP)
        else:
            out = attention(*leaves, is_causal=causal, score="softcap", cap=CAP)
        out.backward(grad)
        if path in ("native", "chunked") and native.last_path() != path:
            raise RuntimeError(f"asked for the {path} path, {native.last_path()} ran")

    return call


def time_shape(shape: dict, paths: list[str], args: argparse.Namespace) -> dict:
    """Every path's ratio to SDPA at one shape."""
    g = torch.Generator().manual_seed(0)
    size = (shape["batch"], shape["heads"], shape["n"], shape["head_dim"])
    inputs = tuple(torch.randn(size, generator=g) for _ in range(3))
    base = fwdbwd("sdpa", inputs, shape["causal"])
    row: dict = dict(shape)
    for path in paths:
        print(f"  {path} / sdpa at {shape}", file=sys.stderr, flush=True)
        est = measure_ratio(fwdbwd(path, inputs, shape["causal"]), base, target=args.target,
                            min_repeats=args.min_repeats, budget_s=args.budget)
        row[path] = est.to_dict()
        print(f"    {est.ratio:.3f} [{est.lo:.3f}, {est.hi:.3f}] n={est.n}", file=sys.stderr)
    return row


def peak_memory(n: int, threads: int) -> dict:
    """Peak resident-set growth (MiB) of one forward + backward per path, each in a fresh
    process (see the module docstring)."""
    out = {"batch": 1, "heads": 8, "n": n, "head_dim": 64, "causal": False,
           "inputs_mib": 3 * 8 * n * 64 * 4 / 2**20}
    for path in ("native", "chunked", "sdpa"):
        print(f"  memory: {path} at N={n}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, path, str(n), str(threads)],
                              capture_output=True, text=True, timeout=1800, check=True)
        out[path] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    """Measure, print the JSON record and write it to ``--out``."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    status = native.kernel_status()  # builds or loads the kernel before any timing
    started, load_before = time.perf_counter(), os.getloadavg()
    rows = [time_shape(shape, args.paths, args) for shape in SHAPES]
    load_after_time = os.getloadavg()
    memory = peak_memory(args.memory_n, args.threads) if args.memory_n else None
    record = {
        "command": "python benchmarks/softcap_bench.py " + " ".join(sys.argv[1:]),
        "what": "forward+backward time / F.scaled_dot_product_attention, float32, softcap "
                f"cap={CAP}; ratio = geometric mean of interleaved repeats, 95% Student-t "
                "interval (lo, hi)",
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch capability "
                   f"{torch.backends.cpu.get_cpu_capability()}",
        "git": git_revision(),
        "versions": versions(),
        "threads": torch.get_num_threads(),
        "kernel": status,
        "load_before": load_before,
        "load_after": load_after_time,
        "rows": rows,
        "memory": memory,
        "seconds": time.perf_counter() - started,
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
