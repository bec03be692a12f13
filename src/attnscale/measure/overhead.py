"""Relative cost of one function against a baseline, measured as a ratio in the same run.

:func:`measure_ratio` times ``fn`` and ``baseline`` in interleaved repeats (A B, B A, A B, ...:
the order alternates every repeat, so a linear drift of the machine's speed cancels within each
pair of repeats). Each repeat times one block of ``number`` calls of each function, ``number``
chosen so that a block lasts about ``block_s`` (15 ms by default; one call when a single call is
longer). With per-repeat ratios r_i = t_A,i / t_B,i the estimate is their geometric mean

    ratio = exp(m),  m = mean(ln r_i),  95% interval exp(m ± t_{0.975, n−1} · s / √n)

(Student-t on the log ratios, s their sample standard deviation). Repeats continue until the
interval's relative half-width max(hi/ratio − 1, 1 − lo/ratio) = e^{t·s/√n} − 1 is at most
``target`` with at least ``min_repeats`` repeats, or until ``budget_s`` seconds have passed (then
``converged`` is False). Checking the interval after every repeat is a form of optional stopping;
``min_repeats`` ≥ 30 keeps the resulting under-coverage small.

:func:`overhead_study` applies it to the thread's claim that cosine similarity adds computational
overhead (C5): forward+backward of :func:`attnscale.attention` with ``score="cosine"`` (τ from
the score's bench parameters) against ``score="scaled_dot"``, both on the fused SDPA path,
float32, D = 64, non-causal, at several sequence lengths N. Per-call work is kept comparable
across N with B·H = max(1, round(work / N²)). At each N a *noise floor* row times scaled_dot
against scaled_dot (identical work, separate tensors and closures) by the same procedure.

Cosine normalizes q and k, O(N·d) work, against O(N²·d) for attention itself (Henry et al.
2020, arXiv 2010.04245), so the overhead should fall like 1/N; :func:`fit_inverse_n` fits
overhead(N) = ratio − 1 ≈ a + b/N by weighted least squares (weights 1/σ², σ = ratio · SE of the
mean log ratio).

Threads: on a machine shared with other work, two intra-op threads make the ratio far noisier
than one (a block waits for its slowest thread, so one preempted thread stalls it): on this
project's 2-core machine under load (N = 1024, 12 s per measurement) the per-repeat standard
deviation of ln r was 1.1-1.4 with 2 threads against 0.16-0.22 with 1, and 2 threads managed
4-19× fewer repeats. ``threads=1`` is the reproducible choice there; the thread count is
recorded either way and belongs to the regime.

Evidence dict returned by :func:`overhead_study` (JSON-ready; read by
:func:`attnscale.audit.claims.c05_overhead.judge`)::

    {"rows": [{"n", "batch", "heads",
               "cosine": RatioEstimate.to_dict(),   # cosine / scaled_dot
               "floor": RatioEstimate.to_dict()}],  # scaled_dot / scaled_dot
     "fit": {"a", "b", "a_se", "b_se", "cov_ab", "chi2", "dof", "weighted", "points"} or None
            (fewer than 2 N),
     "settings": {"head_dim", "dtype", "causal", "pass", "tau", "work", "target",
                  "min_repeats", "budget_s", "block_s", "level"},
     "threads": int, "versions": {...}, "seconds": float}

with ``RatioEstimate.to_dict()`` = {"ratio", "lo", "hi", "n", "converged", "seconds", "ms",
"baseline_ms", "number", "half_width", "se_log", "target"} (lo/hi None below 2 repeats).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)
import torch

from attnscale.core.attention import attention
from attnscale.core.scores import get_score
from attnscale.util.provenance import versions
from attnscale.util.validate import check_float, check_int

BlockTimer = Callable[[Callable[[], object], int], float]

STANDARD: dict[str, Any] = {"n_values": (256, 1024, 4096), "target": 0.02, "min_repeats": 30,
                            "budget_s": 40.0}
QUICK: dict[str, Any] = {"n_values": (256,), "target": 0.1, "min_repeats": 5, "budget_s": 5.0}


def time_block(fn: Callable[[], object], number: int) -> float:
    """Seconds that ``number`` back-to-back calls of ``fn`` take (time.perf_counter)."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - t0


@dataclass
class RatioEstimate:
    """Geometric-mean ratio time(fn) / time(baseline) with its Student-t interval.

    ``ms`` and ``baseline_ms`` are the medians of the per-call times over repeats;
    ``half_width`` = e^{t·SE} − 1 (the larger relative side of the interval); ``log_ratios``
    are the per-repeat ln r_i (kept for checks, left out of :meth:`to_dict`)."""

    ratio: float
    lo: float | None
    hi: float | None
    n: int
    converged: bool
    seconds: float
    ms: float
    baseline_ms: float
    number: int
    half_width: float | None
    se_log: float | None
    target: float
    log_ratios: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "log_ratios"}


