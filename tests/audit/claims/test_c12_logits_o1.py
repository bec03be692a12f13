"""C12 (1/√d_k keeps the logits O(1)) on synthetic row spreads: the rule flips with the init
and trained spreads, reads the trained σ/s_c against 1 with a paired t-test on the log scale
(checked against scipy), puts a blown-up seed past the scale, says inconclusive for a spread it
cannot place, reads real runs (a stale run is missing evidence), and its figure draws (or fails
loudly without data)."""

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
from attnscale.audit.evidence import spread_stat
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.verdicts import MissingEvidence
from attnscale.measure import theory

SEEDS6 = [str(i) for i in range(6)]


def seeds(v: float, spread: float = 0.01) -> dict[str, float]:
    return {s: v * (1 + spread * (i - 2.5)) for i, s in enumerate(SEEDS6)}


def c12(unit=1.0, gpt2=0.01, trained=(0.3, 0.35), n=32, spread=0.01):
    """Step-0 row σ per regime, d_k and seed; scaled_dot's final σ/s_c per width and seed."""
    return {"init_std": {"gpt2": {d: seeds(gpt2) for d in ("16", "64")},
                         "unit": {"16": seeds(unit), "64": seeds(unit * 1.05)}},
            "trained": {w: {"values": seeds(t, spread)} for w, t in zip(WIDTHS, trained,
                                                                         strict=True)},
            "n": n, "steps": 150}


def judge(ev):
    return M.CLAIM.decide(ev)


def test_c12_flips_with_the_init_and_trained_spread():
    ok = judge(c12())
    assert_reads_as(ok, "supported", "C12")
    assert ok.headline == "supported: O(1) at init and below the freezing scale after training"
    bad = judge(c12(unit=8.0))
    assert_reads_as(bad, "refuted", "C12")
    assert bad.headline == "refuted: not O(1) at init"
    assert judge(c12(unit=0.1)).verdict == "refuted"
    past = judge(c12(trained=(0.3, 3.0)))
    assert_reads_as(past, "depends", "C12")
    assert past.numbers["near_or_past"] == [WIDTHS[1]] and "width 128" in past.headline
    assert "past it by more than a factor 2" in past.plain[-1]
    at = judge(c12(trained=(1.0, 0.3)))  # at the freezing scale: within a factor 2
    assert_reads_as(at, "depends", "C12")
    assert at.numbers["near_or_past"] == [WIDTHS[0]] and "within a factor 2" in at.plain[2]
    assert "150 steps" in ok.regime and "n = 32" in ok.regime
    assert "0.975–1.08" in ok.plain[0] and "O(1)" in ok.plain[0] and "not O(1)" in bad.plain[0]


def test_c12_a_spread_between_near_and_past_the_scale_still_depends():
    """σ/s_c about 2, spread across the factor-2 line above the scale: neither 'equal' nor
    'greater' is decided, but the one-sided test that it exceeds ½ is, so the width is not
    below the scale and the verdict is depends (the fresh standard report's case: width 32 at
    3.1× [1.6, 6.1])."""
    v = judge(c12(trained=(0.3, 2.0), spread=0.3))
    assert_reads_as(v, "depends", "C12")
    c = v.numbers["trained"][WIDTHS[1]]
    assert c["reading"] == "inconclusive" and c["not_less"]
    assert v.numbers["near_or_past"] == [WIDTHS[1]]
    assert "not below half of it, so within a factor 2 of it or past it" in v.plain[-1]


def test_c12_spread_it_cannot_place_is_inconclusive_with_seeds_to_decide():
    """Seeds spread over a factor of 3 around s_c/2: the interval spans the factor-2 line."""
    v = judge(c12(trained=(0.3, 0.5), spread=0.3))
    assert_reads_as(v, "inconclusive", "C12")
    c = v.numbers["trained"][WIDTHS[1]]
    assert c["reading"] == "inconclusive" and c["seeds_to_decide"]
    assert f"about {c['seeds_to_decide']} seeds would decide" in v.plain[-1]


def test_c12_reading_matches_scipy_with_holm_over_the_widths():
    ev = c12(trained=(0.38, 1.14), spread=0.05)
    v = judge(ev)
    log_limit = 0.0
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


def test_c12_a_blown_up_seed_puts_its_width_past_the_scale():
    """One seed diverged (+inf) among five far below the scale: that width reads greater
    outright, outside the t-test, and the verdict is depends; a σ ≤ 0 is a bug."""
    ev = c12()
    ev["trained"][WIDTHS[0]]["values"]["3"] = math.inf
    v = judge(ev)
    assert_reads_as(v, "depends", "C12")
    c = v.numbers["trained"][WIDTHS[0]]
    assert c["reading"] == "greater" and c["why"] == "seed 3 blew up at its own LR"
    assert v.numbers["trained"][WIDTHS[1]]["reading"] == "less"
    assert "seed 3 blew up at its own LR: its rows are past the freezing scale" in v.plain[2]
    ev["trained"][WIDTHS[0]]["values"]["3"] = 0.0
    with pytest.raises(ValueError, match="not positive"):
        judge(ev)


def test_c12_without_data_is_inconclusive():
    ev = c12()
    ev["init_std"]["unit"] = {"16": {}, "64": {}}
    assert judge(ev).verdict == "inconclusive" and judge(ev).headline == "inconclusive: no data"
    ev = c12()
    ev["trained"] = {}
    assert judge(ev).verdict == "inconclusive"
    ev["trained"] = {WIDTHS[0]: {"values": {"0": 0.3, "1": 0.31}}}  # two seeds: no reading
    v = judge(ev)
    assert v.verdict == "inconclusive" and "could not be read" in v.plain[-1]


