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
* the exact crossing at finite n and d (quadrature): g₂ is within 0.0017 of it for d ≥ 64, so
  an allowance of tol = 0.005 covers what g₂ drops. The Monte Carlo samples exactly the model
  the quadrature integrates, so a crossing outside its Bonferroni interval of the exact one is
  a bug, not evidence: the rule raises (the report shows an error), as C10 does.

With k cells and h_B each interval's half-width at the Bonferroni level 1 − 0.05/k: supported
when every cell shows equivalence, |ĝ − g₂| + h_B ≤ tol (and the smallest d's shift g₂ − g∞
exceeds tol, so the grid tells g₂ from its limit); refuted when some cell's interval excludes
[g₂ − tol, g₂ + tol] and at no d does every cell show equivalence; depends when some d has
every cell equivalent and another d has one excluded; inconclusive otherwise.
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
from attnscale.audit.studies import PRESETS, VARIANTS, Preset, studies
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

TOL = 0.005  # model-error allowance in γ(1−ρ): ~3× what g₂ drops against the exact crossing
ALPHA = 0.05  # the rule's family-wise error, Bonferroni over the grid's cells
MIN_DRAWS = 8  # independent draws of n tokens per cell, at least
TARGET = 0.002  # the Bonferroni half-width the measurement draws for: TOL less g₂'s 0.0017 or so
C4_STUDIES = tuple(studies(PRESETS["standard"])[s] for s in ("tau", "tau_n64"))  # n = 32, 64
C4_KEYS = tuple(s.cells["seq_len"][0] for s in C4_STUDIES)  # keys in C4's retrieval task
C4_TAU = min(VARIANTS[a]["tau"] for s in C4_STUDIES for a in s.arms if "tau" in VARIANTS[a])
GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "tiny": {"ns": (16, 64), "rhos": (0.0, 0.5), "ds": (64, 1024)},
    "quick": {"ns": (32, 256), "rhos": (0.0, 0.5), "ds": (64, 1024)},
    "standard": {"ns": (32, 128, 512, 2048), "rhos": (0.0, 0.5), "ds": (64, 256, 4096)},
}
RULE = ("n unit vectors with pairwise cosine ρ (shared direction plus independent uniform "
        "directions in d − 1 dimensions), logits γ·ln n·⟨x_i, x_j⟩, each token attending to "
        "all n: the crossing g = γ(1−ρ) where the mean self-weight is 1/2, by Monte Carlo over "
        "independent draws, with h_B the t-interval's half-width at the Bonferroni level "
        "1 − 0.05/k over the k cells. Finite-d theory g₂ = (m/ln n)(1 − √(1 − 2 ln(n−1)/m)), "
        "m = d − 1; limit g∞ = ln(n−1)/ln n; model-error allowance tol = 0.005. A cell is "
        "equivalent if |ĝ − g₂| + h_B ≤ tol, excluded if |ĝ − g₂| − h_B > tol. Supported if "
        "every cell is equivalent and at the smallest d every g₂ − g∞ exceeds tol; depends if "
        "at some d every cell is equivalent and some cell is excluded; refuted if some cell is "
        "excluded and no d has every cell equivalent; inconclusive otherwise. A crossing "
        "farther than h_B from the exact one (quadrature of the same model) is a bug: an error, "
        "not a verdict")
SMALLEST = ("tol = 0.005 in γ(1−ρ): about three times the largest gap between g₂ and the exact "
            "crossing for d ≥ 64 (what g₂'s second order drops), and a fifth of the smallest "
            "finite-d shift g₂ − g∞ at d = 64")