def log_ratio_interval(
    times: Iterable[float], baseline_times: Iterable[float], level: float = 0.95
) -> dict[str, float]:
    """Geometric-mean ratio of paired times and its Student-t interval on the log ratios.

    Returns {"ratio", "lo", "hi", "se_log", "half_width"}: ratio = exp(mean ln(a_i/b_i)),
    [lo, hi] = exp(mean ± t_{(1+level)/2, n−1} · SE), half_width = e^{t·SE} − 1."""
    level = check_float("level", level, low=0.0, high=1.0)
    a, b = np.asarray(list(times), dtype=float), np.asarray(list(baseline_times), dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"times: need two equal-length sequences of >= 2 values; got "
                         f"{a.size} and {b.size}")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("times: every time must be > 0")
    logs = np.log(a / b)
    m, se = float(logs.mean()), float(logs.std(ddof=1) / math.sqrt(logs.size))
    t = float(scipy.stats.t.ppf((1 + level) / 2, logs.size - 1))
    return {"ratio": math.exp(m), "lo": math.exp(m - t * se), "hi": math.exp(m + t * se),
            "se_log": se, "half_width": math.expm1(t * se)}


def calibrate_number(
    fn: Callable[[], object], baseline: Callable[[], object], block_s: float,
    timer: BlockTimer = time_block,
) -> int:
    """Calls per block so one block of the slower function lasts about ``block_s`` (≥ 1).
    Each function runs twice first (warm-up; the second call is the estimate)."""
    per_call = []
    for f in (fn, baseline):
        timer(f, 1)  # warm-up: first-call allocations and kernel selection
        per_call.append(timer(f, 1))
    return max(1, round(block_s / max(max(per_call), 1e-9)))


def measure_ratio(
    fn: Callable[[], object],
    baseline: Callable[[], object],
    *,
    target: float = 0.02,
    min_repeats: int = 30,
    max_repeats: int = 100_000,
    budget_s: float = 40.0,
    block_s: float = 0.015,
    level: float = 0.95,
    timer: BlockTimer = time_block,
    clock: Callable[[], float] = time.perf_counter,
) -> RatioEstimate:
    """time(fn) / time(baseline) in interleaved repeats until the interval's relative
    half-width is ≤ ``target`` (with ≥ ``min_repeats`` repeats) or ``budget_s`` is spent
    (see the module docstring). ``timer(f, number)`` returns the seconds of one block and
    ``clock`` measures the budget; both are injectable for tests. At least 2 repeats run."""
    target = check_float("target", target, low=0.0)
    min_repeats = check_int("min_repeats", min_repeats, minimum=2)
    max_repeats = check_int("max_repeats", max_repeats, minimum=min_repeats)
    budget_s = check_float("budget_s", budget_s, low=0.0)
    block_s = check_float("block_s", block_s, low=0.0)
    start = clock()
    number = calibrate_number(fn, baseline, block_s, timer)
    a_times: list[float] = []
    b_times: list[float] = []
    est, converged = None, False
    while True:
        if len(a_times) % 2 == 0:  # A B, then B A: drift cancels over each pair of repeats
            a_times.append(timer(fn, number))
            b_times.append(timer(baseline, number))
        else:
            b_times.append(timer(baseline, number))
            a_times.append(timer(fn, number))
        n = len(a_times)
        if n < 2:
            continue
        est = log_ratio_interval(a_times, b_times, level)
        if n >= min_repeats and est["half_width"] <= target:
            converged = True
            break
        if clock() - start >= budget_s or n >= max_repeats:
            break
    return RatioEstimate(
        ratio=est["ratio"], lo=est["lo"], hi=est["hi"], n=len(a_times), converged=converged,
        seconds=clock() - start,
        ms=statistics.median(a_times) / number * 1e3,
        baseline_ms=statistics.median(b_times) / number * 1e3,
        number=number, half_width=est["half_width"], se_log=est["se_log"], target=target,
        log_ratios=[math.log(x / y) for x, y in zip(a_times, b_times, strict=True)])


