"""Paired comparisons of two arms over seeds, and the verdict an interval supports.

Two arms (say, unscaled and scaled attention) trained with the same seed share the init stream
and the data order, so their per-seed difference d_s = a_s − b_s removes the variance the arms
share. Inference is on the mean difference over seeds:

* :func:`paired_effect`: mean difference with a Student-t interval (mean ± t_{n−1}·sd/√n) and
  the paired t-test p-value, or a bias-corrected and accelerated (BCa) bootstrap
  interval (``scipy.stats.bootstrap``) when asked, as an :class:`Interval`;
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
* differences with no spread (:func:`no_spread`: every seed moved by the same amount, e.g. two
  arms identical by construction) read :data:`NOT_MEASURABLE`: the t statistic divides by
  their sd of 0, and a sign test would call any unanimous sign significant, though n equal
  differences say nothing of how the next seed would fall. Such a comparison takes no part in
  its Holm family and plans no seeds.

:func:`compare_family` returns :class:`Comparison` results (:mod:`attnscale.lab.interval`).
Henderson et al. 2018 (arXiv 1709.06560) and Agarwal et al. 2021 (arXiv 2108.13264) show why
few-seed point estimates mislead; a rule needs at least :data:`MIN_SEEDS` paired seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)

from attnscale.lab.interval import (
    EQUAL,
    GREATER,
    INCONCLUSIVE,
    LESS,
    NOT_MEASURABLE,
    Comparison,
    Interval,
)
from attnscale.util.validate import check_choice, check_float

MIN_SEEDS = 3
MIN_BOOTSTRAP_SEEDS = 8  # with n = 3 a bootstrap has 10 distinct resamples: no interval
METHODS = ("t", "bootstrap")
Arms = tuple[Mapping[Any, float], Mapping[Any, float]]


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
    k/6 − (k−1)/6 differs in its last bits with k. Such differences are
    :data:`NOT_MEASURABLE`."""
    return float(d.std(ddof=1)) <= 1e-12 * max(1.0, abs(float(d.mean())))


def no_spread_why(mean: float, digits: int = 3) -> str:
    """Why a comparison is :data:`NOT_MEASURABLE`: "every seed's difference is +0.0312", and
    "+0 (the arms are identical)" when that difference is 0."""
    same = " (the arms are identical)" if mean == 0 else ""
    return f"every seed's difference is {mean:+.{digits}g}{same}"


def measurable_differences(a: Mapping[Any, float], b: Mapping[Any, float]) -> np.ndarray:
    """:func:`paired_differences`, or ValueError when they have no spread (:func:`no_spread`):
    a t-test of them is undefined, and the comparison reads :data:`NOT_MEASURABLE`."""
    d = paired_differences(a, b)
    if no_spread(d):
        raise ValueError(f"paired differences with no spread ({no_spread_why(float(d.mean()))})"
                         f" admit no test: the comparison is {NOT_MEASURABLE}")
    return d


