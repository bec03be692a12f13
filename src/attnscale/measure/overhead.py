"""Relative cost of one function against a baseline, measured as a ratio in the same run.

:func:`measure_ratio` times ``fn`` and ``baseline`` in interleaved repeats (A B, B A, A B, ...:
the order alternates every repeat, so a linear drift of the machine's speed cancels within each
pair of repeats). Each repeat times one block of ``number`` calls of each function, ``number``
chosen so that a block lasts about ``block_s`` (15 ms by default; one call when a single call is
longer). A repeat is one *pair* of blocks timed back to back, with log ratio
d_i = ln(t_A,i / t_B,i); the estimate is their geometric mean ratio = exp(m), m = mean(d_i).

Its interval (:func:`log_ratio_interval`) is a moving-block bootstrap over consecutive pairs
(Künsch 1989, Ann. Statist. 17(3); Lahiri 2003, *Resampling Methods for Dependent Data* §3):
with block length L, b = ⌊n/L⌋ and the n − L + 1 overlapping block means
B_j = mean(d_j, …, d_{j+L−1}),

    SE² = s_B² / b,  95% interval exp(m ± t_{0.975, b−1} · SE)

(s_B² the sample variance of the B_j). SE² is the bootstrap variance of the mean of b blocks
drawn with replacement, computed exactly (the limit of infinitely many resamples: no resampling
noise, no seed; a test checks it against numpy resampling), and Student's t on b − 1 degrees of
freedom allows for few blocks. Load that persists over several repeats makes neighbouring d_i
alike; a block holds such a stretch whole, so it widens the interval instead of passing for
precision. L = 1 is the per-repeat Student-t interval exp(m ± t_{0.975, n−1} · s/√n), which
assumes independent repeats: :func:`measure_ratio` uses it unless given ``block``;
:func:`overhead_study` (C5) passes ``block=None``, the automatic length of :func:`block_length`,
L = max(1, min(2⌈√n/2⌉, 2⌊n/10⌋)): about √n, even, so that every block holds as many A-first as
B-first repeats (in a 45 s noise-floor run at N = 2048 on this project's loaded 2-core machine
the first block of a repeat ran about 1.5% faster than the second, which the alternation
cancels), and at most n/5, so that b ≥ 5. Drift that slows both arms alike cancels in d_i
already; what the blocks add is load that favours one arm for a while (one closure's buffers
evicted more than the other's). Under such load (a fake timer, AR(1) with ρ = 0.7 per arm;
tests/measure/test_overhead_interval.py) the per-repeat interval on identical work held 1 in 26
of 50 simulated runs of 200 repeats, the block interval (L = 16) in 48; with load shared by both
arms, 46 and 48.

Repeats continue until the interval's relative half-width
max(hi/ratio − 1, 1 − lo/ratio) = e^{t·SE} − 1 is at most ``target`` with at least
``min_repeats`` repeats, or until ``budget_s`` seconds have passed (then ``converged`` is
False). Checking the interval after every repeat is a form of optional stopping;
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
                  "min_repeats", "budget_s", "block_s", "level", "interval"},
     "threads": int, "versions": {...}, "seconds": float}

with ``RatioEstimate.to_dict()`` = {"ratio", "lo", "hi", "n", "converged", "seconds", "ms",
"baseline_ms", "number", "half_width", "se_log", "target", "block"} (lo/hi None below 2
repeats; "block" the block length L of the interval, 1 for the per-repeat interval).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
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
# how overhead_study's intervals are made (in its settings): moving blocks, automatic length
INTERVAL = "moving-block bootstrap"


def time_block(fn: Callable[[], object], number: int) -> float:
    """Seconds that ``number`` back-to-back calls of ``fn`` take (time.perf_counter)."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - t0


