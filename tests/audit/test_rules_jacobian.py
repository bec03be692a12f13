"""The C10 rule, decided from the law of the row Jacobian norm: the known answer of the
mathematics (the typical row vanishes exponentially, the RMS like s^(−1/2): depends), flips on
opposite shapes, says inconclusive on missing evidence, fails loudly when the Monte Carlo check
disagrees with the law, and its interval agrees with scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from attnscale.audit import rules_jacobian as R
from attnscale.audit import verdicts as V
from attnscale.measure import jacobian as J
from attnscale.measure import jacobian_law as L

NS = (64, 512, 4096)
KS = [10.0, 30.0, 100.0]


def curve(n, rows=4000):
    """A synthetic Monte Carlo curve on s/s_c in {0.03, 1, 3, 10}."""
    sc = math.sqrt(2 * math.log(n))
    ratios = [0.03, 1.0, 3.0, 10.0]
    medians = [1 / math.sqrt(n), 0.3, 0.18, 5e-4]
    return {"n": n, "s_c": sc, "rows": rows, "s": [r * sc for r in ratios],
            "median": medians, "q1": [m / 10 for m in medians], "q3": [0.07] * 4,
            "frac_below_1e-3": [0.0, 0.0, 0.1, 0.5], "rms": [0.0156, 0.27, 0.26, 0.16],
            "uniform_limit": J.uniform_jacobian_norm(n)}


def law(n, median, rms, check=(None, None, 0.1, 0.5)):
    """A synthetic law: ``median`` and ``rms`` are functions of k = s/s_c."""
    return {"n": n, "k": KS, "median": [median(k) for k in KS], "rms": [rms(k) for k in KS],
            "frac": [0.5, 0.8, 0.93], "k_half": 10.0, "check_frac": list(check)}


def evidence(median, rms, **kw):
    return {"curves": [curve(n) for n in NS], "law": [law(n, median, rms, **kw) for n in NS]}


def exponential(k):
    return 2.0 * 2.0 ** -k


def power(k):
    return 0.5 * k ** -0.5


def test_shapes_of_exact_decays():
    """Identities: any power law k^(−a) has slope ratio 1; any exponential e^(−bk) has the
    closed-form ratio ((100 − 30)/ln(10/3)) / ((30 − 10)/ln 3) = 3.19."""
    for a in (0.25, 0.5, 2.0):
        kind, ratio = R.shape(KS, [k ** -a for k in KS])
        assert kind == R.POWER and ratio == pytest.approx(1.0, rel=1e-12)
    for b in (0.05, 0.7, 3.0):
        kind, ratio = R.shape(KS, [math.exp(-b * k) for k in KS])
        assert kind == R.EXPONENTIAL and ratio == pytest.approx(L.exponential_ratio(), 1e-12)
    assert L.exponential_ratio() == pytest.approx((70 / math.log(10 / 3)) / (20 / math.log(3)))
    assert R.shape(KS, [1.0, 1.0, 1.0])[0] == R.POWER  # flat: no decay at all


def test_flips_on_opposite_shapes():
    assert R.judge_c10(evidence(exponential, exponential)).verdict == V.SUPPORTED
    dep = R.judge_c10(evidence(exponential, power))
    assert dep.verdict == V.DEPENDS and dep.plain[0].startswith("Right for the typical row")
    ref = R.judge_c10(evidence(power, power))
    assert ref.verdict == V.REFUTED and ref.plain[0].startswith("Wrong")
    assert ref.headline.startswith("refuted") and dep.headline.startswith("depends")


def test_missing_law_is_named_and_inconclusive():
    ev = evidence(exponential, power)
    ev["law"] = ev["law"][:2]
    v = R.judge_c10(ev)
    assert v.verdict == V.INCONCLUSIVE and "no law for n=[4096]" in v.because
    del ev["law"]
    assert R.judge_c10(ev).verdict == V.INCONCLUSIVE


def test_a_monte_carlo_disagreement_is_a_bug_not_a_verdict():
    """The law says 90% of rows below 1e-3 at 10·s_c where 4000 simulated rows say 50%."""
    ev = evidence(exponential, power, check=(None, None, 0.1, 0.9))
    with pytest.raises(ValueError, match="theory and simulation disagree"):
        R.judge_c10(ev)
    within = evidence(exponential, power, check=(None, None, 0.11, 0.52))
    assert R.judge_c10(within).numbers["per_n"][0]["mc_gap"] == pytest.approx(0.02)


def test_gap_law_matches_simulation_and_its_closed_forms():
    """P(top1 − top2 > g) by quadrature against 20,000 simulated rows (Wilson 99.9%); the
    two-key identity ‖J‖_F = ½·sech²(Δ/2) against the row norm itself; Δ_θ's closed form."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.standard_normal((20000, 64)), axis=1)
    gaps = x[:, -1] - x[:, -2]
    for g in (0.05, 0.2, 0.5):
        lo, hi = R.wilson_interval(float(np.mean(gaps > g)), gaps.size, 0.999)
        assert lo <= L.gap_survival(64, g) <= hi
    assert L.gap_survival(64, 0.0) == pytest.approx(1.0, abs=1e-9)
    assert L.gap_survival(64, L.gap_quantile(64, 0.5)) == pytest.approx(0.5, abs=1e-9)
    for d in (0.0, 1.0, 7.6, 30.0):
        z = np.array([[0.0, -d]])
        assert L.two_key_norm(d) == pytest.approx(float(J.row_jacobian_norms(z)[0]), rel=1e-12)
    assert L.two_key_norm(L.two_key_gap(1e-3)) == pytest.approx(1e-3, rel=1e-12)
    assert L.two_key_gap(1e-3) == pytest.approx(7.5999, abs=1e-4)


