"""C11 (instability without the scale, more so at larger width) on synthetic per-seed LR-sweep
evidence: the unit-init cells decide (GPT-2 init is context), the rule flips with opposite data,
reads inconclusive without an effect at 5 seeds, says instability is "not observed at this
scale" (never a comparison, never seeds to plan) when no run was unstable, its numbers are
scipy's, its sentences cannot read as another verdict, and its figures draw."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from support import (
    CLAIMS_MD,
    NULL_DRAWS,
    assert_reads_as,
    best_p,
    holm_by_hand,
    layouts,
    png_info,
)
from support import SweepDraw as Draw

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Sources
from attnscale.audit.claims import c11_instability as M
from attnscale.audit.deep_readings import unstable_evidence
from attnscale.audit.evidence import lr_text_evidence
from attnscale.audit.interval import Comparison
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence, seeds_sentence

LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]  # six points: δ of the unstable share is 0.1
WIDTHS = ("init=unit d_model=32", "init=unit d_model=128")  # the deciding cells
CONTEXT = ("init=gpt2 d_model=32", "init=gpt2 d_model=128")  # GPT-2 init: context


def sweep_arm(**fields: Any) -> dict[str, Any]:
    """One arm's LR sweep (:func:`attnscale.audit.evidence.lr_sweep_arm`), empty but for
    ``fields``."""
    return {"sensitivity": {}, "unstable": {}, "n_runs": 0, "n_diverged": 0,
            "n_past_logit_limit": 0, "loss_by_lr": {}, "final_logit_by_lr": {},
            "peak_logit_by_lr": {}, "unstable_by_lr": {}, "logit_curves": {}, **fields}


def text(sweep: dict[str, Any], loss: dict[str, Any] | None = None) -> dict[str, Any]:
    """The text LR study's evidence around ``sweep``."""
    return {"loss": loss or {}, "sweep": sweep, "lrs": list(LRS), "n": 32, "logit_limit": 1e4,
            "loss_margin": 1.0}


def c11(draw, sens_gap, unstable=(0.0, 0.0), noise=0.002, cells=WIDTHS, runs=36):
    """LR-sweep evidence: dot − scaled_dot sensitivity = sens_gap[i] at width i; unstable[i]
    is dot's chance per LR of being unstable at width i (scaled_dot: never, unless
    ``unstable`` is "same", when both arms share one chance); ``runs`` per arm and width."""
    sweep = {}
    for w, gap, p in zip(cells, sens_gap, unstable, strict=True):
        same = p == "same"
        sweep[w] = {"scaled_dot": sweep_arm(sensitivity=draw.values(0.3, noise),
                                            unstable=draw.unstable(0.2 if same else 0.0),
                                            n_runs=runs),
                    "dot": sweep_arm(sensitivity=draw.values(0.3 + gap, noise),
                                     unstable=draw.unstable(0.2 if same else p), n_runs=runs,
                                     peak_logit_by_lr={"0.001": 12.0,
                                                       "0.3": 3e4 if gap else 40.0})}
    return text(sweep)


def with_context(ev, draw, sens_gap, unstable=(0.0, 0.0)):
    """``ev`` with GPT-2 init cells beside its unit ones."""
    ev["sweep"].update(c11(draw, sens_gap, unstable, cells=CONTEXT)["sweep"])
    return ev


def judge(ev):
    return M.CLAIM.decide(ev)


# ------------------------------------------------------------------------------ the rule


def test_c11_flips_between_growing_instability_and_none():
    yes = judge(c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5)))
    assert yes.verdict == "supported"
    # no run of either arm unstable: instability is not observed, not a comparison, and the
    # sensitivity half alone decides (no worse at both widths)
    no = judge(c11(Draw(0), (0.0, 0.0)))
    assert no.verdict == "refuted"
    assert set(no.numbers) == {f"{w} sensitivity" for w in WIDTHS} | {"growth"}
    assert judge(c11(Draw(0), (-0.2, -0.2))).verdict == "refuted"  # less sensitive
    flat = judge(c11(Draw(0), (0.3, 0.3)))  # worse at both widths, not growing
    assert flat.verdict == "depends" and flat.numbers["growth"].reading == "equal"
    # more sensitive, and more so wider, but never unstable: the claim is about instability
    sensitive = judge(c11(Draw(0), (0.05, 0.3)))
    assert sensitive.numbers["growth"].greater() and sensitive.verdict == "depends"
    assert "not observed at this scale" in sensitive.plain[1]
    assert yes.headline != no.headline and yes.plain != no.plain
    big = yes.numbers[f"{WIDTHS[1]} sensitivity"].mean
    assert f"width 128 (unit init) sensitivity {big:+.3f} nats" in yes.headline
    assert "3e+04 at width 128 (unit init)" in yes.plain[2]


