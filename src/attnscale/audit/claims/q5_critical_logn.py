"""Q5: "Must a bounded logit's scale grow like ln n with the number of keys?" (beyond the
thread: critical attention scaling, Chen, Lin, Polyanskiy & Rigollet 2025, arXiv 2510.05554:
with logits scaled by γ·ln n, attention neither flattens nor freezes only near γ_c = 1/(1−ρ)).

Setting (:mod:`attnscale.measure.critical_logn`): n unit vectors in d dimensions with pairwise
cosine ρ (a shared direction e plus independent uniform directions w_i in the d − 1 others:
x_i = √ρ·e + √(1−ρ)·w_i, so the off-diagonal cosines are ρ + (1−ρ)·c_ij with Var c_ij = 1/(d−1)
exactly); each token attends to all n, itself included, with logits γ·ln n·⟨x_i, x_j⟩, the
bounded logits of cosine attention at temperature τ = γ·ln n (C4). The self-weight is
w_self = 1/(1 + Σ_{j≠i} e^(−γ ln n (1 − ⟨x_i, x_j⟩))); we measure the crossing g = γ(1−ρ) where
its mean is 1/2, by Monte Carlo with a 95% interval, against

* the limit d → ∞: w_self = 1/(1 + (n−1)·n^(−g)), crossing g∞ = ln(n−1)/ln n → 1;
* the finite-d theory to second order (derived in :mod:`attnscale.measure.critical_logn` from
  E[e^(tX)] = e^(t²/(2m)) for Gaussian fluctuations of variance 1/m, m = d − 1, and E[S] = 1):
  g₂ = (m/L)·(1 − √(1 − 2 ln(n−1)/m)) = g∞ + g∞²·L/(2m) + O(L²/m²), L = ln n. The cruder
  first-order estimate 1 + ln n/(2d) is its leading order with g∞ → 1 and m → d; it misses
  ln(n−1)/ln n (0.991 at n = 32) and reads 1.027 at n = 32, d = 64, where the exact crossing is
  1.018, so the rule uses g₂. (With the Gaussian construction x_i ∝ √ρ·z + √(1−ρ)·u_i, z
  random, the cosines have variance ≈ (1−ρ²)²/d, part of it shared by all keys of a query, and
  g₂ would need a ρ-dependent correction; the construction here makes (1−ρ)²/(d−1) exact);
* the exact crossing at finite n and d (quadrature), for context: g₂ is within 0.0017 of it
  for d ≥ 64, so an allowance of 0.005 covers what g₂ drops.

Supported when every Monte Carlo crossing is within its interval plus 0.005 of g₂ and, at the
largest d, of g∞; refuted when one is outside; inconclusive when intervals are too wide to tell
g₂ from g∞ at the smallest d.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from attnscale.audit.claim import Claim, Entry, Figure, Measurement, Says, Sources, register
from attnscale.audit.evidence import Model
from attnscale.audit.studies import Preset
from attnscale.audit.theory_plots import BAND, below, log_ticks, save
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    REFUTED,
    SUPPORTED,
    MissingEvidence,
    Verdict,
)
from attnscale.measure import critical_logn as crit

ALLOW = 0.005  # model-error allowance in γ(1−ρ), beyond the Monte Carlo interval
H_MAX = 0.02  # widest Monte Carlo half-interval the rule decides on
MIN_DRAWS = 8  # independent draws of n tokens per cell, at least
C4_KEYS = 32  # keys in C4's retrieval task (attnscale.audit.studies.TAU)
GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "tiny": {"ns": (16, 64), "rhos": (0.0, 0.5), "ds": (64, 1024)},
    "quick": {"ns": (32, 256), "rhos": (0.0, 0.5), "ds": (64, 1024)},
    "standard": {"ns": (32, 128, 512, 2048), "rhos": (0.0, 0.5), "ds": (64, 256, 4096)},
}
RULE = ("n unit vectors with pairwise cosine ρ (shared direction plus independent uniform "
        "directions in d − 1 dimensions), logits γ·ln n·⟨x_i, x_j⟩, each token attending to "
        "all n: the crossing g = γ(1−ρ) where the mean self-weight is 1/2, by Monte Carlo with "
        "a 95% t-interval over independent draws (half-width h). Finite-d theory g₂ = "
        "(m/ln n)(1 − √(1 − 2 ln(n−1)/m)), m = d − 1; limit g∞ = ln(n−1)/ln n. Supported if "
        "at every (n, ρ, d) |ĝ − g₂| ≤ h + 0.005 and at the largest d |ĝ − g∞| ≤ h + 0.005; "
        "refuted if some crossing lies outside; inconclusive if some h exceeds 0.02 or, at the "
        "smallest d, h + 0.005 is not below the finite-d shift g₂ − g∞ (the intervals too wide "
        "to tell the finite-d theory from its limit)")
SMALLEST = ("0.005 in γ(1−ρ) beyond the 95% Monte Carlo interval: about three times the "
            "largest gap between g₂ and the exact crossing for d ≥ 64, and a fifth of the "
            "smallest finite-d shift g₂ − g∞ at d = 64")
ANSWERS = {SUPPORTED: "Yes: the self-weight crosses 1/2 at γ·ln n with γ ≈ 1/(1−ρ), plus the "
                      "finite-d correction",
           REFUTED: "No: the crossing does not follow the log-n theory",
           DEPENDS: "Partly", INCONCLUSIVE: "Not decided at this many draws"}


class Crossing(Model):
    """One (n, ρ, d): the Monte Carlo crossing g = γ̂(1−ρ) with its 95% interval, from
    ``draws`` independent draws of n tokens (``queries`` query tokens in all), and the exact
    crossing by quadrature (the same for every ρ)."""

    n: int
    rho: float
    d: int
    g: float
    lo: float
    hi: float
    draws: int
    queries: int
    exact: float

    def half(self) -> float:
        """The interval's half-width (the larger side)."""
        return max(self.g - self.lo, self.hi - self.g)

    def theory(self) -> float:
        """g₂, the finite-d theory
        (:func:`attnscale.measure.critical_logn.second_order_crossing`)."""
        return crit.second_order_crossing(self.n, self.d)

    def limit(self) -> float:
        """g∞ = ln(n−1)/ln n."""
        return crit.limit_crossing(self.n)

    def tau(self) -> float:
        """The temperature of cosine logits τ·cos at the crossing: γ̂·ln n = ĝ·ln n/(1−ρ)."""
        return self.g * math.log(self.n) / (1.0 - self.rho)

    def key(self) -> str:
        return f"n={self.n} ρ={self.rho:g} d={self.d}"


