"""C9: "Large dot products make the softmax peaky" (Vaswani et al. 2017, arXiv 1706.03762,
§3.2.1: large dot products push the softmax "into regions where it has extremely small
gradients").

Exact finite-n theory of the softmax of n i.i.d. N(0, s²) logits (the Random Energy Model,
Derrida 1981; critical scale s_c = √(2 ln n)), checked by Monte Carlo: supported when the
normalized entropy falls monotonically with s and drops through 1/2 between s_c/2 and s_c for
every n tested.

Printed beside it, from the same measurement: at d_k = 64 over 512 keys the expected max weight
unscaled (s = 8) and scaled (s = 1), and the measured norm of the gradient reaching q and k
through attention without and with the scale (measured: larger without it, not smaller, so
what dropping 1/√d_k costs at this size is frozen attention at init, not vanishing gradients;
C10 says where gradients would vanish).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch

from attnscale.audit.claim import Claim, Figure, Measurement, Says, Sources, register
from attnscale.audit.evidence import Model
from attnscale.audit.figure_text import finite
from attnscale.audit.studies import Preset
from attnscale.audit.theory_plots import outside, phase_summary, plot_phase_diagram, save
from attnscale.audit.verdicts import INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.core.attention import attention
from attnscale.measure import montecarlo, theory

MAX_Z = 4.0  # theory against Monte Carlo, in standard errors
RULE = ("Exact theory (checked by Monte Carlo) for softmax over n i.i.d. N(0, s²) logits: "
        "supported if normalized entropy falls monotonically with s, stays above 0.5 below "
        "s_c/2 and falls below 0.5 beyond s_c = √(2 ln n) for every n tested, with theory and "
        "Monte Carlo within 4 SE; refuted if entropy does not fall with s; inconclusive "
        "otherwise")


class Curve(Model):
    """Exact statistics at one n against the logit std s: E[H]/ln n, E[max weight], the RMS
    softmax Jacobian norm (and at 10·s_c), with s_c = √(2 ln n)."""

    n: int
    s: list[float]
    s_c: float
    entropy_norm: list[float]
    max_weight: list[float]
    jacobian: list[float]
    at_10_sc: float

    def monotone(self) -> bool:
        """E[H]/ln n never rises with s."""
        return all(b <= a + 1e-9 for a, b in pairwise(self.entropy_norm))

    def sharp(self) -> bool:
        """E[H]/ln n is above 1/2 below s_c/2 and below 1/2 beyond s_c (s_c from n)."""
        sc = math.sqrt(2 * math.log(self.n))
        pts = list(zip(self.s, self.entropy_norm, strict=True))
        return (all(h > 0.5 for x, h in pts if x < sc / 2)
                and all(h < 0.5 for x, h in pts if x > sc))


class Evidence(Model):
    """The exact curves, the largest |z| of theory against Monte Carlo, the expected max weight
    over 512 keys at s = 8 (unscaled, d_k = 64) and s = 1 (scaled), and the q, k gradient norms
    ‖∂q‖ + ‖∂k‖ through attention at d_k = 64, n = 512, unscaled and scaled (printed, not
    judged), with their ratio."""

    curves: list[Curve]
    max_abs_z: float
    max_weight_unscaled_64_512: float
    max_weight_scaled_64_512: float
    grad_norm: dict[str, float]
    grad_ratio_64: float


def curve(n: int) -> dict[str, Any]:
    """Exact statistics at ``n`` keys over 25 logit stds from 0.1 to 3·s_c."""
    sc = float(theory.rem_critical_scale(n))
    s = [round(x, 4) for x in np.linspace(0.1, 3 * sc, 25)]
    return {"n": n, "s": s, "s_c": sc,
            "entropy_norm": [float(theory.expected_entropy(n, x)) / math.log(n) for x in s],
            "max_weight": [float(theory.expected_max_weight(n, x)) for x in s],
            "jacobian": [float(theory.rms_jacobian_norm(n, x)) for x in s],
            "at_10_sc": float(theory.rms_jacobian_norm(n, 10 * sc))}


def grad_norms() -> dict[str, float]:
    """‖∂q‖ + ‖∂k‖ through attention (d_k = 64, n = 512, random upstream gradient), per score."""
    g = torch.Generator().manual_seed(0)
    norms = {}
    for score in ("dot", "scaled_dot"):
        q, k, v = (torch.randn(4, 4, 512, 64, generator=g, requires_grad=True) for _ in range(3))
        out = attention(q, k, v, score=score)
        out.backward(torch.randn(out.shape, generator=g))
        norms[score] = float(q.grad.norm() + k.grad.norm())
    return norms


def measure(p: Preset) -> dict[str, Any]:
    """Exact finite-n softmax statistics against s for n = 64, 512, 4096; Monte Carlo checks
    of the entropy (``p.mc_samples`` draws) at n = 64, 512 and s = 0.5, 2, 4, 8; the measured
    q/k gradient norms unscaled and scaled."""
    zs = []
    for n in (64, 512):
        for x in (0.5, 2.0, 4.0, 8.0):
            mc = montecarlo.mc_softmax_stats(n, x, samples=p.mc_samples, seed=1)
            exact = float(theory.expected_entropy(n, x))
            zs.append(abs(mc["entropy"].mean - exact) / max(mc["entropy"].se, 1e-12))
    norms = grad_norms()
    return {
        "curves": [curve(n) for n in (64, 512, 4096)],
        "max_abs_z": max(zs),
        "max_weight_unscaled_64_512": float(theory.expected_max_weight(512, 8.0)),
        "max_weight_scaled_64_512": float(theory.expected_max_weight(512, 1.0)),
        "grad_norm": norms,
        "grad_ratio_64": norms["dot"] / norms["scaled_dot"],
    }


def gradient_words(ratio: float) -> str:
    """``31× larger without the scale, not smaller`` (or ``2× smaller without the scale``) for
    the unscaled-over-scaled q/k gradient norm ``ratio``."""
    if ratio >= 1:
        return f"{ratio:.2g}× larger without the scale, not smaller"
    return f"{1 / ratio:.2g}× smaller without the scale"


def cost(ratio: float) -> str:
    """What dropping 1/√d_k costs at d_k = 64 over 512 keys, given the q/k gradient ratio."""
    if ratio >= 1:
        return ("attention frozen near one-hot on random keys at init, not vanishing "
                "gradients")
    return "attention frozen near one-hot on random keys at init, and smaller gradients"


def mechanism(w_un: float, w_sc: float, ratio: float) -> str:
    """The cost of dropping 1/√d_k at d_k = 64 over 512 keys, in one sentence: the frozen
    share of the weight and the q/k gradient ``ratio`` (unscaled over scaled)."""
    return (f"At d_k = 64 over 512 keys, unscaled logits (s = 8) put {w_un:.2f} of the weight "
            f"on one key on average, scaled ones {w_sc:.3f}, and the gradient reaching q and k "
            f"is {gradient_words(ratio)}: the cost of dropping 1/√d_k at this size is "
            f"{cost(ratio)} (C10 says where gradients would vanish).")


def judge(ev: Evidence) -> Verdict:
    """Softmax entropy against the logit scale s around s_c = √(2 ln n)."""
    ok_mc = ev.max_abs_z <= MAX_Z
    monotone = all(c.monotone() for c in ev.curves)
    sharp = all(c.sharp() for c in ev.curves)
    if not monotone:
        verdict = REFUTED
    elif sharp and ok_mc:
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    w_un, w_sc = ev.max_weight_unscaled_64_512, ev.max_weight_scaled_64_512
    ratio = ev.grad_ratio_64
    plain = [f"{'Right' if verdict == SUPPORTED else 'Checked'}: entropy falls with the logit "
             f"scale s: {monotone}; it drops through half of ln n near s_c = √(2 ln n): {sharp}; "
             f"theory and Monte Carlo within {ev.max_abs_z:.1f} SE.",
             mechanism(w_un, w_sc, ratio),
             "The threshold grows only like √(ln n): longer contexts tolerate little more."]
    numbers = {"max_weight_unscaled_64_512": w_un, "max_weight_scaled_64_512": w_sc,
               "grad_ratio_64": ratio, "grad_norm": dict(ev.grad_norm)}
    return Verdict(verdict, RULE,
                   f"entropy monotone in s: {monotone}; sharp around s_c: {sharp}; max |z| "
                   f"theory vs MC {ev.max_abs_z:.2f}; at d_k=64, n=512 unscaled logits (s=8) "
                   f"give max weight {w_un:.2f} vs {w_sc:.3f} scaled, and q/k gradient norms "
                   f"{ratio:.3g}× the scaled ones", numbers, headline=f"{verdict}: max weight "
                   f"{w_un:.2f} unscaled vs {w_sc:.3f} scaled, q/k gradients {ratio:.2g}× scaled "
                   "(d_k=64, n=512)", plain=plain, regime="n i.i.d. N(0, s²) logits",
                   smallest="4 standard errors between theory and Monte Carlo")


def entropy_half(c: Mapping[str, Any]) -> float | None:
    """The logit std s where E[entropy]/ln n first falls through 1/2 (linear interpolation)."""
    s, h = c["s"], c["entropy_norm"]
    for i in range(1, len(s)):
        if h[i - 1] >= 0.5 > h[i]:
            return s[i - 1] + (h[i - 1] - 0.5) / (h[i - 1] - h[i]) * (s[i] - s[i - 1])
    return None


def rem_alt(ev: Mapping[str, Any]) -> str:
    """Where the entropy halves, against s_c, and the max weight at s = 8 against s = 1."""
    parts = []
    for c in ev["curves"]:
        s = entropy_half(c)
        if s is not None:
            parts.append(f"s = {s:.2f} at n = {c['n']} (s_c = {c['s_c']:.2f})")
    text = ("Exact theory: the softmax entropy of n i.i.d. N(0, s²) logits falls through half "
            f"of ln n at {', '.join(parts)}." if parts else
            "Exact theory: the softmax entropy of n i.i.d. N(0, s²) logits falls with s.")
    un, sc = ev.get("max_weight_unscaled_64_512"), ev.get("max_weight_scaled_64_512")
    if finite(un) and finite(sc):
        text += (f" Over 512 keys, unscaled logits at d_k = 64 (s = 8) put {un:.2f} of the "
                 f"weight on one key on average; scaled ones (s = 1) put {sc:.3f}.")
    if finite(ev.get("grad_ratio_64")):
        text += (f" The gradient reaching q and k there is "
                 f"{gradient_words(ev['grad_ratio_64'])}.")
    return text


def phase_alt(summary: Mapping[str, Any]) -> str:
    """The phase diagram's finding (:func:`attnscale.audit.theory_plots.phase_summary`)."""
    at = ", ".join(f"d_k ≈ {d:.0f} at n = {n:,} (REM line 2 ln n = {2 * math.log(n):.1f})"
                   for n, d in summary["half_d"].items() if d is not None)
    return (f"Exact theory over d_k ≤ {summary['d_max']:,} and n ≤ {summary['n_max']:,} keys: "
            f"without 1/√d_k the softmax entropy falls below half of ln n at "
            f"{at}, and is {summary['unscaled_64_512']:.2f}·ln n at d_k = 64, n = 512. Scaled "
            f"by 1/√d_k it never saturates: at least {summary['scaled_min']:.2f}·ln n everywhere.")


