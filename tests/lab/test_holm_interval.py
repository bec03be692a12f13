"""The Holm interval of a comparison (what the forest plots draw): its position against ±δ is
the comparison's reading, it agrees with scipy's t-interval at its level, and it flips with the
data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from attnscale.lab.interval import Interval
from attnscale.lab.paired import (
    INCONCLUSIVE,
    NOT_MEASURABLE,
    classify,
    compare_family,
    holm_interval,
    no_spread,
    paired_differences,
    paired_effect,
    reading_pvalues,
)


def arms(diff: float, noise: float, n: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    level = rng.normal(3.0, 1.0, n)
    return ({s: level[s] + diff + rng.normal(0, noise) for s in range(n)},
            {s: level[s] + rng.normal(0, noise) for s in range(n)})


def as_effect(c) -> Interval:
    """A comparison's Holm interval as an Interval of its own."""
    return Interval(mean=c.mean, lo=c.lo_holm, hi=c.hi_holm, n=c.n, confidence=c.confidence_holm)


def test_a_family_of_one_draws_the_plain_95_interval():
    a, b = arms(0.08, 0.03)
    c = compare_family({"x": (a, b)}, 0.05)["x"]
    e = paired_effect(a, b)
    assert c.confidence_holm == pytest.approx(0.95)
    assert (c.lo_holm, c.hi_holm) == pytest.approx((e.lo, e.hi), rel=1e-12)


def test_holm_interval_matches_scipy_at_its_level():
    family = {f"x{i}": arms(0.02 * i, 0.03, seed=i) for i in range(5)}
    read = compare_family(family, 0.05)
    for k, (a, b) in family.items():
        c = read[k]
        best = min(reading_pvalues(a, b, 0.05).values())
        level = 1 - 0.05 * best / c.p_holm
        assert c.confidence_holm == pytest.approx(level)
        ci = stats.ttest_1samp(paired_differences(a, b), 0.0).confidence_interval(level)
        assert (c.lo_holm, c.hi_holm) == pytest.approx((ci.low, ci.high), rel=1e-9)
        e = paired_effect(a, b)  # never narrower than the unadjusted interval
        assert c.lo_holm <= e.lo + 1e-12 and c.hi_holm >= e.hi - 1e-12


def test_holm_interval_flips_on_opposite_data():
    a, b = arms(0.3, 0.02)
    fwd = compare_family({"x": (a, b), "y": arms(0.0, 0.1, seed=3)}, 0.05)["x"]
    rev = compare_family({"x": (b, a), "y": arms(0.0, 0.1, seed=3)}, 0.05)["x"]
    assert (rev.lo_holm, rev.hi_holm) == pytest.approx((-fwd.hi_holm, -fwd.lo_holm))
    assert classify(as_effect(fwd), 0.05) != classify(as_effect(rev), 0.05)


def test_no_effect_gives_an_interval_across_the_margin():
    for seed in range(10):
        c = compare_family({"x": arms(0.0, 0.05, seed=seed), "y": arms(0.0, 0.05, seed=50 + seed)},
                           0.05)["x"]
        assert c.reading == INCONCLUSIVE
        assert classify(as_effect(c), 0.05) == INCONCLUSIVE


def test_holm_interval_edge_cases():
    a, b = {0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 1.0, 2: 2.0}
    with pytest.raises(ValueError, match="no spread"):  # not measurable: no level to test at
        holm_interval(a, b, 0.1, 0.2)
    lo, hi, level = holm_interval(*arms(0.1, 0.03), 0.0, 0.0)  # p = p_holm = 0: plain level
    assert level == pytest.approx(0.95) and lo < hi


@given(diffs=st.lists(st.floats(-0.3, 0.3), min_size=1, max_size=5),
       noise=st.floats(0.005, 0.2), n=st.integers(3, 8), seed=st.integers(0, 2**16),
       delta=st.floats(0.01, 0.2))
def test_the_holm_interval_reads_as_the_holm_reading(diffs, noise, n, seed, delta):
    """Exactly, up to float ties: where the interval lies against ±δ is the reading."""
    family = {f"c{i}": arms(d, noise, n=n, seed=seed + i) for i, d in enumerate(diffs)}
    for k, c in compare_family(family, delta).items():
        if no_spread(paired_differences(*family[k])):
            assert c.reading == NOT_MEASURABLE == classify(as_effect(c), delta)
            continue
        ties = min(abs(abs(x) - delta) for x in (c.lo_holm, c.hi_holm))
        if ties < 1e-9 * max(1.0, delta) or not math.isfinite(c.lo_holm):
            continue
        assert classify(as_effect(c), delta) == c.reading