def test_large_n_limit_of_the_vanished_fraction():
    """s_c·G → Exp(1) as n grows, so the fraction below θ at s = 10·s_c tends to
    exp(−Δ_θ/10), slowly (the Gumbel limit's error falls like 1/ln n): 0.057 off at n = 64,
    0.033 at 4096, 0.022 at 2^20."""
    d = L.two_key_gap(1e-3)
    off = [L.gap_survival(n, d / (10 * math.sqrt(2 * math.log(n)))) - math.exp(-d / 10)
           for n in (64, 4096, 2**20)]
    assert off[0] > off[1] > off[2] > 0 and off[2] < 0.025


@given(rows=st.integers(1, 5000), k=st.integers(0, 5000),
       conf=st.sampled_from([0.9, 0.95, 1 - 0.05 / 3, 0.99]))
def test_wilson_agrees_with_scipy(rows, k, conf):
    k = min(k, rows)
    ci = binomtest(k, rows).proportion_ci(confidence_level=conf, method="wilson")
    lo, hi = R.wilson_interval(k / rows, rows, conf)
    assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)


def test_wilson_rejects_bad_arguments():
    with pytest.raises(ValueError, match="confidence"):
        R.wilson_interval(0.5, 10, 1.0)
    with pytest.raises(ValueError, match="rows"):
        R.wilson_interval(0.5, 0)


def test_trained_saturation_enters_the_last_sentence():
    ev = evidence(exponential, power)
    theory_only = R.judge_c10(ev)
    assert "theory alone" in theory_only.plain[2] and "no trained" in theory_only.regime
    ev["trained"] = {"dot": {"saturated_fraction": {"mean": 0.62, "lo": 0.55, "hi": 0.69,
                                                    "n": 3}},
                     "scaled_dot": {"saturated_fraction": {"mean": 0.21, "lo": 0.18,
                                                           "hi": 0.24, "n": 3}}}
    v = R.judge_c10(ev)
    assert "0.62 [0.55, 0.69]" in v.plain[2] and "0.21 [0.18, 0.24]" in v.plain[2]
    assert v.verdict == theory_only.verdict  # trained data informs, theory decides


def test_smallest_and_regime_are_stated():
    v = R.judge_c10(evidence(exponential, power))
    assert "1e-3" in v.smallest and "124×" in v.smallest and "16×" in v.smallest
    assert "3.19" in v.smallest and "1.79" in v.smallest
    assert "n = 64, 512, 4096" in v.regime


def test_on_measured_data_the_known_answer_is_depends():
    """End to end on a small real measurement: the typical row vanishes exponentially, the RMS
    falls like s^(−1/2) (the mathematics' answer), and the simulation agrees with the law."""
    ev = J.standard_measurement(ns=(64,), rows=600, points=8)
    v = R.judge_c10(ev)
    r = v.numbers["per_n"][0]
    assert v.verdict == V.DEPENDS, v.because
    assert r["rms_slope"] == pytest.approx(-0.5, abs=0.05)
    assert r["median_ratio"] == pytest.approx(L.exponential_ratio(), abs=0.05)
    assert r["mc_gap"] < 0.06


def test_rejects_empty_evidence():
    with pytest.raises(ValueError, match="curves"):
        R.judge_c10({"curves": []})