class Evidence(Model):
    """Every cell of the (n, ρ, d) grid."""

    crossings: list[Crossing]


def grid(p: Preset) -> dict[str, tuple[Any, ...]]:
    """The (n, ρ, d) grid for preset ``p``, chosen by its Monte Carlo size ``mc_samples``."""
    return GRIDS["tiny" if p.mc_samples < 300 else "quick" if p.mc_samples < 1000
                 else "standard"]


def measure(p: Preset) -> dict[str, Any]:
    """Every cell of :func:`grid`: max(8, ⌈mc_samples/q⌉) draws of n tokens (q query tokens
    each), the Monte Carlo crossing, and the exact crossing by quadrature."""
    g = grid(p)
    cells = []
    for n in g["ns"]:
        for d in g["ds"]:
            exact = crit.exact_crossing(n, d)
            queries = min(n, crit.QUERIES, d - 2)
            draws = max(MIN_DRAWS, math.ceil(p.mc_samples / queries))
            for rho in g["rhos"]:
                gaps = crit.sample_gaps(n, rho, d, draws, seed=[n, d, round(1000 * rho)])
                cells.append({"n": n, "rho": rho, "d": d,
                              **crit.mc_crossing(gaps, n, rho), "draws": draws,
                              "queries": draws * queries, "exact": exact})
    return {"crossings": cells}


def taus(cells: list[Crossing]) -> dict[str, dict[str, float]]:
    """ρ -> n -> the measured temperature γ̂·ln n at the largest d."""
    top = max(c.d for c in cells)
    out: dict[str, dict[str, float]] = {}
    for c in sorted(cells, key=lambda c: (c.rho, c.n)):
        if c.d == top:
            out.setdefault(f"{c.rho:g}", {})[str(c.n)] = c.tau()
    return out


def readings(cells: list[Crossing]) -> dict[str, list[Crossing]]:
    """The cells each part of the rule flags: ``off`` (outside g₂ ± (h + 0.005)), ``far`` (at
    the largest d, outside g∞ ± (h + 0.005)), ``wide`` (h > 0.02), ``blind`` (at the smallest
    d, h + 0.005 not below g₂ − g∞)."""
    lo, hi = min(c.d for c in cells), max(c.d for c in cells)
    return {"off": [c for c in cells if abs(c.g - c.theory()) > c.half() + ALLOW],
            "far": [c for c in cells if c.d == hi and abs(c.g - c.limit()) > c.half() + ALLOW],
            "wide": [c for c in cells if c.half() > H_MAX],
            "blind": [c for c in cells
                      if c.d == lo and c.half() + ALLOW >= c.theory() - c.limit()]}


