"""C13 on synthetic per-seed evidence: the unscaled gap at the largest d_k and its slope per
doubling, each tested alone; flips, no-effect, censoring and scipy checks; no sentence reads as
another verdict."""

from __future__ import annotations

import numpy as np
import pytest
import support
from scipy import stats
from support import (
    DKS,
    NULL_DRAWS,
    SEEDS,
    Draw,
    assert_print_quality,
    assert_reads_as,
    best_p,
    holm_by_hand,
    layouts,
    vals,
)

from attnscale.audit import verdicts as V
from attnscale.audit.claims import c13_paper_large_dk as M
from attnscale.audit.readings import cell
from attnscale.audit.verdicts import LOSS_DELTA


def head_dim(*args, **kwargs):
    """The head-dimension study alone (C13 reads no identity check)."""
    ev = support.head_dim(*args, **kwargs)
    del ev["identity"]
    return ev


def growing(d):
    return 0.05 + 0.05 * np.log2(d / 16)  # +0.05 nats per doubling of d_k


def test_c13_flips_between_a_growing_gap_and_none():
    yes = M.CLAIM.decide(head_dim(Draw(4), growing))
    assert yes.verdict == "supported"
    no = M.CLAIM.decide(head_dim(Draw(4), 0.0))
    assert no.verdict == "refuted"
    assert M.CLAIM.decide(head_dim(Draw(4), -0.2)).verdict == "refuted"  # dot better
    flat = M.CLAIM.decide(head_dim(Draw(4), 0.2))  # there, but not growing
    assert flat.verdict == "depends" and flat.numbers["slope"].reading == "equal"
    assert yes.headline != no.headline and yes.plain != no.plain
    assert f"{yes.numbers['slope'].mean:+.3f}" in yes.headline


def test_c13_shows_the_gpt2_regime_beside_it():
    v = M.CLAIM.decide(head_dim(Draw(5), growing, gpt2_gap=0.3))
    gpt2 = v.numbers["context"]["gpt2"]["256"]
    assert gpt2.reading == "greater"
    assert any(f"With gpt2 init the gap at d_k=256 is {gpt2.mean:+.3f}" in p for p in v.plain)


def test_c13_no_effect_is_mostly_undecided_and_never_a_gap():
    """No effect measured coarsely (noise 5δ per arm): never supported or depends, undecided in
    most draws; the rest read refuted, which is right (no effect is non-inferior: the true gap
    is under δ). Measured finely (noise 0.002) it reads refuted every time."""
    coarse = [M.CLAIM.decide(head_dim(Draw(r), 0.0, noise=5 * LOSS_DELTA)).verdict
              for r in NULL_DRAWS]
    assert set(coarse) <= {"inconclusive", "refuted"}
    assert coarse.count("inconclusive") >= 0.75 * len(coarse), coarse
    for r in NULL_DRAWS:
        assert M.CLAIM.decide(head_dim(Draw(r), 0.0, noise=LOSS_DELTA)).verdict in (
            "inconclusive", "refuted")
        assert M.CLAIM.decide(head_dim(Draw(r), 0.0, noise=0.002)).verdict == "refuted"


def test_c13_censored_or_few_seeds_is_inconclusive():
    ev = head_dim(Draw(6), growing)
    ev["loss"][cell("unit", 256)]["scaled_dot"]["censored"] = True
    assert M.CLAIM.decide(ev).verdict == "inconclusive"
    assert M.CLAIM.decide(head_dim(Draw(6, n=2), growing)).verdict == "inconclusive"


