"""The C10 rule on the per-row Jacobian distribution: it flips on opposite data, is
inconclusive when the data cannot decide, its sentences follow the numbers, and its interval
agrees with scipy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from attnscale.audit import rules_jacobian as R
from attnscale.audit import verdicts as V
from attnscale.measure import jacobian as J

NS = (64, 512, 4096)


def curve(n, frac_end, median_end=None, rows=4000, top=10.0, frac_beyond=None):
    """A synthetic curve on s/s_c in {0.03, 1, 3, top}: the fraction of rows below 1e-3 rises
    to ``frac_end`` at the last scale; ``frac_beyond`` adds a scale at 20·s_c."""
    sc = math.sqrt(2 * math.log(n))
    ratios = [0.03, 1.0, 3.0, top] + ([20.0] if frac_beyond is not None else [])
    fracs = [0.0, 0.0, 0.1 * frac_end, frac_end] + ([frac_beyond] if frac_beyond else [])
    med_end = median_end if median_end is not None else (5e-4 if frac_end > 0.5 else 3e-2)
    medians = [1 / math.sqrt(n), 0.3, 0.18, med_end] + ([1e-6] if frac_beyond else [])
    k = len(ratios)
    return {"n": n, "s_c": sc, "rows": rows, "s": [r * sc for r in ratios],
            "median": medians, "q1": [m / 10 for m in medians], "q3": [0.07] * k,
            "frac_below_1e-3": fracs, "rms": [0.0156, 0.27, 0.26, 0.16, 0.1][:k],
            "uniform_limit": J.uniform_jacobian_norm(n)}


def evidence(fracs, **kw):
    return {"curves": [curve(n, f, **kw) for n, f in zip(NS, fracs, strict=True)]}


def test_flips_on_opposite_data():
    sup = R.judge_c10(evidence([0.8, 0.75, 0.7]))
    assert sup.verdict == V.SUPPORTED
    assert sup.headline.startswith("supported") and "70%" in sup.headline
    ref = R.judge_c10(evidence([0.2, 0.25, 0.3]))
    assert ref.verdict == V.REFUTED and "30%" in ref.headline
    assert [r["status"] for r in ref.numbers["per_n"]] == ["stays"] * 3


def test_n_that_disagree_give_depends():
    v = R.judge_c10(evidence([0.8, 0.5, 0.2]))
    assert v.verdict == V.DEPENDS
    assert "n=64" in v.headline and "n=4096" in v.headline


@pytest.mark.parametrize("ev", [
    evidence([0.5, 0.51, 0.49]),                                  # no effect: at the threshold
    evidence([0.5, 0.51, 0.49], rows=200),
    evidence([0.8, 0.8, 0.8], rows=None),                         # no row count: no interval
    evidence([0.1, 0.1, 0.1], top=3.0),                           # stops short of 10·s_c
    evidence([0.8, 0.5, 0.8]),                                    # one n undecided, none stays
])
def test_undecidable_data_is_inconclusive(ev):
    v = R.judge_c10(ev)
    assert v.verdict == V.INCONCLUSIVE, v.because
    assert v.headline.startswith("inconclusive")


def test_judged_at_the_largest_scale_within_ten_sc():
    """A scale past 10·s_c does not count: the claim is about s ≤ 10·s_c."""
    v = R.judge_c10(evidence([0.2, 0.2, 0.2], frac_beyond=0.95))
    assert v.verdict == V.REFUTED
    assert all(r["s_over_sc"] == pytest.approx(10.0) for r in v.numbers["per_n"])
    # a curve that vanishes before 10·s_c (largest scale 5·s_c) is supported
    assert R.judge_c10(evidence([0.9, 0.9, 0.9], top=5.0)).verdict == V.SUPPORTED


def test_bonferroni_over_n():
    """f = 0.525 with 2000 rows: the 95% interval clears 1/2, the 98.3% one (3 n) does not."""
    lo95, _ = R.wilson_interval(0.525, 2000, 0.95)
    lo98, _ = R.wilson_interval(0.525, 2000, 1 - 0.05 / 3)
    assert lo95 > 0.5 > lo98
    one = {"curves": [curve(64, 0.525, rows=2000)]}
    assert R.judge_c10(one).verdict == V.SUPPORTED
    three = evidence([0.525] * 3, rows=2000)
    assert R.judge_c10(three).verdict == V.INCONCLUSIVE


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


def test_plain_sentences_follow_the_numbers():
    a = R.judge_c10(evidence([0.8, 0.75, 0.7], median_end=4e-4))
    b = R.judge_c10(evidence([0.9, 0.85, 0.8], median_end=2e-5))
    assert a.verdict == b.verdict == V.SUPPORTED
    assert len(a.plain) == 3 and a.plain != b.plain
    assert "0.0004" in a.plain[0] and "2e-05" in b.plain[0] and "90%" in b.plain[0]
    assert a.plain[0].startswith("Right") and a.plain[1].startswith("Missing")
    assert "0.124" in a.plain[1] and "0.0156" in a.plain[1]  # √(n−1)/n at n = 64 and 4096
    assert "RMS 0.16 vs median 0.0004" in a.plain[1]
    assert a.plain[2].startswith("It depends on where the logits sit")
    r = R.judge_c10(evidence([0.2, 0.25, 0.3]))
    assert not r.plain[0].startswith("Right")


def test_trained_saturation_enters_the_depends_sentence():
    ev = evidence([0.8, 0.75, 0.7])
    theory_only = R.judge_c10(ev)
    assert "theory alone" in theory_only.plain[2] and "no trained" in theory_only.regime
    ev["trained"] = {"dot": {"saturated_fraction": {"mean": 0.62, "lo": 0.55, "hi": 0.69,
                                                    "n": 3}},
                     "scaled_dot": {"saturated_fraction": {"mean": 0.21, "lo": 0.18,
                                                           "hi": 0.24, "n": 3}}}
    v = R.judge_c10(ev)
    assert "0.62 [0.55, 0.69]" in v.plain[2] and "0.21 [0.18, 0.24]" in v.plain[2]
    assert v.verdict == theory_only.verdict  # trained data informs, theory decides
    ev["trained"] = None
    assert "theory alone" in R.judge_c10(ev).plain[2]


def test_smallest_and_regime_are_stated():
    v = R.judge_c10(evidence([0.8, 0.75, 0.7]))
    assert "1e-3" in v.smallest and "124×" in v.smallest and "16×" in v.smallest
    assert "n = 64, 512, 4096" in v.regime
    assert "upper quartile stays above 1e-3" in v.because


def test_on_measured_data():
    """End to end on a small real measurement: the rule reads what the module writes."""
    ev = J.standard_measurement(ns=(64,), rows=300, points=8)
    v = R.judge_c10(ev)
    r = v.numbers["per_n"][0]
    assert r["s_over_sc"] == pytest.approx(10.0) and r["rows"] == 300
    assert 0.3 < r["frac"] < 0.7 and r["rms"] > 0.1  # median near 1e-3, RMS not small
    assert v.verdict in V.VERDICTS


def test_rejects_empty_evidence():
    with pytest.raises(ValueError, match="curves"):
        R.judge_c10({"curves": []})
