"""C9: the peaky-softmax rule flips on opposite evidence; its measurement (exact theory checked
by Monte Carlo), evidence model and figures (the entropy curves and the phase diagram)."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import CLAIMS_MD, GENERIC, layouts, png_info

from attnscale.audit import theory_plots
from attnscale.audit.claim import Sources
from attnscale.audit.claims import c09_peaky_softmax as M
from attnscale.audit.studies import PRESETS
from attnscale.audit.verdicts import MissingEvidence
from attnscale.measure import theory


def rem_curves(shape):
    """Curves at n = 64 and 4096 whose E[H]/ln n is ``shape(s / s_c)``."""
    out = []
    for n in (64, 4096):
        sc = math.sqrt(2 * math.log(n))
        s = [0.1 * i * sc for i in range(1, 31)]
        out.append({"n": n, "s": s, "s_c": sc, "entropy_norm": [shape(x / sc) for x in s],
                    "max_weight": [0.5] * len(s), "jacobian": [0.1] * len(s),
                    "at_10_sc": 1e-3})
    return out


def rem(curves: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    """C9's evidence around ``curves``, as :func:`c09_peaky_softmax.measure` writes it."""
    return {"curves": curves, "max_abs_z": 2.0, "max_weight_unscaled_64_512": 0.6,
            "max_weight_scaled_64_512": 0.01, "grad_norm": {"dot": 8.0, "scaled_dot": 1.0},
            "grad_ratio_64": 8.0, **kw}


def exact_evidence() -> dict[str, Any]:
    """The exact theory at n = 64 and 512 on 12 scales (the old figure tests' evidence)."""
    curves = []
    for n in (64, 512):
        sc = float(theory.rem_critical_scale(n))
        s = [float(x) for x in np.linspace(0.1, 3 * sc, 12)]
        curves.append({"n": n, "s": s, "s_c": sc,
                       "entropy_norm": [float(theory.expected_entropy(n, x)) / math.log(n)
                                        for x in s],
                       "max_weight": [float(theory.expected_max_weight(n, x)) for x in s],
                       "jacobian": [0.1] * len(s), "at_10_sc": 1e-3})
    return rem(curves, max_abs_z=1.0, max_weight_unscaled_64_512=0.73,
               max_weight_scaled_64_512=0.027)


def test_c9():
    ev = rem(rem_curves(lambda r: 1 / (1 + r**4)))
    assert M.CLAIM.decide(ev).verdict == "supported"
    ev["curves"] = rem_curves(lambda r: 0.5 + 0.1 * r)  # entropy rising with scale
    assert M.CLAIM.decide(ev).verdict == "refuted"
    ev["curves"] = rem_curves(lambda r: 0.9 - 0.01 * r)  # falls, but never sharp
    assert M.CLAIM.decide(ev).verdict == "inconclusive"


def test_c9_theory_and_monte_carlo_must_agree():
    """A sharp, falling entropy is still inconclusive when Monte Carlo disagrees (> 4 SE)."""
    ev = rem(rem_curves(lambda r: 1 / (1 + r**4)), max_abs_z=4.5)
    assert M.CLAIM.decide(ev).verdict == "inconclusive"


def test_wording_and_numbers_follow_the_evidence():
    good = M.CLAIM.decide(rem(rem_curves(lambda r: 1 / (1 + r**4))))
    flat = M.CLAIM.decide(rem(rem_curves(lambda r: 0.9 - 0.01 * r)))
    assert good.plain[0].startswith("Right:") and flat.plain[0].startswith("Checked:")
    assert "0.60 of the weight" in good.plain[1] and "scaled ones 0.010" in good.plain[1]
    assert good.headline == ("supported: max weight 0.60 unscaled vs 0.010 scaled, q/k "
                             "gradients 8× scaled (d_k=64, n=512)")
    assert good.numbers == {"max_weight_unscaled_64_512": 0.6, "max_weight_scaled_64_512": 0.01,
                            "grad_ratio_64": 8.0, "grad_norm": {"dot": 8.0, "scaled_dot": 1.0}}


