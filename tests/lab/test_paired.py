"""Paired comparisons: the statistics agree with scipy, and the reading of an interval flips on
opposite data and stays inconclusive on data with no effect."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnscale.lab.interval import Comparison, Interval
from attnscale.lab.paired import (
    EQUAL,
    GREATER,
    INCONCLUSIVE,
    LESS,
    NOT_MEASURABLE,
    classify,
    compare_family,
    holm,
    holm_interval,
    no_spread,
    no_worse_pvalues,
    one_sided_t,
    paired_differences,
    paired_effect,
    reading_pvalues,
    seeds_to_decide,
)


def arms(diff: float, noise: float, n: int = 5, seed: int = 0, shared: float = 1.0):
    """Two arms over n seeds: a shared per-seed level (what pairing removes) plus noise."""
    rng = np.random.default_rng(seed)
    level = rng.normal(3.0, shared, n)
    a = {s: level[s] + diff + rng.normal(0, noise) for s in range(n)}
    b = {s: level[s] + rng.normal(0, noise) for s in range(n)}
    return a, b


def test_t_interval_and_p_value_match_scipy():
    a, b = arms(0.1, 0.05)
    eff = paired_effect(a, b, confidence=0.9)
    xa, xb = np.array([a[s] for s in range(5)]), np.array([b[s] for s in range(5)])
    ci = stats.ttest_rel(xa, xb).confidence_interval(0.9)
    assert eff.lo == pytest.approx(ci.low) and eff.hi == pytest.approx(ci.high)
    assert eff.p == pytest.approx(stats.ttest_rel(xa, xb).pvalue)
    assert eff.mean == pytest.approx(float(np.mean(xa - xb))) and eff.n == 5


def test_bootstrap_interval_matches_scipy():
    a, b = arms(0.1, 0.05, n=8)
    eff = paired_effect(a, b, method="bootstrap", seed=3)
    d = paired_differences(a, b)
    ref = stats.bootstrap((d,), np.mean, n_resamples=9999, method="BCa",
                          random_state=np.random.default_rng(3)).confidence_interval
    assert (eff.lo, eff.hi) == pytest.approx((ref.low, ref.high))


def test_holm_matches_the_step_down_definition():
    p = [0.01, 0.04, 0.03, 0.2]
    # sorted: 0.01·4 = 0.04, 0.03·3 = 0.09, 0.04·2 = 0.08 -> 0.09 (monotone), 0.2·1 = 0.2
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    # Holm controls the family-wise error, so it is never below Benjamini-Hochberg's adjustment
    assert all(h >= q for h, q in zip(holm(p), stats.false_discovery_control(p), strict=True))
    with pytest.raises(ValueError, match="pvalues"):
        holm([0.5, 1.5])


def test_pairing_removes_the_shared_variance():
    """The same difference is found with a tight interval although the arms' levels vary."""
    a, b = arms(0.2, 0.01, shared=5.0)
    eff = paired_effect(a, b)
    assert eff.lo > 0.15 and eff.hi < 0.25
    assert classify(eff, smallest=0.05) == GREATER


def test_classify_flips_on_opposite_data():
    a, b = arms(0.3, 0.02)
    assert classify(paired_effect(a, b), 0.05) == GREATER
    assert classify(paired_effect(b, a), 0.05) == LESS


def test_equal_needs_the_whole_interval_inside_the_margin():
    a, b = arms(0.0, 0.001)
    assert classify(paired_effect(a, b), 0.05) == EQUAL


@pytest.mark.parametrize("seed", range(20))
def test_no_effect_with_realistic_noise_is_inconclusive(seed):
    """Both arms from one distribution, noise as large as the smallest real effect, 5 seeds:
    the interval straddles ±δ, so no verdict is read."""
    a, b = arms(0.0, 0.05, seed=seed)
    assert classify(paired_effect(a, b), 0.05) == INCONCLUSIVE


