"""C12 (1/√d_k keeps the logits O(1)) on synthetic evidence: at init the row spread of scaled
dot decides the first half; after training the rule compares measured saturation (mean max
attention weight, share of rows above 0.9) across widths at matched LRs in the unit-init cells
(GPT-2 init is context), with a paired t-test checked against scipy and Holm over every LR and
measure; it flips with the data, reads inconclusive without an effect, prints the trained
logit growth with LR and width, reads real runs (a stale run is missing evidence) and its figure
draws (or fails loudly without data)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from support import CLAIMS_MD, NULL_DRAWS, assert_reads_as, holm_by_hand, layouts, png_info

from attnscale.audit.claim import Sources
from attnscale.audit.claims import c12_logits_o1 as M
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.verdicts import MissingEvidence
from attnscale.lab.records import Run

SEEDS6 = [str(i) for i in range(6)]
LRS = ("0.001", "0.01", "0.1")
WIDTHS = ("d_model=32", "d_model=128")


def seeds(v: float, spread: float = 0.01, rng: np.random.Generator | None = None
          ) -> dict[str, float]:
    """Six per-seed values around ``v``: an even ladder (``rng`` None) or Gaussian noise."""
    if rng is None:
        return {s: v * (1 + spread * (i - 2.5)) for i, s in enumerate(SEEDS6)}
    return {s: float(v + spread * rng.standard_normal()) for s in SEEDS6}


def cell(weight: dict[str, float], logit: float = 10.0, spread: float = 0.01,
         rng: np.random.Generator | None = None) -> dict[str, Any]:
    """One (init, width) cell: per LR the mean max weight ``weight[lr]``, a saturated share
    tied to it, and max |logit| ``logit`` × the LR's rank."""
    return {"max_weight": {lr: seeds(w, spread, rng) for lr, w in weight.items()},
            "saturated_fraction": {lr: seeds(max(0.0, 2 * w - 1) + 0.03, spread, rng)
                                   for lr, w in weight.items()},
            "max_abs_logit": {lr: seeds(logit * (1 + i), spread)
                              for i, lr in enumerate(weight)}}


def c12(unit=1.0, gpt2=0.01, narrow=(0.2, 0.3, 0.5), wide=(0.2, 0.3, 0.5), spread=0.01,
        rng=0, gpt2_cells=True):
    """Step-0 row σ per regime, d_k and seed; per init and width scaled_dot's final
    saturation at each LR of :data:`LRS` (``narrow``, ``wide``: the mean max weights), with
    per-seed noise ``spread`` from ``rng`` (a seed or a generator; None: an even ladder, the
    same at both widths)."""
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    def row(narrow_w, wide_w, logit):
        return {WIDTHS[0]: cell(dict(zip(LRS, narrow_w, strict=True)), logit, spread, rng),
                WIDTHS[1]: cell(dict(zip(LRS, wide_w, strict=True)), 4 * logit, spread, rng)}
    trained = {"unit": row(narrow, wide, 10.0)}
    if gpt2_cells:
        trained["gpt2"] = row(narrow, wide, 2.0)
    return {"init_std": {"gpt2": {d: seeds(gpt2) for d in ("16", "64")},
                         "unit": {"16": seeds(unit), "64": seeds(unit * 1.05)}},
            "trained": trained, "n": 32, "steps": 150}


def judge(ev):
    return M.CLAIM.decide(ev)


def test_c12_flips_with_the_init_and_the_width_effect_at_a_matched_lr():
    ok = judge(c12())
    assert_reads_as(ok, "supported", "C12")
    assert ok.headline == ("supported: O(1) at init; at every matched LR the wider model "
                           "saturates no more")
    bad = judge(c12(unit=8.0))
    assert_reads_as(bad, "refuted", "C12")
    assert bad.headline == "refuted: not O(1) at init" and "not O(1)" in bad.plain[0]
    assert judge(c12(unit=0.1)).verdict == "refuted"
    grows = judge(c12(wide=(0.2, 0.5, 0.9)))  # the wider model saturates more at 0.01, 0.1
    assert_reads_as(grows, "depends", "C12")
    # at 0.01 both widths' shares above 0.9 are 0.03: only the mean max weight grows there
    assert grows.numbers["more"] == ["lr 0.01 max_weight", "lr 0.1 max_weight",
                                     "lr 0.1 saturated_fraction"]
    assert grows.headline == ("depends: O(1) at init; after training the wider model saturates "
                              "more at 2 of 3 matched LRs (lr 0.01, 0.1)")
    assert "At a matched LR the wider model's attention saturates more, at lr 0.01 (mean max " \
        "weight), lr 0.1 (mean max weight, rows above 0.9): lr 0.01 max_weight: +0.2" in \
        " ".join(grows.plain)
    # the narrower saturating more is not the claim failing: still supported
    assert judge(c12(narrow=(0.2, 0.5, 0.9))).verdict == "supported"
    assert "0.975–1.08" in ok.plain[0] and "O(1), as the thread says" in ok.plain[0]