def fig_rem(ev: Mapping[str, Any], folder: Path) -> Figure:
    """Exact E[entropy]/ln n and E[max weight] of n i.i.d. N(0, s²) logits against s, with
    s_c = √(2 ln n) and the d_k = 64, n = 512 points unscaled (s = 8) and scaled (s = 1)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9))
    for i, c in enumerate(ev["curves"]):
        for ax, key in zip(axes, ("entropy_norm", "max_weight"), strict=True):
            ax.plot(c["s"], c[key], color=f"C{i}", label=f"$n = {c['n']}$")
            ax.axvline(c["s_c"], color=f"C{i}", ls=":", lw=0.9)
    for s, key, label in ((8.0, "max_weight_unscaled_64_512", r"unscaled, $d_k=64$ ($s=8$)"),
                          (1.0, "max_weight_scaled_64_512", r"scaled ($s=1$)")):
        if finite(ev.get(key)):
            axes[1].plot(s, ev[key], "k*" if s > 1 else "kD", ms=8, ls="",
                         label=f"{label}, $n=512$: {ev[key]:.3g}")
    axes[0].set(xlabel="logit std $s$", ylabel=r"$\mathbb{E}[H]\,/\,\ln n$", ylim=(0, 1.02))
    axes[1].set(xlabel="logit std $s$", ylabel=r"$\mathbb{E}[\max_j p_j]$", ylim=(0, 1.02))
    axes[1].plot([], [], "k:", lw=0.9, label=r"$s_c=\sqrt{2\ln n}$ (colour: $n$)")
    outside(axes[1])
    fig.suptitle(r"C9: exact theory, softmax of $n$ i.i.d. $\mathcal{N}(0, s^2)$ logits",
                 fontsize=11)
    return save(fig, folder, "c9_entropy", rem_alt(ev))


def fig_phase(folder: Path) -> Figure:
    """The theory phase diagram of ``attnscale theory --plot``, entropy over (d_k, n)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = plot_phase_diagram(str(folder / "c9_phase_diagram.png"), grid=24)
    return {"path": path, "alt": phase_alt(phase_summary())}


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The exact entropy and max-weight curves, and the (d_k, n) phase diagram."""
    return [fig_rem(ev, folder), fig_phase(folder)]


def gather(src: Sources) -> dict[str, Any]:
    """The measurement, as it is stored."""
    return src.measured["rem"]


def says_scale(e: dict[str, Any]) -> list[str]:
    """The mechanism, from the exact theory at d_k = 64 over 512 keys and the measured q/k
    gradient norms (the frozen share alone when an older entry has no gradient ratio)."""
    ev = e["evidence"]
    w_un, w_sc = ev["max_weight_unscaled_64_512"], ev["max_weight_scaled_64_512"]
    ratio = ev.get("grad_ratio_64")
    if not finite(ratio):
        return [f"The mechanism is exact (C9): at d_k = 64 over 512 keys, unscaled logits put "
                f"{w_un:.2f} of the weight on one key on average, scaled ones {w_sc:.3f}."]
    return [f"The mechanism is exact (C9): at d_k = 64 over 512 keys, unscaled logits put "
            f"{w_un:.2f} of the weight on one key on average, scaled ones {w_sc:.3f}, and the "
            f"gradient reaching q and k is {gradient_words(ratio)}. What dropping 1/√d_k costs "
            f"here is {cost(ratio)}."]


CLAIM = register(Claim(
    id="C9", text="Large dot products make the softmax peaky.",
    measures="entropy, max weight, effective keys vs scale, d_k and n", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("rem", lambda p: {"mc": p.mc_samples}, measure),),
    scale=lambda p: "exact theory of n i.i.d. Gaussian logits (n = 64–4096), checked by "
                    "Monte Carlo",
    says=(Says("scale", says_scale, rank=20),)))
