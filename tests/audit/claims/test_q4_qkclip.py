"""Q4 (unscaled dot with QK-Clip against scaled_dot on the text LR sweep) on synthetic per-seed
evidence: the rule flips between standing in and failing, reads inconclusive without an effect
at 5 seeds, with a missing or censored arm, or with few seeds; its Holm correction over the
widths is scipy's paired t-test adjusted by hand, the context comparisons apart; its sentences
cannot read as another verdict, and its forest plot draws."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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
from attnscale.audit.claim import Sources, get_claim
from attnscale.audit.claims import q4_qkclip as M
from attnscale.audit.evidence import lr_text_evidence
from attnscale.audit.studies import PRESETS, VARIANTS, studies
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence


def sweep_arm(clipped: float) -> dict[str, Any]:
    """The clipped arm's LR sweep, empty but for the share of runs the clip acted in at the LR
    every synthetic arm is read at (0.01)."""
    return {"sensitivity": {}, "unstable": {}, "n_runs": 0, "n_diverged": 0,
            "n_past_logit_limit": 0, "loss_by_lr": {}, "final_logit_by_lr": {},
            "peak_logit_by_lr": {}, "unstable_by_lr": {}, "logit_curves": {},
            "clipped_by_lr": {"0.01": clipped, "0.1": 1.0}}


def q4(draw, gaps, noise=0.002, dot=0.1, layernorm=0.0, clipped=0.5):
    """gaps: width -> dot_qkclip − scaled_dot clipped loss; plain dot and QK-LayerNorm sit at
    ``dot`` and ``layernorm`` above scaled_dot; the clip acted in a share ``clipped`` of the
    clipped arm's runs at its chosen LR."""
    loss = {w: {"scaled_dot": draw.arm(2.0, noise), "dot": draw.arm(2.0 + dot, noise),
                "qk_layernorm": draw.arm(2.0 + layernorm, noise),
                M.ARM: draw.arm(2.0 + gap, noise)} for w, gap in gaps.items()}
    return {"loss": loss, "sweep": {w: {M.ARM: sweep_arm(clipped)} for w in gaps},
            "lrs": [1e-3, 1e-2, 1e-1], "n": 32, "logit_limit": 1e4, "loss_margin": 1.0}


def judge(ev):
    return M.CLAIM.decide(ev)


def test_q4_flips_between_standing_in_and_failing():
    yes = judge(q4(Draw(3), dict.fromkeys(WIDTHS, 0.0)))
    assert yes.verdict == "supported"
    assert yes.headline == "supported: d_model=32: holds; d_model=128: holds"
    no = judge(q4(Draw(3), dict.fromkeys(WIDTHS, 0.2)))
    assert no.verdict == "refuted"
    assert no.headline == "refuted: d_model=32: fails; d_model=128: fails"
    some = judge(q4(Draw(3), {WIDTHS[0]: 0.0, WIDTHS[1]: 0.2}))
    assert some.verdict == "depends"
    assert some.plain[0] == ("d_model=32: dot with QK-Clip is no worse than scaled_dot (within "
                             "δ or better).")
    assert some.plain[1] == ("d_model=128: dot with QK-Clip is worse than scaled_dot by more "
                             "than δ.")


def test_q4_where_the_clip_never_acted_is_undecided():
    """The clip acted only at an LR the arm was not read at: the arm was plain dot there, so a
    loss equal to scaled_dot's says nothing of the clip."""
    v = judge(q4(Draw(3), dict.fromkeys(WIDTHS, 0.0), clipped=0.0))
    assert v.verdict == "inconclusive"
    assert v.headline == "inconclusive: d_model=32: idle; d_model=128: idle"
    assert "never clipped a head" in v.plain[0]
    ev = q4(Draw(3), dict.fromkeys(WIDTHS, 0.0))
    del ev["sweep"][WIDTHS[0]][M.ARM]  # not recorded: not shown to act
    assert judge(ev).headline.startswith("inconclusive: d_model=32: idle")


