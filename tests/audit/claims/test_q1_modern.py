"""Q1 (modern scores against scaled_dot: loss and LR sensitivity) on synthetic per-seed
evidence: the rule flips between a match and none, reads inconclusive without an effect at 5
seeds or with a censored arm, its numbers are scipy's, its sentences cannot read as another
verdict, and its forest plot draws."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from scipy import stats
from support import (
    CLAIMS_MD,
    NULL_DRAWS,
    WIDTHS,
    assert_reads_as,
    best_p,
    holm_by_hand,
    layouts,
    png_info,
)
from support import SweepDraw as Draw

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Sources
from attnscale.audit.claims import q1_modern as M
from attnscale.audit.evidence import lr_text_evidence
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence


def sweep_arm(**fields: Any) -> dict[str, Any]:
    """One arm's LR sweep (:func:`attnscale.audit.evidence.lr_sweep_arm`), empty but for
    ``fields``."""
    return {"sensitivity": {}, "unstable": {}, "n_runs": 0, "n_diverged": 0,
            "n_past_logit_limit": 0, "loss_by_lr": {}, "final_logit_by_lr": {},
            "peak_logit_by_lr": {}, "unstable_by_lr": {}, "logit_curves": {}, **fields}


def U(w: str) -> str:
    """The unit-init cell label of a width."""
    return f"init=unit {w}"


def q1(draw, gaps, noise=0.002, init="unit"):
    """gaps: width -> modern score -> (loss gap, sensitivity gap) against scaled_dot, in the
    cells of ``init``."""
    loss, sweep = {}, {}
    for w0, by in gaps.items():
        w = f"init={init} {w0}"
        loss[w] = {"scaled_dot": draw.arm(2.0, noise)}
        sweep[w] = {"scaled_dot": sweep_arm(sensitivity=draw.values(0.3, noise))}
        for m, (dl, ds) in by.items():
            loss[w][m] = draw.arm(2.0 + dl, noise)
            sweep[w][m] = sweep_arm(sensitivity=draw.values(0.3 + ds, noise))
    return {"loss": loss, "sweep": sweep, "lrs": [1e-3, 1e-2, 1e-1], "n": 32,
            "logit_limit": 1e4, "loss_margin": 1.0}


def judge(ev):
    return M.CLAIM.decide(ev)


MATCHES = {"qk_layernorm": (0.0, -0.1), "softcap": (0.2, 0.0)}  # qk_layernorm matches
NONE = {"qk_layernorm": (0.2, -0.1), "softcap": (0.0, 0.1)}  # each fails one half


def test_q1_flips_between_a_match_and_none():
    yes = judge(q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES)))
    assert yes.verdict == "supported"
    assert yes.headline == "supported: d_model=32: qk_layernorm; d_model=128: qk_layernorm"
    no = judge(q1(Draw(3), dict.fromkeys(WIDTHS, NONE)))
    assert no.verdict == "refuted" and no.headline == "refuted: d_model=32: —; d_model=128: —"
    some = judge(q1(Draw(3), {WIDTHS[0]: MATCHES, WIDTHS[1]: NONE}))
    assert some.verdict == "depends"
    assert some.plain[0].startswith("Unit init, d_model=32: qk_layernorm matches")
    assert some.plain[1].startswith("Unit init, d_model=128: no modern score matches")
    assert yes.plain != no.plain


def test_q1_gpt2_context_never_decides():
    """GPT-2-init cells that say the opposite are shown as context; the verdict stays."""
    ev = q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES))
    ctx = q1(Draw(4), dict.fromkeys(WIDTHS, NONE), init="gpt2")
    both = {k: {**ev[k], **ctx[k]} if isinstance(ev[k], dict) else ev[k] for k in ev}
    v = judge(both)
    assert v.verdict == judge(ev).verdict == "supported"
    assert any(k.startswith(M.CONTEXT) for k in v.numbers)
    assert any(s.startswith("Context (GPT-2 init, not in the verdict), d_model=32: no modern")
               for s in v.plain)


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_q1_no_effect_is_inconclusive(rng_seed):
    null = {"qk_layernorm": (0.0, 0.0), "softcap": (0.0, 0.0)}
    ev = q1(Draw(rng_seed), dict.fromkeys(WIDTHS, null), noise=LOSS_DELTA)
    assert judge(ev).verdict == "inconclusive"


def test_q1_censored_or_few_seeds_is_inconclusive():
    ev = q1(Draw(4), dict.fromkeys(WIDTHS, MATCHES))
    for w in WIDTHS:
        ev["loss"][U(w)]["scaled_dot"]["censored"] = True
    v = judge(ev)
    assert v.verdict == "inconclusive" and "undecided" in v.plain[0]
    assert judge(q1(Draw(4, n=2), dict.fromkeys(WIDTHS, MATCHES))).verdict == "inconclusive"


def test_q1_statistics_are_scipys():
    ev = q1(Draw(5), {WIDTHS[0]: {"qk_layernorm": (0.005, -0.06)}}, noise=0.015)
    v = judge(ev)
    w = WIDTHS[0]
    loss = [list(ev["loss"][U(w)][a]["values"].values()) for a in ("qk_layernorm", "scaled_dot")]
    sens = [list(ev["sweep"][U(w)][a]["sensitivity"].values())
            for a in ("qk_layernorm", "scaled_dot")]
    # one score at this width: its sensitivity family has one member, its loss is alone
    expected = [best_p(*loss, LOSS_DELTA), best_p(*sens, LOSS_DELTA)]
    got = (v.numbers[f"unit init {w} qk_layernorm loss"],
           v.numbers[f"unit init {w} qk_layernorm sensitivity"])
    assert [c.p_holm for c in got] == pytest.approx(list(expected), rel=1e-9)
    ci = stats.ttest_rel(*sens).confidence_interval(0.95)
    assert (got[1].lo, got[1].hi) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert got[1].reading == "less"


TWO = {"qk_layernorm": (0.005, -0.06), "softcap": (0.01, -0.03)}


def test_q1_holm_families_are_one_widths_losses_and_its_sensitivities():
    """Two scores at one width: their loss p-values are Holm-corrected together, and their
    sensitivity p-values together, never across the two kinds or across widths."""
    ev = q1(Draw(6), dict.fromkeys(WIDTHS, TWO), noise=0.015)
    v = judge(ev)
    for w in WIDTHS:
        loss = {a: list(ev["loss"][U(w)][a]["values"].values()) for a in ev["loss"][U(w)]}
        sens = {a: list(ev["sweep"][U(w)][a]["sensitivity"].values()) for a in ev["sweep"][U(w)]}
        for kind, table in (("loss", loss), ("sensitivity", sens)):
            raw = [best_p(table[m], table["scaled_dot"], LOSS_DELTA) for m in TWO]
            got = [v.numbers[f"unit init {w} {m} {kind}"].p_holm for m in TWO]
            assert got == pytest.approx(list(holm_by_hand(raw)), rel=1e-9), (w, kind)


def test_q1_without_modern_scores_is_open():
    ev = q1(Draw(3), {w: {} for w in WIDTHS})
    v = judge(ev)
    assert v.verdict == "inconclusive" and v.numbers == {}
    assert v.headline == "inconclusive: d_model=32: open; d_model=128: open"


def test_q1_answers_and_registration():
    from attnscale.audit.claim import get_claim

    assert get_claim("Q1") is M.CLAIM and M.CLAIM.question
    assert set(M.CLAIM.answers) == set(V.VERDICTS)
    assert M.CLAIM.answers[V.REFUTED] == "None matched scaled dot's loss with lower LR sensitivity"
    assert M.CLAIM.studies == ("lr_text", "lr_text_gpt2") and M.CLAIM.measurements == ()
    assert M.CLAIM.text == "Which alternatives do modern models use, and how do they compare?"
    assert "Q1" in CLAIMS_MD


def test_q1_evidence_missing_a_field_is_missing_evidence():
    ev = q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES))
    del ev["loss"]
    with pytest.raises(MissingEvidence, match="loss"):
        M.CLAIM.decide(ev)
    ev = q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES))
    del ev["sweep"][U(WIDTHS[0])]["softcap"]["sensitivity"]
    with pytest.raises(MissingEvidence, match="sensitivity"):
        M.CLAIM.decide(ev)


def test_q1_gathers_the_text_study():
    ev = q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES))
    gpt2 = {"loss": {"init=gpt2 d_model=128": {}}, "sweep": {}, "entropy_init": {}}
    src = Sources(preset=None, studies={}, runs={}, measured={},
                  memo={("lr_text", lr_text_evidence): ev,
                        ("lr_text_gpt2", lr_text_evidence): gpt2})
    got = M.CLAIM.gather(src)
    assert got["loss"] == {**ev["loss"], **gpt2["loss"]} and got["lrs"] == ev["lrs"]


# ------------------------------------------------------------------------------ sentences


CASES = {
    V.SUPPORTED: lambda: q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES)),
    V.REFUTED: lambda: q1(Draw(3), dict.fromkeys(WIDTHS, NONE)),
    V.DEPENDS: lambda: q1(Draw(3), {WIDTHS[0]: MATCHES, WIDTHS[1]: NONE}),
    V.INCONCLUSIVE: lambda: q1(Draw(3, n=2), dict.fromkeys(WIDTHS, MATCHES)),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(judge(CASES[verdict]()), verdict, "Q1")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


# ------------------------------------------------------------------------------ figures


def test_q1_draws_its_forest_plot_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES))
    numbers = {k: c.model_dump() for k, c in judge(ev).numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["q1_effects.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = figs[0]["alt"]
    assert alt.startswith("Modern scores minus scaled_dot (loss and LR sensitivity): of 8 "
                          "paired comparisons (5 seeds")
    assert re.search(r"\d", alt) and alt.rstrip().endswith(".")
    assert [problems for _, problems in saved] == [[]]


def test_q1_forest_without_an_estimate_is_an_error(tmp_path):
    numbers = {k: c.model_dump() for k, c in
               judge(q1(Draw(3, n=2), dict.fromkeys(WIDTHS, MATCHES))).numbers.items()}
    with pytest.raises(ValueError, match="no comparison has an estimate"):
        M.draw({}, numbers, tmp_path)


# ------------------------------------------------------------------------------ takeaways


def says(ev, section):
    v = judge(ev)
    e = {"id": "Q1", "verdict": v.verdict, "evidence": ev,
         "numbers": {k: c.model_dump() for k, c in v.numbers.items()}}
    return [s for x in M.CLAIM.says if x.section == section for s in x.build(e)]


def test_q1_takeaways_follow_its_readings_at_unit_init():
    ev = q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES))
    alt = " ".join(says(ev, "alternatives"))
    assert "QK-LayerNorm: matched scaled dot" in alt or "QK-LayerNorm: was no worse" in alt
    assert "with lower LR sensitivity at d_model=128" in alt
    assert "soft-capping: trailed scaled dot" in alt
    line = says(ev, "answer")[0]
    assert "QK-LayerNorm held up" in line and "soft-capping trailed" in line
    assert says(ev, "when")[0].endswith("did not lower LR sensitivity (Q1).")
    flipped = " ".join(says(q1(Draw(3), dict.fromkeys(WIDTHS, NONE)), "alternatives"))
    assert "QK-LayerNorm: trailed scaled dot" in flipped