def test_c12_identical_widths_are_not_measurable_and_plan_no_seeds():
    """Both widths saturating identically on every seed: every difference is 0, which no test
    reads: the trained half is not decided, and no seeds are planned for it."""
    v = judge(c12(rng=None))
    assert_reads_as(v, "inconclusive", "C12")
    assert all(not c.measurable() and c.seeds_to_decide is None
               for c in v.numbers["width"].values())
    assert "seeds would decide" not in " ".join(v.plain)
    assert "both widths saturate identically on every seed: not measurable" in \
        " ".join(v.plain)


def test_c12_reads_a_matched_lr_never_each_arms_own():
    """Only LRs both widths ran are compared; an LR one width alone ran is left out, and a
    study with one width compares nothing (inconclusive after training)."""
    ev = c12(wide=(0.2, 0.3, 0.9))
    for stat in ("max_weight", "saturated_fraction", "max_abs_logit"):
        del ev["trained"]["unit"][WIDTHS[0]][stat]["0.1"]  # the narrow model never ran 0.1
    v = judge(ev)
    assert v.verdict == "supported" and "lr 0.1 max_weight" not in v.numbers["width"]
    assert "compared at matched LRs (0.001, 0.01)" in v.regime
    one = c12()
    del one["trained"]["unit"][WIDTHS[1]]
    w = judge(one)
    assert_reads_as(w, "inconclusive", "C12")
    assert w.numbers["width"] == {} and "could not be compared at a matched LR" in \
        " ".join(w.plain)


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_c12_no_width_effect_with_noisy_seeds_is_never_depends(rng_seed):
    """Same saturation at both widths, per-seed noise 3δ: never a false width effect."""
    ev = c12(spread=0.15, rng=np.random.default_rng(rng_seed))
    assert judge(ev).verdict in ("inconclusive", "supported")


def test_c12_noisy_seeds_are_mostly_undecided_with_seeds_to_decide():
    verdicts = [judge(c12(spread=0.15, rng=np.random.default_rng(r))) for r in NULL_DRAWS]
    undecided = [v for v in verdicts if v.verdict == "inconclusive"]
    assert len(undecided) >= 0.75 * len(verdicts)
    assert any("seeds would decide the nearest" in " ".join(v.plain) for v in undecided)


def test_c12_reading_matches_scipy_with_holm_over_every_lr_and_measure():
    rng = np.random.default_rng(3)
    ev = c12(wide=(0.2, 0.35, 0.7), spread=0.02, rng=rng)
    v = judge(ev)
    unit = ev["trained"]["unit"]
    keys, ps = [], []
    for lr in LRS:
        for stat in ("max_weight", "saturated_fraction"):
            a = np.array(list(unit[WIDTHS[1]][stat][lr].values()))
            b = np.array(list(unit[WIDTHS[0]][stat][lr].values()))
            c = v.numbers["width"][f"lr {float(lr):g} {stat}"]
            ci = stats.ttest_rel(a, b).confidence_interval(0.95)
            assert (c.mean, c.lo, c.hi) == pytest.approx((np.mean(a - b), ci.low, ci.high),
                                                         rel=1e-9)
            d = M.SAT_DELTA
            ps.append(min(stats.ttest_rel(a, b + d, alternative="greater").pvalue,
                          stats.ttest_rel(a, b - d, alternative="less").pvalue,
                          max(stats.ttest_rel(a, b - d, alternative="greater").pvalue,
                              stats.ttest_rel(a, b + d, alternative="less").pvalue)))
            keys.append(f"lr {float(lr):g} {stat}")
    assert [v.numbers["width"][k].p_holm for k in keys] == pytest.approx(holm_by_hand(ps),
                                                                        rel=1e-9)