def test_the_context_sentence_names_the_context_grid():
    """The GPT-2-init cells run a shorter LR grid than the deciding ones; the sentence says so."""
    ev = with_context(c11(Draw(0), (0.0, 0.0)), Draw(5), (0.3, 0.6))
    for label in CONTEXT:
        for arm in ev["sweep"][label].values():
            arm["loss_by_lr"] = {"0.001": 3.0, "0.003": 2.9, "0.03": 3.2}
    assert judge(ev).plain[-1].startswith("Context, GPT-2 init, LRs 0.001–0.03: dot − scaled_dot")


def test_c11_unit_init_decides_and_gpt2_init_is_context():
    """GPT-2 cells that would read the other way change no verdict and no number; they are a
    sentence. Without unit-init cells nothing is decided."""
    base = judge(c11(Draw(0), (0.0, 0.0)))
    ev = with_context(c11(Draw(0), (0.0, 0.0)), Draw(5), (0.3, 0.6), unstable=(0.0, 0.5))
    v = judge(ev)
    assert v.verdict == base.verdict == "refuted"
    assert set(v.numbers) == set(base.numbers)
    assert v.plain[-1].startswith("Context, GPT-2 init: dot − scaled_dot LR sensitivity "
                                  "width 32 (gpt2 init)")
    only = c11(Draw(0), (0.3, 0.6), cells=CONTEXT)
    w = judge(only)
    assert w.verdict == "inconclusive" and w.because == "no unit-init LR sweep was run"


def test_c11_no_unstable_run_reads_not_observed_with_the_literature_and_no_seeds():
    """0 of N runs unstable: the instability half reads "not observed at this scale", names
    the scales the literature saw it at, and plans no seeds (there is nothing to test)."""
    v = judge(c11(Draw(0, n=3), (0.0, 0.03), noise=0.02))
    text_ = " ".join(v.plain)
    assert "Instability is not observed at this scale: no run of any arm at any LR was " \
        "unstable (0 of 144: none diverged, none blew up and stayed up; widths 32, 128, " \
        "32 tokens)" in text_
    assert "roughly 10M to 1B parameters" in text_ and "ViT-22B (22 billion parameters)" in \
        text_ and "arXiv 2309.14322" in text_ and "arXiv 2302.05442" in text_
    assert not any(k.endswith("unstable") for k in v.numbers)
    assert "not instability" in v.regime and "0 unstable" in v.regime
    advice = seeds_sentence({k: c.model_dump() for k, c in v.numbers.items()})
    assert advice is None or "unstable" not in advice
    ev = c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5))  # observed: compared, no literature
    seen = judge(ev)
    assert f"{WIDTHS[1]} unstable" in seen.numbers and f"{WIDTHS[0]} unstable" not in \
        seen.numbers
    assert "were unstable; dot − scaled_dot unstable share" in seen.plain[1]


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_c11_no_effect_is_inconclusive(rng_seed):
    ev = c11(Draw(rng_seed), (0.0, 0.0), unstable=("same", "same"), noise=LOSS_DELTA)
    assert judge(ev).verdict == "inconclusive"


def test_c11_few_seeds_is_inconclusive():
    ev = c11(Draw(1, n=2), (0.05, 0.3), unstable=(0.0, 0.5))
    v = judge(ev)
    assert v.verdict == "inconclusive"
    assert all(c.reading == "inconclusive" for c in v.numbers.values())


