"""The report's figures: one small function per claim, from that claim's evidence dict.

Each function draws with matplotlib (Agg), saves a PNG under ``folder`` and returns its path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from attnscale.audit.rules_training import gaps
from attnscale.audit.verdicts import LOSS_DELTA
from attnscale.measure import inspection, theory

Evidence = dict[str, Any]


def _save(fig, folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def fig_c1(ev: Evidence, cases: list[dict], folder: Path) -> str:
    """C1: max |error| per tested case against the float64 reference and torch SDPA."""
    fig, ax = plt.subplots(figsize=(5, 3))
    labels = [f"{'causal' if c['causal'] else 'full'}/{c['mask'] or 'no mask'}"
              f"{'/GQA' if c['gqa'] else ''}" for c in cases]
    x = range(len(cases))
    ax.bar([i - 0.2 for i in x], [max(c["err_reference"], 1e-12) for c in cases], 0.4,
           label="vs float64 reference")
    ax.bar([i + 0.2 for i in x], [max(c["err_sdpa"], 1e-12) for c in cases], 0.4,
           label="vs torch SDPA")
    ax.axhline(1e-5, color="red", ls=":", label="tolerance 1e-5")
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, rotation=20, fontsize=8)
    ax.set_ylabel("max |error| (float32)")
    ax.set_title("attnscale.attention(score='scaled_dot') vs reference and SDPA", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, folder, "c1_exactness")


def fig_c2(folder: Path) -> str:
    """C2: the exact density of cos(q, k) for random q, k at several d."""
    fig, ax = plt.subplots(figsize=(5, 3))
    xs = [i / 200 - 1 for i in range(401)]
    for d in (4, 16, 64, 256):
        ax.plot(xs, [float(theory.cosine_logit_pdf(x, d)) for x in xs], label=f"d = {d}")
    ax.set(xlabel="cos(q, k) of random vectors (τ = 1 logit)", ylabel="density",
           title="density of cos(q, k), random q, k (theory)")
    ax.legend(fontsize=8)
    return _save(fig, folder, "c2_cosine_range")


def fig_forest(comps: dict[str, Any], folder: Path, name: str, title: str,
               unit: str) -> str:
    """A verdict's paired comparisons: mean difference and 95% interval each, with ±δ."""
    items = [(k, c) for k, c in comps.items() if c.get("n")]
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(items) + 1.2))
    for i, (_, c) in enumerate(items):
        ax.errorbar(c["mean"], i, xerr=[[c["mean"] - c["lo"]], [c["hi"] - c["mean"]]],
                    fmt="o", capsize=3, color=READING_COLORS.get(c["reading"], "k"))
    if items:
        d = items[0][1]["smallest"]
        ax.axvspan(-d, d, color="#eee", zorder=0, label=f"±δ = {d:g}")
        ax.legend(fontsize=7, loc="best")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(items)), [k for k, _ in items], fontsize=7)
    ax.set(xlabel=f"paired difference ({unit})", title=title)
    return _save(fig, folder, name)


READING_COLORS = {"greater": "#c0392b", "less": "#2874a6", "equal": "#1e8449",
                  "inconclusive": "#7f8c8d"}


def fig_c5(ev: Evidence, folder: Path) -> str:
    """C5: cosine / scaled_dot time and the noise floor against N, with 95% intervals."""
    fig, ax = plt.subplots(figsize=(5, 3))
    ns = [r["n"] for r in ev["rows"]]
    for key, label in (("cosine", "cosine / scaled_dot"), ("floor", "scaled_dot / itself")):
        r = [row[key] for row in ev["rows"]]
        ax.errorbar(ns, [x["ratio"] for x in r],
                    yerr=[[x["ratio"] - (x["lo"] or x["ratio"]) for x in r],
                          [(x["hi"] or x["ratio"]) - x["ratio"] for x in r]],
                    marker="o", capsize=3, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="sequence length N", ylabel="time ratio (fwd+bwd)",
           title="C5: overhead of cosine attention")
    ax.legend(fontsize=8)
    return _save(fig, folder, "c5_overhead")


def fig_head_dim(ev: Evidence, folder: Path) -> str:
    """C7, C13: dot − scaled and absorbed − scaled loss gap against d_k, per init regime."""
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for init in ev["inits"]:
        for arm, ls in (("dot", "-"), ("dot_absorbed", ":")):
            c = gaps(ev, init, arm)
            ds = [int(d) for d, x in c.items() if x.get("n")]
            xs = [c[str(d)] for d in ds]
            ax.errorbar(ds, [x["mean"] for x in xs],
                        yerr=[[x["mean"] - x["lo"] for x in xs], [x["hi"] - x["mean"] for x in xs]],
                        marker="o", ls=ls, capsize=3, label=f"{arm} − scaled, {init} init")
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhspan(-LOSS_DELTA, LOSS_DELTA, color="#eee", zorder=0, label="±δ (0.02 nats)")
    ax.set(xscale="log", xlabel="d_k (one head)", ylabel="Δ clipped eval loss (nats)",
           title="C7/C13: cost of dropping 1/√d_k")
    ax.set_xticks(ev["head_dims"], [str(d) for d in ev["head_dims"]])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    return _save(fig, folder, "c7_c13_head_dim")


