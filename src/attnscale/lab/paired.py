"""Paired comparisons of two arms over seeds, and the verdict an interval supports.

Two arms (say, unscaled and scaled attention) trained with the same seed share the init stream
and the data order, so their per-seed difference d_s = a_s − b_s removes the variance the arms
share. Inference is on the mean difference over seeds:

* :func:`paired_effect`: mean difference with a Student-t interval (mean ± t_{n−1}·sd/√n) and
  the paired t-test p-value, or a bias-corrected and accelerated (BCa) bootstrap
  interval (``scipy.stats.bootstrap``) when asked;
* :func:`holm`: Holm's step-down correction across the comparisons of one claim (Holm 1979):
  sort the m p-values, multiply the k-th smallest by (m − k + 1), keep the running maximum;
* :func:`classify`: the reading of an interval against the smallest effect a rule treats as
  real, δ > 0. Above +δ or below −δ entirely: a real effect of that sign; inside (−δ, +δ)
  entirely: equal within δ (two one-sided tests of equivalence, each at level α/2 for a
  (1 − α) interval: conservative); anything else: ``inconclusive``, never a verdict read from
  overlapping intervals.
* non-inferiority, for a rule's "equal or better": :func:`no_worse_pvalues` tests "a is not
  worse than b by δ or more" (one-sided, H0: mean d ≥ δ) and its mirror; weaker than
  ``equal`` (it asks one bound, not two), and the reading a rule needs when it says "equal or
  less" (Wellek 2010, *Testing Statistical Hypotheses of Equivalence and Noninferiority*).

Henderson et al. 2018 (arXiv 1709.06560) and Agarwal et al. 2021 (arXiv 2108.13264) show why
few-seed point estimates mislead; a rule needs at least :data:`MIN_SEEDS` paired seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)

from attnscale.util.validate import check_choice, check_float

MIN_SEEDS = 3
MIN_BOOTSTRAP_SEEDS = 8  # with n = 3 a bootstrap has 10 distinct resamples: no interval
GREATER, LESS, EQUAL, INCONCLUSIVE = "greater", "less", "equal", "inconclusive"
METHODS = ("t", "bootstrap")


@dataclass(frozen=True)
class Effect:
    """Mean paired difference a − b over ``n`` seeds, its interval and the paired t p-value."""

    mean: float
    low: float
    high: float
    n: int
    p: float
    confidence: float
    method: str

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers, for evidence and JSON."""
        return {"mean": self.mean, "lo": self.low, "hi": self.high, "n": self.n, "p": self.p,
                "confidence": self.confidence, "method": self.method}


def paired_differences(a: Mapping[Any, float], b: Mapping[Any, float]) -> np.ndarray:
    """a_s − b_s for every seed s both arms have (sorted by seed); ValueError under
    :data:`MIN_SEEDS` shared seeds or on a non-finite value."""
    shared = sorted(set(a) & set(b))
    if len(shared) < MIN_SEEDS:
        raise ValueError(f"a paired comparison needs at least {MIN_SEEDS} shared seeds, got "
                         f"{len(shared)} ({sorted(a)} against {sorted(b)})")
    d = np.array([float(a[s]) - float(b[s]) for s in shared])
    if not np.isfinite(d).all():
        raise ValueError(f"paired differences must be finite, got {d.tolist()}")
    return d


def no_spread(d: np.ndarray) -> bool:
    """Every difference is the same up to float rounding (sd ≤ 1e-12·max(1, |mean|)): e.g.
    k/6 − (k−1)/6 differs in its last bits with k."""
    return float(d.std(ddof=1)) <= 1e-12 * max(1.0, abs(float(d.mean())))