def test_c13_slope_is_scipys_regression_and_t_test():
    ev = head_dim(Draw(7), growing, noise=0.01)
    v = M.CLAIM.decide(ev)
    x = np.log2(DKS)
    slopes = []
    for s in map(str, range(SEEDS)):
        gap = [ev["loss"][cell("unit", d)]["dot"]["values"][s]
               - ev["loss"][cell("unit", d)]["scaled_dot"]["values"][s] for d in DKS]
        slopes.append(stats.linregress(x, gap).slope)
    slope = v.numbers["slope"]
    ci = stats.ttest_1samp(slopes, 0.0).confidence_interval(0.95)
    assert slope.mean == pytest.approx(np.mean(slopes), rel=1e-9)
    assert (slope.lo, slope.hi) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # the rule reads the slope and the largest gap only through 'and': each alone (an
    # intersection-union test); the smaller d_k's gaps, context, share one family
    assert slope.reading == "greater"
    p = stats.ttest_1samp(slopes, M.SLOPE_DELTA, alternative="greater").pvalue
    assert slope.p_holm == pytest.approx(p, rel=1e-9)
    big = str(DKS[-1])
    cells = [ev["loss"][cell("unit", d)] for d in DKS]
    assert v.numbers["gaps"][big].p_holm == pytest.approx(
        best_p(vals(cells[-1]["dot"]), vals(cells[-1]["scaled_dot"])), rel=1e-9)
    context = holm_by_hand([best_p(vals(c["dot"]), vals(c["scaled_dot"])) for c in cells[:-1]])
    assert [v.numbers["gaps"][str(d)].p_holm for d in DKS[:-1]] == pytest.approx(context,
                                                                                  rel=1e-9)


def test_c13_evidence_missing_a_field_is_named():
    ev = head_dim(Draw(0), 0.0)
    del ev["loss"]
    with pytest.raises(V.MissingEvidence, match="loss"):
        M.CLAIM.decide(ev)


def test_c13_draws_its_figure(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    from attnscale.util.jsonio import jsonable
    ev = M.CLAIM.read(head_dim(Draw(4), growing, gpt2_gap=0.3))
    figs = M.draw(ev.model_dump(), jsonable(M.judge(ev).numbers), tmp_path)
    assert figs[0]["path"].endswith("c13_head_dim.png") and "per doubling" in figs[0]["alt"]
    # the GPT-2 regime's gap closes the caption; no absorbed arm is described
    assert "At d_k = 256, with GPT-2 init the gap is +0.3" in figs[0]["alt"]
    assert "absorb" not in figs[0]["alt"] and "d_k^(−1/4)" not in figs[0]["alt"]
    assert_print_quality(figs[0])
    assert [problems for _, problems in saved] == [[]]


# ------------------------------------------------------------------------------ sentences

CASES = {
    V.SUPPORTED: lambda: M.CLAIM.decide(head_dim(Draw(4), growing)),
    V.REFUTED: lambda: M.CLAIM.decide(head_dim(Draw(4), 0.0)),
    V.DEPENDS: lambda: M.CLAIM.decide(head_dim(Draw(4), 0.2)),
    V.INCONCLUSIVE: lambda: M.CLAIM.decide(head_dim(Draw(4, n=2), growing)),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(CASES[verdict](), verdict, "C13")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


# ------------------------------------------------------------------------------ takeaways


def _comp(mean, reading):
    return {"mean": mean, "lo": mean - 0.05, "hi": mean + 0.05, "n": 6, "reading": reading}


def _c13_entry(gap, reading, verdict):
    return {"id": "C13", "verdict": verdict, "evidence": {},
            "numbers": {"gaps": {"16": _comp(0.0, "equal"), "256": _comp(gap, reading)},
                        "slope": _comp(0.09, "greater"),
                        "context": {"gpt2": {"256": _comp(0.001, "equal")}}}}


def test_c13_takeaways_follow_the_data():
    def said(e, section):
        return " ".join(s for x in M.CLAIM.says if x.section == section for s in x.build(e))
    real, none = _c13_entry(0.33, "greater", "supported"), _c13_entry(0.004, "equal", "refuted")
    assert "costs +0.330 nats" in said(real, "scale")
    assert "cost nothing we could measure" in said(none, "scale")
    assert "With GPT-2 init" in said(real, "scale") and "no measurable cost" in said(real, "scale")
    assert said(real, "answer").startswith("Keep 1/√d_k")
    assert said(none, "answer").startswith("At this scale dropping")
    undecided = _c13_entry(0.05, "inconclusive", "inconclusive")
    assert "could not decide" in said(undecided, "scale")
