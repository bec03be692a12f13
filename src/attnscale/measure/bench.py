"""Kernel benchmark: every score against PyTorch SDPA and the naive materialized formula.

All three are timed in the same process and the same run, interleaved, so the reported *ratios*
are meaningful on a shared machine even when absolute times are not. Each time is the minimum
over ``repeats`` calls (the least disturbed one).

FLOP convention (model FLOPs, recomputation not counted): the forward pass is two matmuls,
4·B·H·Nq·Nk·D FLOPs (half of that under ``is_causal``); the backward pass is four matmuls, twice
the forward, so forward+backward is 3× the forward. ``peak_fraction`` divides the achieved rate by
this machine's float32 matmul rate, measured in the same run on a large square matmul.

Peak memory is the growth of the process's resident set (Linux VmHWM, reset before each
measurement) during one forward+backward, taken after the timings with glibc told to serve every
allocation of 64 KiB or more by mmap and to return freed memory at once; otherwise freed heap
pages are reused without growing the resident set and the growth reads 0.
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

import torch
import torch.nn.functional as F

from attnscale.core.attention import attention, materialized_attention
from attnscale.core.scores import SCORES, get_score, resolve_params


def bench_params(score: str) -> dict[str, float]:
    """The parameters a score is timed at, over its defaults: ``Score.bench_params``, the values
    practice uses (e.g. cosine τ = 10), so the numbers mean something."""
    return dict(get_score(score).bench_params)


@dataclass
class BenchRow:
    score: str
    n: int
    causal: bool
    fwd_ms: float
    fwdbwd_ms: float
    sdpa_fwd_ms: float
    sdpa_fwdbwd_ms: float
    naive_fwdbwd_ms: float | None
    ratio_fwd: float
    ratio_fwdbwd: float
    ratio_naive: float | None  # naive / ours: how much faster than the materialized formula
    gflops: float
    peak_fraction: float
    peak_mem_mb: float | None
    naive_peak_mem_mb: float | None

    def to_dict(self) -> dict:
        return asdict(self)


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
    n_values: Iterable[int] = (256, 1024, 2048),
    causal_values: Iterable[bool] = (False, True),
    scores: Iterable[str] | None = None,
    batch: int = 8,
    heads: int = 8,
    head_dim: int = 64,
    repeats: int = 3,
    naive: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[BenchRow], dict]:
    """Benchmark ``scores`` (all registered by default) in float32 on CPU.

    Returns the rows and a dict of run facts (matmul peak, settings).
    """
    scores = sorted(SCORES) if scores is None else list(scores)
    for s in scores:
        get_score(s)
    peak = matmul_peak_gflops()
    rows, memory_calls = [], []
    for n in n_values:
        for causal in causal_values:
            inputs = _inputs(batch, heads, n, head_dim)
            for score in scores:
                if progress:
                    progress(f"{score} n={n} causal={causal}")
                row, calls = _bench_one(score, inputs, causal, repeats, naive, peak)
                rows.append(row)
                memory_calls.append(calls)
    # Memory last: the allocator settings of _exact_rss would slow every later timing.
    with _exact_rss() as trim:
        for row, (ours, slow) in zip(rows, memory_calls, strict=True):
            row.peak_mem_mb = _peak_rss_growth_mb(ours, trim)
            row.naive_peak_mem_mb = None if slow is None else _peak_rss_growth_mb(slow, trim)
    facts = {
        "matmul_peak_gflops": peak,
        "batch": batch,
        "heads": heads,
        "head_dim": head_dim,
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "repeats": repeats,
    }
    return rows, facts


def _inputs(b: int, h: int, n: int, d: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(b, h, n, d, generator=g).requires_grad_() for _ in range(3))


def _bench_one(score, inputs, causal, repeats, naive, peak) -> tuple[BenchRow, tuple]:
    """One row of timings, and the (ours, naive) forward+backward calls for the memory pass."""
    q, k, v = inputs
    b, h, n, d = q.shape
    params = bench_params(score)
    ours = _calls(lambda: _attention(q, k, v, causal, score, params), inputs)
    sdpa = _calls(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), inputs)
    times = _interleaved({"ours": ours, "sdpa": sdpa}, repeats)
    naive_ms = slow = None
    if naive:
        sc = get_score(score)
        rp = resolve_params(sc, params, None)
        slow = _calls(
            lambda: materialized_attention(sc, rp, q, k, v, None, 0.0, causal, None, False), inputs
        )
        naive_ms = _best_time(slow["fwdbwd"], max(1, repeats - 1)) * 1e3
    fwdbwd_ms = times["ours"]["fwdbwd"]
    gflops = attention_flops(b, h, n, d, causal, backward=True) / (fwdbwd_ms / 1e3) / 1e9
    row = BenchRow(
        score=score,
        n=n,
        causal=causal,
        fwd_ms=times["ours"]["fwd"],
        fwdbwd_ms=fwdbwd_ms,
        sdpa_fwd_ms=times["sdpa"]["fwd"],
        sdpa_fwdbwd_ms=times["sdpa"]["fwdbwd"],
        naive_fwdbwd_ms=naive_ms,
        ratio_fwd=times["ours"]["fwd"] / times["sdpa"]["fwd"],
        ratio_fwdbwd=fwdbwd_ms / times["sdpa"]["fwdbwd"],
        ratio_naive=None if naive_ms is None else naive_ms / fwdbwd_ms,
        gflops=gflops,
        peak_fraction=gflops / peak,
        peak_mem_mb=None,
        naive_peak_mem_mb=None,
    )
    return row, (ours["fwdbwd"], None if slow is None else slow["fwdbwd"])


def _attention(q, k, v, causal, score, params):
    return attention(q, k, v, is_causal=causal, score=score, **params)


def _calls(fn: Callable[[], torch.Tensor], inputs) -> dict[str, Callable[[], None]]:
    """Forward-only (no graph) and forward+backward closures around ``fn``."""

    def fwd() -> None:
        with torch.no_grad():
            fn()

    def fwdbwd() -> None:
        for t in inputs:
            t.grad = None
        out = fn()
        out.backward(torch.ones_like(out))

    return {"fwd": fwd, "fwdbwd": fwdbwd}


def _interleaved(groups: dict[str, dict[str, Callable]], repeats: int) -> dict:
    """Best time in ms of each call, alternating between the groups every repeat."""
    best = {g: {c: float("inf") for c in calls} for g, calls in groups.items()}
    for g in groups.values():  # warm-up
        for call in g.values():
            call()
    for _ in range(repeats):
        for name, calls in groups.items():
            for c, call in calls.items():
                best[name][c] = min(best[name][c], _best_time(call, 1) * 1e3)
    return best


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
