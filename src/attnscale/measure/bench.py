"""Kernel benchmark: every score's time against PyTorch SDPA, as ratios with 95% intervals.

Every cell is a ratio time(A) / time(SDPA) measured in the same process by
:func:`attnscale.measure.overhead.measure_ratio`: interleaved repeats in A B, B A order (the
order alternates every repeat, so a linear drift of the machine's speed cancels within each pair
of repeats), one block of calls of each function per repeat, and with per-repeat ratios r_i the
geometric mean and its Student-t interval

    ratio = exp(m),  m = mean(ln r_i),  95% interval exp(m ± t_{0.975, n−1} · s / √n).

A row has three cells: the score's forward pass (no autograd graph) against SDPA's, its
forward+backward against SDPA's, and the naive materialized formula's forward+backward against
SDPA's (the score's plain formula with the full (N, N) matrix; ``naive=False`` skips it). Every
(N, causal) block starts with a *noise-floor* row: SDPA against SDPA (identical work, separate
tensors and closures) by the same procedure. Its interval should straddle 1.00; its width is how
far apart two identical kernels read on this machine in this run, the resolution of every other
cell in the block. A cell runs exactly ``repeats`` repeats (``naive_repeats`` for the naive
cell; at least 2, since an interval needs two) unless ``budget_s`` runs out first; ``converged``
says whether the interval's relative half-width came within ``target`` anyway.

FLOP convention (model FLOPs, recomputation not counted): the forward pass is two matmuls,
4·B·H·Nq·Nk·D FLOPs (half of that under ``is_causal``); the backward pass is four matmuls, twice
the forward, so forward+backward is 3× the forward. ``gflops`` divides that by the median
forward+backward time; ``peak_fraction`` divides it by this machine's float32 matmul rate,
measured on a large square matmul before and after the timings (the better reading). Both are
absolute rates, so unlike the ratios they drop when other work shares the machine.

Peak memory is the growth of the process's resident set (Linux VmHWM, reset before each
measurement) during one forward+backward, taken after the timings with glibc told to serve every
allocation of 64 KiB or more by mmap and to return freed memory at once; otherwise freed heap
pages are reused without growing the resident set and the growth reads 0.

Record (:func:`to_record`, what ``attnscale bench --json`` prints; JSON-ready)::

    {"rows": [{"score", "noise_floor", "n", "causal",
               "fwd": cell, "fwdbwd": cell, "naive": cell or None,
               "gflops", "peak_fraction", "peak_mem_mb", "naive_peak_mem_mb"}],
     "config": {"batch", "heads", "head_dim", "n_values", "causal_values", "scores", "dtype",
                "threads", "repeats", "naive_repeats", "target", "budget_s", "block_s",
                "level", "order"},
     "matmul_peak_gflops", "versions", "git_rev", "machine", "seconds"}

with cell = {"ratio", "lo", "hi", "repeats", "ms", "sdpa_ms", "half_width", "se_log",
"converged", "target", "calls_per_block", "seconds"} (``ms`` and ``sdpa_ms``: median per-call
times). The noise-floor row has score "sdpa", noise_floor true and no naive cell.
"""

from __future__ import annotations

import ctypes
import gc
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnscale.core.attention import attention, materialized_attention
from attnscale.core.scores import SCORES, get_score, resolve_params
from attnscale.measure.overhead import RatioEstimate, measure_ratio
from attnscale.util.provenance import git_revision, machine, versions
from attnscale.util.validate import check_float, check_int

# Quick: the target shape (B = 4, H = 8, D = 64, N = 1024), few repeats, no naive formula
# (it took over a third of the time); standard: three lengths at B = 8, every cell. Both give
# intervals; quick's are wider.
QUICK: dict[str, Any] = {"n_values": (1024,), "batch": 4, "repeats": 5, "naive": False,
                         "naive_repeats": 3}
STANDARD: dict[str, Any] = {"n_values": (256, 1024, 2048), "batch": 8, "repeats": 8,
                            "naive": True, "naive_repeats": 3}
FLOOR = "sdpa"  # the score name of the noise-floor row

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def bench_params(score: str) -> dict[str, float]:
    """The parameters a score is timed at, over its defaults: ``Score.bench_params``, the values
    practice uses (e.g. cosine τ = 10), so the numbers mean something."""
    return dict(get_score(score).bench_params)


