"""attnscale.audit.figures: every report figure is a readable, print-quality PNG whose alt text
states its finding, from synthetic evidence shaped like the report's (and real measurements
where they are cheap)."""

from __future__ import annotations

import math
import re
import struct
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscale.audit import figure_text as T
from attnscale.audit import figures as F
from attnscale.audit import theory_plots
from attnscale.audit.claims import CLAIMS, QUESTIONS
from attnscale.audit.measurements import measure_implementation, measure_qk
from attnscale.measure import inspection, theory

IDS = [c.id for c in CLAIMS + QUESTIONS]
LRS = (1e-3, 1e-2, 1e-1)
SEEDS = range(6)
GENERIC = re.compile(r"^\s*(C\d+|Q\d+)?\s*(figure|fig\.?|plot|image)?\s*\d*\s*$", re.I)


def arm(values: list[float]) -> dict[str, Any]:
    """One arm's per-seed values, as :mod:`attnscale.audit.selection` writes them."""
    return {"values": {str(i): float(v) for i, v in enumerate(values)}, "censored": False}


def around(mean: float, spread: float = 0.01, n: int = 6, seed: int = 0) -> dict[str, Any]:
    return arm(list(mean + spread * np.random.default_rng(seed).standard_normal(n)))


def head_dim(unit_gap: float) -> dict[str, Any]:
    dims, loss = [16, 64, 256], {}
    for init, slope in (("unit", unit_gap), ("gpt2", 0.0)):
        for j, d in enumerate(dims):
            loss[f"init={init} d_model={d}"] = {
                "scaled_dot": around(2.0, seed=j), "dot": around(2.0 + slope * j, seed=j + 10),
                "dot_absorbed": around(2.0, seed=j + 20)}
    return {"loss": loss, "inits": ["gpt2", "unit"], "head_dims": dims, "seeds": list(SEEDS),
            "entropy_init": {}, "entropy_end": {},
            "identity": {"exact": [{"d_k": d, "steps": 20, "max_loss_diff": 0.0,
                                    "clipped_steps": 4} for d in dims], "partial": []}}


def sweep_arm(scale: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"sensitivity": {str(s): scale * 0.2 + 0.01 * rng.standard_normal() for s in SEEDS},
            "unstable": {str(s): 0.0 for s in SEEDS},
            "peak_logit_by_lr": {str(lr): scale * 3e5 * lr for lr in LRS},
            "final_logit_by_lr": {str(lr): {str(s): scale * 1e3 * lr * (1 + 0.1 * s)
                                            for s in SEEDS} for lr in LRS},
            "logit_curves": {str(lr): [(t, 1 + scale * 1e4 * lr * t / 100) for t in (0, 50, 100)]
                             for lr in LRS}}


def text_evidence() -> dict[str, Any]:
    widths = ("d_model=32", "d_model=128")
    arms = {"scaled_dot": 1.0, "dot": 3.0, "qk_layernorm": 0.01, "softcap": 0.5,
            "cosine_tau1": 1.0, "cosine_learned": 0.5}
    sweep = {w: {a: sweep_arm(k * (1 + i), i * 10 + j) for j, (a, k) in enumerate(arms.items())}
             for i, w in enumerate(widths)}
    sweep["d_model=128"]["dot"]["final_logit_by_lr"]["0.1"]["0"] = math.inf  # one diverged
    loss = {w: {a: around(2.0 + (0.1 if a == "dot" else 0.0), seed=j) for j, a in
                enumerate(arms)} for w in widths}
    return {"loss": loss, "sweep": sweep, "lrs": list(LRS), "n": 32, "logit_limit": 1e4,
            "loss_margin": 1.0}