ANSWERS = {SUPPORTED: "Yes: the self-weight crosses 1/2 at γ·ln n with γ ≈ 1/(1−ρ), plus the "
                      "finite-d correction",
           REFUTED: "No: the crossing does not follow the log-n theory",
           DEPENDS: "Partly: the crossing follows the log-n theory at some head dimensions d "
                    "and departs from it at others",
           INCONCLUSIVE: "Not decided at this many draws"}


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
        """The 95% interval's half-width (the larger side)."""
        return max(self.g - self.lo, self.hi - self.g)

    def half_b(self, cells: int) -> float:
        """The half-width at the rule's Bonferroni level 1 − ALPHA/``cells``."""
        return crit.widen(self.half(), self.draws, 1.0 - ALPHA / cells)

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
    """Every cell of :func:`grid`: a pilot of max(8, ⌈mc_samples/q⌉) draws of n tokens (q query
    tokens each), then more where its Bonferroni half-width exceeds :data:`TARGET`
    (:func:`attnscale.measure.critical_logn.crossing_to`); the Monte Carlo crossing, and the
    exact crossing by quadrature."""
    g = grid(p)
    level = 1.0 - ALPHA / (len(g["ns"]) * len(g["ds"]) * len(g["rhos"]))
    cells = []
    for n in g["ns"]:
        for d in g["ds"]:
            exact = crit.exact_crossing(n, d)
            queries = min(n, crit.QUERIES, d - 2)
            pilot = max(MIN_DRAWS, math.ceil(p.mc_samples / queries))
            for rho in g["rhos"]:
                c = crit.crossing_to(n, rho, d, pilot, level, TARGET,
                                     seed=[n, d, round(1000 * rho)])
                cells.append({"n": n, "rho": rho, "d": d, **c,
                              "queries": c["draws"] * queries, "exact": exact})
    return {"crossings": cells}


def taus(cells: list[Crossing]) -> dict[str, dict[str, float]]:
    """ρ -> n -> the measured temperature γ̂·ln n at the largest d."""
    top = max(c.d for c in cells)
    out: dict[str, dict[str, float]] = {}
    for c in sorted(cells, key=lambda c: (c.rho, c.n)):
        if c.d == top:
            out.setdefault(f"{c.rho:g}", {})[str(c.n)] = c.tau()
    return out


def check_monte_carlo(cells: list[Crossing]) -> None:
    """ValueError where a Monte Carlo crossing lies farther than its Bonferroni half-width from
    the exact crossing: both are the same model's, so they disagree only through a bug."""
    k = len(cells)
    for c in cells:
        if abs(c.g - c.exact) > c.half_b(k):
            raise ValueError(
                f"Q5: at {c.key()} the Monte Carlo crossing {c.g:.4f} ± {c.half_b(k):.4f} "
                f"(Bonferroni) misses the exact crossing {c.exact:.4f} of the same model: "
                "simulation and quadrature disagree, which is a bug")


def readings(cells: list[Crossing]) -> dict[str, list[Crossing]]:
    """The cells each part of the rule flags: ``equivalent`` (|ĝ − g₂| + h_B ≤ tol),
    ``excluded`` (|ĝ − g₂| − h_B > tol), ``blind`` (at the smallest d, g₂ − g∞ ≤ tol: the
    band around g₂ holds the limit too)."""
    k, lo = len(cells), min(c.d for c in cells)
    return {"equivalent": [c for c in cells if abs(c.g - c.theory()) + c.half_b(k) <= TOL],
            "excluded": [c for c in cells if abs(c.g - c.theory()) - c.half_b(k) > TOL],
            "blind": [c for c in cells if c.d == lo and c.theory() - c.limit() <= TOL]}


def held_ds(cells: list[Crossing], flags: Mapping[str, list[Crossing]]) -> list[int]:
    """The head dimensions d at which every cell is equivalent."""
    ok = {c.key() for c in flags["equivalent"]}
    return [d for d in sorted({c.d for c in cells})
            if all(c.key() in ok for c in cells if c.d == d)]


def verdict_of(cells: list[Crossing], flags: Mapping[str, list[Crossing]]) -> str:
    """The rule (module docstring) on :func:`readings`."""
    if flags["excluded"]:
        return DEPENDS if held_ds(cells, flags) else REFUTED
    if len(flags["equivalent"]) == len(cells) and not flags["blind"]:
        return SUPPORTED
    return INCONCLUSIVE