def test_too_few_seeds_and_bad_arguments():
    with pytest.raises(ValueError, match="at least 3 shared seeds"):
        paired_differences({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0, 2: 0.0})
    with pytest.raises(ValueError, match="finite"):
        paired_differences({0: 1.0, 1: 2.0, 2: float("nan")}, {0: 1.0, 1: 2.0, 2: 0.0})
    a, b = arms(0.1, 0.05)
    with pytest.raises(ValueError, match="method"):
        paired_effect(a, b, method="z")
    with pytest.raises(ValueError, match="confidence"):
        paired_effect(a, b, confidence=1.5)
    with pytest.raises(ValueError, match="at least 8 paired seeds"):
        paired_effect(a, b, method="bootstrap")


def test_constant_difference_is_a_point_and_not_measurable():
    eff = paired_effect({s: s + 1.0 for s in range(4)}, {s: float(s) for s in range(4)})
    assert (eff.lo, eff.mean, eff.hi) == (1.0, 1.0, 1.0) and math.isnan(eff.p)
    assert classify(eff, 0.5) == NOT_MEASURABLE


@pytest.mark.parametrize("diff", [-0.3, -0.06, 0.0, 0.04, 0.07, 0.3])
@pytest.mark.parametrize("seed", range(5))
def test_one_comparison_reads_as_its_interval(diff, seed):
    """With a family of one, the Holm reading is exactly the 95% interval's reading."""
    a, b = arms(diff, 0.03, seed=seed)
    (only,) = compare_family({"x": (a, b)}, smallest=0.05).values()
    assert only.reading == classify(paired_effect(a, b), 0.05)


def test_reading_pvalues_match_scipy_one_sided_tests():
    a, b = arms(0.08, 0.03)
    d = paired_differences(a, b)
    ps = reading_pvalues(a, b, 0.05)
    assert ps[GREATER] == pytest.approx(stats.ttest_1samp(d, 0.05, alternative="greater").pvalue)
    assert ps[LESS] == pytest.approx(stats.ttest_1samp(d, -0.05, alternative="less").pvalue)
    tost = max(stats.ttest_1samp(d, -0.05, alternative="greater").pvalue,
               stats.ttest_1samp(d, 0.05, alternative="less").pvalue)
    assert ps[EQUAL] == pytest.approx(tost)


@pytest.mark.parametrize("n", [2, 3, 6, 10, 40])
def test_the_one_sided_t_test_is_scipys_ttest_1samp(n):
    rng = np.random.default_rng(n)
    for _ in range(50):
        d = rng.normal(rng.normal(0, 0.1), rng.uniform(0.001, 0.3), size=n)
        mu = float(rng.normal(0, 0.1))
        for side in ("greater", "less"):
            want = stats.ttest_1samp(d, mu, alternative=side).pvalue
            assert one_sided_t(d, mu, side) == pytest.approx(want, rel=1e-12, abs=1e-300)
    with pytest.raises(ValueError, match="alternative"):
        one_sided_t(np.array([0.1, 0.2]), 0.0, "two-sided")
    for flat in (np.array([0.1]), np.array([0.3, 0.3, 0.3])):
        with pytest.raises(ValueError, match="spread"):
            one_sided_t(flat, 0.0, "greater")