def rem_evidence() -> dict[str, Any]:
    curves = []
    for n in (64, 512):
        sc = float(theory.rem_critical_scale(n))
        s = [float(x) for x in np.linspace(0.1, 3 * sc, 12)]
        curves.append({"n": n, "s": s, "s_c": sc,
                       "entropy_norm": [float(theory.expected_entropy(n, x)) / math.log(n)
                                        for x in s],
                       "max_weight": [float(theory.expected_max_weight(n, x)) for x in s]})
    return {"curves": curves, "max_abs_z": 1.0, "max_weight_unscaled_64_512": 0.73,
            "max_weight_scaled_64_512": 0.027}


def jacobian_evidence() -> dict[str, Any]:
    curves = []
    for n in (64, 512):
        sc = math.sqrt(2 * math.log(n))
        s = [sc * r for r in (0.1, 0.5, 1.0, 3.0, 10.0)]
        median = [0.1, 0.2, 0.3, 0.05, 5e-4]
        curves.append({"n": n, "s_c": sc, "rows": 2000, "s": s, "median": median,
                       "q1": [m / 10 for m in median], "q3": [m * 3 for m in median],
                       "rms": [0.12, 0.2, 0.3, 0.2, 0.15], "frac_below_1e-3": [0, 0, 0, 0.1, 0.6],
                       "uniform_limit": math.sqrt(n - 1) / n})
    law = [{"n": c["n"], "k": [10.0, 30.0, 100.0], "median": [1e-3, 1e-10, 1e-33],
            "rms": [0.16, 0.095, 0.052], "frac": [0.5, 0.8, 0.93], "k_half": 9.5,
            "check_frac": [None] * 5} for c in curves]
    return {"curves": curves, "law": law, "trained": None}


def task_evidence() -> dict[str, dict[str, Any]]:
    tau_arms = {"scaled_dot": 1.0, "dot": 1.0, "cosine_tau1": 0.9, "cosine_tau4": 1.0,
                "cosine_tau10": 1.0, "cosine_learned": 1.0}
    tau = {"accuracy": {"all": {a: around(v, 0.01, 10, j) for j, (a, v) in
                                enumerate(tau_arms.items())}},
           "loss": {"all": {a: around(0.1 + (0.3 if a == "cosine_tau1" else 0), 0.01, 10, j)
                            for j, a in enumerate(tau_arms)}},
           "bound": {a: float(theory.max_weight_bound(32, t)) for a, t in
                     (("cosine_tau1", 1), ("cosine_tau4", 4), ("cosine_tau10", 10))},
           "n": 32, "chance": 0.25}
    sal_arms = {"scaled_dot": 0.75, "cosine_tau1": 0.05, "cosine_tau10": 0.05,
                "cosine_learned": 0.05, "uniform": 0.06, "cue_none": 0.06}
    salience = {"accuracy": {"all": {a: around(v, 0.02, 10, j) for j, (a, v) in
                                     enumerate(sal_arms.items())}},
                "controls": ["uniform", "cue_none"], "chance": 0.0625}
    lengths = ["n=32", "n=64", "n=128"]
    length = {"lengths": lengths, "chance": 0.25,
              "loss": {k: {"all": {"scaled_dot": around(0.2 + 0.3 * i, seed=i),
                                   "log_length": around(0.2 + 0.25 * i, seed=i + 5)}}
                       for i, k in enumerate(lengths)},
              "accuracy": {k: {"all": {"scaled_dot": around(1 - 0.03 * i, seed=i),
                                       "log_length": around(1 - 0.04 * i, seed=i + 5)}}
                           for i, k in enumerate(lengths)},
              "answer_weight": {k: {"all": {"scaled_dot": around(0.9 - 0.1 * i, seed=i),
                                            "log_length": around(0.95 - 0.07 * i, seed=i + 5)}}
                                for i, k in enumerate(lengths)}}
    return {"C3": salience, "C4": tau, "Q3": length}


def minilm() -> dict[str, Any]:
    layers = [{"layer": i, "name": f"l{i}", "heads": [
        {"head": h, "logit_std": 1 + i + h / 4, "max_abs_logit": 5 + 3 * i + h,
         "entropy": 2.0 + 0.1 * h, "entropy_uniform": 3.9, "max_weight": 0.4,
         "effective_keys": 10.0, "entropy_unscaled": 0.3 + 0.02 * h,
         "entropy_cosine_tau1": 3.85} for h in range(4)]} for i in range(3)]
    result = {"model": "all-MiniLM-L6-v2", "n_tokens": 321, "n_sentences": 8, "layers": layers}
    return {**result, "summary": inspection.summary(result)}


