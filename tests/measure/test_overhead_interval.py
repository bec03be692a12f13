"""The ratio timer's moving-block bootstrap interval (C5's timing intervals): its formula against
numpy resampling, its block length, and its coverage on identical work timed by an injected fake
machine whose load persists over repeats, beside the per-repeat Student-t interval it replaces
there. Speed itself is never asserted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnscale.measure import overhead as O
from attnscale.measure import ratio_interval as RI

RUNS = 50  # simulated measurements per coverage check
REPEATS = 200  # repeats per measurement: blocks of 16 (√200 → even), 12 blocks


class LoadedMachine:
    """A fake block timer and clock. Every block's time is ``number`` × the function's cost ×
    a slow trend shared by every block (the machine slows by ``trend`` over ``horizon`` blocks)
    × a lognormal load factor e^{x} × per-block lognormal noise of spread ``sigma``.

    The load x is AR(1) with lag-one correlation ``rho`` between successive blocks of the same
    load path and standard deviation ``load``. ``shared=True``: one path for every block, load
    that slows both arms alike. ``shared=False``: one path per function, same law for both
    (identical work stays identical on average) but its own realisation: contention that hits
    one closure's buffers more than the other's for a while, as on a machine shared with other
    work."""

    def __init__(self, cost: dict, seed: int, *, sigma: float = 0.05, load: float = 0.1,
                 rho: float = 0.7, trend: float = 0.5, horizon: int = 2 * REPEATS,
                 shared: bool = False):
        self.cost, self.sigma, self.load, self.rho = cost, sigma, load, rho
        self.trend, self.horizon, self.shared = trend, horizon, shared
        self.rng = np.random.default_rng(seed)
        self.paths: dict = {}
        self.calls, self.now = 0, 0.0

    def timer(self, fn, number: int) -> float:
        self.calls += 1
        key = None if self.shared else fn
        x = (self.rho * self.paths.get(key, 0.0)
             + math.sqrt(1 - self.rho**2) * self.load * self.rng.standard_normal())
        self.paths[key] = x
        speed = 1.0 + self.trend * self.calls / self.horizon
        t = number * self.cost[fn] * speed * math.exp(x + self.sigma * self.rng.standard_normal())
        self.now += t
        return t

    def clock(self) -> float:
        return self.now


def a():
    pass


def b():
    pass


def measure(ratio: float, seed: int, **machine) -> tuple[O.RatioEstimate, dict[str, float]]:
    """One measurement of ``REPEATS`` repeats with the automatic block interval, and the
    per-repeat Student-t interval of the same log ratios."""
    m = LoadedMachine({a: ratio * 1e-3, b: 1e-3}, seed, **machine)
    est = O.measure_ratio(a, b, target=1e-9, min_repeats=REPEATS, max_repeats=REPEATS,
                          budget_s=1e9, block=None, timer=m.timer, clock=m.clock)
    r = np.exp(est.log_ratios)
    return est, RI.log_ratio_interval(r, np.ones_like(r))


def coverage(ratio: float, **machine) -> tuple[int, int]:
    """(runs whose block interval holds ``ratio``, runs whose per-repeat interval does)."""
    block = per_repeat = 0
    for seed in range(RUNS):
        est, t = measure(ratio, seed, **machine)
        block += est.lo < ratio < est.hi
        per_repeat += t["lo"] < ratio < t["hi"]
    return block, per_repeat


def test_noise_floor_holds_one_under_persistent_load():
    """Identical work under load that persists over repeats (a slow trend, per-block noise and
    an AR(1) load path per arm): the block interval covers 1 in ≥ 90% of 50 runs; the
    per-repeat interval, which takes repeats as independent, in far fewer."""
    block, per_repeat = coverage(1.0)
    assert block >= 0.9 * RUNS, (block, per_repeat)
    assert per_repeat <= 0.7 * RUNS, (block, per_repeat)


def test_drift_that_slows_both_arms_alike_cancels_in_either_interval():
    """A slow trend plus load shared by both arms: the A B, B A order cancels it in each log
    ratio, so both intervals hold 1 (the blocks are for load that differs between arms)."""
    block, per_repeat = coverage(1.0, shared=True)
    assert block >= 0.9 * RUNS and per_repeat >= 0.85 * RUNS, (block, per_repeat)


def test_a_real_overhead_is_resolved_under_the_same_load():
    """A 20% overhead under the same load: every interval excludes 1, and ≥ 90% hold 1.2."""
    held = 0
    for seed in range(RUNS):
        est, _ = measure(1.2, seed)
        assert est.lo > 1.0, (seed, est.lo)
        held += est.lo < 1.2 < est.hi
        assert est.block == 16 and est.n == REPEATS
    assert held >= 0.9 * RUNS, held


def test_block_length_rule():
    """L = max(1, min(2⌈√n/2⌉, 2⌊n/10⌋)): even, about √n, at least 5 blocks, 1 below 10."""
    assert [RI.block_length(n) for n in (2, 9, 10, 19, 20, 30, 100, 200, 1000)] == [
        1, 1, 2, 2, 4, 6, 10, 16, 32]
    for n in range(10, 3000, 37):
        size = RI.block_length(n)
        assert size % 2 == 0 and n // size >= 5 and size <= math.sqrt(n) + 2


def test_block_se_is_the_moving_block_bootstrap_variance():
    """SE² = s_B²/b equals the variance of the mean of b blocks resampled with replacement from
    the n − L + 1 overlapping blocks (numpy, fixed seed, 20000 resamples), up to the n − 1
    correction and resampling noise."""
    rng = np.random.default_rng(3)
    logs = np.convolve(rng.standard_normal(305), np.ones(6) / 6, mode="valid")  # correlated
    n, size = logs.size, 16
    se, blocks = RI.block_se(logs, size)
    starts = rng.integers(0, n - size + 1, size=(20_000, blocks))
    idx = (starts[:, :, None] + np.arange(size)).reshape(20_000, -1)
    boot = logs[idx].mean(axis=1)
    assert blocks == n // size
    assert se == pytest.approx(boot.std(), rel=0.03)
    t_se, _ = RI.block_se(logs, 1)
    assert t_se == pytest.approx(logs.std(ddof=1) / math.sqrt(n), rel=1e-12)
    assert se > 1.5 * t_se  # the correlation the per-repeat interval misses


def test_interval_formula_and_block_argument():
    """exp(m ± t_{0.975, b−1}·SE); block 1 is the per-repeat interval; an explicit block is
    capped at n/2 (two blocks) and a bad one is refused."""
    rng = np.random.default_rng(0)
    x = np.exp(0.1 * rng.standard_normal(120))
    got = RI.log_ratio_interval(x, np.ones_like(x), block=None)
    se, blocks = RI.block_se(np.log(x), got["block"])
    t = stats.t.ppf(0.975, blocks - 1)
    m = float(np.log(x).mean())
    assert got["block"] == 12 and got["se_log"] == pytest.approx(se)
    assert math.log(got["lo"]) == pytest.approx(m - t * se)
    assert math.log(got["hi"]) == pytest.approx(m + t * se)
    assert got["half_width"] == pytest.approx(math.expm1(t * se))
    assert RI.log_ratio_interval(x[:4], np.ones(4), block=8)["block"] == 2
    with pytest.raises(ValueError, match="block"):
        RI.log_ratio_interval(x, np.ones_like(x), block=0)


def test_the_overhead_study_uses_epoch_intervals():
    """overhead_study measures in fresh-closure epochs of EPOCH repeats and records the method;
    plain measure_ratio keeps the per-repeat interval (block 1) unless asked."""
    out = O.overhead_study((16,), head_dim=8, work=256, target=10.0, min_repeats=24,
                           budget_s=30.0, block_s=1e-4, threads=1)  # the pilot: 3 epochs
    assert out["settings"]["interval"] == O.INTERVAL and out["settings"]["epoch"] == O.EPOCH
    for key in ("cosine", "floor"):
        e = out["rows"][0][key]
        assert e["epochs"] == 3 and e["n"] == 3 * O.EPOCH and e["block"] == O.EPOCH
    m = LoadedMachine({a: 1e-3, b: 1e-3}, 0)
    est = O.measure_ratio(a, b, target=1e-9, min_repeats=40, max_repeats=40, budget_s=1e9,
                          timer=m.timer, clock=m.clock)
    assert est.block == 1 and est.to_dict()["block"] == 1 and est.epochs is None