@pytest.mark.parametrize("n", [8, 32, 512])
def test_c12_scale_is_the_freezing_scale_where_the_top_key_takes_about_half(n):
    """s_c = √(2 ln n) (Derrida 1981): for n Gaussian logits of std s_c the top key's expected
    weight is about ½ (0.40–0.57 for n = 8–512), under 0.4 at s_c/2 and over 0.65 at 2·s_c,
    so the factor-2 band around s_c is where one key starts to take most of the weight."""
    s_c = float(theory.rem_critical_scale(n))
    assert s_c == pytest.approx(math.sqrt(2 * math.log(n)))
    assert 0.38 < float(theory.expected_max_weight(n, s_c)) < 0.6
    assert float(theory.expected_max_weight(n, s_c / 2)) < 0.4
    assert float(theory.expected_max_weight(n, 2 * s_c)) > 0.65


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


def run(seed, lr, d, init, std0, ratio_end, status="done", variant="scaled_dot"):
    """A finished run as the store returns it: two layers, σ at step 0, σ/s_c at the end."""
    layer = {"row_logit_std": std0, "row_freeze_ratio": 0.1}
    end = [{"row_logit_std": 1.0, "row_freeze_ratio": ratio_end},
           {"row_logit_std": 1.0, "row_freeze_ratio": ratio_end / 2}]
    return {"id": f"{variant}-{seed}-{lr}-{d}-{init}", "variant": variant, "status": status,
            "final_loss": 2.0 + lr, "config": {"seed": seed, "lr": lr, "d_model": d,
                                               "init": init},
            "history": [{"loss": 3.0, "layers": [layer, layer]}, {"loss": 2.0, "layers": end}]}


def test_c12_gathers_the_row_spread_from_real_runs_at_each_seeds_own_lr():
    """gather reads scaled_dot's step-0 σ (layer 1) per regime and d_k, and its final σ/s_c
    (larger layer) per width at each seed's leave-one-seed-out LR; a diverged seed is +inf; a
    run stored before the statistic was logged is missing evidence, never a smaller family."""
    plan = studies(PRESETS["tiny"])
    hd, text = plan["head_dim"], plan["lr_text"]
    head_runs = [run(s, lr, d, init, 1.0 + 0.1 * s, 0.3) for s in hd.seeds + hd.tune_seeds
                 for lr in hd.lrs for d in hd.cells["d_model"] for init in hd.cells["init"]]
    head_runs += [run(s, lr, d, "unit", 9.0, 0.3, variant="dot") for s in hd.seeds
                  for lr in hd.lrs for d in hd.cells["d_model"]]
    text_runs = [run(s, lr, d, "gpt2", 0.01, 0.2 + 0.01 * s) for s in text.seeds
                 for lr in text.lrs for d in text.cells["d_model"]]
    text_runs[0]["status"] = "diverged"
    src = Sources(preset=PRESETS["tiny"], studies=plan, measured={},
                  runs={"head_dim": head_runs, "lr_text": text_runs})
    got = M.CLAIM.gather(src)
    assert got["init_std"]["unit"]["16"] == {"0": 1.0, "1": 1.1, "2": 1.2}
    assert set(got["init_std"]) == {"unit", "gpt2"}
    width = f"d_model={text.cells['d_model'][0]}"
    assert got["trained"][width]["values"] == pytest.approx({"0": math.inf, "1": 0.21, "2": 0.22})
    assert got["n"] == text.base["seq_len"] and got["steps"] == text.base["steps"]
    assert M.CLAIM.judge(M.CLAIM.read(got)).numbers["trained"][width]["reading"] == "greater"
    del text_runs[1]["history"][-1]["layers"][0]["row_freeze_ratio"]
    with pytest.raises(MissingEvidence, match="logged no 'row_freeze_ratio'"):
        M.CLAIM.gather(src)


def test_spread_stat_reads_the_largest_layer_and_a_blow_up_as_inf():
    r = run(0, 1e-2, 32, "gpt2", 1.0, 0.4)
    assert spread_stat(r, "row_freeze_ratio", -1) == 0.4  # the larger of 0.4 and 0.2
    assert spread_stat(r, "row_freeze_ratio", -1, layer=1) == 0.2
    assert spread_stat(r, "row_logit_std", 0, layer=0) == 1.0
    r["history"][-1]["layers"][1]["row_freeze_ratio"] = None  # logged, not finite
    assert spread_stat(r, "row_freeze_ratio", -1) == math.inf
    finite_but_diverged = run(0, 1e-2, 32, "gpt2", 1.0, 0.4, status="diverged")
    assert spread_stat(finite_but_diverged, "row_freeze_ratio", -1) == math.inf
    assert spread_stat(finite_but_diverged, "row_logit_std", 0) == 1.0  # step 0 was fine


# ------------------------------------------------------------------------------ figures


def figure_evidence() -> dict[str, Any]:
    """C12's evidence shaped like the report's: one diverged seed at width 128."""
    ev = c12(trained=(0.3, 0.8), spread=0.05)
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
    assert "width 128 0.74–inf times the freezing scale" in alt and alt.endswith(".")
    assert [problems for _, problems in saved] == [[]]


def test_c12_alt_without_trained_spread_says_so():
    ev = {"init_std": {}, "trained": {}, "n": 32, "steps": 150}
    assert M.alt(ev, {}) == "No scaled_dot logit was measured."
    assert M.alt({**figure_evidence(), "trained": {}}, {}).startswith("At init")


def test_c12_figure_with_missing_data_is_an_error_not_faked(tmp_path):
    ev = {"init_std": {"unit": {"8": {}}}, "trained": {}, "n": 32, "steps": 150}
    with pytest.raises(ValueError, match="no scaled_dot logit"):
        M.draw(ev, {}, tmp_path)
    assert not list(tmp_path.iterdir())