def bench() -> dict[str, Any]:
    def est(r: float, hw: float) -> dict[str, Any]:
        return {"ratio": r, "lo": r - hw, "hi": r + hw, "n": 30, "converged": True}
    return {"rows": [{"n": n, "cosine": est(1 + 25 / n, 0.01), "floor": est(1.0, 0.005)}
                     for n in (256, 1024, 4096)],
            "fit": {"a": 0.0, "b": 25.0}, "settings": {"head_dim": 64}, "threads": 1}


def synthetic(unit_gap: float = 0.15) -> tuple[dict[str, Any], dict[str, Any]]:
    """(evidence, measured) for every claim, shaped like :func:`collect_evidence`'s."""
    implementation = measure_implementation()
    text, dk = text_evidence(), head_dim(unit_gap)
    evidence = {
        "C1": implementation["c1"], "C2": implementation["c2"], **task_evidence(),
        "C5": bench(), "C7": dk, "C8": measure_qk(samples=2000), "C9": rem_evidence(),
        "C10": jacobian_evidence(), "C11": text, "C13": dk, "Q1": text,
        "C12": {"init_std": {"unit": {"16": {str(s): 1.0 + 0.02 * s for s in SEEDS}},
                             "gpt2": {"16": {str(s): 0.01 for s in SEEDS}}},
                "final_logit": {w: a["scaled_dot"]["final_logit_by_lr"]
                                for w, a in text["sweep"].items()}, "n": 32},
        "Q2": {"summary": minilm()["summary"], "max_abs_logit": 20.0},
    }
    evidence["C6"] = {"text": text, "retrieval": evidence["C4"]}
    return evidence, {"implementation": implementation, "minilm": minilm()}


def numbers(evidence: dict[str, Any]) -> dict[str, Any]:
    return {c.id: c.judge(evidence[c.id]).numbers for c in CLAIMS + QUESTIONS}


def png_info(path: str) -> tuple[int, int, float]:
    """(width, height, dpi) of a PNG, the dpi from its pHYs chunk (pixels per metre)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    pos, dpi = 8, 0.0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"pHYs":
            x, y, unit = struct.unpack(">IIB", data[pos + 8:pos + 17])
            assert unit == 1, "pHYs unit must be the metre"
            dpi = min(x, y) * 0.0254
        pos += 12 + length
    return width, height, dpi


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every figure of :func:`draw_all`, and each matplotlib figure as it was saved."""
    folder = tmp_path_factory.mktemp("figures")
    evidence, measured = synthetic()
    saved = []
    real = theory_plots.save_png

    def keep(fig, path):
        fig.canvas.draw()
        saved.append((path, fig, check_layout(fig)))
        return real(fig, path)
    mp = pytest.MonkeyPatch()
    mp.setattr(theory_plots, "save_png", keep)
    try:
        out, failed = F.draw_all(evidence, measured, folder, numbers(evidence))
    finally:
        mp.undo()
    assert failed == {}, failed  # every figure of complete evidence draws
    return out, saved, evidence


def test_draw_all_returns_the_contract_shape(drawn):
    out, _, _ = drawn
    assert isinstance(out, dict) and set(out) == set(IDS)
    for claim, figs in out.items():
        assert isinstance(figs, list) and figs, claim
        for f in figs:
            assert set(f) == {"path", "alt"} and all(isinstance(v, str) for v in f.values())
    assert out["C13"][0]["path"] == out["C7"][0]["path"]  # one figure, two findings
    assert out["C13"][0]["alt"] != out["C7"][0]["alt"]


