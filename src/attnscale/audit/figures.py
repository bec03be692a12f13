"""The report's figures: one small function per claim, from that claim's evidence dict.

Each function draws with matplotlib (Agg), saves a PNG under ``folder`` at
:data:`attnscale.audit.theory_plots.DPI` and returns ``{"path": ..., "alt": ...}``, ``alt``
being one or two sentences that state the figure's finding with numbers from the same data
(:mod:`attnscale.audit.figure_text`). The conventions are a paper's: math in mathtext, 95%
intervals wherever the data has them, forest plots that always show 0 and the smallest real
effect ±δ, legends outside the data, titles that name the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from attnscale.audit import figure_text as T
from attnscale.audit import theory_plots as TP
from attnscale.audit.rules_training import gaps
from attnscale.audit.theory_plots import BAND, Figure, below, log_ticks, outside, save, yerr
from attnscale.audit.verdicts import LOSS_DELTA, failure
from attnscale.measure import inspection

Evidence = dict[str, Any]

READING_COLORS = {"greater": "#c0392b", "less": "#2874a6", "equal": "#1e8449",
                  "inconclusive": "#7f8c8d"}
READING_WORDS = {"greater": "reads greater than +δ", "less": "reads less than −δ",
                 "equal": "reads equal (within ±δ)", "inconclusive": "inconclusive"}
INIT_TITLES = {"unit": "unit-variance q, k at init (Vaswani)", "gpt2": "GPT-2 init (std 0.02)"}
ARM_LABELS = {"cosine_tau1": "cosine\n" r"$\tau=1$", "cosine_tau2": "cosine\n" r"$\tau=2$",
              "cosine_tau4": "cosine\n" r"$\tau=4$", "cosine_tau10": "cosine\n" r"$\tau=10$",
              "cosine_learned": "cosine\n" r"learned $\tau$", "uniform": "uniform\n(control)",
              "cue_none": "no cue\n(control)", "dot_absorbed": "dot\nabsorbed"}
SQRT_DK = r"$1/\sqrt{d_k}$"


def fig_c1(cases: list[dict[str, Any]], folder: Path) -> Figure:
    """C1: max |error| per tested case against the float64 reference and torch SDPA; an exact
    zero is written "0 (exact)" at the axis floor, never drawn as a tiny bar."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    errs = [c[k] for c in cases for k in ("err_reference", "err_sdpa") if c[k] > 0]
    floor = 10.0 ** (math.floor(math.log10(min(errs, default=1e-7))) - 2)
    handles: list[Any] = []
    for j, (key, label) in enumerate((("err_reference", "vs float64 reference"),
                                      ("err_sdpa", "vs torch SDPA"))):
        for i, c in enumerate(cases):
            x = i + (j - 0.5) * 0.4
            if c[key] > 0:
                ax.bar(x, c[key] - floor, 0.38, bottom=floor, color=f"C{j}")
            else:
                ax.text(x, floor * 1.6, "0 (exact)", rotation=90, ha="center", va="bottom",
                        fontsize=8, color=f"C{j}")
        handles.append(Patch(color=f"C{j}", label=label))
    handles.append(ax.axhline(1e-5, color="red", ls=":", label="tolerance $10^{-5}$"))
    ax.set(yscale="log", ylim=(floor, 1e-4), xlim=(-0.6, len(cases) - 0.4),
           ylabel="max |error|, float32")
    labels = [f"{'causal' if c['causal'] else 'full'}, {c['mask'] or 'no'} mask"
              f"{', GQA' if c['gqa'] else ''}" for c in cases]
    ax.set_xticks(range(len(cases)), labels, fontsize=8)
    ax.set_title(f"C1: attnscale.attention(score='scaled_dot') against "
                 rf"$\mathrm{{softmax}}(QK^\top/\sqrt{{d_k}})V$, {len(cases)} cases", fontsize=10)
    outside(ax, handles=handles)
    return save(fig, folder, "c1_exactness", T.c1_alt(cases))


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


