"""Paired comparisons: the statistics agree with scipy, and the reading of an interval flips on
opposite data and stays inconclusive on data with no effect."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from attnscale.lab.paired import (
    EQUAL,
    GREATER,
    INCONCLUSIVE,
    LESS,
    classify,
    compare_family,
    holm,
    no_worse_pvalues,
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
    assert eff.low == pytest.approx(ci.low) and eff.high == pytest.approx(ci.high)
    assert eff.p == pytest.approx(stats.ttest_rel(xa, xb).pvalue)
    assert eff.mean == pytest.approx(float(np.mean(xa - xb))) and eff.n == 5


def test_bootstrap_interval_matches_scipy():
    a, b = arms(0.1, 0.05, n=8)
    eff = paired_effect(a, b, method="bootstrap", seed=3)
    d = paired_differences(a, b)
    ref = stats.bootstrap((d,), np.mean, n_resamples=9999, method="BCa",
                          random_state=np.random.default_rng(3)).confidence_interval
    assert (eff.low, eff.high) == pytest.approx((ref.low, ref.high))


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
    assert eff.low > 0.15 and eff.high < 0.25
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


def test_constant_difference_has_a_zero_width_interval():
    eff = paired_effect({s: s + 1.0 for s in range(4)}, {s: float(s) for s in range(4)})
    assert (eff.low, eff.mean, eff.high) == (1.0, 1.0, 1.0)
    assert classify(eff, 0.5) == GREATER


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
        assert only.not_greater == (paired_effect(a, b).high < 0.05)
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
    assert seeds_to_decide(np.full(3, 0.2), 0.05, 0.025) == 6  # sign test: 2⁻⁶ < 0.025
    assert compare_family({"x": arms(0.3, 0.02)}, 0.05)["x"].seeds_to_decide is None  # decided
