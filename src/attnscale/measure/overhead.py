"""Relative cost of one function against a baseline, measured as a ratio in the same run.

:func:`measure_ratio` times ``fn`` and ``baseline`` in interleaved repeats (A B, B A, A B, ...:
the order alternates every repeat, so a linear drift of the machine's speed cancels within each
pair of repeats). Each repeat times one block of ``number`` calls of each function, ``number``
chosen so that a block lasts about ``block_s`` (15 ms by default; one call when a single call is
longer). A repeat is one *pair* of blocks timed back to back, with log ratio
d_i = ln(t_A,i / t_B,i); the estimate is their geometric mean ratio = exp(m), m = mean(d_i).

Its interval (:func:`attnscale.measure.ratio_interval.log_ratio_interval`) is Student's t on
the per-repeat d_i (``block=1``), a moving-block bootstrap over consecutive repeats
(``block=None`` or L), or batch means over epochs (:func:`measure_fresh_ratio`). Repeats are
planned, not stopped at the first narrow interval
(:func:`attnscale.measure.ratio_interval.plan`): a pilot of ``min_repeats`` repeats, then as
many as its half-width says the ``target`` needs, or until ``budget_s`` seconds have passed;
``converged`` says whether the final half-width is at most ``target``.

Cache warmth: each block of a repeat follows either its own function's block (warm) or the
other's (cold); over a repeat pair A B | B A each function has one of each. The warm-up calls
run the baseline first, so the first timed block (``fn``) follows its own call like every
second block after it, and neither arm has an extra cold block.

:func:`measure_fresh_ratio` runs the same repeats in *epochs*: each epoch makes fresh closures
of both functions (new buffers at new addresses), warms them up (baseline, then ``fn``) and
times ``epoch`` repeats; its interval treats the epoch means as the replicates (batch means, a
non-overlapping block bootstrap with blocks = epochs: SE² = s_E²/E on E − 1 degrees of
freedom), so that whatever a pair of closures carries through a whole measurement (where
their buffers landed) varies between epochs and widens the interval. With one pair of closures
for the whole measurement, C5's floor at N = 256 once read +4.6% [+3.6%, +5.6%] over 100
repeats (stopped at its first narrow look); ``benchmarks/noise_floor_coverage.py`` records how
often the floor's interval excludes 1 by each procedure (docs/claims.md, C5). Each epoch's
copies land at varied page offsets (data_ptr() mod 4096 took 2560-3840 over 8 epochs).

:func:`overhead_study` applies it to the thread's claim that cosine similarity adds
computational overhead (C5) with :func:`measure_fresh_ratio`: forward+backward of
:func:`attnscale.attention` with ``score="cosine"`` (τ from the score's bench parameters)
against ``score="scaled_dot"``, both on the fused SDPA path, float32, D = 64, non-causal, at
several sequence lengths N. Per-call work is kept comparable across N with B·H = max(1,
round(work / N²)). At each N a *noise floor* row times scaled_dot against scaled_dot (identical
work, separate tensors and closures) by the same procedure. Each epoch's closures copy (q, k, v)
after a spacer of random size (0–64 KiB in 64-byte steps, drawn from ``seed``), so their buffers
start at varied offsets.

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
                  "min_repeats", "budget_s", "block_s", "level", "interval", "epoch"},
     "threads": int, "versions": {...}, "seconds": float}

with ``RatioEstimate.to_dict()`` = {"ratio", "lo", "hi", "n", "converged", "seconds", "ms",
"baseline_ms", "number", "half_width", "se_log", "target", "block", "epochs"} (lo/hi None
below 2 repeats; "block" the block length of the interval in repeats, 1 for the per-repeat
interval; "epochs" the number of fresh-closure epochs, None for one pair of closures).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnscale.core.attention import attention
from attnscale.core.scores import get_score
from attnscale.measure.ratio_interval import log_ratio_interval, plan
from attnscale.util.provenance import versions
from attnscale.util.validate import check_float, check_int

BlockTimer = Callable[[Callable[[], object], int], float]

STANDARD: dict[str, Any] = {"n_values": (256, 1024, 4096), "target": 0.02, "min_repeats": 80,
                            "budget_s": 40.0}
QUICK: dict[str, Any] = {"n_values": (256,), "target": 0.1, "min_repeats": 40, "budget_s": 5.0}
EPOCH = 10  # repeats per fresh-closure epoch: about 0.3-0.6 s at the study's shapes
# how overhead_study's intervals are made (in its settings and C5's cache key)
INTERVAL = f"batch means over epochs of {EPOCH} repeats with fresh closures, planned length"


def time_block(fn: Callable[[], object], number: int) -> float:
    """Seconds that ``number`` back-to-back calls of ``fn`` take (time.perf_counter)."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - t0


