"""C11 (instability without the scale, more so at larger width) on synthetic per-seed LR-sweep
evidence: the rule flips with opposite data, reads inconclusive without an effect at 5 seeds,
its numbers are scipy's, its sentences cannot read as another verdict, and its figures draw."""

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
from attnscale.audit.claims import c11_instability as M
from attnscale.audit.evidence import lr_text_evidence
from attnscale.audit.interval import Comparison
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence

LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]  # six points: δ of the unstable share is 0.1


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


def c11(draw, sens_gap, unstable=(0.0, 0.0), noise=0.002):
    """LR-sweep evidence: dot − scaled_dot sensitivity = sens_gap[i] at width i; unstable[i]
    is dot's chance per LR of being unstable at width i (scaled_dot: never, unless
    ``unstable`` is "same", when both arms share one chance)."""
    sweep = {}
    for w, gap, p in zip(WIDTHS, sens_gap, unstable, strict=True):
        same = p == "same"
        sweep[w] = {"scaled_dot": sweep_arm(sensitivity=draw.values(0.3, noise),
                                            unstable=draw.unstable(0.2 if same else 0.0)),
                    "dot": sweep_arm(sensitivity=draw.values(0.3 + gap, noise),
                                     unstable=draw.unstable(0.2 if same else p),
                                     peak_logit_by_lr={"0.001": 12.0,
                                                       "0.3": 3e4 if gap else 40.0})}
    return text(sweep)


def judge(ev):
    return M.CLAIM.decide(ev)


# ------------------------------------------------------------------------------ the rule


def test_c11_flips_between_growing_instability_and_none():
    yes = judge(c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5)))
    assert yes.verdict == "supported"
    # neither arm ever unstable: a zero difference on every seed is read by the exact sign
    # test, p = 2⁻ⁿ, Holm-corrected over C11's 5 comparisons: 8 seeds decide, 5 cannot
    no = judge(c11(Draw(0, n=8), (0.0, 0.0)))
    assert no.verdict == "refuted"
    assert judge(c11(Draw(0, n=5), (0.0, 0.0))).verdict == "inconclusive"
    assert judge(c11(Draw(0, n=8), (-0.2, -0.2))).verdict == "refuted"  # less sensitive
    flat = judge(c11(Draw(0), (0.3, 0.3)))  # worse at both widths, not growing
    assert flat.verdict == "depends" and flat.numbers["growth"].reading == "equal"
    assert yes.headline != no.headline and yes.plain != no.plain
    big = yes.numbers["d_model=128 sensitivity"].mean
    assert f"{big:+.3f} nats" in yes.headline and "3e+04 (width d_model=128)" in yes.plain[1]


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


@pytest.mark.filterwarnings("ignore:Precision loss occurred")
def test_c11_one_more_unstable_lr_on_every_seed_reads_one_way():
    """Dot unstable at exactly one more LR than scaled_dot on every seed: d = 1/6 > δ on every
    seed whatever the seeds' own counts k (float rounding of k/6 − (k−1)/6 must not matter),
    and one more unstable LR of six is a real effect once the exact sign test can see it
    through Holm's correction (8 seeds; with 5, p = 2⁻⁵ cannot pass)."""
    got = set()
    for ks in ((1,) * 8, (1, 1, 3, 3, 3, 3, 3, 3), (1, 1, 4, 4, 4, 4, 4, 4)):
        ev = c11(Draw(0, n=8), (0.0, 0.0))
        ev["sweep"][WIDTHS[0]]["dot"]["unstable"] = {str(s): k / 6 for s, k in enumerate(ks)}
        ev["sweep"][WIDTHS[0]]["scaled_dot"]["unstable"] = {str(s): (k - 1) / 6
                                                            for s, k in enumerate(ks)}
        got.add(judge(ev).numbers[f"{WIDTHS[0]} unstable"].reading)
    assert got == {"greater"}, got
    ev = c11(Draw(0, n=5), (0.0, 0.0))
    ev["sweep"][WIDTHS[0]]["dot"]["unstable"] = {str(s): 2 / 6 for s in range(5)}
    ev["sweep"][WIDTHS[0]]["scaled_dot"]["unstable"] = {str(s): 1 / 6 for s in range(5)}
    assert judge(ev).numbers[f"{WIDTHS[0]} unstable"].reading == "inconclusive"


def test_c11_unstable_delta_follows_the_grid():
    """0.6/|grid|: one LR fewer than the grid's step; an empty grid reads as six points."""
    ev = c11(Draw(0), (0.0, 0.0))
    assert M.unstable_delta(M.Evidence.model_validate({**ev, "lrs": [0.1, 0.2, 0.3]})) == \
        pytest.approx(0.2)
    assert M.unstable_delta(M.Evidence.model_validate({**ev, "lrs": []})) == pytest.approx(0.1)


def test_c11_without_a_sweep_is_inconclusive_and_the_regime_counts_divergences():
    v = judge(text({}))
    assert v.verdict == "inconclusive" and v.because == "no LR sweep was run"
    ev = c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5))
    ev["sweep"][WIDTHS[1]]["dot"].update(n_runs=30, n_diverged=4, n_past_logit_limit=7)
    ev["sweep"][WIDTHS[1]]["scaled_dot"].update(n_runs=30)
    v = judge(ev)
    assert "widths 32, 128; 4 of 60 runs diverged" in v.regime
    assert "not divergence" not in v.regime and "7 of 60 runs passed 1e4" in v.plain[1]
    assert "not divergence" in judge(c11(Draw(0), (0.0, 0.0))).regime
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
    assert M.CLAIM.studies == ("lr_text",) and M.CLAIM.measurements == ()
    assert M.CLAIM.text == "Training is unstable without scaling, especially for larger models."
    assert "C11" in CLAIMS_MD


def test_c11_gathers_the_text_study():
    ev = c11(Draw(0), (0.05, 0.3))
    src = Sources(preset=None, studies={}, runs={}, measured={},
                  memo={("lr_text", lr_text_evidence): ev})
    assert M.CLAIM.gather(src) is ev


# ------------------------------------------------------------------------------ sentences


CASES = {
    V.SUPPORTED: lambda: c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5)),
    V.REFUTED: lambda: c11(Draw(0, n=8), (0.0, 0.0)),
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
    """A sweep shaped like the report's, with logit curves."""
    lrs = (1e-3, 1e-2, 1e-1)
    arms = {"scaled_dot": 1.0, "dot": 3.0, "qk_layernorm": 0.01}
    sweep = {}
    for i, w in enumerate(WIDTHS):
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
    assert "dot from LR 0.01" in figs[0]["alt"] and "qk_layernorm at no LR" in figs[0]["alt"]
    assert "Unscaled minus scaled LR sensitivity and instability" in figs[1]["alt"]
    assert M.sweep_unit("d_model=32 unstable") == "share of LR grid"
    assert M.sweep_unit("growth") == M.sweep_unit("d_model=32 sensitivity") == "nats"
    assert {Path(p).name: bad for p, bad in saved if bad} == {}


def test_c11_figure_without_peak_logits_is_an_error(tmp_path):
    ev = text({WIDTHS[0]: {"dot": sweep_arm()}})
    with pytest.raises(ValueError, match="peak logits"):
        M.alt(ev)
    assert math.isfinite(M.unstable_delta(M.Evidence.model_validate(ev)))