def test_c11_statistics_are_scipys():
    ev = c11(Draw(2), (0.02, 0.08), unstable=(0.1, 0.3), noise=0.02)
    v = judge(ev)
    sw = ev["sweep"]
    def arms(key, w):
        return [list(sw[w][a][key].values()) for a in ("dot", "scaled_dot")]
    delta = M.unstable_delta(M.Evidence.model_validate(ev))
    assert delta == pytest.approx(0.1)  # 0.6 / six LRs
    pairs, deltas = {}, {}
    for w in WIDTHS:
        pairs[f"{w} sensitivity"], deltas[f"{w} sensitivity"] = arms("sensitivity", w), 0.02
        pairs[f"{w} unstable"], deltas[f"{w} unstable"] = arms("unstable", w), delta
    large, small = (np.subtract(*arms("sensitivity", w)) for w in WIDTHS[::-1])
    pairs["growth"], deltas["growth"] = (large, small), 0.02  # (large − small) of the excess
    g = v.numbers["growth"]
    ci = stats.ttest_rel(large, small).confidence_interval(0.95)
    assert (g.mean, g.lo, g.hi) == pytest.approx(
        (np.mean(large - small), ci.low, ci.high), rel=1e-9)
    # Holm over the per-width comparisons (read through 'or' / 'somewhere'); growth alone
    per_width = [k for k in v.numbers if k != "growth"]
    expected = holm_by_hand([best_p(*pairs[k], deltas[k]) for k in per_width])
    assert [v.numbers[k].p_holm for k in per_width] == pytest.approx(expected, rel=1e-9)
    assert g.p_holm == pytest.approx(best_p(*pairs["growth"], 0.02), rel=1e-9)
    assert [c.smallest for c in v.numbers.values()] == [deltas[k] for k in v.numbers]


def test_c11_one_more_unstable_lr_on_every_seed_is_not_measurable():
    """Dot unstable at exactly one more LR than scaled_dot on every seed: the differences are
    all 1/6 (up to float rounding of k/6 − (k−1)/6), which no test reads: not measurable, so
    it neither refutes nor supports, and plans no seeds."""
    for ks in ((1,) * 5, (1, 1, 3, 3, 4)):
        ev = c11(Draw(0), (0.0, 0.0))
        ev["sweep"][WIDTHS[0]]["dot"]["unstable"] = {str(s): k / 6 for s, k in enumerate(ks)}
        ev["sweep"][WIDTHS[0]]["scaled_dot"]["unstable"] = {str(s): (k - 1) / 6
                                                            for s, k in enumerate(ks)}
        v = judge(ev)
        c = v.numbers[f"{WIDTHS[0]} unstable"]
        assert not c.measurable() and c.seeds_to_decide is None
        assert c.mean == pytest.approx(1 / 6)
        assert v.verdict == "inconclusive"  # not refuted: dot was more unstable on every seed


def test_c11_unstable_delta_follows_the_grid():
    """0.6/|grid|: one LR fewer than the grid's step; an empty grid reads as six points."""
    ev = c11(Draw(0), (0.0, 0.0))
    assert M.unstable_delta(M.Evidence.model_validate({**ev, "lrs": [0.1, 0.2, 0.3]})) == \
        pytest.approx(0.2)
    assert M.unstable_delta(M.Evidence.model_validate({**ev, "lrs": []})) == pytest.approx(0.1)


def test_c11_without_a_sweep_is_inconclusive_and_the_regime_counts_divergences():
    v = judge(text({}))
    assert v.verdict == "inconclusive" and v.because == "no unit-init LR sweep was run"
    ev = c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5), runs=15)
    ev["sweep"][WIDTHS[1]]["dot"].update(n_runs=30, n_diverged=4, n_past_logit_limit=7)
    ev["sweep"][WIDTHS[1]]["scaled_dot"].update(n_runs=30)
    v = judge(ev)
    assert "widths 32, 128; 4 of 90 runs diverged" in v.regime
    assert "not instability" not in v.regime and "7 of 90 runs passed 1e4" in v.plain[2]
    assert "not instability" in judge(c11(Draw(0), (0.0, 0.0))).regime
    assert v.regime.startswith("unit-variance q, k at init decides, GPT-2 init")
    assert "LR sweep (0.001, 0.003, 0.01, 0.03, 0.1, 0.3) at two widths" in v.rule


