"""C1: attnscale's scaled_dot against the float64 formula and torch SDPA; the rule flips on a
wrong implementation, and its figure marks an exact zero instead of drawing a tiny bar."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import assert_print_quality, layouts

from attnscale.audit import theory_plots
from attnscale.audit.claims import c01_formula as M
from attnscale.audit.verdicts import MissingEvidence


def case(ref: float, sdpa: float, **kw) -> dict:
    return {"causal": False, "mask": None, "gqa": False, "err_reference": ref,
            "err_sdpa": sdpa, **kw}


def test_c1_flips_on_a_wrong_implementation():
    good = {"cases": [case(1e-7, 2e-7), case(3e-7, 0.0, causal=True)]}
    v = M.CLAIM.decide(good)
    assert v.verdict == "supported" and v.numbers == {"max_abs_error": 3e-7}
    assert "to 3.0e-07 over 2 cases" in v.plain[0]
    bad = M.CLAIM.decide({"cases": [case(1e-7, 1e-2)]})
    assert bad.verdict == "refuted" and "a bug" in bad.plain[0]


def test_c1_no_case_is_an_error_and_a_missing_field_is_named():
    with pytest.raises(ValueError, match="no case"):
        M.CLAIM.decide({"cases": []})
    with pytest.raises(MissingEvidence, match="err_sdpa"):
        M.CLAIM.decide({"cases": [{k: v for k, v in case(0.0, 0.0).items() if k != "err_sdpa"}]})


def test_c1_the_measurement_is_exact():
    ev = M.CLAIM.read(M.measure())
    assert len(ev.cases) == 4 and ev.worst() < 1e-5
    assert {(c.causal, c.mask, c.gqa) for c in ev.cases} >= {(True, "float", True)}


def test_c1_marks_an_exact_zero_instead_of_a_tiny_bar(tmp_path, monkeypatch):
    figs = []
    real = theory_plots.save_png

    def keep(fig, path):
        figs.append(fig)
        return real(fig, path)
    monkeypatch.setattr(theory_plots, "save_png", keep)
    cases = [case(3e-7, 0.0), case(4e-7, 0.0, causal=True, mask="bool", gqa=True)]
    out = M.draw({"cases": cases}, {}, tmp_path)[0]
    ax = figs[0].axes[0]
    heights = sorted(p.get_y() + p.get_height() for p in ax.patches)
    assert heights == pytest.approx([3e-7, 4e-7])  # only the nonzero errors are bars
    assert sum(t.get_text() == "0 (exact)" for t in ax.texts) == 2
    assert ax.get_ylim()[0] > 1e-12
    assert "bitwise equal" in out["alt"] and "4.0e-07" in out["alt"]


def test_c1_figure_is_print_quality_with_a_readable_layout(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    cases = [case(3e-7, 0.0), case(4e-7, 0.0, causal=True, mask="bool", gqa=True)]
    (f,) = M.draw({"cases": cases}, {}, tmp_path)
    assert Path(f["path"]).name == "c1_exactness.png"
    assert_print_quality(f)
    assert [problems for _, problems in saved] == [[]]