def test_the_gradient_measurement_is_printed_not_hard_coded():
    """The measured q/k gradient ratio and the frozen max weight reach the plain sentence, the
    headline, the figure's alt text and the page's short answer, and change with the data."""
    for ratio, w_un in ((31.0, 0.73), (4.0, 0.5)):
        ev = rem(rem_curves(lambda r: 1 / (1 + r**4)), grad_ratio_64=ratio,
                 max_weight_unscaled_64_512=w_un, max_weight_scaled_64_512=0.027)
        v = M.CLAIM.decide(ev)
        assert f"is {ratio:.0f}× larger without the scale, not smaller" in v.plain[1]
        assert f"put {w_un:.2f} of the weight on one key" in v.plain[1]
        assert "attention frozen near one-hot on random keys at init, not vanishing " \
            "gradients" in v.plain[1]
        assert f"q/k gradients {ratio:.0f}× scaled" in v.headline
        assert f"is {ratio:.0f}× larger without the scale, not smaller." in M.rem_alt(ev)
        (said,) = M.says_scale({"evidence": ev})
        assert f"put {w_un:.2f} of the weight on one key on average, scaled ones 0.027" in said
        assert f"the gradient reaching q and k is {ratio:.0f}× larger without the scale" in said
        assert "not vanishing gradients" in said
    # opposite data: smaller gradients without the scale are said so, never "larger"
    small = rem(rem_curves(lambda r: 1 / (1 + r**4)), grad_ratio_64=0.25)
    text = " ".join([*M.CLAIM.decide(small).plain, *M.says_scale({"evidence": small})])
    assert "4× smaller without the scale" in text and "larger" not in text
    assert "not vanishing gradients" not in text
    old = {k: v for k, v in ev.items() if k != "grad_ratio_64"}  # an entry from before it
    (said,) = M.says_scale({"evidence": old})
    assert "0.50 of the weight" in said and "gradient" not in said


def test_evidence_with_a_missing_field_is_missing_evidence():
    ev = rem(rem_curves(lambda r: 1 / (1 + r**4)))
    with pytest.raises(MissingEvidence, match="max_abs_z"):
        M.CLAIM.decide({k: v for k, v in ev.items() if k != "max_abs_z"})
    with pytest.raises(MissingEvidence, match="s_c"):
        M.CLAIM.decide({**ev, "curves": [{k: v for k, v in c.items() if k != "s_c"}
                                         for c in ev["curves"]]})


def test_measurement_is_supported_and_keeps_its_cache_key():
    p = PRESETS["tiny"]
    (m,) = M.CLAIM.measurements
    assert m.kind == "rem" and m.params(p) == {"mc": p.mc_samples}
    ev = m.compute(p)
    assert [c["n"] for c in ev["curves"]] == [64, 512, 4096]
    assert ev["grad_ratio_64"] == pytest.approx(ev["grad_norm"]["dot"]
                                                / ev["grad_norm"]["scaled_dot"])
    assert ev["grad_ratio_64"] > 10  # larger without the scale, not smaller (31 measured)
    assert ev["max_weight_unscaled_64_512"] > 10 * ev["max_weight_scaled_64_512"]
    assert M.CLAIM.read(ev).model_dump() == ev  # report.json keeps the same dict
    assert M.CLAIM.decide(ev).verdict == "supported"


def test_gather_reads_its_measurement():
    ev = exact_evidence()
    assert M.CLAIM.gather(Sources(PRESETS["tiny"], {}, {}, {"rem": ev})) == ev
    assert M.CLAIM.studies == () and "n = 64–4096" in M.CLAIM.scale(PRESETS["tiny"])
    assert "**C9" in CLAIMS_MD or "### C9" in CLAIMS_MD


def test_entropy_half_interpolates_the_crossing():
    assert M.entropy_half({"s": [0.0, 1.0, 2.0], "entropy_norm": [1.0, 0.6, 0.4]}) == \
        pytest.approx(1.5)
    assert M.entropy_half({"s": [0.0, 1.0], "entropy_norm": [1.0, 0.9]}) is None


def test_figures_are_print_quality_and_include_the_phase_diagram(tmp_path, monkeypatch):
    """Both figures are written with their findings; the phase diagram (drawn here on a small
    grid: the report's takes seconds) states the numbers of the exact theory it shows."""
    saved = layouts(monkeypatch)
    small = functools.partial(theory_plots.plot_phase_diagram, d_max=256, n_max=4096, grid=6)
    monkeypatch.setattr(M, "plot_phase_diagram", lambda path, grid: small(path))
    summary = theory_plots.phase_summary(d_max=1024, n_max=4096, ns=(512,))
    monkeypatch.setattr(M, "phase_summary", lambda: summary)
    ev = exact_evidence()
    figs = M.draw(ev, M.CLAIM.decide(ev).numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c9_entropy.png", "c9_phase_diagram.png"]
    for f in figs:
        width, height, dpi = png_info(f["path"])
        assert dpi >= 150 and width >= 600 and height >= 400, f["path"]
        alt = f["alt"]
        assert len(alt) >= 40 and alt.rstrip().endswith(".") and not GENERIC.match(alt)
        assert re.search(r"\d", alt)
    assert "0.73 of the weight" in figs[0]["alt"] and "(s_c = 2.88)" in figs[0]["alt"]
    phase = figs[1]["alt"]
    assert "without 1/√d_k" in phase and "never saturates" in phase
    assert f"{summary['unscaled_64_512']:.2f}·ln n" in phase
    assert f"{summary['scaled_min']:.2f}·ln n" in phase
    assert f"d_k ≈ {summary['half_d'][512]:.0f} at n = 512" in phase
    assert {Path(p).name: problems for p, problems in saved if problems} == {}