def test_c11_numbers_serialize_as_before():
    """The comparisons dump to the plain dicts report.json stores."""
    v = judge(c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5)))
    assert all(isinstance(c, Comparison) for c in v.numbers.values())
    dumped = v.numbers["growth"].model_dump()
    assert {"mean", "lo", "hi", "n", "reading", "p_holm", "smallest", "not_greater"} <= \
        set(dumped)


def test_c11_evidence_missing_a_field_is_missing_evidence():
    ev = c11(Draw(0), (0.05, 0.3))
    del ev["lrs"]
    with pytest.raises(MissingEvidence, match="lrs"):
        M.CLAIM.decide(ev)
    ev = c11(Draw(0), (0.05, 0.3))
    del ev["sweep"][WIDTHS[0]]["dot"]["unstable"]
    with pytest.raises(MissingEvidence, match="unstable"):
        M.CLAIM.decide(ev)


def test_c11_claim_is_registered_with_its_study():
    from attnscale.audit.claim import get_claim

    assert get_claim("C11") is M.CLAIM and not M.CLAIM.question
    assert M.CLAIM.studies == ("lr_text", "lr_text_gpt2", "unstable")
    assert M.CLAIM.measurements == ()
    assert M.CLAIM.text == "Training is unstable without scaling, especially for larger models."
    assert "C11" in CLAIMS_MD


def test_c11_gathers_the_text_studies_and_the_deep_one():
    ev = c11(Draw(0), (0.05, 0.3))
    gpt2 = {"loss": {"init=gpt2 d_model=128": {}}, "sweep": {}, "entropy_init": {}}
    src = Sources(preset=None, studies={}, runs={}, measured={},
                  memo={("lr_text", lr_text_evidence): ev,
                        ("lr_text_gpt2", lr_text_evidence): gpt2,
                        ("unstable", unstable_evidence): None})
    got = M.CLAIM.gather(src)
    assert got["unstable"] is None and "init=gpt2 d_model=128" in got["loss"]
    assert got["sweep"] == ev["sweep"] and got["lrs"] == ev["lrs"]


# ------------------------------------------------------------------------------ sentences


CASES = {
    V.SUPPORTED: lambda: c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5)),
    V.REFUTED: lambda: c11(Draw(0), (0.0, 0.0)),
    V.DEPENDS: lambda: c11(Draw(0), (0.3, 0.3)),
    V.INCONCLUSIVE: lambda: c11(Draw(0, n=2), (0.05, 0.3)),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(judge(CASES[verdict]()), verdict, "C11")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


# ------------------------------------------------------------------------------ figures


def figure_evidence() -> dict[str, Any]:
    """A sweep shaped like the report's (both init regimes), with logit curves."""
    lrs = (1e-3, 1e-2, 1e-1)
    arms = {"scaled_dot": 1.0, "dot": 3.0, "qk_layernorm": 0.01}
    sweep = {}
    for i, w in enumerate(WIDTHS + CONTEXT):
        sweep[w] = {}
        for j, (a, k) in enumerate(arms.items()):
            rng, scale = np.random.default_rng(i * 10 + j), k * (1 + i)
            sweep[w][a] = sweep_arm(
                sensitivity={str(s): scale * 0.2 + 0.01 * rng.standard_normal()
                             for s in range(6)},
                unstable={str(s): 0.0 for s in range(6)},
                peak_logit_by_lr={str(lr): scale * 3e5 * lr for lr in lrs},
                logit_curves={str(lr): [(t, 1 + scale * 1e4 * lr * t / 100)
                                        for t in (0, 50, 100)] for lr in lrs})
    return {**text(sweep), "lrs": list(lrs)}


