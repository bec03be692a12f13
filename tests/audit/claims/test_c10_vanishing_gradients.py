"""C10, decided from the law of the row Jacobian norm: the known answer of the mathematics (the
typical row vanishes exponentially, the RMS like s^(−1/2): depends), flips on opposite shapes,
says inconclusive on missing evidence, fails loudly when the Monte Carlo check disagrees with
the law, its interval agrees with scipy, its sentences never read as another verdict, and its
figure is a print-quality PNG whose alt text states the finding."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest
from support import assert_reads_as, layouts, png_info

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Sources
from attnscale.audit.claims import c10_vanishing_gradients as M
from attnscale.audit.evidence import head_dim_evidence
from attnscale.audit.scale import study_scale
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.verdicts import MissingEvidence
from attnscale.measure import jacobian as J
from attnscale.measure import jacobian_law as L
from attnscale.util.jsonio import jsonable

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


def judge(ev):
    return M.CLAIM.decide(ev)


def test_shapes_of_exact_decays():
    """Identities: any power law k^(−a) has slope ratio 1; any exponential e^(−bk) has the
    closed-form ratio ((100 − 30)/ln(10/3)) / ((30 − 10)/ln 3) = 3.19."""
    for a in (0.25, 0.5, 2.0):
        kind, ratio = M.shape(KS, [k ** -a for k in KS])
        assert kind == M.POWER and ratio == pytest.approx(1.0, rel=1e-12)
    for b in (0.05, 0.7, 3.0):
        kind, ratio = M.shape(KS, [math.exp(-b * k) for k in KS])
        assert kind == M.EXPONENTIAL and ratio == pytest.approx(L.exponential_ratio(), 1e-12)
    assert L.exponential_ratio() == pytest.approx((70 / math.log(10 / 3)) / (20 / math.log(3)))
    assert M.shape(KS, [1.0, 1.0, 1.0])[0] == M.POWER  # flat: no decay at all
    with pytest.raises(ValueError, match="three scales"):  # a malformed law is a bug
        M.shape(KS[:2], [1.0, 0.5])
    with pytest.raises(ValueError, match="positive"):
        M.shape(KS, [1.0, 0.5, 0.0])


def test_flips_on_opposite_shapes():
    assert judge(evidence(exponential, exponential)).verdict == V.SUPPORTED
    dep = judge(evidence(exponential, power))
    assert dep.verdict == V.DEPENDS and dep.plain[0].startswith("Right for the typical row")
    ref = judge(evidence(power, power))
    assert ref.verdict == V.REFUTED and ref.plain[0].startswith("Wrong")
    assert ref.headline.startswith("refuted") and dep.headline.startswith("depends")


def test_missing_law_is_named_and_inconclusive():
    ev = evidence(exponential, power)
    ev["law"] = ev["law"][:2]
    v = judge(ev)
    assert v.verdict == V.INCONCLUSIVE and "no law for n=[4096]" in v.because
    del ev["law"]
    assert judge(ev).verdict == V.INCONCLUSIVE


def test_a_monte_carlo_disagreement_is_a_bug_not_a_verdict():
    """The law says 90% of rows below 1e-3 at 10·s_c where 4000 simulated rows say 50%."""
    ev = evidence(exponential, power, check=(None, None, 0.1, 0.9))
    with pytest.raises(ValueError, match="theory and simulation disagree"):
        judge(ev)
    within = evidence(exponential, power, check=(None, None, 0.11, 0.52))
    assert judge(within).numbers["per_n"][0].mc_gap == pytest.approx(0.02)


def test_a_curve_without_a_row_count_cannot_check_the_law():
    ev = evidence(exponential, power)
    del ev["curves"][0]["rows"]
    with pytest.raises(MissingEvidence, match="no row count"):
        judge(ev)


def test_gap_law_matches_simulation_and_its_closed_forms():
    """P(top1 − top2 > g) by quadrature against 20,000 simulated rows (Wilson 99.9%); the
    two-key identity ‖J‖_F = ½·sech²(Δ/2) against the row norm itself; Δ_θ's closed form."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.standard_normal((20000, 64)), axis=1)
    gaps = x[:, -1] - x[:, -2]
    for g in (0.05, 0.2, 0.5):
        lo, hi = M.wilson_interval(float(np.mean(gaps > g)), gaps.size, 0.999)
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
    lo, hi = M.wilson_interval(k / rows, rows, conf)
    assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)


def test_wilson_rejects_bad_arguments():
    with pytest.raises(ValueError, match="confidence"):
        M.wilson_interval(0.5, 10, 1.0)
    with pytest.raises(ValueError, match="rows"):
        M.wilson_interval(0.5, 0)


def test_trained_saturation_enters_the_last_sentence():
    ev = evidence(exponential, power)
    theory_only = judge(ev)
    assert "theory alone" in theory_only.plain[2] and "no trained" in theory_only.regime
    ev["trained"] = {"dot": {"saturated_fraction": {"mean": 0.62, "lo": 0.55, "hi": 0.69,
                                                    "n": 3}},
                     "scaled_dot": {"saturated_fraction": {"mean": 0.21, "lo": 0.18,
                                                           "hi": 0.24, "n": 3}}}
    v = judge(ev)
    assert "0.62 [0.55, 0.69]" in v.plain[2] and "0.21 [0.18, 0.24]" in v.plain[2]
    assert v.verdict == theory_only.verdict  # trained data informs, theory decides