@dataclass
class RatioEstimate:
    """Geometric-mean ratio time(fn) / time(baseline) with its interval
    (:func:`log_ratio_interval`: moving blocks of ``block`` repeats, 1 = per-repeat t).

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
    block: int = 1
    log_ratios: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "log_ratios"}


def block_length(n: int) -> int:
    """The automatic block length for ``n`` repeats: L = max(1, min(2⌈√n/2⌉, 2⌊n/10⌋)), about
    √n, even (as many A-first as B-first repeats in a block) and at most n/5 (≥ 5 blocks); 1
    (independent repeats) below 10 repeats."""
    return max(1, min(2 * math.ceil(math.sqrt(n) / 2), 2 * (n // 10)))


@lru_cache(maxsize=4096)
def _t_quantile(q: float, dof: int) -> float:
    return float(scipy.stats.t.ppf(q, dof))


def block_se(logs: np.ndarray, block: int) -> tuple[float, int]:
    """(SE, b): the moving-block bootstrap standard error of mean(``logs``) with blocks of
    ``block`` consecutive values, SE² = s_B²/b (s_B² the sample variance of the n − L + 1
    overlapping block means, b = ⌊n/L⌋ blocks; Künsch 1989), and b. L = 1 gives s/√n."""
    n = logs.size
    sums = np.concatenate(([0.0], np.cumsum(logs)))
    means = (sums[block:] - sums[:-block]) / block
    b = n // block
    var = float(means.var(ddof=1)) if means.size > 1 else 0.0
    return math.sqrt(max(var, 0.0) / b), b


def log_ratio_interval(
    times: Iterable[float], baseline_times: Iterable[float], level: float = 0.95,
    block: int | None = 1,
) -> dict[str, float]:
    """Geometric-mean ratio of paired times and its moving-block bootstrap interval over
    consecutive pairs (see the module docstring): ratio = exp(m), m = mean ln(a_i/b_i),
    [lo, hi] = exp(m ± t_{(1+level)/2, b−1} · SE) with SE from :func:`block_se`.

    ``block`` is L (1: the per-repeat Student-t interval; None: :func:`block_length`; at most
    n/2, so that there are two blocks). Returns {"ratio", "lo", "hi", "se_log", "half_width",
    "block"} with half_width = e^{t·SE} − 1."""
    level = check_float("level", level, low=0.0, high=1.0)
    a, b = np.asarray(list(times), dtype=float), np.asarray(list(baseline_times), dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"times: need two equal-length sequences of >= 2 values; got "
                         f"{a.size} and {b.size}")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("times: every time must be > 0")
    logs = np.log(a / b)
    size = block_length(logs.size) if block is None else check_int("block", block)
    size = min(size, logs.size // 2)
    m = float(logs.mean())
    se, blocks = block_se(logs, size)
    t = _t_quantile((1 + level) / 2, blocks - 1)
    return {"ratio": math.exp(m), "lo": math.exp(m - t * se), "hi": math.exp(m + t * se),
            "se_log": se, "half_width": math.expm1(t * se), "block": size}


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
    block: int | None = 1,
    timer: BlockTimer = time_block,
    clock: Callable[[], float] = time.perf_counter,
) -> RatioEstimate:
    """time(fn) / time(baseline) in interleaved repeats until the interval's relative
    half-width is ≤ ``target`` (with ≥ ``min_repeats`` repeats) or ``budget_s`` is spent
    (see the module docstring). ``block`` is the interval's block length
    (:func:`log_ratio_interval`: 1 per-repeat, None automatic). ``timer(f, number)`` returns
    the seconds of one block and ``clock`` measures the budget; both are injectable for
    tests. At least 2 repeats run."""
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
        est = log_ratio_interval(a_times, b_times, level, block)
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
        block=est["block"],
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
    honest = {**opts, "block": None}  # moving blocks: load that persists is in the interval
    start, rows = time.perf_counter(), []
    try:
        g = torch.Generator().manual_seed(seed)
        for n in ns:
            b, h = batch_heads(n, work)
            inputs = tuple(torch.randn(b, h, n, head_dim, generator=g) for _ in range(3))
            base = fwdbwd_call("scaled_dot", inputs, {})
            if progress:
                progress(f"cosine vs scaled_dot n={n} B={b} H={h}")
            cos = measure_ratio(fwdbwd_call("cosine", inputs, cosine), base, **honest)
            if progress:
                progress(f"noise floor n={n}")
            floor = measure_ratio(fwdbwd_call("scaled_dot", inputs, {}), base, **honest)
            rows.append({"n": n, "batch": b, "heads": h, "cosine": cos.to_dict(),
                         "floor": floor.to_dict()})
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    fit = fit_inverse_n([r["n"] for r in rows], [r["cosine"]["ratio"] - 1 for r in rows],
                        [r["cosine"]["ratio"] * (r["cosine"]["se_log"] or 0.0) for r in rows])
    settings = {"head_dim": head_dim, "dtype": "float32", "causal": False,
                "pass": "forward+backward", "tau": cosine.get("tau"), "work": work, **opts,
                "interval": INTERVAL}
    return {"rows": rows, "fit": fit, "settings": settings, "threads": used,
            "versions": versions(), "seconds": time.perf_counter() - start}