def test_q4_context_is_read_but_never_decides():
    """Against plain dot the clip is better by 0.1 here, against QK-LayerNorm equal; the verdict
    is the same whatever the context reads."""
    v = judge(q4(Draw(3), dict.fromkeys(WIDTHS, 0.0), dot=0.1))
    w = WIDTHS[0]
    assert v.numbers[f"{w}: dot_qkclip − dot"].reading == "less"
    assert f"{w}: against dot, lower loss, by more than δ (context)." in v.plain
    worse_context = judge(q4(Draw(3), dict.fromkeys(WIDTHS, 0.0), dot=-0.3, layernorm=-0.3))
    assert worse_context.verdict == v.verdict == "supported"


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_q4_no_effect_at_the_edge_is_inconclusive(rng_seed):
    """A true gap of exactly δ: neither no worse nor worse can be shown."""
    ev = q4(Draw(rng_seed), dict.fromkeys(WIDTHS, LOSS_DELTA), noise=LOSS_DELTA)
    assert judge(ev).verdict == "inconclusive"


def test_q4_missing_censored_or_few_seeds_is_inconclusive():
    ev = q4(Draw(4), dict.fromkeys(WIDTHS, 0.0))
    for w in WIDTHS:
        ev["loss"][w]["scaled_dot"]["censored"] = True
    assert judge(ev).verdict == "inconclusive"
    assert judge(q4(Draw(4, n=2), dict.fromkeys(WIDTHS, 0.0))).verdict == "inconclusive"
    ev = q4(Draw(4), dict.fromkeys(WIDTHS, 0.0))
    del ev["loss"][WIDTHS[1]][M.ARM]
    v = judge(ev)
    assert v.verdict == "inconclusive" and v.headline.endswith("d_model=128: inconclusive")


def test_q4_holm_is_over_the_widths_and_each_context_apart():
    ev = q4(Draw(6), {WIDTHS[0]: 0.005, WIDTHS[1]: 0.01}, noise=0.015, dot=0.03)
    v = judge(ev)
    for base in ("scaled_dot", "dot", "qk_layernorm"):
        raw = [best_p(list(ev["loss"][w][M.ARM]["values"].values()),
                      list(ev["loss"][w][base]["values"].values()), LOSS_DELTA)
               for w in WIDTHS]
        got = [v.numbers[f"{w}: {M.ARM} − {base}"].p_holm for w in WIDTHS]
        assert got == pytest.approx(holm_by_hand(raw), rel=1e-9), base


def test_q4_evidence_missing_a_field_is_missing_evidence():
    ev = q4(Draw(3), dict.fromkeys(WIDTHS, 0.0))
    del ev["loss"]
    with pytest.raises(MissingEvidence, match="loss"):
        M.CLAIM.decide(ev)


def test_q4_gathers_the_text_study_which_trains_the_clipped_arm():
    ev = q4(Draw(3), dict.fromkeys(WIDTHS, 0.0))
    src = Sources(preset=None, studies={}, runs={}, measured={},
                  memo={("lr_text", lr_text_evidence): ev})
    assert M.CLAIM.gather(src) is ev
    study = studies(PRESETS["standard"])["lr_text"]
    assert M.ARM in study.arms and VARIANTS[M.ARM] == {"score": "dot", "qk_clip": 100.0}


CASES = {
    V.SUPPORTED: lambda: q4(Draw(3), dict.fromkeys(WIDTHS, 0.0)),
    V.REFUTED: lambda: q4(Draw(3), dict.fromkeys(WIDTHS, 0.2)),
    V.DEPENDS: lambda: q4(Draw(3), {WIDTHS[0]: 0.0, WIDTHS[1]: 0.2}),
    V.INCONCLUSIVE: lambda: q4(Draw(3, n=2), dict.fromkeys(WIDTHS, 0.0)),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(judge(CASES[verdict]()), verdict, "Q4")


def test_q4_draws_its_forest_plot_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = q4(Draw(3), dict.fromkeys(WIDTHS, 0.0))
    numbers = {k: c.model_dump() for k, c in judge(ev).numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["q4_effects.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    assert figs[0]["alt"].startswith("Unscaled dot with QK-Clip minus scaled dot")
    assert [problems for _, problems in saved] == [[]]


def test_q4_answers_and_registration():
    assert get_claim("Q4") is M.CLAIM and M.CLAIM.question
    assert set(M.CLAIM.answers) == set(V.VERDICTS)
    assert M.CLAIM.studies == ("lr_text",) and M.CLAIM.text == "Can QK-Clip stand in for 1/√d_k?"
    assert "### Q4" in CLAIMS_MD
