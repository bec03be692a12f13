"""C5, the cost claim: the rule flips with the evidence, is inconclusive on noise, its per-N
decision agrees with scipy's t-test on the log ratios, its evidence model names what is
missing, a fit that χ² rejects is said to be rejected and never quoted or drawn as a result, its
timing table and takeaway sentence come from its own entry, and its figure is a print-quality
PNG whose alt text states the finding."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from support import layouts, png_info

from attnscale.audit import theory_plots
from attnscale.audit.claim import Panel, Sources
from attnscale.audit.claims import c05_overhead as M
from attnscale.audit.interval import Interval
from attnscale.audit.studies import PRESETS
from attnscale.audit.verdicts import MissingEvidence
from attnscale.measure import overhead as O
from attnscale.measure import ratio_interval as RI


def est(ratio, half=0.01, converged=True):
    """A ratio with a symmetric (on the log scale) interval of relative half-width ``half``."""
    return {"ratio": ratio, "lo": ratio * math.exp(-half), "hi": ratio * math.exp(half),
            "n": 30, "converged": converged, "se_log": half / 2.0}


NS = {1: (256,), 2: (256, 1024), 3: (256, 1024, 4096), 5: (256, 512, 1024, 2048, 4096)}


def evidence(ratios, floors=None, half=0.01, converged=None):
    ns = NS[len(ratios)]
    floors = floors or [1.0] * len(ratios)
    converged = converged or [True] * len(ratios)
    rows = [{"n": n, "batch": 1, "heads": 1, "cosine": est(r, half, c), "floor": est(f, 0.005)}
            for n, r, f, c in zip(ns, ratios, floors, converged, strict=True)]
    fit = O.fit_inverse_n(ns, [r - 1 for r in ratios], [r * half / 2 for r in ratios])
    return {"rows": rows, "fit": fit, "threads": 2, "settings": {"head_dim": 64}}


def judge(ev):
    return M.CLAIM.decide(ev)


def test_flips_between_overhead_and_none():
    yes = judge(evidence([1.30, 1.20, 1.15]))
    assert yes.verdict == "supported" and yes.headline.startswith("supported: +30.0% [")
    no = judge(evidence([1.002, 0.998, 1.001]))
    assert no.verdict == "refuted" and no.headline == "refuted: within ±2.0% at every N"
    assert yes.regime == "CPU float32, forward+backward, D=64, 2 threads"


def test_small_overhead_is_called_small():
    v = judge(evidence([1.08, 1.05, 1.04]))
    assert v.verdict == "supported" and v.headline.startswith("supported, small: +8.0% [")
    assert "N=256" in v.headline


def test_depends_when_the_overhead_vanishes_at_large_n():
    v = judge(evidence([1.12, 1.03, 1.001]))
    assert v.verdict == "depends"
    assert v.headline.startswith("depends on N: +12.0%") and "N=4096" in v.headline
    # three N leave the fit one degree of freedom: each N is read as measured, and
    # 1.03 ± 1% straddles 1.02
    assert not v.numbers["from_fit"] and v.numbers["by_n"]["1024"]["state"] == "undecided"


def test_margin_comes_from_the_noise_floor():
    ev = evidence([1.04, 1.04, 1.04])
    assert judge(ev).verdict == "supported"
    ev = evidence([1.04, 1.04, 1.04], floors=[1.0, 1.05, 1.0])  # floor off by 5% ± 0.5%
    v = judge(ev)
    assert v.numbers["delta"] == pytest.approx(0.05 + 1.05 * math.expm1(0.005), rel=1e-6)
    assert v.verdict == "refuted" and "N=1024" in v.smallest and "5.5%" in v.smallest


def test_unconverged_straddling_measurement_is_inconclusive():
    ev = evidence([1.10, 1.03, 1.001], converged=[True, False, True])
    assert judge(ev).verdict == "inconclusive"
    assert judge(evidence([1.10, 1.03, 1.001])).verdict == "depends"


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
    v = judge(ev)
    assert v.verdict == "inconclusive", v.because
    assert v.headline.startswith("inconclusive")


def test_the_fit_pools_every_n_and_a_misfit_is_read_as_measured():
    """Known answer: exact a + b/N overheads at five N. The fit recovers a and b, its band at
    N = 1024 is narrower than the measurement there (it pools every N), and N* = b/(δ − a) is
    where the fitted overhead reaches δ; rising overheads reject the 1/N model (χ² past its 99th
    percentile), and three N (one degree of freedom) cannot test it: each N is read as
    measured."""
    a, b = 0.005, 16.0
    ratios = [1 + a + b / n for n in NS[5]]
    v = judge(evidence(ratios, half=0.01))
    fit = v.numbers["fit"]
    assert fit["a"] == pytest.approx(a) and fit["b"] == pytest.approx(b)
    read, measured = v.numbers["by_n"]["1024"]["read"], v.numbers["by_n"]["1024"]
    assert read["hi"] - read["lo"] < measured["hi"] - measured["lo"]
    assert v.numbers["crossing"] == pytest.approx(b / (0.02 - a))
    assert v.verdict == "depends" and "falls below +2.0% from N ≈ 1.07e+03" in v.plain[1]
    assert "(fitted)" in v.plain[1]
    rising = judge(evidence([1.04, 1.045, 1.05, 1.06, 1.08]))
    assert not rising.numbers["from_fit"] and rising.numbers["crossing"] is None
    assert rising.verdict == "supported" and "(measured)" in rising.plain[1]
    few = judge(evidence(ratios[::2]))
    assert not few.numbers["from_fit"] and few.numbers["fit"]["dof"] == 1


def test_plain_sentences_follow_the_numbers():
    a, b = judge(evidence([1.08, 1.05, 1.04])), judge(evidence([1.30, 1.20, 1.15]))
    assert a.plain != b.plain and len(a.plain) == len(b.plain) == 2
    assert "+8.0%" in a.plain[1] and "+4.0%" in a.plain[1] and "+30.0%" in b.plain[1]
    assert "+8.0%" in a.plain[1] and "from N ≈" not in a.plain[1]  # never falls below δ
    # three N leave the fit one degree of freedom: untested, so its a and b are not quoted
    assert "falls" in a.plain[1] and "fit: overhead ≈ a + b/N" not in a.plain[1]
    assert "the fit a + b/N is not tested (3 N leave 1 degree of freedom" in a.because
    five = judge(evidence([1 + 0.005 + 16 / n for n in NS[5]]))
    assert "fit: overhead ≈ a + b/N, a = +0.5%" in five.plain[1]
    rising = judge(evidence([1.04, 1.05, 1.08]))
    assert "did not fall" in rising.plain[1] and rising.plain[1].startswith("What it depends")
    assert judge(evidence([1.0, 1.0, 1.0])).plain[0].startswith("Wrong as measured")


def test_per_n_decision_agrees_with_scipy_t_test():
    """"real" exactly when the one-sided t-test of mean ln r > ln(1 + δ) has p < 0.025 (the
    95% interval's lower end above 1 + δ)."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        mu, sd, n = rng.uniform(0.0, 0.08), rng.uniform(0.005, 0.05), int(rng.integers(5, 40))
        logs = mu + sd * rng.standard_normal(n)
        e = M.Ratio(**RI.log_ratio_interval(np.exp(logs), np.ones(n)), n=n, converged=True)
        delta = 0.02
        p = stats.ttest_1samp(logs, math.log1p(delta), alternative="greater").pvalue
        assert (M.classify(e, delta) == "real") == (p < 0.025)
        inside = (stats.ttest_1samp(logs, math.log1p(delta), alternative="less").pvalue < 0.025
                  and stats.ttest_1samp(logs, math.log(1 - delta),
                                        alternative="greater").pvalue < 0.025)
        assert (M.classify(e, delta) == "absent") == inside


def test_empty_evidence_is_rejected():
    with pytest.raises(ValueError, match="ev"):
        judge({"rows": []})


def test_a_wide_noise_floor_cannot_show_absence():
    """δ above 10%: a narrow cosine interval at 1.0 is undecided, not refuted."""
    ev = evidence([1.0, 1.0, 1.0], floors=[1.0, 1.15, 1.0])
    v = judge(ev)
    assert v.numbers["delta"] > M.MAX_DELTA
    assert v.verdict == "inconclusive" and "too wide" in v.plain[0]
    assert judge(evidence([1.30, 1.30, 1.30], floors=[1.0, 1.15, 1.0])).verdict == "supported"


def test_one_n_makes_no_claim_about_the_trend():
    v = judge(evidence([1.08]))
    assert v.verdict == "supported" and "only N=256 was measured" in v.plain[1]
    assert "did not fall" not in v.plain[1] and "falls with N" not in v.plain[1]


def test_missing_fields_are_missing_evidence():
    ev = evidence([1.08, 1.05, 1.04])
    with pytest.raises(MissingEvidence, match="rows"):
        judge({k: v for k, v in ev.items() if k != "rows"})
    del ev["rows"][1]["cosine"]["converged"]
    with pytest.raises(MissingEvidence, match="converged"):
        judge(ev)


def test_the_measured_dict_validates_and_keeps_its_numbers():
    """The overhead study's own output (every key it writes) fits the model; the verdict's
    numbers carry the fit and per-N ratios unchanged, and a ratio is the audit's interval."""
    ev = O.overhead_study((16, 32), head_dim=8, work=4096, min_repeats=3, target=0.5,
                          budget_s=0.2, block_s=0.001, threads=1)
    typed = M.Evidence.model_validate(ev)
    assert typed.settings.model_dump(exclude_unset=True)["pass"] == "forward+backward"
    v = M.judge(typed)
    assert ev["fit"]["dof"] == 0 and v.numbers["fit"] == {  # two N: an exact, untested fit
        "status": "untested", "chi2": ev["fit"]["chi2"], "dof": 0, "chi2_99": None,
        "points": 2}
    assert ev["settings"]["interval"] == O.INTERVAL and ev["settings"]["epoch"] == O.EPOCH
    assert typed.rows[0].cosine.block == ev["rows"][0]["cosine"]["block"] == O.EPOCH
    assert typed.rows[0].floor.epochs == ev["rows"][0]["floor"]["epochs"] >= 2
    assert v.numbers["by_n"]["16"]["ratio"] == ev["rows"][0]["cosine"]["ratio"]
    iv = typed.rows[0].cosine.interval()
    assert isinstance(iv, Interval) and iv.mean == ev["rows"][0]["cosine"]["ratio"]
    assert (iv.lo, iv.hi, iv.n) == tuple(ev["rows"][0]["cosine"][k] for k in ("lo", "hi", "n"))


def test_ci_pct_and_threads_fallback():
    assert M.ci_pct({"ratio": 1.031, "lo": 1.02, "hi": 1.042}) == "+3.1% [+2.0%, +4.2%]"
    assert M.ci_pct({"ratio": 0.99, "lo": None, "hi": None}) == "-1.0%"
    ev = evidence([1.30, 1.20, 1.15])
    del ev["threads"], ev["settings"]
    assert judge(ev).regime == "CPU float32, forward+backward, D=64, ? threads"


def test_gather_scale_and_measurement():
    p = PRESETS["tiny"]
    src = Sources(preset=p, studies={}, runs={}, measured={"bench": evidence([1.1])})
    assert M.CLAIM.gather(src) is src.measured["bench"]
    assert M.CLAIM.scale(p) == ("one CPU thread, N = 64, a pilot of 2 epochs of 10 "
                                "interleaved repeats; other hardware differs")
    (m,) = M.CLAIM.measurements
    # the interval method is in the key: a study cached with per-repeat intervals is not reused
    assert m.kind == "bench" and m.params(p) == {**p.bench, "interval": O.INTERVAL}
    assert M.CLAIM.studies == ()


# ---------------------------------------------------------------------------- the figure


def bench() -> dict[str, Any]:
    def e(r: float, hw: float) -> dict[str, Any]:
        return {"ratio": r, "lo": r - hw, "hi": r + hw, "n": 30, "converged": True}
    return {"rows": [{"n": n, "cosine": e(1 + 25 / n, 0.01), "floor": e(1.0, 0.005)}
                     for n in (256, 1024, 4096)],
            "fit": {"a": 0.0, "b": 25.0}, "settings": {"head_dim": 64}, "threads": 1}


def test_figure_is_print_quality_with_its_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = bench()
    numbers = M.CLAIM.decide(ev).numbers
    (fig,) = M.draw(ev, numbers, tmp_path)
    assert set(fig) == {"path", "alt"} and Path(fig["path"]).name == "c5_overhead.png"
    width, height, dpi = png_info(fig["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = fig["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and re.search(r"\d", alt)
    assert alt.startswith("Cosine attention costs +9.8% [+8.8%, +10.8%] over scaled_dot at "
                          "N = 256, +0.6% [-0.4%, +1.6%] at N = 4096")
    assert f"±{numbers['delta']:.1%}" in alt
    assert [problems for _, problems in saved] == [[]]


def test_alt_text_follows_the_data():
    ev = bench()
    assert "the smallest overhead" not in M.alt(ev, None)  # no margin: said less, not faked
    ev["rows"] = ev["rows"][:1]
    assert "N = 4096" not in M.alt(ev, 0.02) and "±2.0%" in M.alt(ev, 0.02)


# ------------------------------------------------- a rejected fit, the table and the takeaway

RISING = [1.04, 1.045, 1.05, 1.06, 1.08]  # does not fall like a + b/N: χ² 13.2 on 3 dof


def test_a_rejected_fit_is_said_with_its_chi2_and_never_quoted(tmp_path, monkeypatch):
    """χ² above its 99th percentile: the numbers keep the status, χ² and dof but no a or b; the
    sentences say it was rejected (with χ² and dof) and quote no parameter; the figure draws no
    fit line or band, its legend and alt text saying why."""
    ev = evidence(RISING)
    v = judge(ev)
    fit = v.numbers["fit"]
    assert fit["status"] == "rejected" and fit["dof"] == 3
    assert fit["chi2"] > fit["chi2_99"] == pytest.approx(stats.chi2.ppf(0.99, 3))
    assert not {"a", "b", "a_se", "b_se"} & set(fit) and not v.numbers["from_fit"]
    said = f"the fit a + b/N is rejected (χ² = {fit['chi2']:.1f} on 3 dof"
    assert said in v.plain[1] and said in v.because
    for text in (*v.plain, v.because, v.headline):
        assert "a = " not in text and "b = " not in text and "fit: overhead" not in text
    drawn = []
    real = theory_plots.save_png
    monkeypatch.setattr(theory_plots, "save_png",
                        lambda fig, path: drawn.append(fig) or real(fig, path))
    (figure,) = M.draw(ev, v.numbers, tmp_path)
    labels = [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
    assert not any(label.startswith("fit $a + b/N$, $b$") or "band" in label
                   for label in labels)
    assert any("rejected" in label and "not drawn" in label for label in labels)
    assert figure["alt"].endswith(f"χ² = {fit['chi2']:.1f} on 3 dof rejects it.")
    used = judge(evidence([1 + 0.005 + 16 / n for n in NS[5]]))
    assert used.numbers["fit"]["status"] == "used" and "a" in used.numbers["fit"]


def entry_of(ev):
    """The claim's report entry, as :func:`attnscale.audit.render.judge` writes it."""
    v = judge(ev)
    return {"id": "C5", "verdict": v.verdict, "evidence": ev, "numbers": v.numbers}


def test_the_timing_table_is_the_claims_own_panel():
    """One panel from the entry's evidence: two rows per N (cosine, then the floor) with the
    ratio, interval, repeats and epochs; its note says how intervals are made and why the
    fit is not read."""
    ev = evidence(RISING)
    ev["rows"][0]["cosine"] |= {"block": 10, "epochs": 3, "converged": False}
    (panel,) = M.CLAIM.panels(entry_of(ev))
    assert isinstance(panel, Panel) and panel.title.startswith("Speed: cosine against scaled")
    assert panel.columns == ("N", "comparison", "time ratio", "95% interval", "repeats", "epochs")
    assert len(panel.rows) == 10 and all(len(r) == 6 for r in panel.rows)
    lo, hi = ev["rows"][0]["cosine"]["lo"], ev["rows"][0]["cosine"]["hi"]
    assert panel.rows[0] == ("256", "cosine / scaled_dot", "1.040", f"[{lo:.3f}, {hi:.3f}]",
                             "30 (budget)", "3")
    assert panel.rows[1][:3] == ("256", "scaled_dot / itself", "1.000")
    assert panel.rows[1][5] == "—"  # evidence without epochs says so
    assert "batch means over the epochs" in panel.note and "is rejected (χ² = 13.2 on 3 dof" in \
        panel.note
    assert M.CLAIM.panels({"evidence": {}}) == []


def test_the_takeaway_sentence_comes_from_the_entry():
    """The alternatives sentence: the measured overhead with its interval at every N, and the
    noise floor's margin; nothing without per-N numbers."""
    (says,) = M.CLAIM.says
    assert (says.section, says.rank) == ("alternatives", 40)
    e = entry_of(evidence([1.30, 1.20, 1.15]))
    (sentence,) = says.build(e)
    by_n = e["numbers"]["by_n"]
    assert sentence.startswith(f"Cosine attention's extra time on CPU (forward + backward): "
                               f"{M.ci_pct(by_n['256'])} at N = 256, ")
    assert f"{M.ci_pct(by_n['4096'])} at N = 4096" in sentence
    assert sentence.endswith(f"; the noise floor on this machine is "
                             f"±{e['numbers']['delta']:.1%} (C5).")
    assert says.build(entry_of(evidence([1.0, 1.0, 1.0]))) != [sentence]
    assert says.build({"numbers": {}}) == []