def fig_arms(ev: Evidence, folder: Path, name: str, title: str) -> str:
    """Accuracy per arm: mean bar and every seed's value as a dot."""
    arms = ev["accuracy"]["all"]
    fig, ax = plt.subplots(figsize=(5.5, 3))
    for i, a in enumerate(arms.values()):
        xs = list(a["values"].values())
        if xs:
            ax.bar(i, sum(xs) / len(xs), color="#aec7e8")
            ax.scatter([i] * len(xs), xs, s=10, color="#1f4e79", zorder=3)
    ax.axhline(ev["chance"], color="grey", ls=":", label="chance")
    ax.set_xticks(range(len(arms)), list(arms), rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="eval accuracy", title=title)
    ax.legend(fontsize=8)
    return _save(fig, folder, name)


def fig_c8(ev: Evidence, folder: Path) -> str:
    """C8: mean and spread of q·k against d_k (Monte Carlo)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3))
    d = [r["d"] for r in ev["by_d"]]
    a.errorbar(d, [r["mean"] for r in ev["by_d"]], yerr=[3 * r["se_mean"] for r in ev["by_d"]],
               marker="o", label="mean ± 3 SE")
    a.plot(d, d, ls=":", color="red", label="the thread's O(d_k)")
    a.set(xscale="log", xlabel="d_k", ylabel="E[q·k]", yscale="symlog",
          title="mean of q·k, unit-variance components (MC)")
    a.legend(fontsize=8)
    b.plot(d, [r["std"] for r in ev["by_d"]], marker="o", label="std(q·k)")
    b.plot(d, [math.sqrt(x) for x in d], ls=":", label="√d_k")
    b.plot(d, [r["std_scaled"] for r in ev["by_d"]], marker="s", label="std(q·k/√d_k)")
    b.set(xscale="log", yscale="log", xlabel="d_k", title="spread of q·k (Monte Carlo)")
    b.legend(fontsize=8)
    return _save(fig, folder, "c8_qk_moments")


def fig_rem(ev: Evidence, folder: Path, key: str, ylabel: str, name: str) -> str:
    """C9, C10: one exact softmax statistic (``key`` of each curve) against the logit std s."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for curve in ev["curves"]:
        line = ax.plot(curve["s"], curve[key], label=f"n = {curve['n']}")[0]
        ax.axvline(curve["s_c"], color=line.get_color(), ls=":", lw=0.8)
    ax.set(xlabel="logit std s  (dotted: s_c = √(2 ln n))", ylabel=ylabel)
    ax.set_title("exact theory: softmax of n i.i.d. N(0, s²) logits", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, folder, name)


def fig_c10(ev: Evidence, folder: Path) -> str:
    """C10: per-row ‖J‖_F median and quartiles, and the RMS, against s / s_c."""
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for c in ev["curves"]:
        x = [s / c["s_c"] for s in c["s"]]
        line = ax.plot(x, c["median"], label=f"median, n={c['n']}")[0]
        ax.fill_between(x, c["q1"], c["q3"], color=line.get_color(), alpha=0.2)
        ax.plot(x, c["rms"], ls=":", color=line.get_color())
    ax.axhline(1e-3, color="grey", ls="--", lw=0.8)
    ax.set(yscale="log", xscale="log", xlabel="s / s_c", ylabel="‖J‖_F per row",
           title="C10: median (band: quartiles), RMS dotted")
    ax.legend(fontsize=7)
    return _save(fig, folder, "c10_jacobian")


def fig_c11(ev: Evidence, folder: Path) -> str:
    """C11: max |logit| against step at the larger width, one line per LR: unscaled, scaled
    and QK-LayerNorm (Wortsman et al. 2023's attention-logit growth, and its remedy)."""
    width = list(ev["sweep"])[-1]
    arms = [a for a in ("dot", "scaled_dot", "qk_layernorm") if a in ev["sweep"][width]]
    fig, axes = plt.subplots(1, len(arms), figsize=(4.2 * len(arms), 3.2), squeeze=False,
                             sharey=True)
    for ax, arm in zip(axes[0], arms, strict=True):
        for lr, curve in ev["sweep"][width][arm]["logit_curves"].items():
            if curve:
                ax.plot([s for s, _ in curve], [v for _, v in curve], label=f"lr {float(lr):g}")
        ax.axhline(ev["logit_limit"], color="red", ls="--", lw=0.8)
        ax.set(yscale="log", xlabel="step", ylabel="max |logit|", title=f"{arm}, {width}")
        ax.legend(fontsize=6)
    return _save(fig, folder, "c11_max_logit")