def paired_effect(
    a: Mapping[Any, float],
    b: Mapping[Any, float],
    confidence: float = 0.95,
    method: str = "t",
    seed: int = 0,
) -> Interval:
    """The mean of :func:`paired_differences` with a two-sided interval (Student t, or BCa
    bootstrap with 9999 resamples drawn from ``seed``) and the two-sided paired t-test p-value
    (``scipy.stats.ttest_1samp(d, 0)``). With no spread the interval is the point itself and
    p is NaN: there is no test (:data:`NOT_MEASURABLE`)."""
    check_float("confidence", confidence, low=0.0, high=1.0)
    check_choice("method", method, METHODS)
    d = paired_differences(a, b)
    if method == "bootstrap" and len(d) < MIN_BOOTSTRAP_SEEDS:
        raise ValueError(f"method='bootstrap' needs at least {MIN_BOOTSTRAP_SEEDS} paired "
                         f"seeds, got {len(d)}; use method='t'")
    n, mean = len(d), float(d.mean())
    point = dict(mean=mean, n=n, confidence=confidence, method=method)
    if no_spread(d):
        return Interval(lo=mean, hi=mean, p=math.nan, **point)
    p = float(scipy.stats.ttest_1samp(d, 0.0).pvalue)
    if method == "t":
        sd = float(d.std(ddof=1))
        half = float(scipy.stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        return Interval(lo=mean - half, hi=mean + half, p=p, **point)
    res = scipy.stats.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=9999,
                                method="BCa", random_state=np.random.default_rng(seed))
    return Interval(lo=float(res.confidence_interval.low), hi=float(res.confidence_interval.high),
                    p=p, **point)


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
    exactly the interval reading of :func:`classify` for a (1 − α) t-interval. ValueError for
    differences with no spread (:func:`measurable_differences`)."""
    check_float("smallest", smallest, low=0.0)
    d = measurable_differences(a, b)
    return {GREATER: one_sided_t(d, smallest, "greater"), LESS: one_sided_t(d, -smallest, "less"),
            EQUAL: max(one_sided_t(d, -smallest, "greater"), one_sided_t(d, smallest, "less"))}


def one_sided_t(d: np.ndarray, popmean: float, alternative: str) -> float:
    """The p-value of ``scipy.stats.ttest_1samp(d, popmean, alternative=...)`` ("greater" or
    "less"), from the same statistic t = (mean − popmean)/(s/√n) and Student's t with n − 1
    degrees of freedom (``scipy.special.stdtr``): the judging of a report makes thousands of
    these tests, and ttest_1samp's input handling took a millisecond each."""
    check_choice("alternative", alternative, ("greater", "less"))
    n = len(d)
    if n < 2 or no_spread(np.asarray(d, dtype=float)):
        raise ValueError(f"a t-test needs at least 2 differences with spread; got {list(d)}")
    t = (np.mean(d) - popmean) / np.sqrt(np.var(d, ddof=1) / n)
    return float(scipy.special.stdtr(n - 1, -t if alternative == "greater" else t))


def no_worse_pvalues(a: Mapping[Any, float], b: Mapping[Any, float],
                     smallest: float) -> dict[str, float]:
    """One-sided non-inferiority p-values of d = a − b against δ = ``smallest``:
    ``not_greater`` (H0: mean d ≥ δ, i.e. a is δ or more above b) and ``not_less`` (H0: mean
    d ≤ −δ). At level α/2 ``not_greater`` holds exactly when the (1 − α) t-interval's upper
    bound lies below +δ. ValueError for differences with no spread, as in
    :func:`reading_pvalues`."""
    check_float("smallest", smallest, low=0.0)
    d = measurable_differences(a, b)
    return {"not_greater": one_sided_t(d, smallest, "less"),
            "not_less": one_sided_t(d, -smallest, "greater")}


def seeds_to_decide(d: np.ndarray, smallest: float, alpha: float, cap: int = 1000) -> int | None:
    """How many paired seeds would decide a comparison at its measured mean m and spread sd:
    the least n with t_{n−1}(1 − α)·sd/√n < | |m| − δ | (the one-sided level α it was tested
    at, so the interval clears ±δ or fits inside it). None when |m| sits on ±δ, when more than
    ``cap`` seeds would be needed, or when d has no spread (:func:`no_spread`: no sd to plan
    from). A plug-in planning figure (Julious 2004, Stat. Med. 23(12)), not a promise: the next
    seeds move m."""
    m, margin = float(d.mean()), abs(abs(float(d.mean())) - smallest)
    if not 0.0 < alpha < 0.5 or margin <= 1e-12 * max(1.0, abs(m)) or no_spread(d):
        return None
    n = np.arange(max(2, len(d)), cap + 1)
    ok = scipy.stats.t.ppf(1 - alpha, n - 1) * float(d.std(ddof=1)) / np.sqrt(n) < margin
    return int(n[np.argmax(ok)]) if ok.any() else None


