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

from attnscale.measure import inspection, theory

Evidence = dict[str, Any]


def _save(fig, folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _bars(ax, cis: dict[str, dict], ylabel: str, chance: float | None = None,
          bounds: tuple[float, float] | None = None) -> None:
    """Bars of means with their 95% CIs; ``bounds`` clips the drawn CI to the metric's range
    (a t-interval over 2 seeds can leave [0, 1])."""
    lo_b, hi_b = bounds if bounds is not None else (-math.inf, math.inf)
    names = list(cis)
    means = [cis[n]["mean"] for n in names]
    err = [[m - max(lo_b, cis[n]["lo"] if cis[n].get("lo") is not None else m) for n, m in
            zip(names, means, strict=True)],
           [min(hi_b, cis[n]["hi"] if cis[n].get("hi") is not None else m) - m for n, m in
            zip(names, means, strict=True)]]
    ax.bar(range(len(names)), means, yerr=err, capsize=3, color="#4c78a8")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if chance is not None:
        ax.axhline(chance, color="grey", ls=":", label="chance")
        ax.legend(fontsize=8)


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


def fig_c3(ev: Evidence, folder: Path) -> str:
    """C3: salience accuracy per score with 95% CIs."""
    fig, ax = plt.subplots(figsize=(5, 3))
    _bars(ax, ev["accuracy"], "salience accuracy", ev.get("chance"), bounds=(0.0, 1.0))
    ax.set_title("salience task (key marked only by its norm): accuracy by score", fontsize=9)
    return _save(fig, folder, "c3_salience")


def fig_c4(ev: Evidence, folder: Path) -> str:
    """C4: the max-weight bound of logits in [−τ, τ], and MQAR accuracy per cosine variant."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3))
    taus = [0.1 * i for i in range(1, 101)]
    for n in (64, 512, 4096):
        a.plot(taus, [float(theory.max_weight_bound(n, t)) for t in taus], label=f"n = {n}")
    a.set(xlabel="τ (logits in [−τ, τ])", ylabel="largest possible weight", xscale="log",
          title="e^{2τ}/(e^{2τ}+n−1)")
    a.legend(fontsize=8)
    _bars(b, ev["accuracy"], "accuracy (95% CI clipped to [0, 1])",
          ev.get("chance"), bounds=(0.0, 1.0))
    b.set_title("MQAR at the best LR: cosine τ = 1, 10, learned vs scaled_dot", fontsize=9)
    return _save(fig, folder, "c4_bound_and_mqar")


def fig_c5(rows: list[dict], folder: Path) -> str:
    """C5: each score's time / SDPA against N, from the benchmark rows."""
    fig, ax = plt.subplots(figsize=(6, 3))
    for score in sorted({r["score"] for r in rows}):
        pts = sorted((r["n"], r["ratio_fwdbwd"]) for r in rows if r["score"] == score)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=score)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(1.1, color="red", ls=":", lw=0.8)
    ax.set(xscale="log", xlabel="N", ylabel="time / SDPA (fwd+bwd)",
           title="attnscale bench: each score's time / PyTorch SDPA (non-causal)")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, folder, "c5_speed")


def fig_best_loss(ev: Evidence, folder: Path, name: str) -> str:
    """C6: each score's best-LR eval loss per task."""
    tasks = list(ev["best_loss"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        _bars(ax, ev["best_loss"][task], "best-LR eval loss")
        ax.set_title(f"{task}: best-LR eval loss by score")
    return _save(fig, folder, name)


def fig_head_dim(ev: Evidence, folder: Path, name: str) -> str:
    """C7, C13: best-LR eval loss of unscaled and scaled attention against d_k."""
    fig, ax = plt.subplots(figsize=(5, 3))
    dks = sorted(ev["best_loss"], key=int)
    for variant in ("scaled_dot", "dot"):
        means = [ev["best_loss"][d][variant]["mean"] for d in dks if variant in ev["best_loss"][d]]
        ax.plot([int(d) for d in dks][: len(means)], means, marker="o", label=variant)
    ax.set(xscale="log", xlabel="head dim d_k", ylabel="best-LR eval loss",
           title="text, one head: unscaled vs scaled over d_k")
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


def fig_c11(ev: Evidence, folder: Path) -> str:
    """C11: clipped final loss against the learning rate, one panel per width."""
    widths = sorted(ev["by_width"], key=int)
    fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 3.2), squeeze=False)
    for ax, w in zip(axes[0], widths, strict=True):
        for name, row in ev["by_width"][w].items():
            pts = sorted((float(k), v) for k, v in row["loss_by_lr"].items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                    lw=2.2 if name in ("dot", "scaled_dot") else 0.9)
        ax.set(xscale="log", xlabel="learning rate", ylabel="final loss (diverged = loss₀)",
               title=f"{ev.get('task', 'text')} LR sweep, width {w}")
    axes[0][-1].legend(fontsize=6, ncol=2)
    return _save(fig, folder, "c11_lr_sweeps")