def test_smallest_and_regime_are_stated():
    v = judge(evidence(exponential, power))
    assert "1e-3" in v.smallest and "124×" in v.smallest and "16×" in v.smallest
    assert "3.19" in v.smallest and "1.79" in v.smallest
    assert "n = 64, 512, 4096" in v.regime


def test_on_measured_data_the_known_answer_is_depends():
    """End to end on a small real measurement: the typical row vanishes exponentially, the RMS
    falls like s^(−1/2) (the mathematics' answer), and the simulation agrees with the law."""
    ev = J.standard_measurement(ns=(64,), rows=600, points=8)
    v = judge(ev)
    r = v.numbers["per_n"][0]
    assert v.verdict == V.DEPENDS, v.because
    assert r.rms_slope == pytest.approx(-0.5, abs=0.05)
    assert r.median_ratio == pytest.approx(L.exponential_ratio(), abs=0.05)
    assert r.mc_gap < 0.06
    typed = M.Evidence.model_validate(ev)  # every key the measurement writes is declared
    assert typed.curves[0].model_dump()["frac_below_1e-3"] == ev["curves"][0]["frac_below_1e-3"]


def test_rejects_empty_evidence():
    with pytest.raises(ValueError, match="curves"):
        judge({"curves": []})


def test_missing_fields_are_missing_evidence():
    with pytest.raises(MissingEvidence, match="curves"):
        judge({"law": []})
    ev = evidence(exponential, power)
    del ev["curves"][1]["frac_below_1e-3"]
    with pytest.raises(MissingEvidence, match="frac_below_1e-3"):
        judge(ev)


# ------------------------------------------- sentences never read as another verdict

CASES = {
    V.SUPPORTED: lambda: judge(evidence(exponential, exponential)),
    V.REFUTED: lambda: judge(evidence(power, power)),
    V.DEPENDS: lambda: judge(evidence(exponential, power)),
    V.INCONCLUSIVE: lambda: judge({"curves": [curve(64)]}),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(CASES[verdict](), verdict, "C10")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


# ------------------------------------------------------- gather, scale, measurement


def test_gather_scale_and_measurement():
    p = PRESETS["tiny"]
    plan = studies(p)
    dk = {"saturated_end": {"init=unit d_model=16": {
        "dot": {"values": {"0": 0.6, "1": 0.7, "2": 0.65}},
        "scaled_dot": {"values": {"0": 0.2, "1": 0.25, "2": 0.3}}}},
        "head_dims": [8, 16]}
    measured = evidence(exponential, power)
    src = Sources(preset=p, studies=plan, runs={}, measured={"jacobian": measured},
                  memo={("head_dim", head_dim_evidence): dk})
    ev = M.CLAIM.gather(src)
    assert ev["curves"] == measured["curves"] and ev["law"] == measured["law"]
    assert ev["trained"]["dot"]["saturated_fraction"]["mean"] == pytest.approx(0.65)
    assert set(ev["trained"]) == {"dot", "scaled_dot"}
    assert M.CLAIM.scale(p) == (f"{p.jacobian_rows} random rows per (n, s) and head_dim: "
                                f"{study_scale(plan['head_dim'])}")
    assert M.CLAIM.studies == ("head_dim",)
    (m,) = M.CLAIM.measurements
    assert m.kind == "jacobian" and m.params(p) == {"rows": p.jacobian_rows, "law": 1}


# ---------------------------------------------------------------------------- the figure


def jacobian_evidence() -> dict[str, Any]:
    curves = []
    for n in (64, 512):
        sc = math.sqrt(2 * math.log(n))
        s = [sc * r for r in (0.1, 0.5, 1.0, 3.0, 10.0)]
        median = [0.1, 0.2, 0.3, 0.05, 5e-4]
        curves.append({"n": n, "s_c": sc, "rows": 2000, "s": s, "median": median,
                       "q1": [m / 10 for m in median], "q3": [m * 3 for m in median],
                       "rms": [0.12, 0.2, 0.3, 0.2, 0.15], "frac_below_1e-3": [0, 0, 0, 0.1, 0.6],
                       "uniform_limit": math.sqrt(n - 1) / n})
    law = [{"n": c["n"], "k": [10.0, 30.0, 100.0], "median": [1e-3, 1e-10, 1e-33],
            "rms": [0.16, 0.095, 0.052], "frac": [0.5, 0.8, 0.93], "k_half": 9.5,
            "check_frac": [None] * 5} for c in curves]
    return {"curves": curves, "law": law, "trained": None}


def test_figure_is_print_quality_with_its_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = jacobian_evidence()
    v = judge(ev)
    assert v.verdict == V.DEPENDS
    (fig,) = M.draw(ev, jsonable(v.numbers), tmp_path)  # the plain numbers report.json holds
    assert set(fig) == {"path", "alt"} and Path(fig["path"]).name == "c10_jacobian.png"
    width, height, dpi = png_info(fig["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = fig["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and re.search(r"\d", alt)
    assert "peaks near s_c at about 0.30" in alt and "9.5·s_c at n = 64" in alt
    assert "50% at n = 64, 50% at n = 512" in alt and "1e-33" in alt
    assert [problems for _, problems in saved] == [[]]


def test_alt_text_needs_a_judged_n():
    with pytest.raises(ValueError, match="per_n"):
        M.alt(jacobian_evidence(), [])