def fig_c5(ev: Evidence, delta: float | None, folder: Path) -> Figure:
    """C5: cosine's extra time over scaled_dot, and the noise floor, against N (95% CI), the
    ±δ margin and the fit a + b/N."""
    rows = sorted(ev["rows"], key=lambda r: r["n"])
    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for key, label, color, shift in (("cosine", "cosine / scaled_dot", "C0", 0.97),
                                     ("floor", "scaled_dot / itself (noise floor)", "C7", 1.03)):
        est = [{"mean": 100 * (r[key]["ratio"] - 1),
                "lo": 100 * (r[key]["lo"] - 1) if T.finite(r[key].get("lo")) else None,
                "hi": 100 * (r[key]["hi"] - 1) if T.finite(r[key].get("hi")) else None}
               for r in rows]
        ax.errorbar([n * shift for n in ns], [e["mean"] for e in est], yerr=yerr(est),
                    marker="o", capsize=3, color=color, label=f"{label}, 95% CI")
    fit = ev.get("fit")
    if fit and len(ns) > 1:
        grid = np.geomspace(ns[0], ns[-1], 50)
        ax.plot(grid, 100 * (fit["a"] + fit["b"] / grid), "C0--", lw=0.8,
                label=f"fit $a + b/N$, $b$ = {fit['b']:.3g}")
    if T.finite(delta):
        ax.axhspan(-100 * delta, 100 * delta, color=BAND, zorder=0,
                   label=f"±δ = ±{delta:.1%}: smallest resolvable")
    ax.axhline(0, color="k", lw=0.8)
    log_ticks(ax, ns)
    ax.set(xlabel="sequence length $N$", ylabel="extra time vs scaled_dot (%)")
    settings = ev.get("settings", {})
    threads = ev.get("threads", "?")
    ax.set_title(f"C5: cosine attention's overhead, forward+backward, CPU float32, "
                 f"$D={settings.get('head_dim', 64)}$, {threads} thread"
                 f"{'' if threads == 1 else 's'}", fontsize=10)
    outside(ax)
    return save(fig, folder, "c5_overhead", T.c5_alt(ev, delta))


def fig_head_dim(ev: Evidence, folder: Path, alt: str) -> Figure:
    """C7, C13: dot − scaled and absorbed − scaled clipped loss against d_k, one panel per
    init regime, mean and 95% CI (Holm within the regime), over the ±δ band."""
    inits = sorted(ev["inits"], key=lambda i: i != "unit")
    fig, axes = plt.subplots(1, len(inits), figsize=(4.3 * len(inits) + 0.6, 3.9), sharey=True,
                             squeeze=False)
    arms = (("dot", "-", "o", 0.93, "C3", rf"dot − scaled_dot (no {SQRT_DK})"),
            ("dot_absorbed", ":", "s", 1.07, "C0",
             r"dot_absorbed − scaled_dot (q, k init and LR $\times d_k^{-1/4}$)"))
    for ax, init in zip(axes[0], inits, strict=True):
        for arm, ls, marker, shift, color, _ in arms:
            c = gaps(ev, init, arm)
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
    return save(fig, folder, "c7_c13_head_dim", alt)