@dataclass
class RatioEstimate:
    """Geometric-mean ratio time(fn) / time(baseline) with its interval
    (:func:`log_ratio_interval`: blocks of ``block`` repeats, 1 = per-repeat t; with
    ``epochs``, the blocks are the epochs).

    ``ms`` and ``baseline_ms`` are the medians of the per-call times over repeats;
    ``half_width`` = e^{t·SE} − 1 (the larger relative side of the interval); ``epochs`` the
    fresh-closure epochs (:func:`measure_fresh_ratio`; None: one pair of closures); ``stopped``
    why the repeats ended: "plan" (the count the pilot planned), "cap" (``max_repeats``, short
    of the plan) or "budget" (``budget_s``); ``log_ratios`` are the per-repeat ln r_i (kept
    for checks, left out of :meth:`to_dict`)."""

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
    epochs: int | None = None
    stopped: str | None = None
    log_ratios: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "log_ratios"}


def calibrate_number(
    fn: Callable[[], object], baseline: Callable[[], object], block_s: float,
    timer: BlockTimer = time_block,
) -> int:
    """Calls per block so one block of the slower function lasts about ``block_s`` (≥ 1).
    Each function runs twice first (warm-up; the second call is the estimate), the baseline
    first: the first timed block, ``fn``'s, then follows its own call (module docstring)."""
    per_call = []
    for f in (baseline, fn):
        timer(f, 1)  # warm-up: first-call allocations and kernel selection
        per_call.append(timer(f, 1))
    return max(1, round(block_s / max(max(per_call), 1e-9)))


def time_repeat(fn: Callable[[], object], baseline: Callable[[], object], number: int,
                a_first: bool, timer: BlockTimer) -> tuple[float, float]:
    """(t_fn, t_baseline) of one repeat: a block of each, ``fn`` first or second."""
    if a_first:
        t_a = timer(fn, number)
        return t_a, timer(baseline, number)
    t_b = timer(baseline, number)
    return timer(fn, number), t_b


def ratio_estimate(est: dict[str, float], a_times: list[float], b_times: list[float],
                   number: int, target: float, seconds: float,
                   epochs: int | None = None, stopped: str | None = None) -> RatioEstimate:
    """The :class:`RatioEstimate` of timed blocks and their interval ``est``
    (:func:`log_ratio_interval`)."""
    return RatioEstimate(
        ratio=est["ratio"], lo=est["lo"], hi=est["hi"], n=len(a_times),
        converged=est["half_width"] <= target, seconds=seconds,
        ms=statistics.median(a_times) / number * 1e3,
        baseline_ms=statistics.median(b_times) / number * 1e3,
        number=number, half_width=est["half_width"], se_log=est["se_log"], target=target,
        block=int(est["block"]), epochs=epochs, stopped=stopped,
        log_ratios=[math.log(x / y) for x, y in zip(a_times, b_times, strict=True)])


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
    """time(fn) / time(baseline) in interleaved repeats: a pilot of ``min_repeats``, then as many
    as :func:`plan` says a half-width of ``target`` needs (at most ``max_repeats``), or until
    ``budget_s`` is spent (see the module docstring). ``block`` is the interval's block length
    (:func:`log_ratio_interval`: 1 per-repeat, None automatic). ``timer(f, number)`` returns
    the seconds of one block and ``clock`` measures the budget; both are injectable for
    tests. At least 2 repeats run, and an even number unless ``max_repeats`` is odd and
    reached; the interval is Stein's two-stage one over the pilot
    (:func:`log_ratio_interval` with ``pilot``)."""
    target = check_float("target", target, low=0.0)
    min_repeats = check_int("min_repeats", min_repeats, minimum=2)
    max_repeats = check_int("max_repeats", max_repeats, minimum=min_repeats)
    budget_s = check_float("budget_s", budget_s, low=0.0)
    block_s = check_float("block_s", block_s, low=0.0)
    start = clock()
    number = calibrate_number(fn, baseline, block_s, timer)
    a_times: list[float] = []
    b_times: list[float] = []
    goal = wanted = min_repeats
    while True:
        t_a, t_b = time_repeat(fn, baseline, number, len(a_times) % 2 == 0, timer)
        a_times.append(t_a)
        b_times.append(t_b)
        n = len(a_times)
        if n == min_repeats:  # the pilot: plan the rest once, never stop on a narrow look
            first = log_ratio_interval(a_times, b_times, level, block)
            wanted = plan(n, first["half_width"], target)
            goal = min(max_repeats, wanted + wanted % 2)  # even: as many A-first as B-first
        if n >= goal:
            stopped = "plan" if wanted <= max_repeats else "cap"
            break
        if n % 2 == 0 and clock() - start >= budget_s:
            stopped = "budget"
            break
    est = log_ratio_interval(a_times, b_times, level, block,
                             pilot=min_repeats if n > min_repeats else None)
    return ratio_estimate(est, a_times, b_times, number, target, clock() - start,
                          stopped=stopped)