def numbers(cells: list[Crossing]) -> dict[str, Any]:
    """Per cell: ĝ with its interval, g₂, g∞, the exact crossing, the gap ĝ − g₂, the
    Bonferroni half-width and the allowance; the measured temperatures (:func:`taus`); the
    largest gaps."""
    k = len(cells)
    per = {c.key(): {"g": c.g, "lo": c.lo, "hi": c.hi, "theory": c.theory(),
                     "limit": c.limit(), "exact": c.exact, "gap": c.g - c.theory(),
                     "half_bonferroni": c.half_b(k), "tolerance": TOL} for c in cells}
    return {"cells": per, "tau": taus(cells), "level": 1.0 - ALPHA / k,
            "largest_gap": max(abs(v["gap"]) for v in per.values()),
            "largest_reach": max(abs(v["gap"]) + v["half_bonferroni"] for v in per.values()),
            "closed_form_error": max(abs(v["theory"] - v["exact"]) for v in per.values())}


def excluded_at(c: Crossing, k: int) -> str:
    """Where one cell stands against g₂, with its Bonferroni half-width."""
    return (f"at n = {c.n}, ρ = {c.rho:g}, d = {c.d} the crossing γ̂(1−ρ) = {c.g:.4f} "
            f"± {c.half_b(k):.4f} (Bonferroni) is {c.g - c.theory():+.4f} from the finite-d "
            f"theory {c.theory():.4f} (allowed ±{TOL})")


def lead(verdict: str, cells: list[Crossing], flags: dict[str, list[Crossing]]) -> str:
    """The first plain sentence: what the verdict says, with its deciding numbers."""
    k = len(cells)
    reach = {c.key(): abs(c.g - c.theory()) + c.half_b(k) for c in cells}
    if verdict == SUPPORTED:
        top = [c for c in cells if c.d == max(x.d for x in cells)]
        near = max(abs(c.g - c.limit()) for c in top)
        return (f"Right: at all {k} (n, ρ, d) the Monte Carlo crossing γ̂(1−ρ) of the mean "
                f"self-weight and its {100 * (1 - ALPHA / k):.2f}% (Bonferroni) interval lie "
                f"within {max(reach.values()):.4f} of the finite-d theory g₂ (allowed: {TOL}), "
                f"and at d = {top[0].d} within {near:.4f} of the limit ln(n−1)/ln n: "
                "γ* → 1/(1−ρ).")
    if verdict == REFUTED:
        return (f"Wrong at {len(flags['excluded'])} of {k} cells: "
                f"{excluded_at(flags['excluded'][0], k)}.")
    if verdict == DEPENDS:
        held = ", ".join(str(d) for d in held_ds(cells, flags))
        return (f"Partly right: at d = {held} every crossing is within the allowance of g₂, but "
                f"{excluded_at(flags['excluded'][0], k)}.")
    if len(flags["equivalent"]) == k:
        shift = min(c.theory() - c.limit() for c in flags["blind"])
        return (f"Undecided: every crossing is within the allowance of g₂, but at the smallest "
                f"d = {flags['blind'][0].d} the finite-d shift g₂ − g∞ is only {shift:.4f}, "
                f"inside the allowance {TOL}: the grid cannot tell the finite-d theory from its "
                "limit.")
    w = max(cells, key=lambda c: reach[c.key()])
    return (f"Undecided: {k - len(flags['equivalent'])} of {k} cells neither agree nor "
            f"disagree within the allowance {TOL}; the farthest, at n = {w.n}, ρ = {w.rho:g}, "
            f"d = {w.d}, reaches {reach[w.key()]:.4f} from g₂ (crossing {w.g:.4f} ± "
            f"{w.half_b(k):.4f}, Bonferroni): its interval is too wide to tell.")


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
    need = {n: math.log(n - 1) for n in C4_KEYS}  # τ in the limit, ρ = 0
    sc = [math.sqrt(2 * math.log(n)) for n in (lo, hi)]
    return [f"For cosine attention τ·cos (C4) the crossing is a temperature, τ̂ = γ̂·ln n: "
            f"{', '.join(f'{row[n]:.2f} at n = {n}' for n in ns)} (ρ = {rho0}, d = "
            f"{max(c.d for c in cells)}){other}; the limit is ln(n−1)/(1−ρ). "
            + ("It grows with n, so a τ tuned at one length is too small at longer ones."
               if grows else "Here it does not grow with n at every step."),
            f"C4 trains τ = {C4_TAU:g} at {' and '.join(f'n = {n}' for n in C4_KEYS)} keys: in "
            f"the limit, typical keys (ρ = 0) need τ = "
            f"{' and '.join(f'ln {n - 1} = {t:.2f} at n = {n}' for n, t in need.items())} for "
            f"one weight to reach 1/2, and even keys at the far pole (C4's cap "
            f"e^(2τ)/(e^(2τ)+n−1)) need τ = {' and '.join(f'{t / 2:.2f}' for t in need.values())}"
            ".",
            f"It is the same ln n as C9's: Gaussian logits of std s freeze the softmax once s "
            f"passes s_c = √(2 ln n) ({sc[0]:.2f} at n = {lo}, {sc[1]:.2f} at n = {hi}), where "
            f"the top logit stands ln n above the log-mean-exp of all n; here the self-logit "
            f"must stand ln(n−1) above the log-mean-exp of the other n − 1."]