def test_c11_draws_the_logits_and_the_forest_with_findings(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = figure_evidence()
    numbers = {k: c.model_dump() for k, c in judge(ev).numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c11_max_logit.png", "c11_effects.png"]
    for f in figs:
        width, height, dpi = png_info(f["path"])
        assert dpi >= 150 and width >= 600 and height >= 400, (f["path"], width, height, dpi)
        assert len(f["alt"]) >= 40 and f["alt"].rstrip().endswith(".")
        assert re.search(r"\d", f["alt"])
    assert figs[0]["alt"].startswith("At width 128 (unit init) the mean peak max |logit|")
    assert "dot from LR 0.01" in figs[0]["alt"] and "qk_layernorm at no LR" in figs[0]["alt"]
    assert "Unscaled minus scaled LR sensitivity and instability" in figs[1]["alt"]
    assert M.sweep_unit(f"{WIDTHS[0]} unstable") == "share of LR grid"
    assert M.sweep_unit("growth") == M.sweep_unit(f"{WIDTHS[0]} sensitivity") == "nats"
    assert {Path(p).name: bad for p, bad in saved if bad} == {}


def test_c11_figure_without_peak_logits_is_an_error(tmp_path):
    ev = text({WIDTHS[0]: {"dot": sweep_arm()}})
    with pytest.raises(ValueError, match="peak logits"):
        M.alt(ev)
    assert math.isfinite(M.unstable_delta(M.Evidence.model_validate(ev)))


# ------------------------------------------------------------------------------ takeaway


def says_entry(cells, diverged=0, unstable=0.0):
    """A report entry's evidence: scaled dot and QK-LayerNorm peak logits per cell, two seeds
    over six LRs each (``unstable``: seed 0's unstable share of scaled dot's grid)."""
    sweep = {w: {"scaled_dot": {"peak_logit_by_lr": {"0.01": 30.0, "0.3": 900.0 + i},
                                "n_diverged": diverged, "n_runs": 12,
                                "unstable": {"0": unstable, "1": 0.0}},
                 "qk_layernorm": {"peak_logit_by_lr": {"0.01": 8.0, "0.3": 12.0},
                                  "n_runs": 12, "unstable": {"0": 0.0, "1": 0.0}}}
             for i, w in enumerate(cells)}
    return {"evidence": {"sweep": sweep}}


def test_says_when_reads_the_widest_unit_cell_and_says_not_observed():
    (said,) = M.says_when(says_entry([*WIDTHS, *CONTEXT]))
    assert "at width 128 (unit init) and the largest LRs scaled dot's max |logit| reached 901" \
        in said and "QK-LayerNorm's 12 (lr 0.3) (C11)" in said
    assert "here no run of the sweep diverged or was unstable, so instability is not " \
        "observed at this scale (they saw it in small Transformers, roughly 10M to 1B " \
        "parameters, at high learning rates, and Dehghani et al. 2023 in ViT-22B)." in said
    (gpt2,) = M.says_when(says_entry(CONTEXT))  # no unit cells: the widest GPT-2 one
    assert "at width 128 (gpt2 init)" in gpt2
    (old,) = M.says_when(says_entry(["d_model=32", "d_model=128"]))  # labels before the init
    assert "at width 128 (gpt2 init)" in old
    (blown,) = M.says_when(says_entry(WIDTHS, diverged=3))
    assert "here 6 runs diverged" in blown and "not observed" not in blown
    (stayed,) = M.says_when(says_entry(WIDTHS, unstable=0.5))
    assert "no run of the sweep diverged (6 blew up and stayed up)" in stayed
    assert M.says_when({"evidence": {"sweep": {}}}) == []


def test_c11_reads_the_deep_instability_study_as_the_larger_widths():
    """Sensitivity growing with width alone reads depends; add instability that the deep study
    saw (unscaled unstable at most high LRs, scaled never) and it reads supported."""
    def arm(share, n):
        return {"unstable": {str(s): share[s] for s in range(6)}, "n_runs": 18,
                "n_unstable": n, "peak_logit": 1e5}
    never = arm([0.0] * 6, 0)
    often = arm([1.0, 2 / 3, 1.0, 1.0, 2 / 3, 1.0], 16)
    ev = c11(Draw(0), (0.05, 0.3))
    ev["unstable"] = {"cells": {"d_model=256": {"scaled_dot": never, "dot": often}},
                      "steps": 1000, "lrs": [0.03, 0.1, 0.3]}
    v = judge(ev)
    assert v.numbers["deep d_model=256 unstable: dot − scaled_dot"].greater()
    assert v.verdict == "supported" and "16 of 36 were unstable" in v.plain[1]
    ev["unstable"]["cells"]["d_model=256"]["dot"] = never
    v = judge(ev)
    assert v.verdict == "depends" and "not observed at this scale either" in v.plain[1]
