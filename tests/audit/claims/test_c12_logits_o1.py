"""C12 (1/√d_k keeps the logits O(1)) on synthetic row spreads: the rule flips with the init
and trained spreads, reads the trained spread against the freezing scale s_c(n) = √(2 ln n) with
a paired t-test on the log scale (checked against scipy), says inconclusive for a spread it
cannot place, and its figure draws (or fails loudly without data)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from support import CLAIMS_MD, WIDTHS, assert_reads_as, layouts, png_info

from attnscale.audit.claim import Sources
from attnscale.audit.claims import c12_logits_o1 as M
from attnscale.audit.evidence import head_dim_evidence, init_row_std, lr_text_evidence
from attnscale.audit.verdicts import MissingEvidence
from attnscale.measure import theory

SEEDS6 = [str(i) for i in range(6)]
S_C = math.sqrt(2 * math.log(32))  # 2.63


def seeds(v: float, spread: float = 0.01) -> dict[str, float]:
    return {s: v * (1 + spread * (i - 2.5)) for i, s in enumerate(SEEDS6)}


def c12(unit=1.0, gpt2=0.01, trained=(1.0, 1.2), n=32, spread=0.01):
    """Step-0 row σ per regime, d_k and seed; scaled_dot's final row σ per width and seed."""
    return {"init_std": {"gpt2": {d: seeds(gpt2) for d in ("16", "64")},
                         "unit": {"16": seeds(unit), "64": seeds(unit * 1.05)}},
            "trained": {w: {"values": seeds(t, spread)} for w, t in zip(WIDTHS, trained,
                                                                         strict=True)},
            "n": n}


def judge(ev):
    return M.CLAIM.decide(ev)


def test_c12_flips_with_the_init_and_trained_spread():
    ok = judge(c12())
    assert_reads_as(ok, "supported", "C12")
    assert ok.numbers["limit"] == pytest.approx(S_C)
    assert ok.headline == "supported: O(1) at init and below the freezing scale after training"
    bad = judge(c12(unit=8.0))
    assert_reads_as(bad, "refuted", "C12")
    assert bad.headline == "refuted: not O(1) at init"
    assert judge(c12(unit=0.1)).verdict == "refuted"
    past = judge(c12(trained=(1.0, 8.0)))
    assert_reads_as(past, "depends", "C12")
    assert past.numbers["at_or_past"] == [WIDTHS[1]] and "width 128" in past.headline
    at = judge(c12(trained=(S_C, 1.0)))  # at the freezing scale: within a factor 2
    assert_reads_as(at, "depends", "C12")
    assert at.numbers["at_or_past"] == [WIDTHS[0]] and "about half the weight" in at.plain[2]
    assert "0.975–1.08" in ok.plain[0] and "O(1)" in ok.plain[0] and "not O(1)" in bad.plain[0]


def test_c12_spread_it_cannot_place_is_inconclusive_with_seeds_to_decide():
    """Seeds spread over a factor of 3 around s_c/2: the interval spans the factor-2 line."""
    v = judge(c12(trained=(1.0, S_C / 2), spread=0.4))
    assert_reads_as(v, "inconclusive", "C12")
    c = v.numbers["trained"][WIDTHS[1]]
    assert c["reading"] == "inconclusive" and c["seeds_to_decide"]
    assert f"about {c['seeds_to_decide']} seeds would decide" in v.plain[-1]


