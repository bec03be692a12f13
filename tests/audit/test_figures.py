"""attnscale.audit.figures and figure_text, the figure code the claims share: forest plots
always show 0 and the ±δ band, the accuracy-per-arm and head-dimension figures are print-quality
PNGs with a readable layout, :func:`figures.draw` reports a figure that cannot be drawn as an
error (never drops it in silence), the layout check itself can fail, the formatting helpers,
and alt text that follows the data. Each claim's own figures are tested in its file under
tests/audit/claims/."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from claims.support import Draw, around, assert_print_quality, check_layout, head_dim, layouts

from attnscale.audit import figure_text as T
from attnscale.audit import figures as F
from attnscale.audit import theory_plots
from attnscale.audit.claims import c07_absorbed_constant as C7
from attnscale.audit.verdicts import LOSS_DELTA
from attnscale.util.jsonio import jsonable


def capture(monkeypatch) -> list[Any]:
    """Every matplotlib figure saved through :func:`theory_plots.save_png` from now on."""
    figs: list[Any] = []
    real = theory_plots.save_png

    def keep(fig, path):
        figs.append(fig)
        return real(fig, path)
    monkeypatch.setattr(theory_plots, "save_png", keep)
    return figs


# ------------------------------------------------------------------------ forest plots

COMPS = {"d_model=32 softcap loss": {"mean": 1.0, "lo": 0.9, "hi": 1.1, "n": 6,
                                     "reading": "greater", "smallest": 0.02},
         "d_model=32 softcap sensitivity": {"mean": math.nan, "lo": math.nan, "hi": math.nan,
                                            "n": 0, "reading": "inconclusive",
                                            "smallest": 0.02, "why": "2 paired seeds"}}


def test_forest_plots_always_show_zero_and_the_delta_band(tmp_path, monkeypatch):
    figs = capture(monkeypatch)
    out = F.fig_forest(COMPS, tmp_path, "f", "title", "nats", "Softcap minus scaled_dot")
    ax = figs[0].axes[0]
    lo, hi = ax.get_xlim()
    assert lo <= -0.02 and hi >= 1.1 and lo < 0 < hi
    band = [p for p in ax.patches if p.get_width() == pytest.approx(0.04)]
    assert band and all(p.get_x() == pytest.approx(-0.02) for p in band)  # ±δ around 0
    assert "1 greater, 1 inconclusive" in out["alt"]
    assert "+1.000 nats [+0.900, +1.100]" in out["alt"]
    assert_print_quality(out)
    with pytest.raises(ValueError, match="comps"):
        F.fig_forest({"x": COMPS["d_model=32 softcap sensitivity"]}, tmp_path, "g", "t", "nats")


def test_forest_rows_with_different_units_get_a_panel_each(tmp_path, monkeypatch):
    """A unit per comparison (a function of its name) splits the rows into panels, one x scale
    each, and every panel still shows 0, even when all its effects lie on one side."""
    figs = capture(monkeypatch)
    comps = {**COMPS, "d_model=32 softcap unstable": {
        "mean": 0.5, "lo": 0.4, "hi": 0.6, "n": 6, "reading": "greater", "smallest": 0.1}}
    F.fig_forest(comps, tmp_path, "f", "title",
                 lambda k: "share of LR grid" if k.endswith("unstable") else "nats")
    axes = figs[0].axes
    assert [ax.get_xlabel() for ax in axes] == ["paired difference (nats)",
                                                 "paired difference (share of LR grid)"]
    assert [len(ax.get_yticks()) for ax in axes] == [2, 1]
    for ax in axes:
        lo, hi = ax.get_xlim()
        assert lo < 0 < hi


# ------------------------------------------------------------------- accuracy per arm


def tau() -> dict[str, Any]:
    """Retrieval accuracy per arm with the cap on one key's weight at each τ."""
    arms = {"scaled_dot": 1.0, "cosine_tau1": 0.4, "cosine_tau10": 0.95}
    return {"accuracy": {"all": {a: around(v, 0.01, 10, j) for j, (a, v) in
                                 enumerate(arms.items())}},
            "bound": {"cosine_tau1": 0.19, "cosine_tau10": 1.0}, "chance": 0.25}


def test_arms_figure_is_print_quality_with_its_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    figs = capture(monkeypatch)
    ev = tau()
    out = F.fig_arms(ev, tmp_path, "arms", "retrieval", extra="More in words.")
    assert Path(out["path"]).name == "arms.png"
    assert_print_quality(out)
    assert out["alt"] == T.arms_alt(ev, "More in words.")
    assert "over 10 seeds (chance 0.25)" in out["alt"] and "the lowest arm is cosine_tau1" in \
        out["alt"]
    ax = figs[0].axes[0]
    assert len(ax.get_xticks()) == 3 and ax.get_title() == "retrieval, 10 seeds"
    assert [problems for _, problems in saved] == [[]]


def test_arms_figure_skips_empty_arms_and_fails_without_any(tmp_path, monkeypatch):
    figs = capture(monkeypatch)
    ev = tau()
    ev["accuracy"]["all"]["dot"] = {"values": {}, "censored": False}
    F.fig_arms(ev, tmp_path, "arms", "retrieval")
    assert len(figs[0].axes[0].get_xticks()) == 3
    with pytest.raises(ValueError, match="no arm has accuracy values"):
        F.fig_arms({**ev, "accuracy": {"all": {"dot": {"values": {}}}}}, tmp_path, "x", "t")
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------ head dimension