def test_holm_across_a_family_withholds_a_borderline_reading():
    """A reading that stands alone (p just under 0.025) is withheld among many comparisons."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        a, b = arms(0.1, 0.04, seed=int(rng.integers(1 << 30)))
        p = reading_pvalues(a, b, 0.05)[GREATER]
        if 0.005 < p < 0.025:
            break
    else:
        pytest.fail("no borderline draw found")
    alone = compare_family({"x": (a, b)}, 0.05)["x"]
    # four undecidable comparisons beside it
    others = {f"y{i}": arms(0.0, 0.2, seed=100 + i) for i in range(4)}
    family = compare_family({"x": (a, b), **others}, 0.05)
    assert alone.reading == GREATER and family["x"].reading == INCONCLUSIVE
    mins = [min(reading_pvalues(*ab, 0.05).values()) for ab in [(a, b), *others.values()]]
    assert family["x"].p_holm == pytest.approx(holm(mins)[0]) and family["x"].p_holm > p


def test_family_flips_on_opposite_data_and_stays_inconclusive_without_effect():
    a, b = arms(0.3, 0.02)
    assert compare_family({"x": (b, a)}, 0.05)["x"].reading == LESS
    for seed in range(10):
        a, b = arms(0.0, 0.05, seed=seed)
        assert compare_family({"x": (a, b)}, 0.05)["x"].reading == INCONCLUSIVE
    with pytest.raises(ValueError, match="pairs"):
        compare_family({}, 0.05)


def test_non_inferiority_matches_scipy_and_the_interval_bound():
    """not_greater: H0 mean d ≥ δ, one-sided; it holds at level 0.025 exactly when the 95%
    t-interval's upper bound lies below +δ, and flips on mirrored data to not_less."""
    for seed in range(20):
        a, b = arms(0.01, 0.03, seed=seed)
        d = paired_differences(a, b)
        ps = no_worse_pvalues(a, b, 0.05)
        assert ps["not_greater"] == pytest.approx(
            stats.ttest_1samp(d, 0.05, alternative="less").pvalue, rel=1e-12)
        assert ps["not_less"] == pytest.approx(
            stats.ttest_1samp(d, -0.05, alternative="greater").pvalue, rel=1e-12)
        only = compare_family({"x": (a, b)}, 0.05)["x"]
        assert only.not_greater == (paired_effect(a, b).hi < 0.05)
        assert compare_family({"x": (b, a)}, 0.05)["x"].not_less == only.not_greater


def test_non_inferiority_is_weaker_than_equal_and_needs_no_lower_bound():
    """A clearly better arm with a wide interval is 'no worse' though not 'equal'; a worse one
    is never 'no worse'; no effect with large noise is neither."""
    a, b = arms(-0.2, 0.1, n=6, seed=3)
    c = compare_family({"x": (a, b)}, 0.05)["x"]
    assert c.not_greater and c.reading in (LESS, INCONCLUSIVE) and not c.not_less
    a, b = arms(0.3, 0.02)
    assert not compare_family({"x": (a, b)}, 0.05)["x"].not_greater
    a, b = arms(0.0, 0.3, seed=4)
    c = compare_family({"x": (a, b)}, 0.05)["x"]
    assert not c.not_greater and not c.not_less


def test_seeds_to_decide_is_the_least_n_whose_interval_clears_delta():
    """At the measured mean and sd, n seeds decide when t_{n−1}(1 − α)·sd/√n < ||m| − δ|; the
    figure is the least such n (checked against scipy by hand), None on the boundary."""
    a, b = arms(0.06, 0.03, seed=2)
    c = compare_family({"x": (a, b)}, 0.05)["x"]
    d = paired_differences(a, b)
    need = seeds_to_decide(d, 0.05, 0.025)
    if c.reading == INCONCLUSIVE:
        assert c.seeds_to_decide == need
    margin, sd = abs(abs(d.mean()) - 0.05), d.std(ddof=1)
    half = lambda n: stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)  # noqa: E731
    assert half(need) < margin <= half(need - 1) or need == len(d)
    assert seeds_to_decide(np.array([0.05, 0.04, 0.06]), 0.05, 0.025) is None  # on +δ
    assert seeds_to_decide(np.full(3, 0.2), 0.05, 0.025) is None  # no spread: nothing to plan
    assert compare_family({"x": arms(0.3, 0.02)}, 0.05)["x"].seeds_to_decide is None  # decided


def test_all_zero_differences_are_not_measurable_and_leave_the_holm_family():
    """Two arms identical seed by seed (e.g. a clip that never acted): no spread, so no test and
    no planning figure; the family's measurable comparison keeps the p_holm it has alone."""
    same = {s: 3.0 + 0.1 * s for s in range(5)}
    a, b = arms(0.045, 0.01, seed=6)
    alone = compare_family({"x": (a, b)}, 0.05)["x"]
    family = compare_family({"x": (a, b), "zero": (same, dict(same))}, 0.05)
    zero = family["zero"]
    assert zero.reading == NOT_MEASURABLE and not zero.measurable() and not zero.decided()
    assert zero.seeds_to_decide is None and not zero.not_greater and not zero.not_less
    assert math.isnan(zero.p) and math.isnan(zero.p_holm)
    assert (zero.lo, zero.mean, zero.hi) == (0.0, 0.0, 0.0) == (zero.lo_holm, 0.0, zero.hi_holm)
    assert zero.why == "every seed's difference is +0 (the arms are identical)"
    assert 0 < alone.p_holm < 0.5  # a family of two measurable ones would double it
    assert family["x"].p_holm == alone.p_holm and family["x"].reading == alone.reading
    assert family["x"].model_dump() == alone.model_dump()
    assert list(family) == ["x", "zero"]


