"""C8: "E[q·k] grows like O(d_k)" (the thread's reading of Vaswani et al. 2017, arXiv 1706.03762,
§3.2.1 footnote 4: for independent unit-variance components q·k has mean 0 and variance d_k).

Monte Carlo of q·k over d_k: refuted when the mean stays within 3 standard errors of 0 while
the std grows like √d_k; supported when the mean itself grows with d_k.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from attnscale.audit.claim import Claim, Figure, Measurement, Sources, register
from attnscale.audit.evidence import Model
from attnscale.audit.figure_text import finite
from attnscale.audit.theory_plots import log_ticks, save
from attnscale.audit.verdicts import INCONCLUSIVE, REFUTED, SUPPORTED, Verdict, loglog_slope
from attnscale.measure import theory

SAMPLES = 20000
DIMS = (16, 64, 256, 1024)
RULE = ("Monte Carlo of q·k for unit-variance independent components over d_k. The thread's "
        "'E[q·k] grows like O(d_k)' is refuted if the mean is within 3 SE of 0 at every d_k "
        "while the std grows like √d_k (log-log slope within 0.5 ± 0.05); supported if the "
        "mean grows with d_k (slope of |mean| ≥ 0.9 and means > 3 SE); inconclusive otherwise")


class Row(Model):
    """q·k at one d_k: its mean with the mean's standard error, its std, and the std of
    q·k/√d_k."""

    d: int
    mean: float
    se_mean: float
    std: float
    std_scaled: float

    def z(self) -> float:
        """|mean| in standard errors."""
        return abs(self.mean) / self.se_mean


class Evidence(Model):
    """The Monte Carlo rows over d_k, and (context) the init logit std of real models:
    d_model -> score -> std (:func:`attnscale.measure.theory.init_logit_std`)."""

    by_d: list[Row]
    real_init: dict[str, dict[str, float]]


def measure(samples: int = SAMPLES, seed: int = 0) -> dict[str, Any]:
    """q·k of ``samples`` pairs with independent N(0, 1) components at each d_k in
    :data:`DIMS`, and the logit std at GPT-2-style init (std 0.02, d_k = 64) for d_model 256,
    768, 4096, with and without 1/√d_k."""
    rng = np.random.default_rng(seed)
    by_d = []
    for d in DIMS:
        dots = np.einsum("ij,ij->i", rng.standard_normal((samples, d)),
                         rng.standard_normal((samples, d)))
        by_d.append({"d": d, "mean": float(dots.mean()),
                     "se_mean": float(dots.std(ddof=1) / math.sqrt(samples)),
                     "std": float(dots.std(ddof=1)),
                     "std_scaled": float((dots / math.sqrt(d)).std(ddof=1))})
    real_init = {str(dm): {score: float(theory.init_logit_std(dm, 64, 0.02, score))
                           for score in ("dot", "scaled_dot")} for dm in (256, 768, 4096)}
    return {"by_d": by_d, "real_init": real_init}


def judge(ev: Evidence) -> Verdict:
    """Mean and spread of q·k over d_k (Monte Carlo)."""
    rows = sorted(ev.by_d, key=lambda r: r.d)
    ds = [r.d for r in rows]
    zero_mean = all(abs(r.mean) <= 3 * r.se_mean for r in rows)
    slope = loglog_slope(ds, [r.std for r in rows])
    mean_slope = loglog_slope(ds, [abs(r.mean) + 1e-12 for r in rows])
    grows = mean_slope >= 0.9 and all(abs(r.mean) > 3 * r.se_mean for r in rows)
    if zero_mean and abs(slope - 0.5) <= 0.05:
        verdict = REFUTED
    elif grows:
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    worst = max(rows, key=Row.z)
    z = worst.z()
    plain = [f"Wrong as worded: E[q·k] is 0 at every d_k (largest |mean| is {z:.1f} standard "
             f"errors from 0)." if verdict == REFUTED else
             f"The mean of q·k is {z:.1f} standard errors from 0 at worst (d_k={worst.d}), "
             f"growing with d_k like d_k^{mean_slope:.2f}.",
             f"What grows is the spread: std(q·k) ∝ d_k^{slope:.2f} (√d_k would be 0.50), the "
             f"size that 1/√d_k undoes.",
             "It depends on q and k having independent unit-variance components (init=unit)."]
    return Verdict(verdict, RULE,
                   f"std(q·k) ∝ d_k^{slope:.3f}; largest |mean|/SE = {z:.2f} "
                   f"(d_k={worst.d})", {"std_slope": slope, "mean_slope": mean_slope},
                   headline=f"{verdict}: |mean| ≤ {z:.1f} SE, std ∝ d_k^{slope:.2f}",
                   plain=plain,
                   regime="independent unit-variance components",
                   smallest="3 standard errors for the mean; ±0.05 on the slope")


def alt(ev: Mapping[str, Any], slope: float | None) -> str:
    """The mean of q·k stays at 0 while its spread grows like √d_k."""
    rows = sorted(ev["by_d"], key=lambda r: r["d"])
    z = max(abs(r["mean"]) / r["se_mean"] for r in rows)
    grow = f" as d_k^{slope:.2f} (√d_k is 0.50)" if finite(slope) else ""
    scaled = [r["std_scaled"] for r in rows]
    return (f"Monte Carlo over d_k = {rows[0]['d']}–{rows[-1]['d']}: the mean of q·k stays within "
            f"{z:.1f} standard errors of 0, while its std grows from {rows[0]['std']:.1f} to "
            f"{rows[-1]['std']:.1f}{grow}. After dividing by √d_k the std is "
            f"{min(scaled):.2f}–{max(scaled):.2f} at every d_k.")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Mean (± 3 SE) and spread of q·k against d_k (Monte Carlo), with the verdict's slope."""
    rows = sorted(ev["by_d"], key=lambda r: r["d"])
    d = [r["d"] for r in rows]
    pairs = round((rows[0]["std"] / rows[0]["se_mean"]) ** 2)  # std/SE = √samples
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.9))
    a.errorbar(d, [r["mean"] for r in rows], yerr=[3 * r["se_mean"] for r in rows],
               marker="o", capsize=3, label=r"mean of $q\cdot k$, ±3 SE")
    a.plot(d, d, ls=":", color="C3", label=r"the thread's $O(d_k)$: $d_k$")
    a.axhline(0, color="k", lw=0.8)
    a.set(yscale="symlog", ylabel=r"$\mathbb{E}[q\cdot k]$", xlabel="$d_k$")
    log_ticks(a, d)
    b.plot(d, [r["std"] for r in rows], marker="o", label=r"std$(q\cdot k)$")
    b.plot(d, np.sqrt(d), ls=":", color="k", label=r"$\sqrt{d_k}$")
    b.plot(d, [r["std_scaled"] for r in rows], marker="s", label=r"std$(q\cdot k/\sqrt{d_k})$")
    log_ticks(b, d)
    top = max(r["std"] for r in rows)
    log_ticks(b, [2 ** k for k in range(int(math.log2(top)) + 2)], "y")
    b.set(xlabel="$d_k$", ylabel="standard deviation")
    for ax in (a, b):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8,
                  frameon=False)
    fig.suptitle(rf"C8: $q\cdot k$ with unit-variance components, Monte Carlo, {pairs:,} "
                 r"pairs per $d_k$", fontsize=11)
    return [save(fig, folder, "c8_qk_moments", alt(ev, numbers.get("std_slope")))]


def gather(src: Sources) -> dict[str, Any]:
    """The measurement, as it is stored."""
    return src.measured["qk"]


CLAIM = register(Claim(
    id="C8", text="E[q·k] grows like O(d_k).",
    measures="Monte Carlo of q·k; init and trained logits", rule=RULE, evidence=Evidence,
    gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("qk", lambda p: {"samples": SAMPLES},
                              lambda p: measure(samples=SAMPLES)),),
    scale=lambda p: "Monte Carlo, 20000 samples per d_k, unit-variance components"))
