"""C2: the cosine-range rule flips on opposite evidence; its measurement, evidence model and
figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import CLAIMS_MD, GENERIC, layouts, png_info

from attnscale.audit.claim import Sources
from attnscale.audit.claims import c02_cosine_range as M
from attnscale.audit.studies import PRESETS
from attnscale.audit.verdicts import MissingEvidence

GOOD = {"max_abs_logit_tau1": 0.9999, "max_abs_logit_tau10": 9.99, "max_err_vs_reference": 1e-7}


def test_c2():
    assert M.CLAIM.decide(GOOD).verdict == "supported"
    assert M.CLAIM.decide({**GOOD, "max_abs_logit_tau1": 1.5}).verdict == "refuted"


def test_c2_flips_on_tau10_range_and_on_the_error():
    assert M.CLAIM.decide({**GOOD, "max_abs_logit_tau10": 10.1}).verdict == "refuted"
    assert M.CLAIM.decide({**GOOD, "max_err_vs_reference": 1e-3}).verdict == "refuted"


def test_c2_numbers_are_the_evidence_and_sentences_follow_it():
    v = M.judge(M.Evidence.model_validate(GOOD))
    assert v.numbers == GOOD
    assert "stayed within" in v.plain[0] and "0.9999" not in v.plain[0] and "1.000" in v.plain[0]
    out = M.CLAIM.decide({**GOOD, "max_abs_logit_tau1": 1.5})
    assert "left [−τ, τ]" in out.plain[0] and out.headline.startswith("refuted")


def test_evidence_with_a_missing_field_is_missing_evidence():
    with pytest.raises(MissingEvidence, match="max_err_vs_reference"):
        M.CLAIM.decide({k: v for k, v in GOOD.items() if k != "max_err_vs_reference"})
    with pytest.raises(ValueError, match="extra: Extra inputs"):  # a key it does not know: a bug
        M.CLAIM.decide({**GOOD, "extra": 1.0})


def test_measurement_is_supported_and_keeps_its_cache_key():
    (m,) = M.CLAIM.measurements
    assert m.kind == "cosine_range" and m.params(PRESETS["tiny"]) == {}
    ev = m.compute(PRESETS["tiny"])
    assert set(ev) == set(GOOD)
    assert 0 < ev["max_abs_logit_tau1"] <= 1 and 1 < ev["max_abs_logit_tau10"] <= 10
    assert M.CLAIM.decide(ev).verdict == "supported"
    assert m.compute(PRESETS["tiny"]) == ev  # seeded: the same numbers every time


def test_gather_reads_its_measurement():
    src = Sources(PRESETS["tiny"], {}, {}, {"cosine_range": GOOD})
    assert M.CLAIM.gather(src) == GOOD
    assert M.CLAIM.studies == () and M.CLAIM.scale(PRESETS["tiny"]).startswith("random q, k")
    assert "**C2" in CLAIMS_MD or "### C2" in CLAIMS_MD


def test_figure_is_print_quality_with_its_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    (f,) = M.draw(GOOD, M.CLAIM.decide(GOOD).numbers, tmp_path)
    assert set(f) == {"path", "alt"} and Path(f["path"]).name == "c2_cosine_range.png"
    width, height, dpi = png_info(f["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = f["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and not GENERIC.match(alt)
    assert "0.500 at d = 4" not in alt and "0.50 at d = 4" in alt and "0.062 at d = 256" in alt
    assert "1.000 at τ = 1" in alt and "9.99 at τ = 10" in alt
    assert [problems for _, problems in saved] == [[]]


def test_alt_says_less_without_measured_numbers():
    alt = M.alt({})
    assert "never left" not in alt and "O(1/√d)" in alt