def fig_c11(ev: Evidence, folder: Path) -> Figure:
    """C11: max |logit| against step, one panel per (width, arm): unscaled, scaled and
    QK-LayerNorm (Wortsman et al. 2023's attention-logit growth, and its remedy); one colour
    per LR from one sequential colormap, one colorbar for every panel."""
    widths = list(ev["sweep"])
    arms = [a for a in ("dot", "scaled_dot", "qk_layernorm") if a in ev["sweep"][widths[-1]]]
    lrs = sorted(float(x) for x in ev["lrs"])
    norm = LogNorm(lrs[0], lrs[-1] * (1.0001 if len(lrs) == 1 else 1))  # one LR: vmin < vmax
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(len(widths), len(arms), figsize=(3.5 * len(arms) + 1.2,
                             2.6 * len(widths) + 0.9), sharex=True, sharey=True, squeeze=False,
                             layout="constrained")
    for (r, w), (col, arm) in ((x, y) for x in enumerate(widths) for y in enumerate(arms)):
        ax = axes[r, col]
        for lr, curve in ev["sweep"][w].get(arm, {}).get("logit_curves", {}).items():
            pts = [(s, v) for s, v in curve if T.finite(v) and v > 0]
            if pts:
                ax.plot(*zip(*pts, strict=True), color=cmap(norm(float(lr))), lw=1.4)
        ax.axhline(ev["logit_limit"], color="C3", ls="--", lw=0.9)
        ax.set_yscale("log")
        ax.set_title(f"{arm}, {w.replace('d_model=', 'width ')}", fontsize=10)
        if r == len(widths) - 1:
            ax.set_xlabel("step")
        if col == 0:
            ax.set_ylabel("max |logit|")
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="peak LR")
    bar.set_ticks(lrs, labels=[f"{x:g}" for x in lrs])
    bar.minorticks_off()
    fig.suptitle("C11: max |logit| during training, char-level text, GPT-2 init, first seed "
                 "at each LR", fontsize=11)
    below(fig, [Line2D([], [], color="C3", ls="--", label=f"{T.sci(ev['logit_limit'])}: "
                       "Wortsman et al. 2023's instability marker")], ncol=1)
    return save(fig, folder, "c11_max_logit", T.c11_alt(ev))


def c12_init_panel(ax: plt.Axes, init_std: dict[str, Any]) -> None:
    """C12's left panel: scaled_dot's step-0 logit std against d_k per regime (95% CI)."""
    for i, (regime, by_d) in enumerate(init_std.items()):
        ds = sorted(by_d, key=int)
        cs = [T.arm_ci({"values": by_d[d]}) for d in ds]
        ax.errorbar([int(d) for d in ds], [c["mean"] for c in cs], yerr=yerr(cs), marker="o",
                    capsize=3, color=f"C{i}", label=f"{regime} init, 95% CI")
    ax.axhspan(0.25, 4, color=BAND, zorder=0, label="O(1): 0.25 to 4")
    ax.set(yscale="log", ylabel="logit std at step 0", title="at init (layer 1)")
    log_ticks(ax, sorted({int(d) for by_d in init_std.values() for d in by_d}))
    ax.set_xlabel("$d_k$")


def fig_c12(ev: Evidence, numbers: dict[str, Any], folder: Path) -> Figure:
    """C12: scaled_dot's logit std at init per regime, and its final max |logit| per seed
    against LR per width, with 4·s_c(n); a diverged run is drawn at the top as ▲."""
    at_init = [v for by_d in ev["init_std"].values() for seeds in by_d.values()
               for v in seeds.values() if T.finite(v)]
    if not at_init and not any(ev["final_logit"].values()):
        raise ValueError("ev: no scaled_dot logit was measured")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 4.1))
    if at_init:
        c12_init_panel(a, ev["init_std"])
    limit = numbers.get("limit", 4 * math.sqrt(2 * math.log(ev["n"])))
    finite_all = [x for by_lr in ev["final_logit"].values() for s in by_lr.values()
                  for x in s.values() if T.finite(x)]
    top = 3 * max(finite_all, default=limit)
    for i, (w, by_lr) in enumerate(ev["final_logit"].items()):
        shift = 1 + 0.12 * (i - (len(ev["final_logit"]) - 1) / 2)
        pts = [(float(lr) * shift, x) for lr, seeds in by_lr.items() for x in seeds.values()]
        ok = [(p, x) for p, x in pts if T.finite(x)]
        if ok:
            b.scatter(*zip(*ok, strict=True), s=14, color=f"C{i}", alpha=0.8,
                      label=f"{w.replace('d_model=', 'width ')}, each seed")
        bad = [p for p, x in pts if not T.finite(x)]
        if bad:
            b.scatter(bad, [top] * len(bad), marker="^", color=f"C{i}", label="diverged")
    b.axhline(limit, color="C3", ls="--", label=rf"$4\,s_c(n)=4\sqrt{{2\ln {ev['n']}}}$"
              f" = {limit:.1f}")
    lrs = sorted({float(lr) for by_lr in ev["final_logit"].values() for lr in by_lr})
    if lrs:
        log_ticks(b, lrs)
    b.set(yscale="log", xlabel="peak LR", ylabel="final max |logit|", title="after training")
    for ax in (a, b):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=8,
                  frameon=False)
    fig.suptitle(f"C12: scaled_dot's logits, char-level text (n = {ev['n']} keys)",
                 fontsize=11)
    return save(fig, folder, "c12_trained_logits", T.c12_alt(ev, numbers))


