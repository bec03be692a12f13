"""C5's timing procedure on fake machines whose answer is known: cache warmth (a block that
follows the other function's block is slower), closures whose buffers make them persistently
faster or slower, the epoch plan, batch means and bad arguments. Speed itself is never
asserted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnscale.measure import overhead as O
from attnscale.measure import ratio_interval as RI

RUNS = 50  # simulated measurements per coverage check


class Closure:
    """A fake closure: its function's name (which sets its cost) and nothing else; each
    instance is a new set of buffers."""

    def __init__(self, tag: str):
        self.tag = tag

    def __call__(self) -> None:
        pass


class Machine:
    """A fake block timer and clock. A block of ``number`` calls takes number × cost[tag] ×
    (1 + ``cold``, when the previous call was another closure's) × the closure's placement
    factor e^{placement·z} (drawn once per closure: where its buffers landed) × per-block
    noise e^{sigma·z}."""

    def __init__(self, cost: dict[str, float], seed: int, *, cold: float = 0.0,
                 placement: float = 0.0, sigma: float = 0.0):
        self.cost, self.cold, self.placement, self.sigma = cost, cold, placement, sigma
        self.rng = np.random.default_rng(seed)
        self.factor: dict[int, float] = {}
        self.keep: list[Closure] = []  # so that no id is reused
        self.last: Closure | None = None
        self.now = 0.0

    def timer(self, fn: Closure, number: int) -> float:
        if id(fn) not in self.factor:
            self.keep.append(fn)
            self.factor[id(fn)] = math.exp(self.placement * self.rng.standard_normal())
        warm = 1.0 if self.last is fn else 1.0 + self.cold
        t = (number * self.cost[fn.tag] * warm * self.factor[id(fn)]
             * math.exp(self.sigma * self.rng.standard_normal()))
        self.last, self.now = fn, self.now + t
        return t

    def clock(self) -> float:
        return self.now


def fresh(m: Machine, ratio: float = 1.0, **kw) -> O.RatioEstimate:
    opts = {"target": 1e-9, "min_repeats": 200, "max_repeats": 200, "budget_s": 1e9, **kw}
    m.cost.update({"a": ratio * 1e-3, "b": 1e-3})
    return O.measure_fresh_ratio(lambda: Closure("a"), lambda: Closure("b"), timer=m.timer,
                                 clock=m.clock, **opts)


def test_cache_warmth_is_balanced_between_the_arms():
    """A block after the other function's block is 10% slower. On identical work without noise
    both procedures read exactly 1: each arm has as many cold blocks as the other."""
    est = fresh(Machine({}, 0, cold=0.1))
    assert est.ratio == pytest.approx(1.0, abs=1e-12) and est.epochs == 20
    m = Machine({"a": 1e-3, "b": 1e-3}, 0, cold=0.1)
    a, b = Closure("a"), Closure("b")
    fixed = O.measure_ratio(a, b, target=1e-9, min_repeats=20, max_repeats=20, budget_s=1e9,
                            timer=m.timer, clock=m.clock)
    assert fixed.ratio == pytest.approx(1.0, abs=1e-12)


def test_fresh_epochs_hold_one_where_one_pair_of_closures_does_not():
    """Each closure is 3% faster or slower for good (where its buffers landed), plus 3% noise
    per block. One pair of closures for 200 repeats: its interval covers 1 in few of 50 runs.
    Fresh closures every 10 repeats: in ≥ 90%."""
    held_fresh = held_fixed = 0
    for seed in range(RUNS):
        est = fresh(Machine({}, seed, placement=0.03, sigma=0.03))
        held_fresh += est.lo < 1.0 < est.hi
        m = Machine({"a": 1e-3, "b": 1e-3}, seed, placement=0.03, sigma=0.03)
        one = O.measure_ratio(Closure("a"), Closure("b"), target=1e-9, min_repeats=200,
                              max_repeats=200, budget_s=1e9, block=None, timer=m.timer,
                              clock=m.clock)
        held_fixed += one.lo < 1.0 < one.hi
    assert held_fresh >= 0.9 * RUNS, (held_fresh, held_fixed)
    assert held_fixed <= 0.5 * RUNS, (held_fresh, held_fixed)


def test_a_real_overhead_is_resolved_across_fresh_closures():
    """A 10% overhead with the same placement and noise: every interval excludes 1 and ≥ 90%
    hold 1.1."""
    held = 0
    for seed in range(RUNS):
        est = fresh(Machine({}, seed, placement=0.03, sigma=0.03), ratio=1.1)
        assert est.lo > 1.0, (seed, est.lo)
        held += est.lo < 1.1 < est.hi
    assert held >= 0.9 * RUNS, held


def test_the_epochs_follow_the_pilot_plan():
    """A pilot of ⌈min_repeats / epoch⌉ epochs, then plan()'s count from its batch-means
    half-width; the interval is Stein's over batch means: the pilot's epoch-mean SE scaled to
    the epochs run (or the whole run's, if larger), t on the pilot's epochs − 1."""
    m = Machine({}, 4, sigma=0.05)
    est = fresh(m, ratio=1.05, target=0.01, min_repeats=40, max_repeats=100_000)
    logs = np.asarray(est.log_ratios)
    pilot = RI.log_ratio_interval(np.exp(logs[:40]), np.ones(40), block=10, overlap=False)
    assert est.epochs == RI.plan(4, pilot["half_width"], 0.01) > 4 and est.stopped == "plan"
    assert est.n == 10 * est.epochs and est.block == 10
    means = logs.reshape(est.epochs, 10).mean(axis=1)
    se = max(means.std(ddof=1) / math.sqrt(est.epochs),
             means[:4].std(ddof=1) / math.sqrt(4) * math.sqrt(4 / est.epochs))
    assert est.se_log == pytest.approx(se, rel=1e-9)
    assert est.half_width == pytest.approx(math.expm1(stats.t.ppf(0.975, 3) * se), rel=1e-9)
    assert est.converged == (est.half_width <= 0.01)


def test_the_timer_calls_of_two_epochs():
    """Each epoch: fresh closures, the baseline's warm-up call, then fn's, then fn-first and
    baseline-first repeats in turn; so at each epoch's start fn's first timed block follows
    its own call."""
    log = []

    def timer(fn, number):
        log.append((fn.tag, number))
        return 1e-3 * number

    O.measure_fresh_ratio(lambda: Closure("a"), lambda: Closure("b"), epoch=4, min_repeats=8,
                          max_repeats=8, target=1.0, block_s=2e-3, timer=timer,
                          clock=lambda: 0.0)
    calls = [tag if number == 2 else tag.upper() for tag, number in log]
    epoch = ["B", "A", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert calls == ["B", "B", "A", "A", *epoch, *epoch]  # calibration, then two epochs


def test_budget_ends_the_plan_after_two_epochs_at_least():
    """A budget spent during a pilot of 8 epochs ends it after the second; after the pilot it
    ends the plan; either way the interval is over whole epochs."""
    est = fresh(Machine({}, 5, sigma=0.5), target=1e-3, min_repeats=80, max_repeats=100_000,
                budget_s=1e-6)
    assert est.epochs == 2 and est.n == 20 and not est.converged and est.stopped == "budget"
    est = fresh(Machine({}, 5, sigma=0.5), target=1e-3, min_repeats=20, max_repeats=100_000,
                budget_s=1.0)  # an epoch takes about 0.3 s here
    assert est.epochs > 2 and est.n == 10 * est.epochs and est.stopped == "budget"


def test_max_repeats_caps_the_epochs():
    est = fresh(Machine({}, 6, sigma=0.5), target=1e-3, min_repeats=20, max_repeats=45)
    assert est.epochs == 4 and est.n == 40 and est.stopped == "cap"
    est = fresh(Machine({}, 6, sigma=0.5), target=1e-3, min_repeats=20, max_repeats=20)
    assert est.epochs == 2 and est.stopped == "cap"


def test_batch_means_are_disjoint_blocks():
    rng = np.random.default_rng(1)
    logs = rng.standard_normal(60)
    se, blocks = RI.block_se(logs, 10, overlap=False)
    means = logs.reshape(6, 10).mean(axis=1)
    assert blocks == 6 and se == pytest.approx(means.std(ddof=1) / math.sqrt(6), rel=1e-12)
    with pytest.raises(ValueError, match="logs"):
        RI.block_se(logs[:55], 10, overlap=False)
    with pytest.raises(ValueError, match="block"):
        RI.log_ratio_interval(np.exp(logs[:55]), np.ones(55), block=10, overlap=False)


def test_bad_arguments_name_themselves():
    m = Machine({"a": 1e-3, "b": 1e-3}, 0)
    for kw, name in (({"epoch": 3}, "epoch"), ({"epoch": 0}, "epoch"),
                     ({"target": 0.0}, "target"), ({"min_repeats": 1}, "min_repeats"),
                     ({"max_repeats": 1}, "max_repeats"), ({"max_repeats": 15}, "max_repeats"),
                     ({"min_repeats": 10, "max_repeats": 15}, "max_repeats"),
                     ({"budget_s": -1.0}, "budget_s")):
        with pytest.raises(ValueError, match=name):
            O.measure_fresh_ratio(lambda: Closure("a"), lambda: Closure("b"), timer=m.timer,
                                  clock=m.clock, **kw)
    with pytest.raises(ValueError, match="spacer"):
        O.fwdbwd_call("scaled_dot", (), {}, spacer=-1)