def pilot_epochs(min_repeats: int, epoch: int = EPOCH) -> int:
    """Epochs in :func:`measure_fresh_ratio`'s pilot: max(2, ⌈min_repeats / epoch⌉)."""
    return max(2, math.ceil(min_repeats / epoch))


def measure_fresh_ratio(
    make_fn: Callable[[], Callable[[], object]],
    make_baseline: Callable[[], Callable[[], object]],
    *,
    epoch: int = EPOCH,
    target: float = 0.02,
    min_repeats: int = 80,
    max_repeats: int = 100_000,
    budget_s: float = 40.0,
    block_s: float = 0.015,
    level: float = 0.95,
    timer: BlockTimer = time_block,
    clock: Callable[[], float] = time.perf_counter,
) -> RatioEstimate:
    """time(fn) / time(baseline) over epochs of fresh closures (module docstring): each epoch
    calls ``make_baseline()`` and ``make_fn()``, runs each once untimed (baseline first) and
    times ``epoch`` interleaved repeats (even: as many fn-first as baseline-first). The
    interval is batch means over epochs (Stein's two-stage interval over the pilot, as in
    :func:`measure_ratio`); a pilot of :func:`pilot_epochs` epochs (at most ``max_repeats`` /
    ``epoch``, which must allow two), then :func:`plan`'s count, capped by ``max_repeats`` and
    ``budget_s`` (checked after each epoch, from the second on)."""
    epoch = check_int("epoch", epoch, minimum=2)
    if epoch % 2:
        raise ValueError(f"epoch must be even (as many fn-first as baseline-first repeats); "
                         f"got {epoch}")
    target = check_float("target", target, low=0.0)
    min_repeats = check_int("min_repeats", min_repeats, minimum=2)
    max_epochs = check_int("max_repeats", max_repeats, minimum=max(min_repeats, 2 * epoch))
    max_epochs //= epoch
    budget_s = check_float("budget_s", budget_s, low=0.0)
    block_s = check_float("block_s", block_s, low=0.0)
    start = clock()
    number = calibrate_number(make_fn(), make_baseline(), block_s, timer)
    a_times: list[float] = []
    b_times: list[float] = []
    pilot = min(max_epochs, pilot_epochs(min_repeats, epoch))
    goal = wanted = pilot
    while True:
        for t_a, t_b in time_epoch(make_fn(), make_baseline(), number, epoch, timer):
            a_times.append(t_a)
            b_times.append(t_b)
        done = len(a_times) // epoch
        if done == pilot:  # plan the rest once, never stop on a narrow look
            first = log_ratio_interval(a_times, b_times, level, epoch, overlap=False)
            wanted = plan(done, first["half_width"], target)
            goal = min(max_epochs, wanted)
        if done >= goal:
            stopped = "plan" if wanted <= max_epochs else "cap"
            break
        if done >= 2 and clock() - start >= budget_s:
            stopped = "budget"
            break
    est = log_ratio_interval(a_times, b_times, level, epoch, overlap=False,
                             pilot=pilot * epoch if done > pilot else None)
    return ratio_estimate(est, a_times, b_times, number, target, clock() - start, done,
                          stopped)