def test_c12_reading_matches_scipy_with_holm_over_the_widths():
    ev = c12(trained=(1.0, 3.0), spread=0.05)
    v = judge(ev)
    log_limit = math.log(S_C)
    ps = []
    for w, reading in zip(WIDTHS, ("less", "equal"), strict=True):
        c = v.numbers["trained"][w]
        x = np.log(list(ev["trained"][w]["values"].values())) - log_limit
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
        assert c["reading"] == reading
        assert (c["lo"], c["hi"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
        if reading == "less":
            ps.append(stats.ttest_1samp(x, -math.log(2), alternative="less").pvalue)
        else:
            ps.append(max(stats.ttest_1samp(x, -math.log(2), alternative="greater").pvalue,
                          stats.ttest_1samp(x, math.log(2), alternative="less").pvalue))
    holm = [min(1.0, max(sorted(ps)[0] * 2, p)) if p == max(ps) else min(1.0, 2 * p)
            for p in ps]
    assert [v.numbers["trained"][w]["p_holm"] for w in WIDTHS] == pytest.approx(holm, rel=1e-9)


def test_c12_a_diverged_seed_is_past_the_scale_not_dropped():
    ev = c12()
    ev["trained"][WIDTHS[0]]["values"]["0"] = math.inf
    c = judge(ev).numbers["trained"][WIDTHS[0]]
    assert c["n"] == 6 and c["hi"] > math.log(2)


def test_c12_without_data_is_inconclusive():
    ev = c12()
    ev["init_std"]["unit"] = {"16": {}, "64": {}}
    assert judge(ev).verdict == "inconclusive" and judge(ev).headline == "inconclusive: no data"
    ev = c12()
    ev["trained"] = {}
    assert judge(ev).verdict == "inconclusive"
    ev["trained"] = {WIDTHS[0]: {"values": {"0": 1.0, "1": 1.1}}}  # two seeds: no reading
    v = judge(ev)
    assert v.verdict == "inconclusive" and "could not be read" in v.plain[-1]


@pytest.mark.parametrize("n", [8, 32, 512])
def test_c12_limit_is_the_freezing_scale_where_the_top_key_takes_about_half(n):
    """s_c = √(2 ln n) (Derrida 1981): for n Gaussian logits of std s_c the top key's expected
    weight is about ½ (0.40–0.57 for n = 8–512), under 0.4 at s_c/2 and over 0.65 at 2·s_c,
    so the factor-2 band around s_c is where one key starts to take most of the weight."""
    assert M.limit_of(n) == pytest.approx(math.sqrt(2 * math.log(n)))
    assert 0.38 < float(theory.expected_max_weight(n, M.limit_of(n))) < 0.6
    assert float(theory.expected_max_weight(n, M.limit_of(n) / 2)) < 0.4
    assert float(theory.expected_max_weight(n, 2 * M.limit_of(n))) > 0.65


def test_c12_gpt2_init_is_described_not_judged():
    """The GPT-2 regime's small spread is a sentence, never a verdict: only unit-variance
    seeds decide the init half."""
    v = judge(c12(gpt2=0.01))
    assert v.verdict == "supported" and "far below 1, set by the init" in v.plain[1]
    assert "of order one" in judge(c12(gpt2=1.0)).plain[1]
    no_gpt2 = c12()
    del no_gpt2["init_std"]["gpt2"]
    assert len(judge(no_gpt2).plain) == 1 + len(WIDTHS)


def test_c12_evidence_missing_a_field_is_missing_evidence():
    ev = c12()
    del ev["n"]
    with pytest.raises(MissingEvidence, match="n"):
        M.CLAIM.decide(ev)
    with pytest.raises(MissingEvidence, match="trained"):
        M.CLAIM.decide({k: v for k, v in c12().items() if k != "trained"})


def test_c12_claim_is_registered_with_its_studies():
    from attnscale.audit.claim import get_claim

    assert get_claim("C12") is M.CLAIM and not M.CLAIM.question
    assert M.CLAIM.studies == ("head_dim", "lr_text") and M.CLAIM.measurements == ()
    assert M.CLAIM.text == "Dividing by √d_k keeps logits O(1): no saturation, gradients flow."
    assert "C12" in CLAIMS_MD


def test_c12_gathers_the_row_spread_at_init_and_at_each_seeds_own_lr():
    """gather reads scaled_dot's step-0 row σ from the head-dimension study and its final row
    σ per width (the LOO-chosen table of the text study), and n."""
    seeds_ = {str(s): 1.0 + 0.1 * s for s in range(3)}
    dk = {"row_std_init": {"init=unit d_model=16": {"scaled_dot": {"values": seeds_},
                                                    "dot": {"values": {"0": 9.0}}},
                           "init=gpt2 d_model=16": {"dot": {"values": {"0": 0.1}}}}}
    chosen = {"values": {"0": 1.5, "1": math.inf}, "lrs": {"0": 0.01, "1": 0.03}}
    text = {"row_std_end": {"d_model=32": {"scaled_dot": chosen, "dot": {"values": {}}},
                            "d_model=128": {"dot": {"values": {"0": 1.0}}}},
            "n": 64}
    src = Sources(preset=None, studies={}, runs={}, measured={},
                  memo={("head_dim", head_dim_evidence): dk, ("lr_text", lr_text_evidence): text})
    got = M.CLAIM.gather(src)
    assert got == {"init_std": init_row_std(dk), "trained": {"d_model=32": chosen}, "n": 64}
    assert got["init_std"] == {"unit": {"16": seeds_}, "gpt2": {"16": {}}}
    assert M.CLAIM.read(got).trained["d_model=32"].values["1"] == math.inf


# ------------------------------------------------------------------------------ figures


def figure_evidence() -> dict[str, Any]:
    """C12's evidence shaped like the report's: one diverged seed at width 128."""
    ev = c12(trained=(1.0, 2.0), spread=0.05)
    ev["trained"][WIDTHS[1]]["values"]["0"] = math.inf
    return ev


def test_c12_draws_init_and_trained_spread_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = figure_evidence()
    figs = M.draw(ev, judge(ev).numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c12_row_spread.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = figs[0]["alt"]
    assert alt.startswith("At init a row of scaled_dot's logits has std 0.0097–0.01 with gpt2 "
                          "init, 0.97–1.1 with unit init.")
    assert "width 128 1.9–inf" in alt and "s_c = 2.63" in alt and alt.endswith(".")
    assert [problems for _, problems in saved] == [[]]


def test_c12_alt_without_trained_spread_says_so():
    ev = {"init_std": {}, "trained": {}, "n": 32}
    assert M.alt(ev, {}) == "No scaled_dot logit was measured."
    assert M.alt({**figure_evidence(), "trained": {}}, {}).startswith("At init")


def test_c12_figure_with_missing_data_is_an_error_not_faked(tmp_path):
    ev = {"init_std": {"unit": {"8": {}}}, "trained": {}, "n": 32}
    with pytest.raises(ValueError, match="no scaled_dot logit"):
        M.draw(ev, {}, tmp_path)
    assert not list(tmp_path.iterdir())