def test_c12_sentences_print_the_saturation_and_the_logit_growth():
    v = judge(c12(wide=(0.2, 0.3, 0.58), spread=1e-4))
    text = " ".join(v.plain)
    assert ("After 150 steps at the same LR (unit init), scaled_dot's mean max attention weight "
            "goes from width 32 to width 128: lr 0.001: 0.20 → 0.20 (3% → 3% of rows above "
            "0.9); lr 0.01: 0.30 → 0.30") in text
    assert "lr 0.1: 0.50 → 0.58 (3% → 19% of rows above 0.9)" in text
    assert "After 150 steps at the same LR (gpt2 init)" in text  # context, printed
    assert ("Trained logits grow with LR and width: scaled_dot's final max |logit| from lr "
            "0.001 to 0.1 is 10 → 30 at width 32 (unit init); 40 → 120 at width 128 (unit "
            "init); 2 → 6 at width 32 (gpt2 init); 8 → 24 at width 128 (gpt2 init).") in text
    assert "of rows above 0.9) (the first row of each causal sequence sees one key, so 1/32 of " \
        "rows are always above 0.9)" in text
    assert "arXiv 2309.14322" in text and "arXiv 2302.05442" in text
    assert "why QK-norm, logit soft-capping and QK-Clip exist" in text
    assert v.numbers["table"]["unit"][WIDTHS[1]]["0.1"]["max_weight"] == pytest.approx(0.58,
                                                                                      abs=1e-3)
    assert "unit-variance init decides, GPT-2 init is context" in v.regime
    assert "150 steps at widths 32, 128 (n = 32)" in v.regime


def test_c12_the_logit_growth_sentence_follows_the_data():
    """Max |logit| that does not grow with the LR, or is smaller at the wider width, is said
    so, never "grows"."""
    ev = c12()
    cells = ev["trained"]["unit"]
    flat = judge(ev)
    assert "Trained logits grow with LR and width:" in flat.plain[-1]
    for w, scale in zip(WIDTHS, (4.0, 1.0), strict=True):  # the narrow width larger
        cells[w]["max_abs_logit"] = {lr: seeds(scale * 10.0) for lr in LRS}  # flat in LR
    assert "Trained logits did not grow with LR or width here:" in judge(ev).plain[-1]
    cells[WIDTHS[0]]["max_abs_logit"]["0.1"] = seeds(80.0)
    cells[WIDTHS[1]]["max_abs_logit"]["0.1"] = seeds(20.0)
    assert "Trained logits grow with LR (not with width here):" in judge(ev).plain[-1]


def test_c12_gpt2_init_is_described_not_judged():
    """The GPT-2 regime is sentences, never the verdict: its step-0 spread and its trained
    width effect leave the verdict as the unit cells have it."""
    v = judge(c12(gpt2=0.01))
    assert v.verdict == "supported" and "far below 1, set by the init" in v.plain[1]
    assert "of order one" in judge(c12(gpt2=1.0)).plain[1]
    ev = c12()
    ev["trained"]["gpt2"][WIDTHS[1]] = cell(dict(zip(LRS, (0.9, 0.95, 0.99), strict=True)))
    assert judge(ev).verdict == "supported"
    no_gpt2 = c12(gpt2_cells=False)
    del no_gpt2["init_std"]["gpt2"]
    assert all("gpt2" not in s and "GPT-2" not in s for s in judge(no_gpt2).plain)


def test_c12_without_data_is_inconclusive():
    ev = c12()
    ev["init_std"]["unit"] = {"16": {}, "64": {}}
    assert judge(ev).verdict == "inconclusive" and judge(ev).headline == "inconclusive: no data"
    ev = c12()
    ev["trained"] = {}
    assert judge(ev).verdict == "inconclusive"


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


def run(seed, lr, d, init, std0, weight, status="done", variant="scaled_dot"):
    """A finished run as the store returns it: two layers, σ at step 0; at the end a mean max
    weight ``weight`` in layer 1 (layer 2 half of it), its share above 0.9 and max |logit|."""
    layer = {"row_logit_std": std0, "row_freeze_ratio": 0.1}
    end = [{"max_weight": weight, "saturated_fraction": weight / 2, "max_abs_logit": 50 * lr},
           {"max_weight": weight / 2, "saturated_fraction": weight, "max_abs_logit": 7.0}]
    return Run.from_row({
        "id": f"{variant}-{seed}-{lr}-{d}-{init}", "variant": variant, "status": status,
        "final_loss": 2.0 + lr, "config": {"seed": seed, "lr": lr, "d_model": d, "init": init},
        "history": [{"loss": 3.0, "layers": [layer, layer]}, {"loss": 2.0, "layers": end}]})