def time_epoch(fn: Callable[[], object], baseline: Callable[[], object], number: int,
               epoch: int, timer: BlockTimer) -> list[tuple[float, float]]:
    """One epoch of fresh closures: each called once untimed, the baseline first (so fn's first
    timed block follows its own call), then ``epoch`` repeats alternating which goes first;
    [(t_fn, t_baseline)] per repeat."""
    timer(baseline, 1)
    timer(fn, 1)
    return [time_repeat(fn, baseline, number, i % 2 == 0, timer) for i in range(epoch)]


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
    score: str, inputs: tuple[torch.Tensor, ...], params: dict[str, float], spacer: int = 0
) -> Callable[[], None]:
    """A forward+backward closure of ``attention`` on its own copies of (q, k, v), made after
    a ``spacer``-element float32 tensor that the closure keeps (so its copies start elsewhere)."""
    pad = torch.empty(check_int("spacer", spacer, minimum=0))
    leaves = [t.detach().clone().requires_grad_() for t in inputs]  # (B, H, N, D) each

    def call(_spacer: torch.Tensor = pad) -> None:  # the default keeps the spacer alive
        for t in leaves:
            t.grad = None
        out = attention(*leaves, score=score, **params)
        out.backward(torch.ones_like(out))

    return call


def fresh_calls(
    score: str, inputs: tuple[torch.Tensor, ...], params: dict[str, float],
    rng: random.Random,
) -> Callable[[], Callable[[], None]]:
    """A factory of :func:`fwdbwd_call` closures, each after a spacer of random size (0 to
    64 KiB in 64-byte steps, drawn from ``rng``), for :func:`measure_fresh_ratio`."""
    return lambda: fwdbwd_call(score, inputs, params, spacer=16 * rng.randrange(1024))


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
    """C5: cosine / scaled_dot and scaled_dot / scaled_dot forward+backward time at each N, each
    by :func:`measure_fresh_ratio` (see the module docstring for the procedure and the returned
    dict). ``budget_s`` is per measurement; ``threads`` sets torch's thread count for the study
    (default: leave it). ``QUICK`` holds a cheap setting: ``overhead_study(**QUICK)``."""
    ns = [check_int("n_values", n, minimum=1) for n in n_values]
    head_dim = check_int("head_dim", head_dim)
    work = check_int("work", work)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads))
    cosine = dict(get_score("cosine").bench_params)  # not bench.bench_params: bench imports us
    opts = {"target": target, "min_repeats": min_repeats, "budget_s": budget_s,
            "block_s": block_s, "level": level}
    start, rows, rng = time.perf_counter(), [], random.Random(seed)
    try:
        g = torch.Generator().manual_seed(seed)
        for n in ns:
            b, h = batch_heads(n, work)
            inputs = tuple(torch.randn(b, h, n, head_dim, generator=g) for _ in range(3))
            base = fresh_calls("scaled_dot", inputs, {}, rng)
            if progress:
                progress(f"cosine vs scaled_dot n={n} B={b} H={h}")
            cos = measure_fresh_ratio(fresh_calls("cosine", inputs, cosine, rng), base, **opts)
            if progress:
                progress(f"noise floor n={n}")
            floor = measure_fresh_ratio(fresh_calls("scaled_dot", inputs, {}, rng), base, **opts)
            rows.append({"n": n, "batch": b, "heads": h, "cosine": cos.to_dict(),
                         "floor": floor.to_dict()})
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    fit = fit_inverse_n([r["n"] for r in rows], [r["cosine"]["ratio"] - 1 for r in rows],
                        [r["cosine"]["ratio"] * (r["cosine"]["se_log"] or 0.0) for r in rows])
    settings = {"head_dim": head_dim, "dtype": "float32", "causal": False,
                "pass": "forward+backward", "tau": cosine.get("tau"), "work": work, **opts,
                "interval": INTERVAL, "epoch": EPOCH}
    return {"rows": rows, "fit": fit, "settings": settings, "threads": used,
            "versions": versions(), "seconds": time.perf_counter() - start}