def holm_interval(a: Mapping[Any, float], b: Mapping[Any, float], p: float, p_holm: float,
                  confidence: float = 0.95) -> tuple[float, float, float]:
    """The two-sided t-interval at the level Holm's correction effectively tested this
    comparison at: confidence 1 − 2·α_i with α_i = (1 − ``confidence``)/2 · p/p_holm, where p is
    the best reading's raw one-sided p-value. Returns (low, high, its confidence).

    A one-sided t-test at level α_i rejects exactly when the (1 − 2α_i) interval clears the
    null's boundary (both bounds for the equivalence test), and Holm keeps a reading exactly when
    p ≤ α_i, so this interval clears +δ, clears −δ or lies inside ±δ exactly when the reading
    says so. It is at least as wide as the unadjusted interval (p_holm ≥ p). ValueError for
    differences with no spread (:func:`measurable_differences`)."""
    d = measurable_differences(a, b)
    n, mean = len(d), float(d.mean())
    ratio = p / p_holm if p_holm > 0 else 1.0
    alpha = (1 - confidence) / 2 * min(1.0, ratio)
    level = 1 - 2 * alpha
    if alpha <= 0:
        return -math.inf, math.inf, level
    half = float(scipy.stats.t.ppf(1 - alpha, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    return mean - half, mean + half, level


def compare_family(
    pairs: Mapping[str, Arms],
    smallest: float | Mapping[str, float],
    confidence: float = 0.95,
) -> dict[str, Comparison]:
    """Every comparison of one claim, read with Holm's correction across them.

    ``pairs`` maps a comparison's name to its two arms (seed -> value). A comparison whose
    differences have no spread reads :data:`NOT_MEASURABLE` (:func:`not_measurable`) and takes
    no part in the family. For each other one the best-supported reading (smallest p of
    :func:`reading_pvalues`) is kept; those p-values are Holm-adjusted across the measurable
    comparisons and a reading stands when its adjusted p is at most (1 − ``confidence``)/2,
    else the comparison is :data:`INCONCLUSIVE`. With one comparison this is :func:`classify`
    of the ``confidence`` t-interval. Each comparison also carries :func:`holm_interval`, the
    interval whose position against ±δ is its reading, and the non-inferiority readings, each
    Holm-adjusted across the measurable comparisons on its own.
    """
    check_float("confidence", confidence, low=0.0, high=1.0)
    if not pairs:
        raise ValueError("pairs must hold at least one comparison")
    deltas = {k: float(smallest[k] if isinstance(smallest, Mapping) else smallest)
              for k in pairs}
    flat = {k for k, (a, b) in pairs.items() if no_spread(paired_differences(a, b))}
    out = {k: not_measurable(*pairs[k], deltas[k], confidence) for k in flat}
    read = {k: ab for k, ab in pairs.items() if k not in flat}
    if read:
        out.update(read_measurable(read, deltas, confidence))
    return {k: out[k] for k in pairs}


def not_measurable(a: Mapping[Any, float], b: Mapping[Any, float], smallest: float,
                   confidence: float = 0.95) -> Comparison:
    """A comparison whose differences have no spread: :data:`NOT_MEASURABLE`, its intervals the
    point itself, no p-value, no non-inferiority reading and no seeds to plan."""
    e = paired_effect(a, b, confidence)
    return Comparison(**e.model_dump(), reading=NOT_MEASURABLE, smallest=smallest,
                      lo_holm=e.mean, hi_holm=e.mean, why=no_spread_why(e.mean))


def read_measurable(pairs: Mapping[str, Arms], deltas: Mapping[str, float],
                    confidence: float) -> dict[str, Comparison]:
    """The Holm family of :func:`compare_family`: comparisons whose differences have spread."""
    best = {}
    for k, (a, b) in pairs.items():
        best[k] = min(reading_pvalues(a, b, deltas[k]).items(), key=lambda kv: kv[1])
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
        out[k] = Comparison(**paired_effect(a, b, confidence).model_dump(), reading=reading,
                            p_holm=adjusted[k], smallest=deltas[k], lo_holm=low, hi_holm=high,
                            confidence_holm=level, not_greater=held["not_greater"][k],
                            not_less=held["not_less"][k], seeds_to_decide=need)
    return out


def classify(effect: Interval, smallest: float) -> str:
    """:data:`GREATER`, :data:`LESS`, :data:`EQUAL` or :data:`INCONCLUSIVE`: where the interval
    lies against ±``smallest`` (module docstring); :data:`NOT_MEASURABLE` for an interval of
    zero width (differences with no spread, :func:`paired_effect`), :data:`INCONCLUSIVE` for
    none at all."""
    check_float("smallest", smallest, low=0.0)
    if effect.lo is None or effect.hi is None:
        return INCONCLUSIVE
    if effect.lo == effect.hi:
        return NOT_MEASURABLE
    if effect.lo > smallest:
        return GREATER
    if effect.hi < -smallest:
        return LESS
    if -smallest < effect.lo and effect.hi < smallest:
        return EQUAL
    return INCONCLUSIVE