def paired_effect(
    a: Mapping[Any, float],
    b: Mapping[Any, float],
    confidence: float = 0.95,
    method: str = "t",
    seed: int = 0,
) -> Effect:
    """The mean of :func:`paired_differences` with a two-sided interval (Student t, or BCa
    bootstrap with 9999 resamples drawn from ``seed``) and the paired t-test p-value."""
    check_float("confidence", confidence, low=0.0, high=1.0)
    check_choice("method", method, METHODS)
    d = paired_differences(a, b)
    if method == "bootstrap" and len(d) < MIN_BOOTSTRAP_SEEDS:
        raise ValueError(f"method='bootstrap' needs at least {MIN_BOOTSTRAP_SEEDS} paired "
                         f"seeds, got {len(d)}; use method='t'")
    n, mean = len(d), float(d.mean())
    sd = float(d.std(ddof=1))
    if no_spread(d):  # every seed moved by the same amount: the interval is that amount,
        # and the two-sided p-value is the exact sign test's
        return Effect(mean, mean, mean, n, min(1.0, 2 * 0.5**n) if mean else 1.0,
                      confidence, method)
    p = float(scipy.stats.ttest_1samp(d, 0.0).pvalue)
    if method == "t":
        half = float(scipy.stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        return Effect(mean, mean - half, mean + half, n, p, confidence, method)
    res = scipy.stats.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=9999,
                          method="BCa", random_state=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Effect(mean, low, high, n, p, confidence, method)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order (each ≤ 1)."""
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"pvalues must be a list of numbers in [0, 1], got {list(pvalues)}")
    order = np.argsort(p)
    m = len(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def reading_pvalues(a: Mapping[Any, float], b: Mapping[Any, float],
                    smallest: float) -> dict[str, float]:
    """One-sided paired t-test p-values for each reading of d = a − b against δ = ``smallest``:
    ``greater`` (H0: mean d ≤ δ), ``less`` (H0: mean d ≥ −δ) and ``equal`` (two one-sided
    tests, H0: |mean d| ≥ δ; the larger of the two p-values). At level α/2 each reading is
    exactly the interval reading of :func:`classify` for a (1 − α) t-interval.

    With no spread (every seed moved by the same amount, as a measure that moves in steps
    can) the t-test is undefined; the exact sign test takes over: a reading that every one of
    the n seeds shows has p = 2⁻ⁿ (so 5 seeds alone do not pass α/2 = 0.025; 6 do)."""
    check_float("smallest", smallest, low=0.0)
    d = paired_differences(a, b)
    if no_spread(d):
        m, sign_p = float(d.mean()), 0.5 ** len(d)
        return {GREATER: sign_p if m > smallest else 1.0,
                LESS: sign_p if m < -smallest else 1.0,
                EQUAL: sign_p if abs(m) < smallest else 1.0}
    def one_sided(popmean: float, alternative: str) -> float:
        return float(scipy.stats.ttest_1samp(d, popmean, alternative=alternative).pvalue)
    return {GREATER: one_sided(smallest, "greater"), LESS: one_sided(-smallest, "less"),
            EQUAL: max(one_sided(-smallest, "greater"), one_sided(smallest, "less"))}


def no_worse_pvalues(a: Mapping[Any, float], b: Mapping[Any, float],
                     smallest: float) -> dict[str, float]:
    """One-sided non-inferiority p-values of d = a − b against δ = ``smallest``:
    ``not_greater`` (H0: mean d ≥ δ, i.e. a is δ or more above b) and ``not_less`` (H0: mean
    d ≤ −δ). At level α/2 ``not_greater`` holds exactly when the (1 − α) t-interval's upper
    bound lies below +δ. With no spread, the exact sign test (p = 2⁻ⁿ), as in
    :func:`reading_pvalues`."""
    check_float("smallest", smallest, low=0.0)
    d = paired_differences(a, b)
    if no_spread(d):
        m, sign_p = float(d.mean()), 0.5 ** len(d)
        return {"not_greater": sign_p if m < smallest else 1.0,
                "not_less": sign_p if m > -smallest else 1.0}
    return {"not_greater": float(scipy.stats.ttest_1samp(d, smallest, alternative="less").pvalue),
            "not_less": float(scipy.stats.ttest_1samp(d, -smallest,
                                                      alternative="greater").pvalue)}


def seeds_to_decide(d: np.ndarray, smallest: float, alpha: float, cap: int = 1000) -> int | None:
    """How many paired seeds would decide a comparison at its measured mean m and spread sd:
    the least n with t_{n−1}(1 − α)·sd/√n < | |m| − δ | (the one-sided level α it was tested
    at, so the interval clears ±δ or fits inside it), or with no spread the sign test's
    ⌈log₂(1/α)⌉. None when |m| sits on ±δ or more than ``cap`` seeds would be needed. A plug-in
    planning figure (Julious 2004, Stat. Med. 23(12)), not a promise: the next seeds move m."""
    m, margin = float(d.mean()), abs(abs(float(d.mean())) - smallest)
    if not 0.0 < alpha < 0.5 or margin <= 1e-12 * max(1.0, abs(m)):
        return None
    if no_spread(d):
        return max(len(d), math.ceil(math.log2(1.0 / alpha)))
    n = np.arange(max(2, len(d)), cap + 1)
    ok = scipy.stats.t.ppf(1 - alpha, n - 1) * float(d.std(ddof=1)) / np.sqrt(n) < margin
    return int(n[np.argmax(ok)]) if ok.any() else None


@dataclass(frozen=True)
class Comparison:
    """One comparison of a claim: the paired effect, its reading after Holm's correction across
    the claim's comparisons, that reading's Holm-adjusted p-value, the smallest real effect,
    the interval that agrees with the reading (:func:`holm_interval`), and the two
    non-inferiority readings (:func:`no_worse_pvalues`, Holm-adjusted over the same family):
    ``not_greater`` (a is less than δ above b) and ``not_less``; for an inconclusive reading,
    :func:`seeds_to_decide` at the level Holm tested it at."""

    effect: Effect
    reading: str
    p_holm: float
    smallest: float
    holm_low: float = math.nan
    holm_high: float = math.nan
    holm_confidence: float = math.nan
    not_greater: bool = False
    not_less: bool = False
    seeds_to_decide: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers, for evidence and JSON."""
        return {**self.effect.to_dict(), "reading": self.reading, "p_holm": self.p_holm,
                "smallest": self.smallest, "lo_holm": self.holm_low, "hi_holm": self.holm_high,
                "confidence_holm": self.holm_confidence, "not_greater": self.not_greater,
                "not_less": self.not_less, "seeds_to_decide": self.seeds_to_decide}


def holm_interval(a: Mapping[Any, float], b: Mapping[Any, float], p: float, p_holm: float,
                  confidence: float = 0.95) -> tuple[float, float, float]:
    """The two-sided t-interval at the level Holm's correction effectively tested this
    comparison at: confidence 1 − 2·α_i with α_i = (1 − ``confidence``)/2 · p/p_holm, where p is
    the best reading's raw one-sided p-value. Returns (low, high, its confidence).

    A one-sided t-test at level α_i rejects exactly when the (1 − 2α_i) interval clears the
    null's boundary (both bounds for the equivalence test), and Holm keeps a reading exactly when
    p ≤ α_i, so this interval clears +δ, clears −δ or lies inside ±δ exactly when the reading
    says so. It is at least as wide as the unadjusted interval (p_holm ≥ p). With no spread
    (:func:`no_spread`) the interval is the point itself and the sign test decides."""
    d = paired_differences(a, b)
    n, mean = len(d), float(d.mean())
    ratio = p / p_holm if p_holm > 0 else 1.0
    alpha = (1 - confidence) / 2 * min(1.0, ratio)
    level = 1 - 2 * alpha
    if no_spread(d) or alpha <= 0:
        return (mean, mean, level) if no_spread(d) else (-math.inf, math.inf, level)
    half = float(scipy.stats.t.ppf(1 - alpha, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    return mean - half, mean + half, level


def compare_family(
    pairs: Mapping[str, tuple[Mapping[Any, float], Mapping[Any, float]]],
    smallest: float | Mapping[str, float],
    confidence: float = 0.95,
) -> dict[str, Comparison]:
    """Every comparison of one claim, read with Holm's correction across them.

    ``pairs`` maps a comparison's name to its two arms (seed -> value). For each comparison the
    best-supported reading (smallest p of :func:`reading_pvalues`) is kept; those p-values are
    Holm-adjusted across the family and a reading stands when its adjusted p is at most
    (1 − ``confidence``)/2, else the comparison is :data:`INCONCLUSIVE`. With one comparison
    this is :func:`classify` of the ``confidence`` t-interval. Each comparison also carries
    :func:`holm_interval`, the interval whose position against ±δ is its reading, and the
    non-inferiority readings, each Holm-adjusted across the family on its own.
    """
    check_float("confidence", confidence, low=0.0, high=1.0)
    if not pairs:
        raise ValueError("pairs must hold at least one comparison")
    deltas = {k: float(smallest[k] if isinstance(smallest, Mapping) else smallest)
              for k in pairs}
    effects = {k: paired_effect(a, b, confidence) for k, (a, b) in pairs.items()}
    best = {}
    for k, (a, b) in pairs.items():
        ps = reading_pvalues(a, b, deltas[k])
        best[k] = min(ps.items(), key=lambda kv: kv[1])
    adjusted = dict(zip(best, holm([p for _, p in best.values()]), strict=True))
    alpha_side = (1 - confidence) / 2
    ni = {k: no_worse_pvalues(a, b, deltas[k]) for k, (a, b) in pairs.items()}
    held = {side: dict(zip(ni, (p <= alpha_side for p in holm([ni[k][side] for k in ni])),
                           strict=True)) for side in ("not_greater", "not_less")}
    out = {}
    for k, (a, b) in pairs.items():
        reading = best[k][0] if adjusted[k] <= alpha_side else INCONCLUSIVE
        low, high, level = holm_interval(a, b, best[k][1], adjusted[k], confidence)
        need = (seeds_to_decide(paired_differences(a, b), deltas[k], (1 - level) / 2)
                if reading == INCONCLUSIVE else None)
        out[k] = Comparison(effects[k], reading, adjusted[k], deltas[k], low, high, level,
                            held["not_greater"][k], held["not_less"][k], need)
    return out


def classify(effect: Effect, smallest: float) -> str:
    """:data:`GREATER`, :data:`LESS`, :data:`EQUAL` or :data:`INCONCLUSIVE`: where the interval
    lies against ±``smallest`` (module docstring)."""
    check_float("smallest", smallest, low=0.0)
    if effect.low > smallest:
        return GREATER
    if effect.high < -smallest:
        return LESS
    if -smallest < effect.low and effect.high < smallest:
        return EQUAL
    return INCONCLUSIVE
