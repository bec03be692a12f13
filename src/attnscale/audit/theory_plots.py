"""Figures of the theory: the softmax entropy against the logit size, and where it freezes.

* :func:`plot_entropy_vs_scale`: exact E[entropy]/ln n of n i.i.d. N(0, s²) logits against s,
  with the Random Energy Model asymptotes and Monte Carlo points (Derrida 1981);
* :func:`plot_phase_diagram`: the (d_k, n) plane, unscaled against scaled dot products;
* :func:`plot_score_entropy`: every registered score with a theory hook, exact E[entropy]/ln n
  against n at one d_k, labelled by the score's registry ``tex``.

Each draws with matplotlib (Agg, no display), writes ``path`` and returns it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import matplotlib
import numpy as np

matplotlib.use("Agg")  # no display needed; chosen before pyplot loads
import matplotlib.pyplot as plt

from attnscale.core.scores import get_score
from attnscale.measure.montecarlo import mc_softmax_stats
from attnscale.measure.theory import (
    expected_entropy,
    expected_stat,
    rem_critical_scale,
    rem_entropy_asymptotic,
    stat_scores,
)

__all__ = ["plot_entropy_vs_scale", "plot_phase_diagram", "plot_score_entropy", "score_curves"]


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
        ax.plot(grid, expected_entropy(n, grid) / ln_n, color=color, label=f"n = {n} (exact)")
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
    ax.set_xlabel("logit std s")
    ax.set_ylabel("E[entropy] / ln n")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Softmax of n i.i.d. N(0, s²) logits; dashed: s_c = √(2 ln n); "
                 "dotted: REM asymptotes", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_phase_diagram(path: str, d_max: int = 4096, n_max: int = 1 << 20, grid: int = 20) -> str:
    """Plot the (d_k, n) plane: where unscaled dot-product attention is frozen.

    Colour: exact normalised entropy E[H]/ln n with logit std s = √d_k (unscaled q·k, typical
    ‖q‖ = √d) in the left panel and s = 1 (q·k/√d_k) in the right. The black line is
    √d_k = s_c(n) = √(2 ln n), i.e. d_k = 2 ln n: to its right unscaled attention is frozen
    (REM, Derrida 1981); scaled attention would need n < e^{1/2} to freeze, i.e. never.
    """
    ds = np.unique(np.round(np.geomspace(1, d_max, grid)).astype(int))
    ns = np.unique(np.round(np.geomspace(2, n_max, grid)).astype(int))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True, layout="constrained")
    for ax, (title, scale) in zip(axes, (("unscaled q·k (s = √d_k)", True),
                                         ("scaled q·k/√d_k (s = 1)", False)), strict=True):
        s = np.sqrt(ds)[None, :] if scale else np.ones((1, ds.size))
        h = expected_entropy(ns[:, None], s) / np.log(ns)[:, None]
        mesh = ax.pcolormesh(ds, ns, h, shading="nearest", vmin=0, vmax=1, cmap="viridis")
        ax.plot(2 * np.log(ns), ns, color="k", lw=1.5, label="d_k = 2 ln n: unscaled s = s_c")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(ds[0], ds[-1])
        ax.set_ylim(ns[0], ns[-1])
        ax.set_xlabel("d_k")
        ax.set_title(title)
    axes[0].set_ylabel("n (keys)")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.colorbar(mesh, ax=axes, label="E[entropy] / ln n")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    ax.set(xscale="log", xlabel="n (keys)", ylabel="E[entropy] / ln n", ylim=(-0.02, 1.02),
           title=f"Softmax entropy at init, q and k ~ N(0, I), d_k = {d}, default parameters")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