@dataclass
class BenchRow:
    """One score at one (N, causal): three ratio cells against SDPA (see the module docstring)."""

    score: str
    noise_floor: bool
    n: int
    causal: bool
    fwd: dict[str, Any]
    fwdbwd: dict[str, Any]
    naive: dict[str, Any] | None
    gflops: float
    peak_fraction: float | None = None  # set once the run's matmul peak is known
    peak_mem_mb: float | None = None
    naive_peak_mem_mb: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cell(est: RatioEstimate) -> dict[str, Any]:
    """A ratio estimate as a benchmark cell (the keys the module docstring lists)."""
    return {"ratio": est.ratio, "lo": est.lo, "hi": est.hi, "repeats": est.n, "ms": est.ms,
            "sdpa_ms": est.baseline_ms, "half_width": est.half_width, "se_log": est.se_log,
            "converged": est.converged, "target": est.target, "calls_per_block": est.number,
            "seconds": est.seconds}


def matmul_peak_gflops(size: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 matmul rate in GFLOP/s, best of ``repeats`` (2·size³ FLOPs each)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = _best_time(lambda: a @ b, repeats)
    return 2 * size**3 / best / 1e9


def attention_flops(b: int, h: int, n: int, d: int, causal: bool, backward: bool) -> float:
    """Model FLOPs of attention over n queries and n keys (see the module docstring)."""
    fwd = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return fwd * (3.0 if backward else 1.0)


def run(
    n_values: Iterable[int] = STANDARD["n_values"],
    causal_values: Iterable[bool] = (False, True),
    scores: Iterable[str] | None = None,
    batch: int = STANDARD["batch"],
    heads: int = 8,
    head_dim: int = 64,
    repeats: int = STANDARD["repeats"],
    naive: bool = True,
    naive_repeats: int = STANDARD["naive_repeats"],
    *,
    target: float = 0.02,
    budget_s: float = 120.0,
    block_s: float = 0.015,
    level: float = 0.95,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[BenchRow], dict[str, Any]]:
    """Benchmark ``scores`` (all registered by default) against SDPA in float32 on CPU.

    Returns the rows (a noise-floor row first in every (N, causal) block) and the run facts:
    everything :func:`to_record` puts beside the rows. ``repeats`` and ``naive_repeats`` are
    raised to 2; ``budget_s`` caps one cell; ``threads`` sets torch's thread count for the run
    (default: leave it). QUICK and STANDARD hold the presets ``attnscale bench`` uses.
    """
    start = time.perf_counter()
    ns = [check_int("n_values", n) for n in n_values]
    causals = [bool(c) for c in causal_values]
    scores = sorted(SCORES) if scores is None else list(scores)
    for s in scores:
        get_score(s)
    dims = {"batch": check_int("batch", batch), "heads": check_int("heads", heads),
            "head_dim": check_int("head_dim", head_dim)}
    common = {"target": check_float("target", target, low=0.0),
              "budget_s": check_float("budget_s", budget_s, low=0.0),
              "block_s": check_float("block_s", block_s, low=0.0, low_inclusive=True),
              "level": check_float("level", level, low=0.0, high=1.0)}
    timing, naive_timing = (_fixed_repeats(name, r, common) for name, r in
                            (("repeats", repeats), ("naive_repeats", naive_repeats)))
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads))
    try:
        first = matmul_peak_gflops()
        rows = _time_rows(ns, causals, scores, dims, timing, naive_timing if naive else None,
                          progress)
        # the better of two readings: one taken while other work loads the machine reads low
        peak = max(first, matmul_peak_gflops())
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    for row in rows:
        row.peak_fraction = row.gflops / peak
    config = {**dims, "n_values": ns, "causal_values": causals, "scores": scores,
              "dtype": "float32", "threads": used, "repeats": timing["min_repeats"],
              "naive_repeats": naive_timing["min_repeats"] if naive else None, **common,
              "order": "interleaved, A B then B A"}
    return rows, {"config": config, "matmul_peak_gflops": peak, "versions": versions(),
                  "git_rev": git_revision(), "machine": machine(),
                  "seconds": time.perf_counter() - start}


