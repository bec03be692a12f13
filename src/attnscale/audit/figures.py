"""The figures several claims share (forest plots, arms per task, the head-dimension gaps),
and :func:`draw`, which runs a claim's own ``draw`` and reports a failure as an error.

Each claim's figure lives in its module (:mod:`attnscale.audit.claims`). Each function draws
with matplotlib (Agg), saves a PNG under ``folder`` at :data:`attnscale.audit.theory_plots.DPI`
and returns ``{"path": ..., "alt": ...}``, ``alt`` being one or two sentences that state the
figure's finding with numbers from the same data (:mod:`attnscale.audit.figure_text`). The
conventions are a paper's: math in mathtext, 95% intervals wherever the data has them, forest
plots that always show 0 and the smallest real effect ±δ, legends outside the data, titles that
name the data.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from attnscale.audit import figure_text as T
from attnscale.audit.evidence import HeadDim
from attnscale.audit.readings import gaps
from attnscale.audit.theory_plots import BAND, Figure, below, log_ticks, outside, save, yerr
from attnscale.audit.verdicts import LOSS_DELTA, failure
from attnscale.util.diskcache import source_digest
from attnscale.util.jsonio import dumps, jsonable

Evidence = dict[str, Any]

READING_COLORS = {"greater": "#c0392b", "less": "#2874a6", "equal": "#1e8449",
                  "inconclusive": "#7f8c8d", "not measurable": "#b7950b"}
READING_WORDS = {"greater": "reads greater than +δ", "less": "reads less than −δ",
                 "equal": "reads equal (within ±δ)", "inconclusive": "inconclusive",
                 "not measurable": "not measurable (identical differences)"}
INIT_TITLES = {"unit": "unit-variance q, k at init (Vaswani)", "gpt2": "GPT-2 init (std 0.02)"}
ARM_LABELS = {"cosine_tau1": "cosine\n" r"$\tau=1$", "cosine_tau2": "cosine\n" r"$\tau=2$",
              "cosine_tau4": "cosine\n" r"$\tau=4$", "cosine_tau10": "cosine\n" r"$\tau=10$",
              "cosine_learned": "cosine\n" r"learned $\tau$", "uniform": "uniform\n(control)",
              "cue_none": "no cue\n(control)"}
SQRT_DK = r"$1/\sqrt{d_k}$"


def short(key: str) -> str:
    """A comparison's name for a tick label: "d_model=128 softcap loss" ->
    "width 128 · softcap · loss"."""
    if key == "growth":
        return "growth of the excess, widest − narrowest"
    t = key.replace("d_model=", "width ").replace(":", "").split()
    if len(t) > 1 and t[0] == "width":
        t = [f"width {t[1]}", *t[2:]]
    return " · ".join(t)


def forest_panel(ax: plt.Axes, items: list[tuple[str, dict[str, Any]]], unit: str) -> None:
    """One panel of a forest plot: each comparison's mean, its 95% CI (thick) and its Holm
    interval (thin, :func:`attnscale.lab.paired.holm_interval`: it clears or stays inside ±δ
    exactly as the colour's reading says), over its own ±δ band; the 95% interval written at
    the right; 0 always in view, centred."""
    right = blended_transform_factory(ax.transAxes, ax.transData)
    span = 0.0
    for i, (_, c) in enumerate(items):
        d = c.get("smallest")
        if T.finite(d):
            ax.barh(i, 2 * d, left=-d, height=1.0, color=BAND, zorder=0, lw=0)
            span = max(span, 2 * d)
        if not T.finite(c.get("mean")):
            ax.text(0, i, f"no estimate: {c.get('why') or 'no data'}", ha="center",
                    va="center", fontsize=8, color="#555", style="italic")
            continue
        color = READING_COLORS.get(c.get("reading"), "k")
        # thin: the Holm interval, whose place against ±δ is the reading (the colour); thick:
        # the unadjusted 95% interval quoted at the right and in the verdict
        holm = holm_extent(c)
        if holm is not None:
            ax.errorbar(c["mean"], i, xerr=yerr([holm]), fmt="none", capsize=3, lw=1,
                        color=color)
        ax.errorbar(c["mean"], i, xerr=yerr([c]), fmt="o", ms=5, capsize=0, lw=3.2,
                    color=color)
        span = max([span, *(abs(x) for x in (holm or {}).values() if T.finite(x))])
        ax.text(1.02, i, T.interval(c, "", 3), transform=right, va="center", fontsize=8)
        span = max(span, *(abs(c[k]) for k in ("mean", "lo", "hi") if T.finite(c.get(k))))
    ax.axvline(0, color="k", lw=0.8)
    span = span or 1.0  # nothing but zeros: any symmetric range
    ax.set_xlim(-1.12 * span, 1.12 * span)
    ax.set_ylim(len(items) - 0.5, -0.5)
    ax.set_yticks(range(len(items)), [short(k) for k, _ in items], fontsize=8)
    ax.set_xlabel(f"paired difference ({unit})" if unit else "paired difference", fontsize=9)


def holm_extent(c: dict[str, Any]) -> dict[str, float] | None:
    """The comparison's Holm interval as a mean ± CI dict, or None when it has none."""
    lo, hi = c.get("lo_holm"), c.get("hi_holm")
    if not (T.finite(lo) and T.finite(hi)):
        return None
    return {"mean": c["mean"], "lo": lo, "hi": hi}


def fig_forest(comps: dict[str, Any], folder: Path, name: str, title: str,
               unit: str | Callable[[str], str], what: str = "") -> Figure:
    """A verdict's paired comparisons: mean difference and 95% interval each, with ±δ. Rows
    with different units (``unit`` as a function of the comparison's name) go in separate
    panels, one x scale each."""
    unit_of = unit if callable(unit) else (lambda _k: unit)
    if not any(T.finite(c.get("mean")) for c in comps.values()):
        raise ValueError("comps: no comparison has an estimate")
    groups: dict[str, list[str]] = {}
    for k in comps:
        groups.setdefault(unit_of(k), []).append(k)
    sizes = [len(v) for v in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, squeeze=False,
                             figsize=(7.5, 0.36 * sum(sizes) + 1.1 * len(groups) + 0.9),
                             gridspec_kw={"height_ratios": sizes})
    for ax, (u, keys) in zip(axes[:, 0], groups.items(), strict=True):
        forest_panel(ax, [(k, comps[k]) for k in keys], u)
    axes[0, 0].set_title(title, fontsize=10)
    fig.tight_layout()
    seen = {c.get("reading") for c in comps.values()}
    below(fig, [Patch(color=BAND, label="±δ: smallest real effect"),
                Line2D([], [], color="k", lw=3.2, label="95% interval"),
                Line2D([], [], color="k", lw=1, marker="|", ms=8,
                       label="Holm interval: decides the reading (colour)")]
          + [Line2D([], [], marker="o", ls="", color=READING_COLORS[r], label=READING_WORDS[r])
             for r in READING_COLORS if r in seen], ncol=3)
    return save(fig, folder, name, T.forest_alt(comps, unit_of, what or title))


def fig_arms(ev: Evidence, folder: Path, name: str, title: str, extra: str = "") -> Figure:
    """Accuracy per arm: mean with its 95% interval, every seed as a dot, chance; for C4 also
    the exact cap e^{2τ}/(e^{2τ}+n−1) on one key's weight at each τ."""
    arms = {a: v for a, v in ev["accuracy"]["all"].items() if v and v.get("values")}
    if not arms:
        raise ValueError("ev: no arm has accuracy values")
    fig, ax = plt.subplots(figsize=(7.5, 3.9))
    bound = ev.get("bound", {})
    for i, (a, v) in enumerate(arms.items()):
        xs = list(v["values"].values())
        ax.scatter(i + np.linspace(-0.2, 0.2, len(xs)), xs, s=10, color="#8fb3d9", zorder=2,
                   label="one seed" if i == 0 else None)
        ax.errorbar(i, T.arm_ci(v)["mean"], yerr=yerr([T.arm_ci(v)]), fmt="o", color="k",
                    capsize=5, zorder=3, label="mean, 95% CI" if i == 0 else None)
        if T.finite(bound.get(a)):
            ax.plot([i - 0.32, i + 0.32], [bound[a]] * 2, color="C3", lw=2,
                    label="theory: cap on one key's weight\n"
                    r"$e^{2\tau}/(e^{2\tau}+n-1)$ (not an accuracy)"
                    if a == next(b for b in arms if b in bound) else None)
    ax.axhline(ev["chance"], color="grey", ls=":", label=f"chance ({ev['chance']:.2f})")
    ax.set_xticks(range(len(arms)), [ARM_LABELS.get(a, a) for a in arms], fontsize=9)
    ax.set(ylim=(0, 1.05), ylabel="eval accuracy")
    ax.set_title(f"{title}, {max(T.arm_ci(v)['n'] for v in arms.values())} seeds", fontsize=10)
    outside(ax)
    return save(fig, folder, name, T.arms_alt(ev, extra))


def fig_head_dim(ev: Evidence, folder: Path, alt: str, name: str) -> Figure:
    """C7, C13: dot − scaled clipped loss against d_k, one panel per init regime, mean and
    95% CI (Holm within the regime), over the ±δ band."""
    inits = sorted(ev["inits"], key=lambda i: i != "unit")
    typed = HeadDim.model_validate({k: ev[k] for k in HeadDim.model_fields})
    fig, axes = plt.subplots(1, len(inits), figsize=(4.3 * len(inits) + 0.6, 3.9), sharey=True,
                             squeeze=False)
    arms = (("dot", "-", "o", 1.0, "C3", rf"dot − scaled_dot (no {SQRT_DK})"),)
    for ax, init in zip(axes[0], inits, strict=True):
        for arm, ls, marker, shift, color, _ in arms:
            c = {d: x.model_dump() for d, x in gaps(typed, init, arm).items()}
            ds = [d for d in c if T.finite(c[d].get("mean"))]
            ax.errorbar([int(d) * shift for d in ds], [c[d]["mean"] for d in ds],
                        yerr=yerr([c[d] for d in ds]), marker=marker, ls=ls, color=color,
                        capsize=3)
        ax.axhspan(-LOSS_DELTA, LOSS_DELTA, color=BAND, zorder=0)
        ax.axhline(0, color="k", lw=0.8)
        log_ticks(ax, ev["head_dims"])
        ax.set_title(INIT_TITLES.get(init, f"{init} init"), fontsize=10)
        ax.set_xlabel(r"$d_k$ (one head, $d_{model} = d_k$)")
    axes[0, 0].set_ylabel("Δ clipped eval loss (nats)")
    fig.suptitle(f"C7/C13: loss cost of dropping {SQRT_DK}, char-level text, "
                 f"{len(ev['seeds'])} seeds, mean and 95% CI", fontsize=11)
    fig.tight_layout()
    below(fig, [Line2D([], [], color=c, ls=ls, marker=m, label=lab)
                for _, ls, m, _, c, lab in arms]
          + [Patch(color=BAND, label=f"±δ = {LOSS_DELTA} nats")], ncol=2)
    return save(fig, folder, name, alt)


@cache
def package_digest() -> str:
    """sha256 over every attnscale source file: a figure may depend on any of them (its claim,
    the shared figure code, the theory it draws), so an edit anywhere draws it again."""
    root = Path(__file__).resolve().parents[1]
    return source_digest(*sorted(root.rglob("*.py")))


def figure_key(claim: Any, ev: dict[str, Any], numbers: dict[str, Any]) -> str:
    """What a claim's figures are a function of: its evidence, its rule's numbers, attnscale's
    source and matplotlib's version (sha256)."""
    digest = hashlib.sha256(dumps({"id": claim.id, "evidence": jsonable(ev),
                                   "numbers": jsonable(numbers), "mpl": matplotlib.__version__,
                                   "code": package_digest()}, sort_keys=True).encode())
    return digest.hexdigest()


def drawn_before(folder: Path, claim_id: str, key: str) -> list[Figure] | None:
    """The figures drawn for ``key`` into ``folder`` by an earlier run, if all still there."""
    try:
        record = json.loads((folder / ".drawn" / f"{claim_id}.json").read_text())
    except (OSError, json.JSONDecodeError):  # none, or unreadable: draw again
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        return None
    figs = record.get("figures")
    return figs if figs and all(Path(f["path"]).exists() for f in figs) else None


def remember(folder: Path, claim_id: str, key: str, figs: list[Figure]) -> None:
    """Record what was drawn for ``key`` (written aside and renamed: never half a record)."""
    record = folder / ".drawn" / f"{claim_id}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(dumps({"key": key, "figures": figs}))
    os.replace(tmp, record)


def draw(claim: Any, ev: Any, numbers: dict[str, Any], folder: Path
         ) -> tuple[list[Figure], list[str]]:
    """A judged claim's figures (``claim.draw`` on the plain form of its typed evidence ``ev``
    and the rule's plain ``numbers``), and the failures of the ones that could not be drawn
    (an error of the report, never a figure left out in silence; a claim's figures stand or
    fall together). Figures whose evidence, numbers and code are those of an earlier draw into
    ``folder`` are reused, not redrawn."""
    folder, plain = Path(folder), ev.model_dump()
    try:
        key = figure_key(claim, plain, numbers)
        if (figs := drawn_before(folder, claim.id, key)) is not None:
            return figs, []
        (folder / ".drawn" / f"{claim.id}.json").unlink(missing_ok=True)  # its files change now
        figs = claim.draw(plain, numbers, folder)
        for fig in figs:
            if not Path(fig["path"]).exists():
                raise FileNotFoundError(f"the figure was not written: {fig['path']}")
    except Exception as e:  # a figure that cannot be drawn is reported, not dropped
        plt.close("all")
        return [], [failure(e)]
    remember(folder, claim.id, key, figs)
    return figs, []