def fig_q3(ev: Evidence, folder: Path) -> Figure:
    """Q3: eval loss (what the rule reads), accuracy and attention weight on the answer against
    evaluation length, each arm's mean and 95% interval over seeds."""
    lengths = ev["lengths"]
    ns = [int(k.split("=")[1]) for k in lengths]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    arms = list(ev["accuracy"][lengths[0]]["all"])
    seeds = 0
    for ax, key, label in ((axes[0], "loss", "eval loss (nats)"),
                           (axes[1], "accuracy", "eval accuracy"),
                           (axes[2], "answer_weight", "attention weight on the answer")):
        for j, arm in enumerate(arms):
            cs = [T.arm_ci(ev[key].get(k, {}).get("all", {}).get(arm)) for k in lengths]
            seeds = max(seeds, *(c["n"] for c in cs))
            shift = 1 + 0.04 * (j - (len(arms) - 1) / 2)
            ax.errorbar([n * shift for n in ns], [c["mean"] for c in cs], yerr=yerr(cs),
                        marker="o", capsize=3, color=f"C{j}", label=f"{arm}, 95% CI")
        ax.set(xscale="log", xlabel="evaluation length (keys)", ylabel=label)
        ax.set_xticks(ns, [f"{n}\n(train)" if i == 0 else str(n) for i, n in enumerate(ns)])
        ax.minorticks_off()
    chance = axes[1].axhline(ev["chance"], color="grey", ls=":",
                             label=f"chance accuracy ({ev['chance']:.2f})")
    outside(axes[2], handles=[*axes[2].get_legend_handles_labels()[0], chance])
    fig.suptitle(f"Q3: length generalization, retrieval trained at n = {ns[0]}, RoPE, "
                 f"{seeds} seeds", fontsize=11)
    return save(fig, folder, "q3_length", T.q3_alt(ev))


def fig_q2(result: dict[str, Any], folder: Path) -> Figure:
    """Q2: MiniLM's layer × head heatmaps (:func:`attnscale.measure.inspection.plot_heatmaps`)."""
    return {"path": inspection.plot_heatmaps(result, str(folder))[0], "alt": T.q2_alt(result)}


def c13_figure(ev: Evidence, numbers: dict[str, Any], folder: Path) -> Figure:
    """C13 shares C7's figure, with its own finding: the gap's slope against d_k."""
    alt = T.head_dim_alt(ev, numbers["gaps"], {}, numbers.get("context", {}).get("gpt2", {}),
                         numbers.get("slope"))
    return {"path": str(folder / "c7_c13_head_dim.png"), "alt": alt}


def c7_figure(ev: Evidence, numbers: dict[str, Any], folder: Path) -> Figure:
    """C7: the head-dimension figure, with C7's finding (the unscaled and absorbed gaps)."""
    alt = T.head_dim_alt(ev, numbers["dot"], numbers["absorbed"], gaps(ev, "gpt2")
                         if "gpt2" in ev["inits"] else {})
    return fig_head_dim(ev, folder, alt)


def sweep_unit(key: str) -> str:
    """C11's comparisons: LR sensitivity (and its growth) in nats, instability as a share."""
    return "share of LR grid" if key.endswith("unstable") else "nats"