def numbers(cells: list[Crossing]) -> dict[str, Any]:
    """Per cell: ĝ with its interval, g₂, g∞, the exact crossing, the gap ĝ − g₂ and the
    tolerance; the measured temperatures (:func:`taus`); the largest gaps."""
    per = {c.key(): {"g": c.g, "lo": c.lo, "hi": c.hi, "theory": c.theory(),
                     "limit": c.limit(), "exact": c.exact, "gap": c.g - c.theory(),
                     "tolerance": c.half() + ALLOW} for c in cells}
    return {"cells": per, "tau": taus(cells),
            "largest_gap": max(abs(v["gap"]) for v in per.values()),
            "closed_form_error": max(abs(v["theory"] - v["exact"]) for v in per.values())}


def lead(verdict: str, cells: list[Crossing], flags: dict[str, list[Crossing]]) -> str:
    """The first plain sentence: what the verdict says, with its deciding numbers."""
    worst = max(cells, key=lambda c: abs(c.g - c.theory()) - c.half())
    top = [c for c in cells if c.d == max(x.d for x in cells)]
    near = max(abs(c.g - c.limit()) for c in top)
    if verdict == SUPPORTED:
        return (f"Right: at all {len(cells)} (n, ρ, d) the Monte Carlo crossing γ̂(1−ρ) of the "
                f"mean self-weight is within {max(abs(c.g - c.theory()) for c in cells):.4f} "
                f"of the finite-d theory g₂ (allowed: its 95% interval + {ALLOW}), and at "
                f"d = {top[0].d} within {near:.4f} of the limit ln(n−1)/ln n: γ* → 1/(1−ρ).")
    if verdict == REFUTED:
        bad = (flags["off"] or flags["far"])[0]
        ref, name = ((bad.theory(), "the finite-d theory") if flags["off"]
                     else (bad.limit(), "the limit ln(n−1)/ln n"))
        return (f"Wrong at {len({c.key() for c in flags['off'] + flags['far']})} of "
                f"{len(cells)} cells: at n = {bad.n}, ρ = {bad.rho:g}, d = {bad.d} the crossing "
                f"γ̂(1−ρ) = {bad.g:.4f} [{bad.lo:.4f}, {bad.hi:.4f}] is {bad.g - ref:+.4f} from "
                f"{name} {ref:.4f} (allowed ±{bad.half() + ALLOW:.4f}).")
    widest = max(cells, key=Crossing.half)
    shift = min(c.theory() - c.limit() for c in cells if c.d == min(x.d for x in cells))
    return (f"Undecided: the Monte Carlo intervals are too wide to tell the finite-d theory from "
            f"its limit (widest ±{widest.half():.4f} at n = {widest.n}, d = {widest.d}; the "
            f"smallest finite-d shift is {shift:.4f}); closest call n = {worst.n}, "
            f"d = {worst.d}.")


def ties(cells: list[Crossing]) -> list[str]:
    """The C4 and C9 sentences: the temperature bounded logits need, measured and in the
    limit, and C9's ln n."""
    tau = taus(cells)
    rho0 = min(tau, key=float)
    row = tau[rho0]
    ns = sorted(row, key=int)
    lo, hi = int(ns[0]), int(ns[-1])
    grows = all(row[b] > row[a] for a, b in pairwise(ns))
    more = [r for r in tau if r != rho0]
    other = (f"; at ρ = {more[0]}, {tau[more[0]][ns[0]]:.2f} at n = {lo} (× 1/(1−ρ))"
             if more else "")
    c4 = math.log(C4_KEYS - 1)
    sc = [math.sqrt(2 * math.log(n)) for n in (lo, hi)]
    return [f"For cosine attention τ·cos (C4) the crossing is a temperature, τ̂ = γ̂·ln n: "
            f"{', '.join(f'{row[n]:.2f} at n = {n}' for n in ns)} (ρ = {rho0}, d = "
            f"{max(c.d for c in cells)}){other}; the limit is ln(n−1)/(1−ρ). "
            + ("It grows with n, so a τ tuned at one length is too small at longer ones."
               if grows else "Here it does not grow with n at every step."),
            f"C4 trains τ = 1 over n = {C4_KEYS} keys: in the limit, typical keys (ρ = 0) "
            f"need τ = ln {C4_KEYS - 1} = {c4:.2f} for one weight to reach 1/2, and even keys "
            f"at the far pole (C4's cap e^(2τ)/(e^(2τ)+n−1)) need τ = {c4 / 2:.2f}.",
            f"It is the same ln n as C9's: Gaussian logits of std s freeze the softmax once s "
            f"passes s_c = √(2 ln n) ({sc[0]:.2f} at n = {lo}, {sc[1]:.2f} at n = {hi}), where "
            f"the top logit stands ln n above the log-mean-exp of all n; here the self-logit "
            f"must stand ln(n−1) above the log-mean-exp of the other n − 1."]


