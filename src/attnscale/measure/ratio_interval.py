"""Intervals for a ratio of times measured in interleaved repeats, and how many repeats to plan.

The interval of a geometric-mean time ratio (:func:`log_ratio_interval`) over n repeats with log
ratios d_i = ln(t_A,i / t_B,i) and m = mean(d_i) is a moving-block bootstrap over consecutive
pairs (Künsch 1989, Ann. Statist. 17(3); Lahiri 2003, *Resampling Methods for Dependent Data*
§3): with block length L, b = ⌊n/L⌋ and the n − L + 1 overlapping block means B_j = mean(d_j, …,
d_{j+L−1}),

    SE² = s_B² / b,  95% interval exp(m ± t_{0.975, b−1} · SE)

(s_B² the sample variance of the B_j). SE² is the bootstrap variance of the mean of b blocks
drawn with replacement, computed exactly (the limit of infinitely many resamples: no resampling
noise, no seed; a test checks it against numpy resampling), and Student's t on b − 1 degrees of
freedom allows for few blocks. Load that persists over several repeats makes neighbouring d_i
alike; a block holds such a stretch whole, so it widens the interval instead of passing for
precision. L = 1 is the per-repeat Student-t interval exp(m ± t_{0.975, n−1} · s/√n), which
assumes independent repeats (:func:`attnscale.measure.overhead.measure_ratio` uses it unless
given ``block``). ``block=None`` is the automatic length of :func:`block_length`, L = max(1,
min(2⌈√n/2⌉, 2⌊n/10⌋)): about √n, even, so that every block holds as many A-first as B-first
repeats (in a 45 s noise-floor run at N = 2048 on this project's loaded 2-core machine the first
block of a repeat ran about 1.5% faster than the second, which the alternation cancels), and at
most n/5, so that b ≥ 5. Drift that slows both arms alike cancels in d_i already; what the
blocks add is load that favours one arm for a while (one closure's buffers evicted more than the
other's). Under such load (a fake timer, AR(1) with ρ = 0.7 per arm;
tests/measure/test_overhead_interval.py) the per-repeat interval on identical work held 1 in 26
of 50 simulated runs of 200 repeats, the block interval (L = 16) in 48; with load shared by both
arms, 46 and 48. With ``overlap=False`` the blocks are disjoint (batch means): the study that
re-makes its closures every L repeats (an *epoch*) reads each epoch's mean as one replicate, SE²
= s_E²/E on E − 1 degrees of freedom.

A measurement's length is planned, not stopped at the first narrow interval: a pilot of n₀
units (repeats or epochs) gives a relative half-width h₀ = e^{t·SE} − 1, and the measurement
runs to n = ⌈n₀ · 1.2 · (ln(1 + h₀) / ln(1 + target))²⌉ units (:func:`plan`: SE ∝ 1/√n, 20%
slack for a pilot's noisy SE). Stopping at the first look whose interval is narrow enough
selects the runs whose SE happened to come out small, and their intervals cover less than they
say. Even one plan leaks a little when the final interval reuses the pilot's SE estimate (a run
whose pilot SE came out small stops early and keeps it), so the final interval is Stein's
two-stage one (Stein 1945, Ann. Math. Statist. 16(3)): the mean of all n, the pilot's SE scaled
to n, SE₀·√(n₀/n), with the pilot's t quantile. n depends on the pilot only through SE₀, which
(for normal, independent units) is independent of the mean, so its coverage is exact whatever
the plan. The interval takes the whole run's SE instead where that is larger (load that grew
after the pilot).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache

import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)

from attnscale.util.validate import check_float, check_int

PLAN_SLACK = 1.2  # a pilot's SE is noisy: plan 20% more than it says the target needs
UNBOUNDED = 1 << 62  # the plan for a pilot without a finite width


def block_length(n: int) -> int:
    """The automatic block length for ``n`` repeats: L = max(1, min(2⌈√n/2⌉, 2⌊n/10⌋)), about
    √n, even (as many A-first as B-first repeats in a block) and at most n/5 (≥ 5 blocks); 1
    (independent repeats) below 10 repeats."""
    return max(1, min(2 * math.ceil(math.sqrt(n) / 2), 2 * (n // 10)))


@lru_cache(maxsize=4096)
def _t_quantile(q: float, dof: int) -> float:
    return float(scipy.stats.t.ppf(q, dof))


def block_se(logs: np.ndarray, block: int, overlap: bool = True) -> tuple[float, int]:
    """(SE, b): the moving-block bootstrap standard error of mean(``logs``) with blocks of
    ``block`` consecutive values, SE² = s_B²/b (s_B² the sample variance of the n − L + 1
    overlapping block means, b = ⌊n/L⌋ blocks; Künsch 1989), and b. L = 1 gives s/√n.
    ``overlap=False``: batch means, s_B² over the b disjoint blocks (n a multiple of L)."""
    n = logs.size
    sums = np.concatenate(([0.0], np.cumsum(logs)))
    means = (sums[block:] - sums[:-block]) / block
    if not overlap:
        if n % block:
            raise ValueError(f"logs: {n} values do not split into blocks of {block}")
        means = means[::block]
    b = n // block
    var = float(means.var(ddof=1)) if means.size > 1 else 0.0
    return math.sqrt(max(var, 0.0) / b), b


def log_ratio_interval(
    times: Iterable[float], baseline_times: Iterable[float], level: float = 0.95,
    block: int | None = 1, overlap: bool = True, pilot: int | None = None,
) -> dict[str, float]:
    """Geometric-mean ratio of paired times and its moving-block bootstrap interval over
    consecutive pairs (see the module docstring): ratio = exp(m), m = mean ln(a_i/b_i),
    [lo, hi] = exp(m ± t_{(1+level)/2, b−1} · SE) with SE from :func:`block_se`.

    ``block`` is L (1: the per-repeat Student-t interval; None: :func:`block_length`; at most
    n/2, so that there are two blocks); ``overlap=False`` gives batch means over disjoint
    blocks (:func:`block_se`). ``pilot``: the first n₀ pairs were the pilot that set n (Stein
    1945, module docstring): SE = max(SE_all, SE₀·√(n₀/n)) with SE₀, and the t quantile's
    b₀ − 1 degrees of freedom, from the pilot alone (its blocks sized for n₀). Returns
    {"ratio", "lo", "hi", "se_log", "half_width", "block"} with half_width = e^{t·SE} − 1."""
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
    if not overlap and logs.size % size:
        raise ValueError(f"block: {logs.size} repeats do not split into blocks of {size}")
    m = float(logs.mean())
    se, blocks = block_se(logs, size, overlap)
    if pilot is not None and check_int("pilot", pilot, minimum=2) < logs.size:
        first = min(block_length(pilot) if block is None else size, pilot // 2)
        se0, blocks = block_se(logs[:pilot], first, overlap)
        se = max(se, se0 * math.sqrt(pilot / logs.size))
    t = _t_quantile((1 + level) / 2, blocks - 1)
    return {"ratio": math.exp(m), "lo": math.exp(m - t * se), "hi": math.exp(m + t * se),
            "se_log": se, "half_width": math.expm1(t * se), "block": size}


def plan(done: int, half_width: float, target: float) -> int:
    """Units (repeats or epochs) that should bring the interval's half-width to ``target``,
    from a pilot of ``done`` units whose half-width was ``half_width``: SE ∝ 1/√n, so
    n = ⌈done · PLAN_SLACK · (ln(1 + half_width) / ln(1 + target))²⌉, at least ``done``; a
    width that is not finite plans without end (the caller's cap and time budget stop it)."""
    need = done * PLAN_SLACK * (math.log1p(half_width) / math.log1p(target)) ** 2
    return max(done, math.ceil(need)) if math.isfinite(need) else UNBOUNDED