def test_c9_includes_the_theory_phase_diagram(drawn):
    out, _, _ = drawn
    phase = [f for f in out["C9"] if Path(f["path"]).name == "c9_phase_diagram.png"]
    assert len(phase) == 1
    alt = phase[0]["alt"]
    assert "without 1/√d_k" in alt and "never saturates" in alt
    summary = theory_plots.phase_summary()
    assert f"{summary['unscaled_64_512']:.2f}·ln n" in alt
    assert f"{summary['scaled_min']:.2f}·ln n" in alt


@pytest.mark.parametrize("claim", IDS)
def test_every_figure_is_print_quality_with_a_finding(drawn, claim):
    out, _, _ = drawn
    for f in out[claim]:
        width, height, dpi = png_info(f["path"])
        assert dpi >= 150, (f["path"], dpi)
        assert width >= 600 and height >= 400, (f["path"], width, height)
        alt = f["alt"]
        assert len(alt) >= 40 and alt.rstrip().endswith("."), alt
        assert re.search(r"\d", alt), alt
        assert not GENERIC.match(alt) and not alt.lower().startswith(("figure", claim.lower()))


def check_layout(fig) -> list[str]:
    """Problems a reader would see: overlapping tick labels, tiny fonts, a legend over an axes'
    data area, raw TeX or a "√" outside mathtext."""
    problems = []
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    boxes = [ax.get_window_extent(renderer) for ax in axes]
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    for leg in (x for x in legends if x is not None):
        box = leg.get_window_extent(renderer)
        if any(box.overlaps(b) for b in boxes):
            problems.append(f"legend over data: {[t.get_text() for t in leg.get_texts()]}")
    texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    texts += [t for leg in legends if leg is not None for t in leg.get_texts()]
    texts += [fig._suptitle] if fig._suptitle is not None else []
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            texts += labels
            spans = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
            for a, b in pairwise(spans):
                if a.overlaps(b):
                    problems.append("overlapping tick labels")
            problems += [f"tick font {t.get_fontsize()}" for t in labels if t.get_fontsize() < 8]
    for t in texts:
        plain = re.sub(r"\$[^$]*\$", "", t.get_text())
        if re.search(r"\^\{|_\{|\\[a-z]+|√", plain):
            problems.append(f"raw math: {t.get_text()!r}")
    return problems


def test_figures_have_readable_layout_and_rendered_math(drawn):
    _, saved, _ = drawn
    assert len(saved) >= 18  # every figure but the MiniLM heatmap goes through save_png
    bad = {Path(p).name: problems for p, _, problems in saved if problems}
    assert not bad, bad