def fig_c12(ev: Evidence, folder: Path) -> str:
    """C12: logit size at initialization against d_k, and the trained max |logit|."""
    fig, ax = plt.subplots(figsize=(5, 3))
    d = sorted(ev["init_std_scaled"], key=int)
    ax.plot([int(x) for x in d], [ev["init_std_scaled"][x] for x in d], marker="o",
            label="init, q·k/√d_k")
    ax.plot([int(x) for x in d], [math.sqrt(int(x)) for x in d], ls=":", label="init, q·k")
    ax.axhline(ev.get("trained_max_abs_logit") or 0, color="red", ls="--",
               label="max |logit| after training (scaled)")
    ax.set(xscale="log", yscale="log", xlabel="d_k", ylabel="logit size")
    ax.set_title("logit size: init (unit-variance q, k) and after training (text)", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, folder, "c12_logit_size")


def fig_q1(ev: Evidence, folder: Path) -> str:
    """Q1: best-LR loss against LR sensitivity, one panel per task."""
    tasks = list(ev["by_task"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        rows = ev["by_task"][task]
        for name, r in rows.items():
            ax.scatter(r["lr_sensitivity"], r["best_loss"]["mean"], s=25)
            ax.annotate(name, (r["lr_sensitivity"], r["best_loss"]["mean"]), fontsize=7)
        ax.set(xlabel="LR sensitivity (Wortsman)", ylabel="best-LR loss",
               title=f"{task}: best loss vs LR sensitivity")
    return _save(fig, folder, "q1_alternatives")


def fig_q3(ev: Evidence, folder: Path) -> str:
    """Q3: accuracy against evaluation length per score."""
    fig, ax = plt.subplots(figsize=(5, 3))
    for variant, by_len in ev["accuracy"].items():
        keys = sorted(by_len, key=lambda k: int(k.split("=")[1]))
        ax.errorbar([int(k.split("=")[1]) for k in keys], [by_len[k]["mean"] for k in keys],
                    yerr=[(by_len[k]["hi"] or by_len[k]["mean"]) - by_len[k]["mean"]
                          for k in keys], marker="o", capsize=3, label=variant)
    ax.set(xscale="log", xlabel="eval length", ylabel="accuracy",
           title="length task: accuracy by eval length")
    ax.legend(fontsize=8)
    return _save(fig, folder, "q3_length")


def draw_all(evidence: dict[str, Evidence], measured: dict[str, Any], folder: Path,
             minilm: dict[str, Any]) -> dict[str, list[str]]:
    """Every claim's figures; a figure whose data is missing is skipped, not faked."""
    jobs: dict[str, list[Callable[[], str]]] = {
        "C1": [lambda: fig_c1(evidence["C1"], measured["implementation"]["cases"], folder)],
        "C2": [lambda: fig_c2(folder)],
        "C3": [lambda: fig_c3(evidence["C3"], folder)],
        "C4": [lambda: fig_c4(evidence["C4"], folder)],
        "C5": [lambda: fig_c5(measured["bench"]["rows"], folder)],
        "C6": [lambda: fig_best_loss(evidence["C6"], folder, "c6_best_loss")],
        "C7": [lambda: fig_head_dim(evidence["C7"], folder, "c7_c13_head_dim")],
        "C8": [lambda: fig_c8(evidence["C8"], folder)],
        "C9": [lambda: fig_rem(evidence["C9"], folder, "entropy_norm", "E[entropy] / ln n",
                               "c9_entropy"),
               lambda: fig_rem(evidence["C9"], folder, "max_weight", "E[max weight]",
                               "c9_max_weight")],
        "C10": [lambda: fig_rem(evidence["C10"], folder, "jacobian", "RMS ‖J‖_F",
                                "c10_jacobian")],
        "C11": [lambda: fig_c11(evidence["C11"], folder)],
        "C12": [lambda: fig_c12(evidence["C12"], folder)],
        "C13": [lambda: str(folder / "c7_c13_head_dim.png")],
        "Q1": [lambda: fig_q1(evidence["Q1"], folder)],
        "Q2": [lambda: inspection.plot_heatmaps(minilm, str(folder))[0]],
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