def judge(ev: Evidence) -> Verdict:
    """The Monte Carlo crossings against the finite-d theory g₂ and, at the largest d, the
    limit g∞; 0.005 beyond each 95% interval."""
    cells = ev.crossings
    if not cells:
        raise MissingEvidence("Q5: no crossing was measured")
    flags = readings(cells)
    if flags["off"] or flags["far"]:
        verdict = REFUTED
    elif flags["wide"] or flags["blind"]:
        verdict = INCONCLUSIVE
    else:
        verdict = SUPPORTED
    nums = numbers(cells)
    tau = nums["tau"][min(nums["tau"], key=float)]
    lo, hi = min(tau, key=int), max(tau, key=int)
    return Verdict(verdict, RULE,
                   f"largest |ĝ − g₂| {nums['largest_gap']:.4f} over {len(cells)} cells; "
                   f"outside g₂: {len(flags['off'])}, outside g∞ at the largest d: "
                   f"{len(flags['far'])}, intervals wider than {H_MAX}: {len(flags['wide'])}, "
                   f"unresolved at the smallest d: {len(flags['blind'])}; g₂ against the exact "
                   f"crossing: {nums['closed_form_error']:.4f} at most", nums,
                   headline=f"{verdict}: crossing within {nums['largest_gap']:.4f} of theory; "
                   f"τ ≈ {tau[lo]:.2f} at n = {lo}, {tau[hi]:.2f} at n = {hi}",
                   plain=[lead(verdict, cells, flags), *ties(cells)],
                   regime="n unit vectors with pairwise cosine ρ, logits γ·ln n·cos; no training",
                   smallest=SMALLEST)