def test_head_dim_figure_has_a_panel_per_init_unit_first(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    figs = capture(monkeypatch)
    ev = head_dim(Draw(0), 0.2)
    alt = "Without 1/√d_k the loss moves by 0.2 nats at d_k = 256 (a caption from the claim)."
    out = F.fig_head_dim(ev, tmp_path, alt, "dk")
    assert out == {"path": str(tmp_path / "dk.png"), "alt": alt}  # the claim's caption, as is
    assert_print_quality(out)
    axes = figs[0].axes
    assert [ax.get_title() for ax in axes] == [F.INIT_TITLES["unit"], F.INIT_TITLES["gpt2"]]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["16", "64", "128", "256"]
    # one series per panel, dot − scaled_dot at the d_k themselves (no trained absorbed arm)
    assert [len(ax.containers) for ax in axes] == [1, 1]
    assert list(axes[0].containers[0].lines[0].get_xdata()) == [16, 64, 128, 256]
    legend = [t.get_text() for t in figs[0].legends[0].get_texts()]
    assert legend[0].startswith("dot − scaled_dot") and len(legend) == 2
    assert not any("absorbed" in t for t in legend)
    band = [p for p in axes[0].patches if p.get_y() == pytest.approx(-LOSS_DELTA)]
    assert band and band[0].get_height() == pytest.approx(2 * LOSS_DELTA)
    assert [problems for _, problems in saved] == [[]]


# ---------------------------------------------------------------- figures.draw


def c7_evidence(gap: float = 0.2) -> tuple[Any, dict[str, Any]]:
    """C7's typed evidence and its rule's plain numbers, as the report hands them to draw."""
    ev = C7.CLAIM.read(head_dim(Draw(0), gap))
    return ev, jsonable(C7.judge(ev).numbers)


def test_draw_reports_a_draw_that_raises_as_a_bug(tmp_path):
    ev, numbers = c7_evidence()
    broken = dataclasses.replace(C7.CLAIM, draw=lambda ev, numbers, folder: 1 / 0)
    assert F.draw(broken, ev, numbers, tmp_path) == (
        [], ["a bug: ZeroDivisionError: division by zero"])


def test_draw_reports_a_figure_that_was_not_written(tmp_path):
    ev, numbers = c7_evidence()
    missing = str(tmp_path / "never.png")
    liar = dataclasses.replace(C7.CLAIM,
                               draw=lambda ev, numbers, folder: [{"path": missing, "alt": "x"}])
    assert F.draw(liar, ev, numbers, tmp_path) == (
        [], [f"a bug: FileNotFoundError: the figure was not written: {missing}"])


def test_draw_returns_a_good_claims_figures_and_reuses_them(tmp_path):
    ev, numbers = c7_evidence()
    calls = []

    def counted(ev, numbers, folder):
        calls.append(folder)
        return C7.draw(ev, numbers, folder)
    claim = dataclasses.replace(C7.CLAIM, draw=counted)
    figs, failed = F.draw(claim, ev, numbers, tmp_path)
    assert failed == [] and [Path(f["path"]).name for f in figs] == ["c7_head_dim.png"]
    own = C7.draw(ev.model_dump(), numbers, tmp_path / "again")  # what the claim draws itself
    assert [f["alt"] for f in figs] == [f["alt"] for f in own]
    assert_print_quality(figs[0])
    assert F.draw(claim, ev, numbers, tmp_path) == (figs, []) and len(calls) == 1  # reused
    other, other_numbers = c7_evidence(gap=0.4)
    assert F.draw(claim, other, other_numbers, tmp_path)[0] != figs and len(calls) == 2


# ------------------------------------------------------------------ the layout check


def test_check_layout_catches_what_the_issue_complained_about():
    """The layout check itself can fail: a legend over the data and raw e^{2τ} are caught; the
    same figure with its legend outside and the bound in mathtext passes."""
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

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    theory_plots.outside(ax)
    ax.set_title(r"bound $e^{2\tau}/(e^{2\tau}+n-1)$")
    fig.canvas.draw()
    problems = check_layout(fig)
    plt.close(fig)
    assert problems == []


# ------------------------------------------------------------------ formatting helpers


def test_interval_and_sci_formatting():
    ci = {"mean": 0.331, "lo": 0.25, "hi": 0.41}
    assert T.interval(ci, "nats") == "+0.33 nats [+0.25, +0.41]"
    assert T.interval({"mean": 0.5, "lo": None, "hi": None}) == "+0.50"
    assert T.interval(ci, "", 1, sign=False) == "0.3 [0.2, 0.4]"
    assert T.sci(1e4) == "1e4" and T.sci(899000.0) == "8.99e5" and T.sci(0.02) == "0.02"
    assert not T.finite(None) and not T.finite(math.nan) and T.finite(np.float32(1.0))
    assert not T.finite(math.inf) and not T.finite(True) and not T.finite("1.0")


# ------------------------------------------------------------------ alt text follows data


def test_alt_text_follows_the_data(tmp_path):
    """The C7 finding is computed: a larger unscaled gap gives a different, larger number."""
    alts, numbers = [], []
    for i, gap in enumerate((0.05, 0.6)):
        ev = head_dim(Draw(0), gap)
        nums = jsonable(C7.CLAIM.decide(ev).numbers)
        alts.append(C7.draw(ev, nums, tmp_path / str(i))[0]["alt"])
        numbers.append(nums)
    gap = [float(re.search(r"moves by ([+-][\d.]+) nats", x).group(1)) for x in alts]
    assert gap[1] > gap[0] + 0.5
    assert gap[1] == pytest.approx(numbers[1]["dot"]["256"]["mean"], abs=0.006)
