"""C8: the E[q·k] rule flips on opposite evidence (the thread's wording is refuted by the
Monte Carlo); its measurement, evidence model and figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from support import CLAIMS_MD, GENERIC, layouts, png_info

from attnscale.audit.claim import Sources
from attnscale.audit.claims import c08_mean_qk as M
from attnscale.audit.studies import PRESETS
from attnscale.audit.verdicts import MissingEvidence

DIMS = (16, 64, 256, 1024)
REAL_INIT = {"256": {"dot": 0.26, "scaled_dot": 0.032}}


def row(d: int, mean: float, se_mean: float, std: float) -> dict[str, Any]:
    """One Monte Carlo row as :func:`c08_mean_qk.measure` writes it."""
    return {"d": d, "mean": mean, "se_mean": se_mean, "std": std,
            "std_scaled": std / math.sqrt(d)}


def qk(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"by_d": rows, "real_init": REAL_INIT}


def test_c8():
    right = qk([row(d, 0.01 * math.sqrt(d), 0.05 * math.sqrt(d), math.sqrt(d)) for d in DIMS])
    assert M.CLAIM.decide(right).verdict == "refuted"  # the thread's wording is wrong
    thread = qk([row(d, 0.5 * d, 0.01 * d, math.sqrt(d)) for d in DIMS])
    assert M.CLAIM.decide(thread).verdict == "supported"
    # a mean that neither vanishes nor grows like d_k: no reading
    flat = qk([row(d, 5.0, 0.1, math.sqrt(d)) for d in DIMS])
    assert M.CLAIM.decide(flat).verdict == "inconclusive"


def test_c8_zero_mean_with_the_wrong_spread_is_not_refuted():
    """A vanishing mean alone does not refute: the std must also grow like √d_k."""
    fast = qk([row(d, 0.0, 1.0, d ** 0.7) for d in DIMS])
    assert M.CLAIM.decide(fast).verdict == "inconclusive"


def test_plain_sentences_follow_the_evidence():
    """The sentences above a rule are built from its numbers: other data, other sentences."""
    rows = [row(d, 0.0, 1.0, math.sqrt(d)) for d in (16, 64)]
    a = M.CLAIM.decide(qk(rows))
    b = M.CLAIM.decide(qk([{**r, "std": r["d"] ** 0.7} for r in rows]))
    assert a.plain != b.plain and "d_k^0.50" in a.plain[1] and "d_k^0.70" in b.plain[1]
    assert a.numbers["std_slope"] == pytest.approx(0.5) and b.numbers["std_slope"] == \
        pytest.approx(0.7)


def test_wording_matches_the_verdict():
    right = M.CLAIM.decide(qk([row(d, 0.0, 1.0, math.sqrt(d)) for d in DIMS]))
    thread = M.CLAIM.decide(qk([row(d, 0.5 * d, 0.01 * d, math.sqrt(d)) for d in DIMS]))
    assert right.plain[0].startswith("Wrong as worded") and right.headline.startswith("refuted")
    assert "Wrong" not in thread.plain[0] and thread.headline.startswith("supported")


def test_evidence_with_a_missing_field_is_missing_evidence():
    rows = [row(d, 0.0, 1.0, math.sqrt(d)) for d in DIMS]
    with pytest.raises(MissingEvidence, match="se_mean"):
        M.CLAIM.decide(qk([{k: v for k, v in r.items() if k != "se_mean"} for r in rows]))
    with pytest.raises(MissingEvidence, match="real_init"):
        M.CLAIM.decide({"by_d": rows})


def test_measurement_refutes_the_thread_and_keeps_its_cache_key():
    (m,) = M.CLAIM.measurements
    assert m.kind == "qk" and m.params(PRESETS["tiny"]) == {"samples": 20000}
    ev = M.measure(samples=2000)
    assert [r["d"] for r in ev["by_d"]] == list(DIMS)
    assert set(ev["real_init"]) == {"256", "768", "4096"}
    for r in ev["by_d"]:
        assert r["std"] == pytest.approx(math.sqrt(r["d"]), rel=0.1)
        assert r["std_scaled"] == pytest.approx(1.0, rel=0.1)
    v = M.CLAIM.decide(ev)
    assert v.verdict == "refuted"  # E[q·k] is 0, not O(d_k)
    assert v.numbers["std_slope"] == pytest.approx(0.5, abs=0.05)


def test_gather_reads_its_measurement():
    ev = qk([row(d, 0.0, 1.0, math.sqrt(d)) for d in DIMS])
    assert M.CLAIM.gather(Sources(PRESETS["tiny"], {}, {}, {"qk": ev})) == ev
    assert M.CLAIM.read(ev).model_dump() == ev  # report.json keeps the same dict
    assert M.CLAIM.studies == () and "20000 samples" in M.CLAIM.scale(PRESETS["tiny"])
    assert "**C8" in CLAIMS_MD or "### C8" in CLAIMS_MD


def test_figure_is_print_quality_with_its_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = M.measure(samples=2000)
    numbers = M.CLAIM.decide(ev).numbers
    (f,) = M.draw(ev, numbers, tmp_path)
    assert Path(f["path"]).name == "c8_qk_moments.png"
    width, height, dpi = png_info(f["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = f["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and not GENERIC.match(alt)
    assert f"as d_k^{numbers['std_slope']:.2f}" in alt and "d_k = 16–1024" in alt
    assert [problems for _, problems in saved] == [[]]
    # without the verdict's slope the alt text says less, never a made-up slope
    assert "as d_k^" not in M.alt(ev, None)
