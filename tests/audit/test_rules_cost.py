"""The C5 cost rule flips with the evidence, is inconclusive on noise, and its per-N decision
agrees with scipy's t-test on the log ratios."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnscale.audit import rules_cost as R
from attnscale.measure import overhead as O


def est(ratio, half=0.01, converged=True):
    """A ratio with a symmetric (on the log scale) interval of relative half-width ``half``."""
    return {"ratio": ratio, "lo": ratio * math.exp(-half), "hi": ratio * math.exp(half),
            "n": 30, "converged": converged, "se_log": half / 2.0}


def evidence(ratios, floors=None, half=0.01, converged=None):
    ns = (256, 1024, 4096)[:len(ratios)]
    floors = floors or [1.0] * len(ratios)
    converged = converged or [True] * len(ratios)
    rows = [{"n": n, "batch": 1, "heads": 1, "cosine": est(r, half, c), "floor": est(f, 0.005)}
            for n, r, f, c in zip(ns, ratios, floors, converged, strict=True)]
    fit = O.fit_inverse_n(ns, [r - 1 for r in ratios], [r * half / 2 for r in ratios])
    return {"rows": rows, "fit": fit, "threads": 2, "settings": {"head_dim": 64}}


def test_flips_between_overhead_and_none():
    yes = R.judge_c5(evidence([1.30, 1.20, 1.15]))
    assert yes.verdict == "supported" and yes.headline.startswith("supported: +30.0%")
    no = R.judge_c5(evidence([1.002, 0.998, 1.001]))
    assert no.verdict == "refuted" and no.headline == "refuted: within ±2.0% at every N"
    assert yes.regime == "CPU float32, forward+backward, D=64, 2 threads"


def test_small_overhead_is_called_small():
    v = R.judge_c5(evidence([1.08, 1.05, 1.04]))
    assert v.verdict == "supported" and v.headline.startswith("supported, small: +8.0% [")
    assert "N=256" in v.headline


def test_depends_when_the_overhead_vanishes_at_large_n():
    v = R.judge_c5(evidence([1.12, 1.03, 1.001]))
    assert v.verdict == "depends"
    assert v.headline.startswith("depends on N: +12.0%") and "N=4096" in v.headline
    assert v.numbers["by_n"]["1024"]["state"] == "undecided"  # 1.03 ± 1% straddles 1.02


def test_margin_comes_from_the_noise_floor():
    ev = evidence([1.04, 1.04, 1.04])
    assert R.judge_c5(ev).verdict == "supported"
    ev = evidence([1.04, 1.04, 1.04], floors=[1.0, 1.05, 1.0])  # floor off by 5% ± 0.5%
    v = R.judge_c5(ev)
    assert v.numbers["delta"] == pytest.approx(0.05 + 1.05 * math.expm1(0.005), rel=1e-6)
    assert v.verdict == "refuted" and "N=1024" in v.smallest and "5.5%" in v.smallest


def test_unconverged_straddling_measurement_is_inconclusive():
    ev = evidence([1.10, 1.03, 1.001], converged=[True, False, True])
    assert R.judge_c5(ev).verdict == "inconclusive"
    assert R.judge_c5(evidence([1.10, 1.03, 1.001])).verdict == "depends"


def noisy_row(n, seed):
    """cosine and baseline from one distribution, wide intervals (few repeats, 30% noise)."""
    rows = {}
    for i, key in enumerate(("cosine", "floor")):
        rng = np.random.default_rng(1000 * seed + i)

        def timer(fn, number, rng=rng):
            return number * 1e-3 * math.exp(0.3 * rng.standard_normal())

        rows[key] = O.measure_ratio(lambda: None, lambda: None, min_repeats=4, target=0.02,
                                    max_repeats=6, budget_s=1e9, timer=timer).to_dict()
    return {"n": n, "batch": 1, "heads": 1, **rows}


@pytest.mark.parametrize("seed", range(5))
def test_no_effect_with_wide_intervals_is_inconclusive(seed):
    ev = {"rows": [noisy_row(n, seed) for n in (256, 1024, 4096)], "fit": None, "threads": 2}
    v = R.judge_c5(ev)
    assert v.verdict == "inconclusive", v.because
    assert v.headline.startswith("inconclusive")


def test_plain_sentences_follow_the_numbers():
    a, b = R.judge_c5(evidence([1.08, 1.05, 1.04])), R.judge_c5(evidence([1.30, 1.20, 1.15]))
    assert a.plain != b.plain and len(a.plain) == len(b.plain) == 2
    assert "+8.0%" in a.plain[1] and "+4.0%" in a.plain[1] and "+30.0%" in b.plain[1]
    assert "falls" in a.plain[1] and "fit: overhead ≈ a + b/N" in a.plain[1]
    rising = R.judge_c5(evidence([1.04, 1.05, 1.08]))
    assert "did not fall" in rising.plain[1] and rising.plain[1].startswith("What it depends")
    assert R.judge_c5(evidence([1.0, 1.0, 1.0])).plain[0].startswith("Wrong as measured")


def test_per_n_decision_agrees_with_scipy_t_test():
    """"real" exactly when the one-sided t-test of mean ln r > ln(1 + δ) has p < 0.025 (the
    95% interval's lower end above 1 + δ)."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        mu, sd, n = rng.uniform(0.0, 0.08), rng.uniform(0.005, 0.05), int(rng.integers(5, 40))
        logs = mu + sd * rng.standard_normal(n)
        e = O.log_ratio_interval(np.exp(logs), np.ones(n))
        e["converged"] = True
        delta = 0.02
        p = stats.ttest_1samp(logs, math.log1p(delta), alternative="greater").pvalue
        assert (R.classify(e, delta) == "real") == (p < 0.025)
        inside = (stats.ttest_1samp(logs, math.log1p(delta), alternative="less").pvalue < 0.025
                  and stats.ttest_1samp(logs, math.log(1 - delta),
                                        alternative="greater").pvalue < 0.025)
        assert (R.classify(e, delta) == "absent") == inside


def test_empty_evidence_is_rejected():
    with pytest.raises(ValueError, match="ev"):
        R.judge_c5({"rows": []})


def test_a_wide_noise_floor_cannot_show_absence():
    """δ above 10%: a narrow cosine interval at 1.0 is undecided, not refuted."""
    ev = evidence([1.0, 1.0, 1.0], floors=[1.0, 1.15, 1.0])
    v = R.judge_c5(ev)
    assert v.numbers["delta"] > R.MAX_DELTA
    assert v.verdict == "inconclusive" and "too wide" in v.plain[0]
    assert R.judge_c5(evidence([1.30, 1.30, 1.30], floors=[1.0, 1.15, 1.0])).verdict == "supported"


def test_one_n_makes_no_claim_about_the_trend():
    v = R.judge_c5(evidence([1.08]))
    assert v.verdict == "supported" and "only N=256 was measured" in v.plain[1]
    assert "did not fall" not in v.plain[1] and "falls with N" not in v.plain[1]