def fig_c12(ev: Evidence, folder: Path) -> str:
    """C12: scaled_dot's final max |logit| against LR per width, with 4·s_c(n)."""
    fig, ax = plt.subplots(figsize=(5, 3))
    for width, by_lr in ev["final_logit"].items():
        pts = [(float(k), x) for k, seeds in by_lr.items() for x in seeds.values()
               if math.isfinite(x)]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, label=f"{width}, each seed")
    ax.axhline(4 * math.sqrt(2 * math.log(ev["n"])), color="red", ls="--", label="4·s_c(n)")
    ax.set(xscale="log", yscale="log", xlabel="peak LR", ylabel="final max |logit|",
           title="C12: scaled_dot logits after training")
    ax.legend(fontsize=7)
    return _save(fig, folder, "c12_trained_logits")


def fig_q3(ev: Evidence, folder: Path) -> str:
    """Q3: accuracy and attention weight on the answer against evaluation length."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    lengths = ev["lengths"]
    for ax, key, label in ((axes[0], "accuracy", "accuracy"),
                           (axes[1], "answer_weight", "attention on the answer")):
        arms = ev[key][lengths[0]]["all"] if lengths else {}
        for arm in arms:
            ys = [ev[key][k]["all"].get(arm, {}).get("values", {}) for k in lengths]
            ax.plot([int(k.split("=")[1]) for k in lengths],
                    [sum(v.values()) / len(v) if v else math.nan for v in ys],
                    marker="o", label=arm)
        ax.set(xscale="log", xlabel="eval length", ylabel=label)
        ax.legend(fontsize=8)
    return _save(fig, folder, "q3_length")


def draw_all(evidence: dict[str, Evidence], measured: dict[str, Any], folder: Path,
             verdicts: dict[str, Any]) -> dict[str, list[str]]:
    """Every claim's figures; a figure whose data is missing is skipped, not faked.
    ``verdicts``: claim id -> the rule's numbers (paired comparisons for the forest plots)."""
    def forest(cid: str, title: str, unit: str) -> Callable[[], str]:
        return lambda: fig_forest(verdicts[cid], folder, f"{cid.lower()}_effects", title, unit)
    jobs: dict[str, list[Callable[[], str]]] = {
        "C1": [lambda: fig_c1(evidence["C1"], measured["implementation"]["cases"], folder)],
        "C2": [lambda: fig_c2(folder)],
        "C3": [lambda: fig_arms(evidence["C3"], folder, "c3_salience", "C3: cue on ‖k‖ only"),
               forest("C3", "cosine − scaled_dot accuracy", "accuracy")],
        "C4": [lambda: fig_arms(evidence["C4"], folder, "c4_tau",
                                f"C4: retrieval accuracy at n = {evidence['C4']['n']}"),
               forest("C4", "cosine − scaled_dot accuracy", "accuracy")],
        "C5": [lambda: fig_c5(evidence["C5"], folder)],
        "C6": [forest("C6", "rival − scaled_dot loss", "nats")],
        "C7": [lambda: fig_head_dim(evidence["C7"], folder)],
        "C8": [lambda: fig_c8(evidence["C8"], folder)],
        "C9": [lambda: fig_rem(evidence["C9"], folder, "entropy_norm", "E[entropy] / ln n",
                               "c9_entropy"),
               lambda: fig_rem(evidence["C9"], folder, "max_weight", "E[max weight]",
                               "c9_max_weight")],
        "C10": [lambda: fig_c10(evidence["C10"], folder)],
        "C11": [lambda: fig_c11(evidence["C11"], folder), forest("C11", "dot − scaled_dot", "")],
        "C12": [lambda: fig_c12(evidence["C12"], folder)],
        "C13": [lambda: str(folder / "c7_c13_head_dim.png")],
        "Q1": [forest("Q1", "modern − scaled_dot", "nats")],
        "Q2": [lambda: inspection.plot_heatmaps(measured["minilm"], str(folder))[0]],
        "Q3": [lambda: fig_q3(evidence["Q3"], folder)],
    }
    out: dict[str, list[str]] = {}
    for claim, fns in jobs.items():
        for fn in fns:
            try:
                path = fn()
            except (KeyError, ValueError, TypeError, ZeroDivisionError, IndexError):
                plt.close("all")
                continue
            if Path(path).exists():
                out.setdefault(claim, []).append(path)
    return out