def test_check_layout_catches_what_the_issue_complained_about(tmp_path):
    """The layout check itself can fail: a legend over the data and raw e^{2τ} are caught."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.legend(loc="center")
    ax.set_title("bound e^{2τ}/(e^{2τ}+n−1)")
    fig.canvas.draw()
    problems = check_layout(fig)
    plt.close(fig)
    assert any("legend over data" in p for p in problems)
    assert any("raw math" in p for p in problems)


def test_alt_text_follows_the_data(tmp_path):
    """The C7 finding is computed: a larger unscaled gap gives a different, larger number."""
    small, _ = synthetic(unit_gap=0.05)
    large, _ = synthetic(unit_gap=0.4)
    a = F.c7_figure(small["C7"], numbers(small)["C7"], tmp_path / "a")["alt"]
    b = F.c7_figure(large["C7"], numbers(large)["C7"], tmp_path / "b")["alt"]
    gap = [float(re.search(r"moves by ([+-][\d.]+) nats", x).group(1)) for x in (a, b)]
    assert gap[1] > gap[0] + 0.5
    assert gap[1] == pytest.approx(numbers(large)["C7"]["dot"]["256"]["mean"], abs=0.006)


def capture(monkeypatch) -> list[Any]:
    figs: list[Any] = []
    real = theory_plots.save_png

    def keep(fig, path):
        figs.append(fig)
        return real(fig, path)
    monkeypatch.setattr(theory_plots, "save_png", keep)
    return figs


def test_c1_marks_an_exact_zero_instead_of_a_tiny_bar(tmp_path, monkeypatch):
    figs = capture(monkeypatch)
    cases = [{"causal": False, "mask": None, "gqa": False, "err_reference": 3e-7,
              "err_sdpa": 0.0}, {"causal": True, "mask": "bool", "gqa": True,
                                 "err_reference": 4e-7, "err_sdpa": 0.0}]
    out = F.fig_c1(cases, tmp_path)
    ax = figs[0].axes[0]
    heights = sorted(p.get_y() + p.get_height() for p in ax.patches)
    assert heights == pytest.approx([3e-7, 4e-7])  # only the nonzero errors are bars
    assert sum(t.get_text() == "0 (exact)" for t in ax.texts) == 2
    assert ax.get_ylim()[0] > 1e-12
    assert "bitwise equal" in out["alt"] and "4.0e-07" in out["alt"]


def test_forest_plots_always_show_zero_and_the_delta_band(tmp_path, monkeypatch):
    figs = capture(monkeypatch)
    comps = {"d_model=32 softcap loss": {"mean": 1.0, "lo": 0.9, "hi": 1.1, "n": 6,
                                         "reading": "greater", "smallest": 0.02},
             "d_model=32 softcap sensitivity": {"mean": math.nan, "lo": math.nan, "hi": math.nan,
                                                "n": 0, "reading": "inconclusive",
                                                "smallest": 0.02, "why": "2 paired seeds"}}
    out = F.fig_forest(comps, tmp_path, "f", "title", "nats", "Softcap minus scaled_dot")
    lo, hi = figs[0].axes[0].get_xlim()
    assert lo <= -0.02 and hi >= 1.1 and lo < 0 < hi
    assert "1 greater, 1 inconclusive" in out["alt"]
    assert "+1.000 nats [+0.900, +1.100]" in out["alt"]
    with pytest.raises(ValueError, match="comps"):
        F.fig_forest({"x": comps["d_model=32 softcap sensitivity"]}, tmp_path, "g", "t", "nats")


def test_figures_with_missing_data_are_errors_not_faked_or_dropped(tmp_path):
    evidence, measured = synthetic()
    evidence["Q3"] = {**evidence["Q3"], "lengths": []}
    evidence["C3"] = {**evidence["C3"], "accuracy": {"all": {}}}
    evidence["C12"] = {"init_std": {"unit": {"8": {}}}, "final_logit": {}, "n": 32}
    out, failed = F.draw_all(evidence, measured, tmp_path, numbers(evidence))
    assert "Q3" not in out and "C12" not in out
    assert set(failed) >= {"Q3", "C12", "C3"}
    assert all(isinstance(f, str) and f.startswith(("missing evidence", "a bug"))
               for fs in failed.values() for f in fs)


def test_a_figure_that_raises_is_reported_and_claims_without_a_verdict_are_not_drawn(
        tmp_path, monkeypatch):
    evidence, measured = synthetic()
    monkeypatch.setattr(F, "fig_q3", lambda ev, folder: 1 / 0)
    num = numbers(evidence)
    del num["C10"]  # its rule failed: its figures are not drawn, and not reported twice
    out, failed = F.draw_all(evidence, measured, tmp_path, num)
    assert failed == {"Q3": ["a bug: ZeroDivisionError: division by zero"]}
    assert "C10" not in out and "Q3" not in out and "C9" in out


def test_interval_and_sci_formatting():
    ci = {"mean": 0.331, "lo": 0.25, "hi": 0.41}
    assert T.interval(ci, "nats") == "+0.33 nats [+0.25, +0.41]"
    assert T.interval({"mean": 0.5, "lo": None, "hi": None}) == "+0.50"
    assert T.sci(1e4) == "1e4" and T.sci(899000.0) == "8.99e5" and T.sci(0.02) == "0.02"
    assert not T.finite(None) and not T.finite(math.nan) and T.finite(np.float32(1.0))