def to_record(rows: Iterable[BenchRow], facts: dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready record of a run: {"rows": [...], **facts} (see the module docstring)."""
    return {"rows": [r.to_dict() for r in rows], **facts}


def _fixed_repeats(name: str, repeats: int, common: dict[str, float]) -> dict[str, Any]:
    """measure_ratio's options for exactly ``repeats`` repeats (raised to 2: an interval needs
    two); ``target`` then only says whether the interval came within it."""
    count = max(2, check_int(name, repeats))
    return {**common, "min_repeats": count, "max_repeats": count}


def _time_rows(ns: list[int], causals: list[bool], scores: list[str], dims: dict, timing: dict,
               naive_timing: dict | None,
               progress: Callable[[str], None] | None) -> list[BenchRow]:
    """Every row, block by block (one (q, k, v) per (N, causal)), then their peak memory."""
    rows, kernels = [], []
    for n in ns:
        for causal in causals:
            inputs = _inputs(dims["batch"], dims["heads"], n, dims["head_dim"])
            for score in [None, *scores]:  # None: the noise floor
                if progress:
                    progress(f"{score or 'noise floor'} n={n} causal={causal}")
                row, used = _bench_one(score, inputs, causal, timing, naive_timing)
                rows.append(row)
                kernels.append(used)
    _measure_memory(rows, kernels)
    return rows


def _inputs(b: int, h: int, n: int, d: int) -> QKV:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    return q, k, v


def _sdpa(causal: bool) -> Kernel:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _ours(score: str, causal: bool) -> Kernel:
    params = bench_params(score)
    return lambda q, k, v: attention(q, k, v, is_causal=causal, score=score, **params)


def _naive(score: str, causal: bool) -> Kernel:
    sc = get_score(score)
    rp = resolve_params(sc, bench_params(score), None)
    return lambda q, k, v: materialized_attention(sc, rp, q, k, v, None, 0.0, causal, None,
                                                  False)


def _bench_one(score: str | None, inputs: QKV, causal: bool, timing: dict,
               naive_timing: dict | None) -> tuple[BenchRow, tuple]:
    """One row: ``score`` (None: SDPA itself, the noise floor) against SDPA, three cells; and
    the (kernel, naive kernel or None, inputs) that the memory pass reruns."""
    kernel = _sdpa(causal) if score is None else _ours(score, causal)
    ours, sdpa = _calls(kernel, inputs), _calls(_sdpa(causal), inputs)
    fwd = cell(measure_ratio(ours["fwd"], sdpa["fwd"], **timing))
    fwdbwd = cell(measure_ratio(ours["fwdbwd"], sdpa["fwdbwd"], **timing))
    slow = naive = None
    if naive_timing is not None and score is not None:
        slow = _naive(score, causal)
        naive = cell(measure_ratio(_calls(slow, inputs)["fwdbwd"], sdpa["fwdbwd"],
                                   **naive_timing))
    b, h, n, d = inputs[0].shape
    gflops = attention_flops(b, h, n, d, causal, backward=True) / (fwdbwd["ms"] / 1e3) / 1e9
    row = BenchRow(score=score or FLOOR, noise_floor=score is None, n=n, causal=causal, fwd=fwd,
                   fwdbwd=fwdbwd, naive=naive, gflops=gflops)
    return row, (kernel, slow, inputs)


def _calls(kernel: Kernel, inputs: QKV) -> dict[str, Callable[[], None]]:
    """Forward-only (no graph) and forward+backward closures of ``kernel`` on its own copies of
    (q, k, v), so that two closures never share tensors or gradients."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def fwd() -> None:
        with torch.no_grad():
            kernel(*leaves)

    def fwdbwd() -> None:
        for t in leaves:
            t.grad = None
        out = kernel(*leaves)
        out.backward(torch.ones_like(out))

    return {"fwd": fwd, "fwdbwd": fwdbwd}


def _measure_memory(rows: list[BenchRow], kernels: list[tuple]) -> None:
    """Peak memory of each row's forward+backward (and the naive formula's), after every
    timing: the allocator settings of _exact_rss would slow every later timing."""
    with _exact_rss() as trim:
        for row, (kernel, slow, inputs) in zip(rows, kernels, strict=True):
            row.peak_mem_mb = _peak_rss_growth_mb(_calls(kernel, inputs)["fwdbwd"], trim)
            if slow is not None:
                row.naive_peak_mem_mb = _peak_rss_growth_mb(_calls(slow, inputs)["fwdbwd"], trim)


def _best_time(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


_STATUS = Path("/proc/self/status")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)


@contextmanager
def _exact_rss() -> Iterator[Callable[[], None] | None]:
    """While active, glibc mmaps every allocation ≥ 64 KiB and trims freed memory at once, so
    the resident set follows the live allocations. Yields a function that releases the freed
    heap pages still resident (None when this is not glibc: the growth stays coarse).
    Afterwards the thresholds are fixed at glibc's maximum dynamic values (setting them once
    ends glibc's dynamic adjustment)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        yield None
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 1 << 16)
    libc.mallopt(_M_TRIM_THRESHOLD, 0)
    try:
        yield lambda: libc.malloc_trim(0)
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)


def _peak_rss_growth_mb(
    fn: Callable[[], None], trim: Callable[[], None] | None = None
) -> float | None:
    """Growth of resident memory during one call (MB), from Linux's resettable VmHWM."""
    if not _STATUS.exists():
        return None
    gc.collect()
    if trim is not None:
        trim()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    base = _status_kb("VmRSS")
    fn()
    return max(0.0, (_status_kb("VmHWM") - base) / 1024)


def _status_kb(field: str) -> int:
    match = re.search(rf"{field}:\s+(\d+)", _STATUS.read_text())
    return int(match.group(1)) if match else 0