@pytest.mark.parametrize("delta", [0.01, 0.03125, 0.5])
def test_identical_nonzero_differences_are_not_measurable(delta):
    """Every seed moved by +0.03125 (past, on or inside ±δ): not measurable, never equal or
    greater however many seeds agree; the p-value readers refuse such differences."""
    b = {s: 1.0 + s for s in range(8)}
    a = {s: v + 0.03125 for s, v in b.items()}
    (c,) = compare_family({"x": (a, b)}, delta).values()
    assert c.reading == NOT_MEASURABLE and c.seeds_to_decide is None
    assert c.mean == pytest.approx(0.03125) and c.lo == c.hi == c.mean
    assert c.why == "every seed's difference is +0.0312"
    assert c.effect("nats") == "+0.0312 nats: not measurable — every seed's difference is +0.0312"
    for reader in (reading_pvalues, no_worse_pvalues):
        with pytest.raises(ValueError, match="not measurable"):
            reader(a, b, delta)
    with pytest.raises(ValueError, match="no spread"):
        holm_interval(a, b, 0.01, 0.02)


def test_a_family_of_only_unmeasurable_comparisons():
    same = {s: float(s) for s in range(3)}
    read = compare_family({"x": (same, same), "y": ({s: v + 1 for s, v in same.items()}, same)},
                          0.05)
    assert [c.reading for c in read.values()] == [NOT_MEASURABLE] * 2


def test_a_tiny_spread_is_measurable():
    """Differences 0.1, 0.1 + 1e-9, 0.1: a spread of ~6e-10, far above float rounding, so the
    t-test reads them (a real, if absurdly precise, effect past δ)."""
    b = {0: 1.0, 1: 2.0, 2: 3.0}
    d = [0.1, 0.1 + 1e-9, 0.1]
    a = {s: b[s] + d[s] for s in b}
    x = paired_differences(a, b)
    assert not no_spread(x)
    c = compare_family({"x": (a, b)}, 0.05)["x"]
    assert c.measurable() and c.reading == GREATER and c.decided()
    assert c.p == pytest.approx(stats.ttest_1samp(x, 0.0).pvalue)
    assert c.p_holm == pytest.approx(stats.ttest_1samp(x, 0.05, alternative="greater").pvalue)
    assert c.lo < c.mean < c.hi


def test_paired_effect_is_the_one_interval_type():
    """paired_effect returns an Interval, compare_family a Comparison (an Interval), and both
    dump to the field names report.json reads."""
    a, b = arms(0.1, 0.05)
    eff = paired_effect(a, b)
    assert isinstance(eff, Interval) and eff.method == "t" and eff.confidence == 0.95
    assert set(eff.model_dump()) == {"mean", "lo", "hi", "n", "confidence", "p", "method"}
    assert set(Interval.of([1.0, 2.0]).model_dump()) == {"mean", "lo", "hi", "n", "confidence"}
    c = compare_family({"x": (a, b)}, 0.05)["x"]
    assert isinstance(c, Comparison) and isinstance(c, Interval)
    assert set(c.model_dump()) == {
        "mean", "lo", "hi", "n", "confidence", "p", "method", "reading", "p_holm", "smallest",
        "lo_holm", "hi_holm", "confidence_holm", "not_greater", "not_less", "seeds_to_decide",
        "why"}
    assert Comparison.model_validate(c.model_dump()) == c


def test_holm_matches_statsmodels_when_installed():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    p = [0.01, 0.04, 0.03, 0.2, 0.001]
    assert holm(p) == pytest.approx(multitest.multipletests(p, method="holm")[1].tolist())
