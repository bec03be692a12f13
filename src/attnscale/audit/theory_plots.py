"""Figures of the theory: the softmax entropy against the logit size, and where it freezes.

* :func:`plot_entropy_vs_scale`: exact E[entropy]/ln n of n i.i.d. N(0, s²) logits against s,
  with the Random Energy Model asymptotes and Monte Carlo points (Derrida 1981);
* :func:`plot_phase_diagram`: the (d_k, n) plane, unscaled against scaled dot products;
* :func:`plot_score_entropy`: every registered score with a theory hook, exact E[entropy]/ln n
  against n at one d_k, labelled by the score's registry ``tex``;
* the helpers the report's figures share (:func:`save`, :func:`outside`, :func:`below`,
  :func:`yerr`, :func:`log_ticks`); each claim's own figure lives in its module
  (:mod:`attnscale.audit.claims`).

Each draws with matplotlib (Agg, no display), math in mathtext, legends outside the data,
writes ``path`` as a :data:`DPI`-dpi PNG (:func:`save_png`) and returns it.
:func:`phase_summary` gives the numbers the phase diagram shows, for the report's caption.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # no display needed; chosen before pyplot loads
import matplotlib.pyplot as plt

from attnscale.audit import figure_text as T
from attnscale.core.scores import get_score
from attnscale.measure.montecarlo import mc_softmax_stats
from attnscale.measure.theory import (
    expected_entropy,
    expected_stat,
    rem_critical_scale,
    rem_entropy_asymptotic,
    stat_scores,
)

__all__ = ["BAND", "DPI", "below", "half_entropy_dk", "log_ticks", "outside", "phase_summary",
           "plot_entropy_vs_scale", "plot_phase_diagram", "plot_score_entropy", "save", "save_png",
           "score_curves", "yerr"]


DPI = 160  # ≥ 150 dpi for print; the PNG's pHYs chunk records it
MATH_SC = r"$s_c=\sqrt{2\ln n}$"
BAND = "#e4e4e4"  # the ±δ band: differences inside it are too small to matter
Figure = dict[str, str]  # a report figure: {"path": PNG file, "alt": its finding in words}
Evidence = dict[str, Any]


def save_png(fig: plt.Figure, path: str) -> str:
    """Save ``fig`` at :data:`DPI` as a PNG (pHYs set), cropped to its artists (legends placed
    outside the axes stay in), close it and return ``path``."""
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)
    return path


def plot_entropy_vs_scale(
    path: str,
    ns: tuple[int, ...] = (16, 256, 4096),
    samples: int = 400,
    seed: int = 0,
) -> str:
    """Plot normalised entropy H/ln n against the logit std s, for a few n.

    Lines: exact theory (:func:`attnscale.measure.theory.expected_entropy`); dotted: REM
    asymptote; points: Monte Carlo
    (:func:`attnscale.measure.montecarlo.mc_softmax_stats`) with ±2 SE bars; vertical lines at
    s_c = √(2 ln n). Writes ``path`` and returns it.
    """
    fig, ax = plt.subplots(figsize=(7, 4.5))
    s_max = 3.0 * float(rem_critical_scale(max(ns)))
    grid = np.linspace(0.0, s_max, 61)
    for i, n in enumerate(ns):
        color = f"C{i}"
        ln_n = math.log(n)
        ax.plot(grid, expected_entropy(n, grid) / ln_n, color=color, label=f"$n = {n}$, exact")
        s_c = float(rem_critical_scale(n))
        # The asymptotes fail near s_c at finite n (one goes negative, one diverges): hide that.
        asym = np.where(np.abs(grid - s_c) < 0.3 * s_c, np.nan, rem_entropy_asymptotic(n, grid))
        ax.plot(grid, asym / ln_n, color=color, ls=":", lw=1)
        pts = np.linspace(0.25, s_max, 9)
        est = [mc_softmax_stats(n, s, samples=samples, seed=seed + j)["entropy"]
               for j, s in enumerate(pts)]
        ax.errorbar(pts, [e.mean / ln_n for e in est], yerr=[2 * e.se / ln_n for e in est],
                    fmt="o", ms=3, color=color)
        ax.axvline(s_c, color=color, ls="--", lw=0.8)
    ax.plot([], [], "k:", lw=1, label="REM asymptotes")
    ax.plot([], [], "k--", lw=0.8, label=MATH_SC)
    ax.errorbar([], [], yerr=[], fmt="o", ms=3, color="k",
                label=f"Monte Carlo ({samples} draws, ±2 SE)")
    ax.set_xlabel("logit std $s$")
    ax.set_ylabel(r"$\mathbb{E}[H]\,/\,\ln n$")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(r"Softmax of $n$ i.i.d. $\mathcal{N}(0, s^2)$ logits: exact theory and "
                 "Monte Carlo", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    return save_png(fig, path)


def phase_grid(d_max: int, n_max: int, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """The (d_k, n) grid of :func:`plot_phase_diagram`: ``grid`` log-spaced integers each."""
    ds = np.unique(np.round(np.geomspace(1, d_max, grid)).astype(int))
    ns = np.unique(np.round(np.geomspace(2, n_max, grid)).astype(int))
    return ds, ns


def plot_phase_diagram(path: str, d_max: int = 4096, n_max: int = 1 << 20, grid: int = 20) -> str:
    """Plot the (d_k, n) plane: where unscaled dot-product attention is frozen.

    Colour: exact normalised entropy E[H]/ln n with logit std s = √d_k (unscaled q·k, typical
    ‖q‖ = √d) in the left panel and s = 1 (q·k/√d_k) in the right. The black line is
    √d_k = s_c(n) = √(2 ln n), i.e. d_k = 2 ln n (REM, Derrida 1981); the white dashed
    contour is where E[H]/ln n = 1/2. Scaled attention would need n < e^{1/2} to freeze, i.e.
    never.
    """
    ds, ns = phase_grid(d_max, n_max, grid)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True, layout="constrained")
    panels = ((r"unscaled $q\cdot k$  ($s=\sqrt{d_k}$)", True),
              (r"scaled $q\cdot k/\sqrt{d_k}$  ($s=1$)", False))
    for ax, (title, unscaled) in zip(axes, panels, strict=True):
        s = np.sqrt(ds)[None, :] if unscaled else np.ones((1, ds.size))
        h = expected_entropy(ns[:, None], s) / np.log(ns)[:, None]
        mesh = ax.pcolormesh(ds, ns, h, shading="gouraud", vmin=0, vmax=1, cmap="viridis")
        if h.min() < 0.5 < h.max():
            ax.contour(ds, ns, h, levels=[0.5], colors="white", linestyles="--", linewidths=1.2)
        if unscaled:  # the transition exists only for s = √d_k
            line = np.geomspace(ns[0], ns[-1], 200)
            ax.plot(2 * np.log(line), line, color="k", lw=1.5)
        ax.set(xscale="log", yscale="log", xlim=(ds[0], ds[-1]), ylim=(ns[0], ns[-1]),
               xlabel="$d_k$ (head dimension)", title=title)
    axes[0].set_ylabel("$n$ (keys)")
    axes[0].plot([], [], "k-", lw=1.5, label=r"$d_k=2\ln n$: unscaled $s=s_c$ (REM transition)")
    axes[0].plot([], [], "w--", lw=1.2, label=r"$\mathbb{E}[H]/\ln n=1/2$")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center",
               bbox_to_anchor=(0.45, -0.01), ncol=2, fontsize=9, facecolor="#bbbbbb")
    fig.colorbar(mesh, ax=axes, label=r"$\mathbb{E}[H]\,/\,\ln n$ (1 = uniform, 0 = one key)")
    fig.suptitle(r"Exact theory: softmax entropy of $n$ keys, $q, k\sim\mathcal{N}(0, I_{d_k})$",
                 fontsize=11)
    return save_png(fig, path)


def half_entropy_dk(n: int, d_max: int) -> float | None:
    """The d_k at which unscaled attention (s = √d_k) keeps half of ln n: E[H(n, √d)]/ln n =
    1/2, by bisection in log d over [1, d_max]; None when it is not crossed there."""
    def h(d: float) -> float:
        return float(expected_entropy(n, math.sqrt(d))) / math.log(n) - 0.5
    lo, hi = 0.0, math.log(d_max)
    if h(1.0) < 0 or h(float(d_max)) > 0:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if h(math.exp(mid)) > 0 else (lo, mid)
    return math.exp((lo + hi) / 2)


def phase_summary(d_max: int = 4096, n_max: int = 1 << 20,
                  ns: tuple[int, ...] = (512, 1 << 20)) -> dict[str, object]:
    """The numbers the phase diagram shows, for its caption: per n in ``ns`` the d_k where
    unscaled entropy halves (:func:`half_entropy_dk`); unscaled E[H]/ln n at d_k = 64, n = 512;
    and the least scaled E[H]/ln n over n in [2, ``n_max``]."""
    n_grid = np.unique(np.round(np.geomspace(2, n_max, 40)).astype(int))
    scaled = expected_entropy(n_grid, 1.0) / np.log(n_grid)
    return {"d_max": d_max, "n_max": n_max,
            "half_d": {n: half_entropy_dk(n, d_max) for n in ns},
            "unscaled_64_512": float(expected_entropy(512, 8.0)) / math.log(512),
            "scaled_min": float(np.min(scaled))}


def score_curves(
    d: int, ns: Iterable[int], scores: Iterable[str] | None = None
) -> dict[str, list[float]]:
    """Exact E[entropy]/ln n at each n for one query against n keys, q, k ~ N(0, I_d), per score.

    ``scores`` defaults to every registered score with a theory hook
    (:func:`attnscale.measure.theory.stat_scores`); keys are the scores' ``tex`` labels.
    """
    names = stat_scores() if scores is None else tuple(scores)
    ns = list(ns)
    return {get_score(name).tex: [expected_stat("entropy", d, n, name) / math.log(n) for n in ns]
            for name in names}


def plot_score_entropy(
    path: str, d: int = 64, ns: tuple[int, ...] = (16, 64, 256, 1024, 4096),
    scores: Iterable[str] | None = None,
) -> str:
    """Plot :func:`score_curves`: how much of ln n each score's softmax keeps at init."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in score_curves(d, ns, scores).items():
        ax.plot(ns, values, marker="o", label=label)
    ax.set(xscale="log", xlabel="$n$ (keys)", ylabel=r"$\mathbb{E}[H]\,/\,\ln n$",
           ylim=(-0.02, 1.02))
    ax.set_xticks(list(ns), [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_title(f"Exact theory: softmax entropy at init, $q, k\\sim\\mathcal{{N}}(0, I)$, "
                 f"$d_k = {d}$, default parameters", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    return save_png(fig, path)


# ---------------------------------------------- the report's theory and Monte Carlo figures


def save(fig: plt.Figure, folder: Path, name: str, alt: str) -> Figure:
    """Write ``fig`` as ``folder/name.png`` (see :func:`theory_plots.save_png`)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"path": save_png(fig, str(folder / f"{name}.png")), "alt": alt}


def outside(ax: plt.Axes, **kw: Any) -> None:
    """The axes' legend to the right of it, off the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, **kw)


def below(fig: plt.Figure, handles: list[Any], ncol: int = 2, y: float = 0.0) -> None:
    """One legend for the whole figure, under its axes."""
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, y), ncol=ncol,
               fontsize=8, frameon=False)


def yerr(cs: list[dict[str, Any]]) -> list[list[float]]:
    """errorbar's [below, above] half-widths of mean ± CI dicts (0 where an end is missing)."""
    return [[c["mean"] - c["lo"] if T.finite(c.get("lo")) else 0.0 for c in cs],
            [c["hi"] - c["mean"] if T.finite(c.get("hi")) else 0.0 for c in cs]]


def log_ticks(ax: plt.Axes, values: list[Any], axis: str = "x") -> None:
    """Ticks exactly at ``values`` on a log axis, labelled plainly (no 3×10¹)."""
    getattr(ax, f"set_{axis}scale")("log")
    getattr(ax, f"set_{axis}ticks")([float(v) for v in values], [f"{v:g}" for v in values])
    ax.minorticks_off()