def alt(ev: Mapping[str, Any]) -> str:
    """The largest gap to the theory, and how far the crossing sits from the limit at the
    smallest and the largest d."""
    cells = [Crossing.model_validate(c) for c in ev["crossings"]]
    if not cells:
        raise ValueError("ev: Q5 has no crossing to draw")
    worst = max(cells, key=lambda c: abs(c.g - c.theory()))
    big = max(c.n for c in cells)
    lo = max((c for c in cells if c.n == big), key=lambda c: (-c.d, -c.rho))
    hi = max((c for c in cells if c.n == big), key=lambda c: (c.d, -c.rho))
    return (f"The Monte Carlo crossing γ̂(1−ρ) of the mean self-weight is at most "
            f"{abs(worst.g - worst.theory()):.4f} from the finite-d theory (n = {worst.n}, "
            f"ρ = {worst.rho:g}, d = {worst.d}; allowance {ALLOW} beyond its 95% interval). "
            f"At n = {big} it is {lo.g:.3f} at d = {lo.d}, {lo.g - lo.limit():+.3f} from the "
            f"limit ln(n−1)/ln n = {lo.limit():.4f}, and {hi.g - hi.limit():+.4f} from it at "
            f"d = {hi.d}.")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Left: the crossing γ(1−ρ) against n, the theory g₂ per d (lines), the limit, the Monte
    Carlo points per ρ with 95% intervals. Right: Monte Carlo minus g₂, with the ±0.005
    allowance and the exact crossing minus g₂."""
    cells = [Crossing.model_validate(c) for c in ev["crossings"]]
    text = alt(ev)
    ns, ds = sorted({c.n for c in cells}), sorted({c.d for c in cells})
    rhos = sorted({c.rho for c in cells})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    dense = np.geomspace(ns[0], ns[-1], 60)
    left.plot(dense, [crit.limit_crossing(n) for n in dense], "k--", lw=1)
    marks = dict(zip(rhos, "osD^v", strict=False))
    for i, d in enumerate(ds):
        left.plot(dense, [crit.second_order_crossing(n, d) for n in dense],
                  color=f"C{i}", lw=1.3)
        for j, rho in enumerate(rhos):
            mine = sorted((c for c in cells if c.d == d and c.rho == rho), key=lambda c: c.n)
            xs = [c.n * (1 + 0.05 * (j - (len(rhos) - 1) / 2)) for c in mine]
            err = [[c.g - c.lo for c in mine], [c.hi - c.g for c in mine]]
            for ax, ys in ((left, [c.g for c in mine]),
                           (right, [c.g - c.theory() for c in mine])):
                ax.errorbar(xs, ys, yerr=err, fmt=marks[rho], ms=4, capsize=2,
                            color=f"C{i}", mfc="white" if j else f"C{i}")
        exact = sorted({(c.n, c.exact - c.theory()) for c in cells if c.d == d})
        right.plot([n for n, _ in exact], [x for _, x in exact], "_", color="k", ms=10)
    right.axhspan(-ALLOW, ALLOW, color=BAND, zorder=0)
    right.axhline(0, color="k", lw=0.8)
    for ax in (left, right):
        log_ticks(ax, ns)
        ax.set_xlabel("$n$ (tokens, each attending to all $n$)")
    left.set_ylabel(r"crossing $\gamma(1-\rho)$ where $\mathbb{E}[w_{self}] = 1/2$")
    right.set_ylabel(r"Monte Carlo $-$ theory $g_2$")
    fig.suptitle(r"Q5: critical $\gamma\ln n$ scaling, $n$ unit vectors with pairwise cosine "
                 r"$\rho$, logits $\gamma\ln n\,\langle x_i, x_j\rangle$", fontsize=11)
    fig.tight_layout()
    below(fig, [*(Line2D([], [], color=f"C{i}", lw=1.3, label=f"theory $g_2$, $d = {d}$")
                  for i, d in enumerate(ds)),
                Line2D([], [], color="k", ls="--", lw=1,
                       label=r"limit $d\to\infty$: $\ln(n-1)/\ln n$"),
                *(Line2D([], [], color="grey", marker=marks[r], ls="", mfc="white" if j else
                         "grey", label=f"Monte Carlo, $\\rho = {r:g}$, 95% CI")
                  for j, r in enumerate(rhos)),
                Line2D([], [], color="k", marker="_", ls="", ms=10,
                       label="exact (quadrature) $-$ $g_2$"),
                Patch(color=BAND, label=f"allowance $\\pm{ALLOW}$")], ncol=4)
    return [save(fig, folder, "q5_critical_logn", text)]


def says_when(e: Entry) -> list[str]:
    """The temperature bounded logits need at the shortest and longest n measured."""
    tau = (e.get("numbers") or {}).get("tau") or {}
    if not tau:
        return []
    row = tau[min(tau, key=float)]
    ns = sorted(row, key=int)
    at = f"τ ≈ {row[ns[0]]:.1f} at n = {ns[0]}, {row[ns[-1]]:.1f} at n = {ns[-1]}"
    if e.get("verdict") != SUPPORTED:
        state = "did not hold" if e.get("verdict") == REFUTED else "was not decided"
        return [f"That bounded logits need a temperature growing like ln n {state} here "
                f"(measured self-weight crossings at {at}) (Q5)."]
    return [f"Bounded logits (cosine, QK-norm) need a temperature that grows with context: "
            f"the self-weight crosses 1/2 at {at}, so a τ tuned at one length is too small at "
            f"longer ones (Q5)."]


def gather(src: Sources) -> dict[str, Any]:
    """The measurement, as it is stored."""
    return src.measured["critical_logn"]


CLAIM = register(Claim(
    id="Q5", text="Must a bounded logit's scale grow like ln n with the number of keys "
    "(critical attention scaling)?",
    measures="Monte Carlo crossing of the mean self-weight against finite-d theory over n, ρ, d",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("critical_logn",
                              lambda p: {"mc": p.mc_samples, **grid(p)}, measure),),
    scale=lambda p: (f"theory and Monte Carlo, no training: n = {min(grid(p)['ns'])}–"
                     f"{max(grid(p)['ns'])}, d = {min(grid(p)['ds'])}–{max(grid(p)['ds'])}, "
                     f"about {p.mc_samples} query tokens per cell"),
    answers=ANSWERS, says=(Says("when", says_when, rank=60),)))