def fit_inverse_n(
    n_values: Iterable[int], overheads: Iterable[float], sigmas: Iterable[float] | None = None
) -> dict[str, Any] | None:
    """Weighted least squares of overhead(N) = a + b/N (weights 1/σ²; unweighted when σ is
    missing or any σ ≤ 0). Returns {"a", "b", "a_se", "b_se", "cov_ab", "chi2", "dof",
    "weighted", "points"} with the covariance from (XᵀWX)⁻¹ (σ taken as absolute), χ² = Σ
    w·residual² and dof = points − 2 (for a Birge ratio √(χ²/dof) when the errors are
    understated), or None with fewer than 2 distinct N."""
    x = 1.0 / np.asarray(list(n_values), dtype=float)
    y = np.asarray(list(overheads), dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"overheads: need one per N; got {y.size} for {x.size} N")
    if np.unique(x).size < 2:
        return None
    s = None if sigmas is None else np.asarray(list(sigmas), dtype=float)
    weighted = s is not None and s.shape == x.shape and bool((s > 0).all())
    w = 1.0 / s**2 if weighted else np.ones_like(x)
    design = np.stack([np.ones_like(x), x], axis=1)
    normal = design.T @ (design * w[:, None])
    coef = np.linalg.solve(normal, design.T @ (w * y))
    if weighted:
        cov = np.linalg.inv(normal)
    else:  # no σ: scale by the residual variance (needs a spare point)
        dof = x.size - 2
        rss = float(((y - design @ coef) ** 2).sum())
        cov = np.linalg.inv(normal) * (rss / dof if dof > 0 else math.nan)
    se = np.sqrt(np.diag(cov))
    chi2 = float((w * (y - design @ coef) ** 2).sum())
    return {"a": float(coef[0]), "b": float(coef[1]),
            "a_se": None if math.isnan(se[0]) else float(se[0]),
            "b_se": None if math.isnan(se[1]) else float(se[1]),
            "cov_ab": None if math.isnan(cov[0, 1]) else float(cov[0, 1]),
            "chi2": chi2, "dof": int(x.size) - 2, "weighted": weighted, "points": int(x.size)}


def batch_heads(n: int, work: int) -> tuple[int, int]:
    """(B, H) with B·H = max(1, round(work / N²)) and H = gcd(B·H, 8), so that one call does
    about the same work at every N."""
    bh = max(1, round(work / n**2))
    heads = math.gcd(bh, 8)
    return bh // heads, heads


def fwdbwd_call(
    score: str, inputs: tuple[torch.Tensor, ...], params: dict[str, float]
) -> Callable[[], None]:
    """A forward+backward closure of ``attention`` on its own copies of (q, k, v)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def call() -> None:
        for t in leaves:
            t.grad = None
        out = attention(*leaves, score=score, **params)
        out.backward(torch.ones_like(out))

    return call


def overhead_study(
    n_values: Iterable[int] = STANDARD["n_values"],
    *,
    head_dim: int = 64,
    work: int = 1 << 20,
    target: float = STANDARD["target"],
    min_repeats: int = STANDARD["min_repeats"],
    budget_s: float = STANDARD["budget_s"],
    block_s: float = 0.015,
    level: float = 0.95,
    threads: int | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """C5: cosine / scaled_dot and scaled_dot / scaled_dot forward+backward time at each N
    (see the module docstring for the procedure and the returned dict). ``budget_s`` is per
    measurement; ``threads`` sets torch's thread count for the study (default: leave it).
    ``QUICK`` holds a cheap setting: ``overhead_study(**QUICK)``."""
    ns = [check_int("n_values", n, minimum=1) for n in n_values]
    head_dim = check_int("head_dim", head_dim)
    work = check_int("work", work)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads))
    cosine = dict(get_score("cosine").bench_params)  # not bench.bench_params: bench imports us
    opts = {"target": target, "min_repeats": min_repeats, "budget_s": budget_s,
            "block_s": block_s, "level": level}
    start, rows = time.perf_counter(), []
    try:
        g = torch.Generator().manual_seed(seed)
        for n in ns:
            b, h = batch_heads(n, work)
            inputs = tuple(torch.randn(b, h, n, head_dim, generator=g) for _ in range(3))
            base = fwdbwd_call("scaled_dot", inputs, {})
            if progress:
                progress(f"cosine vs scaled_dot n={n} B={b} H={h}")
            cos = measure_ratio(fwdbwd_call("cosine", inputs, cosine), base, **opts)
            if progress:
                progress(f"noise floor n={n}")
            floor = measure_ratio(fwdbwd_call("scaled_dot", inputs, {}), base, **opts)
            rows.append({"n": n, "batch": b, "heads": h, "cosine": cos.to_dict(),
                         "floor": floor.to_dict()})
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    fit = fit_inverse_n([r["n"] for r in rows], [r["cosine"]["ratio"] - 1 for r in rows],
                        [r["cosine"]["ratio"] * (r["cosine"]["se_log"] or 0.0) for r in rows])
    settings = {"head_dim": head_dim, "dtype": "float32", "causal": False,
                "pass": "forward+backward", "tau": cosine.get("tau"), "work": work, **opts}
    return {"rows": rows, "fit": fit, "settings": settings, "threads": used,
            "versions": versions(), "seconds": time.perf_counter() - start}