def judge(ev: Evidence) -> Verdict:
    """The Monte Carlo crossings against the finite-d theory g₂ within tol, at the Bonferroni
    level over the cells; ValueError where one misses the exact crossing (a bug)."""
    cells = ev.crossings
    if not cells:
        raise MissingEvidence("Q5: no crossing was measured")
    check_monte_carlo(cells)
    flags = readings(cells)
    verdict = verdict_of(cells, flags)
    nums = numbers(cells)
    tau = nums["tau"][min(nums["tau"], key=float)]
    lo, hi = min(tau, key=int), max(tau, key=int)
    because = (f"largest |ĝ − g₂| + h_B {nums['largest_reach']:.4f} over {len(cells)} cells "
               f"(allowance {TOL}, Bonferroni level {nums['level']:.4f}); equivalent: "
               f"{len(flags['equivalent'])}, excluded: {len(flags['excluded'])}, d with every "
               f"cell equivalent: {held_ds(cells, flags) or 'none'}, smallest-d cells with "
               f"g₂ − g∞ ≤ tol: {len(flags['blind'])}; g₂ against the exact crossing: "
               f"{nums['closed_form_error']:.4f} at most")
    return Verdict(verdict, RULE, because, nums,
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
            f"ρ = {worst.rho:g}, d = {worst.d}; allowance ±{TOL}). "
            f"At n = {big} it is {lo.g:.3f} at d = {lo.d}, {lo.g - lo.limit():+.3f} from the "
            f"limit ln(n−1)/ln n = {lo.limit():.4f}, and {hi.g - hi.limit():+.4f} from it at "
            f"d = {hi.d}.")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Left: the crossing γ(1−ρ) against n, the theory g₂ per d (lines), the limit, the Monte
    Carlo points per ρ with 95% intervals. Right: Monte Carlo minus g₂, with the ±tol
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
    right.axhspan(-TOL, TOL, color=BAND, zorder=0)
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
                Patch(color=BAND, label=f"allowance $\\pm{TOL}$")], ncol=4)
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
        state = {REFUTED: "did not hold", DEPENDS: "held at some head dimensions only"}.get(
            e.get("verdict"), "was not decided")
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
                              lambda p: {"mc": p.mc_samples, **grid(p), "target": TARGET},
                              measure),),
    scale=lambda p: (f"theory and Monte Carlo, no training: n = {min(grid(p)['ns'])}–"
                     f"{max(grid(p)['ns'])}, d = {min(grid(p)['ds'])}–{max(grid(p)['ds'])}, "
                     f"about {p.mc_samples} query tokens per cell"),
    answers=ANSWERS, says=(Says("when", says_when, rank=60),)))