def test_c12_gathers_the_saturation_from_real_runs_at_every_lr():
    """gather reads scaled_dot's step-0 σ (layer 1) per regime and d_k, and per init, width,
    LR and reported seed its final saturation and max |logit| (the larger layer); a diverged
    run is saturated (1) with an infinite logit; a run stored before the statistic was logged
    is missing evidence, never a smaller family."""
    plan = studies(PRESETS["tiny"])
    hd, text = plan["head_dim"], plan["lr_text"]
    head_runs = [run(s, lr, d, init, 1.0 + 0.1 * s, 0.3) for s in hd.seeds + hd.tune_seeds
                 for lr in hd.lrs for d in hd.cells["d_model"] for init in hd.cells["init"]]
    text_runs = [run(s, lr, d, init, 0.01, 0.2 + 0.01 * s) for s in text.seeds
                 for lr in text.lrs for d in text.cells["d_model"] for init in text.cells["init"]]
    text_runs += [run(s, lr, d, "unit", 0.01, 0.9, variant="dot") for s in text.seeds
                  for lr in text.lrs for d in text.cells["d_model"]]  # not scaled_dot
    text_runs[0] = replace(text_runs[0], status="diverged")
    src = Sources(preset=PRESETS["tiny"], studies=plan, measured={},
                  runs={"head_dim": head_runs, "lr_text": text_runs})
    got = M.CLAIM.gather(src)
    assert got["init_std"]["unit"]["16"] == {"0": 1.0, "1": 1.1, "2": 1.2}
    assert set(got["trained"]) == set(text.cells["init"])
    width, lr = f"d_model={text.cells['d_model'][0]}", str(float(text.lrs[0]))
    first = text_runs[0].config.model.init
    cell_ = got["trained"][first][width]
    assert cell_["max_weight"][lr] == pytest.approx({"0": 1.0, "1": 0.21, "2": 0.22})
    assert cell_["saturated_fraction"][lr] == pytest.approx({"0": 1.0, "1": 0.21, "2": 0.22})
    assert cell_["max_abs_logit"][lr]["0"] == math.inf
    assert cell_["max_abs_logit"][lr]["1"] == pytest.approx(7.0)
    assert got["n"] == text.base["seq_len"] and got["steps"] == text.base["steps"]
    M.CLAIM.judge(M.CLAIM.read(got))  # it reads
    del text_runs[1].history[-1]["layers"][0]["max_weight"]
    with pytest.raises(MissingEvidence, match="logged no 'max_weight'"):
        M.CLAIM.gather(Sources(preset=PRESETS["tiny"], studies=plan, measured={},
                               runs={"head_dim": head_runs, "lr_text": text_runs}))


def test_final_stat_reads_the_largest_layer_and_a_blow_up_as_saturated():
    r = run(0, 1e-2, 32, "unit", 1.0, 0.4)
    assert M.final_stat(r, "max_weight") == 0.4  # the larger of 0.4 and 0.2
    assert M.final_stat(r, "saturated_fraction") == 0.4
    r.history[-1]["layers"][1]["max_weight"] = None  # logged, not finite
    assert M.final_stat(r, "max_weight") == 1.0
    gone = run(0, 1e-2, 32, "unit", 1.0, 0.4, status="diverged")
    assert M.final_stat(gone, "max_abs_logit") == math.inf


# ------------------------------------------------------------------------------ figures


def test_c12_draws_init_saturation_and_logits_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = c12(wide=(0.2, 0.4, 0.7), spread=1e-4)
    from attnscale.util.jsonio import jsonable
    figs = M.draw(ev, jsonable(judge(ev).numbers), tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c12_saturation.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = figs[0]["alt"]
    assert alt.startswith("At init a row of scaled_dot's logits has std 0.0097–0.01 with gpt2 "
                          "init, 0.97–1.1 with unit init.")
    assert ("After training at lr 0.1 (unit init) the mean max attention weight is width 32 "
            "0.50 (max |logit| 30), width 128 0.70 (max |logit| 120).") in alt
    assert [problems for _, problems in saved] == [[]]


def test_c12_alt_without_trained_data_says_so():
    ev = {"init_std": {}, "trained": {}, "n": 32, "steps": 150}
    assert M.alt(ev, {}) == "No scaled_dot logit was measured."
    assert M.alt(c12(), {}).startswith("At init")


def test_c12_figure_with_missing_data_is_an_error_not_faked(tmp_path):
    ev = {"init_std": {"unit": {"8": {}}}, "trained": {}, "n": 32, "steps": 150}
    with pytest.raises(ValueError, match="no scaled_dot logit"):
        M.draw(ev, {}, tmp_path)
    assert not list(tmp_path.iterdir())