def draw_all(evidence: dict[str, Evidence], measured: dict[str, Any], folder: Path,
             verdicts: dict[str, Any]) -> tuple[dict[str, list[Figure]], dict[str, list[str]]]:
    """Every judged claim's figures as ``{claim id: [{"path", "alt"}, ...]}``, and the figures
    that failed to draw as ``{claim id: [failure, ...]}`` (an error of the report, never a
    figure left out in silence). ``verdicts``: claim id -> the rule's ``numbers``, for the
    claims whose rule gave a verdict; the others' figures are not drawn."""
    folder, ev, num = Path(folder), evidence, verdicts
    def forest(cid: str, title: str, unit: str | Callable[[str], str],
               what: str) -> Callable[[], Figure]:
        n = T.n_seeds(num.get(cid, {}))
        return lambda: fig_forest(num[cid], folder, f"{cid.lower()}_effects",
                                  f"{cid}: {title}, {n} seeds, mean and 95% CI", unit, what)
    jobs: dict[str, list[Callable[[], Figure]]] = {
        "C1": [lambda: fig_c1(measured["implementation"]["cases"], folder)],
        "C2": [lambda: TP.fig_c2(ev["C2"], folder)],
        "C3": [lambda: fig_arms(ev["C3"], folder, "c3_salience", r"C3: salience, cue on "
                                r"$\|k\|$ only, accuracy per arm", T.c3_extra(ev["C3"])),
               forest("C3", "cosine − scaled_dot accuracy", "accuracy",
                      "Cosine minus scaled_dot accuracy with the cue on ‖k‖")],
        "C4": [lambda: fig_arms(ev["C4"], folder, "c4_tau", f"C4: retrieval among fillers, "
                                f"n = {ev['C4']['n']} keys, accuracy per arm",
                                T.c4_extra(ev["C4"])),
               forest("C4", "cosine − scaled_dot clipped eval loss", "nats",
                      "Cosine minus scaled_dot retrieval loss")],
        "C5": [lambda: fig_c5(ev["C5"], num.get("C5", {}).get("delta"), folder)],
        "C6": [forest("C6", "rival − scaled_dot clipped eval loss", "nats",
                      "Rival minus scaled_dot loss")],
        "C7": [lambda: c7_figure(ev["C7"], num["C7"], folder)],
        "C8": [lambda: TP.fig_c8(ev["C8"], num.get("C8", {}).get("std_slope"), folder)],
        "C9": [lambda: TP.fig_rem(ev["C9"], folder), lambda: TP.fig_phase(folder)],
        "C10": [lambda: TP.fig_c10(ev["C10"], num["C10"]["per_n"], folder)],
        "C11": [lambda: fig_c11(ev["C11"], folder),
                forest("C11", "dot − scaled_dot, LR sweep", sweep_unit,
                       "Unscaled minus scaled LR sensitivity and instability")],
        "C12": [lambda: fig_c12(ev["C12"], num.get("C12", {}), folder)],
        "C13": [lambda: c13_figure(ev["C13"], num["C13"], folder)],
        "Q1": [forest("Q1", "modern score − scaled_dot, char-level text", "nats",
                      "Modern scores minus scaled_dot (loss and LR sensitivity)")],
        "Q2": [lambda: fig_q2(measured["minilm"], folder)],
        "Q3": [lambda: fig_q3(ev["Q3"], folder)],
    }
    out: dict[str, list[Figure]] = {}
    failed: dict[str, list[str]] = {}
    for claim, fns in jobs.items():
        if claim not in num:
            continue
        for fn in fns:
            try:
                fig = fn()
                if not Path(fig["path"]).exists():
                    raise FileNotFoundError(f"the figure was not written: {fig['path']}")
            except Exception as e:  # a figure that cannot be drawn is reported, not dropped
                plt.close("all")
                failed.setdefault(claim, []).append(failure(e))
                continue
            out.setdefault(claim, []).append(fig)
    return out, failed
