"""C2: "Cosine similarity is an alternative scoring with scores in [−1, 1]" (the thread's answer
on why √d_k; the cosine score τ·cos(q, k) of Henry et al. 2020, arXiv 2010.04245).

Measures the largest |logit| of attnscale's cosine score at τ = 1 and τ = 10 for q, k norms
from 1e-3 to 1e3, and the cosine score against its float64 reference; supported when the logits
stay in [−τ, τ] and the error is under 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch

from attnscale.audit.claim import Claim, Figure, Measurement, Sources, register
from attnscale.audit.evidence import Model
from attnscale.audit.figure_text import finite
from attnscale.audit.theory_plots import BAND, outside, save
from attnscale.audit.verdicts import REFUTED, SUPPORTED, Verdict
from attnscale.core.attention import attention, reference_attention
from attnscale.measure.cosine_theory import cosine_logit_pdf
from attnscale.measure.stats import attention_stats

TOLERANCE = 1e-5
NORMS = (1e-3, 1.0, 1e3)  # ‖q‖ is scaled by each, ‖k‖ by its inverse
DS = (4, 16, 64, 256)  # the figure's dimensions
RULE = ("supported if cosine logits τ·cos(q,k) lie in [−τ, τ] for every tested input "
        "(including q, k norms from 1e-3 to 1e3) and the cosine score matches its float64 "
        "reference within 1e-5; else refuted")


class Evidence(Model):
    """The largest |τ·cos(q, k)| at τ = 1 and τ = 10 (float64), and the cosine score's largest
    error against its float64 reference at τ = 10 (float32)."""

    max_abs_logit_tau1: float
    max_abs_logit_tau10: float
    max_err_vs_reference: float


def measure(preset: Any = None) -> dict[str, float]:
    """max |τ·cos(q, k)| over q = x·r, k = y/r (x, y ~ N(0, I), r in :data:`NORMS`, float64) at
    τ = 1 and 10, and max |cosine attention − its float64 reference| at τ = 10 (float32)."""
    g = torch.Generator().manual_seed(2)
    max_abs = {}
    for tau in (1.0, 10.0):
        worst = 0.0
        for norm in NORMS:
            q = torch.randn(2, 4, 64, 32, generator=g, dtype=torch.float64) * norm
            k = torch.randn(2, 4, 64, 32, generator=g, dtype=torch.float64) / norm
            st = attention_stats(q, k, score="cosine", tau=tau)
            worst = max(worst, float(st.max_abs_logit.max()))
        max_abs[tau] = worst
    q, k, v = (torch.randn(2, 4, 33, 16, generator=g) for _ in range(3))
    err = float((attention(q, k, v, score="cosine", tau=10.0)
                 - reference_attention(q, k, v, score="cosine", tau=10.0)).abs().max())
    return {"max_abs_logit_tau1": max_abs[1.0], "max_abs_logit_tau10": max_abs[10.0],
            "max_err_vs_reference": err}


def judge(ev: Evidence) -> Verdict:
    """The range of cosine logits and the cosine score's exactness."""
    t1, t10, err = ev.max_abs_logit_tau1, ev.max_abs_logit_tau10, ev.max_err_vs_reference
    in_range = t1 <= 1 + 1e-6 and t10 <= 10 + 1e-5
    ok = in_range and err < TOLERANCE
    plain = [f"Cosine logits {'stayed within' if in_range else 'left'} [−τ, τ] (largest |logit| "
             f"{t1:.3f} at τ=1, {t10:.2f} at τ=10) for q, k norms from 1e-3 to 1e3.",
             "Only with τ = 1 is the range [−1, 1]: practice learns or fixes a larger τ (C4)."]
    return Verdict(SUPPORTED if ok else REFUTED, RULE,
                   f"max |logit| {t1:.6f} at τ=1 and {t10:.5f} at τ=10; error vs reference "
                   f"{err:.1e}", ev.model_dump(),
                   headline=f"{'supported' if ok else 'refuted'}: |τ·cos| ≤ τ",
                   plain=plain, smallest="1e-5 absolute against the float64 formula")


def alt(ev: Mapping[str, Any], ds: tuple[int, ...] = DS) -> str:
    """cos(q, k) of random vectors has std 1/√d; the measured cosine logits stay in ±τ."""
    spread = f"its std is exactly 1/√d: {1 / math.sqrt(ds[0]):.2f} at d = {ds[0]} and " \
             f"{1 / math.sqrt(ds[-1]):.3f} at d = {ds[-1]}"
    measured = ""
    if finite(ev.get("max_abs_logit_tau1")) and finite(ev.get("max_abs_logit_tau10")):
        measured = (f" Measured cosine logits never left [−τ, τ]: largest |logit| "
                    f"{ev['max_abs_logit_tau1']:.3f} at τ = 1 and {ev['max_abs_logit_tau10']:.2f}"
                    f" at τ = 10, for q, k norms from 1e-3 to 1e3.")
    return (f"For random q, k the cosine logit lies in [−1, 1] and concentrates near 0 as d "
            f"grows ({spread}), so at τ = 1 every logit is O(1/√d)." + measured)


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The exact density of cos(q, k) for random q, k at several d: τ·cos lies in [−τ, τ]."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    xs = np.linspace(-0.999, 0.999, 801)
    for d in DS:
        ax.plot(xs, cosine_logit_pdf(xs, d), label=f"$d = {d}$ (std $1/\\sqrt{{d}}$ = "
                f"{1 / math.sqrt(d):.2g})")
    ax.axvspan(-1.15, -1, color=BAND, zorder=0, label=r"impossible: $|\cos| > 1$")
    ax.axvspan(1, 1.15, color=BAND, zorder=0)
    ax.set(xlim=(-1.15, 1.15), xlabel=r"$\cos(q, k)$ = the logit at $\tau = 1$",
           ylabel="density")
    ax.set_title(r"C2: exact density of $\cos(q,k)$, $q, k \sim \mathcal{N}(0, I_d)$ (theory)",
                 fontsize=10)
    outside(ax)
    return [save(fig, folder, "c2_cosine_range", alt(ev))]


def gather(src: Sources) -> dict[str, Any]:
    """The measurement, as it is stored."""
    return src.measured["cosine_range"]


CLAIM = register(Claim(
    id="C2", text="Cosine similarity is an alternative scoring with scores in [−1, 1].",
    measures="range and exactness of the cosine score, with and without τ", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("cosine_range", lambda p: {}, measure),),
    scale=lambda p: "random q, k with norms 1e-3 to 1e3; exact range"))
