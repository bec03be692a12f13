"""The project's one interval type, the paired-comparison result built on it, and the readings.

In the manner of scipy.stats result objects: the numbers are fields, what follows from them are
methods. :class:`Interval` is an estimate with a two-sided interval over ``n`` values (Student
t for a mean over seeds, a BCa bootstrap, or any other interval a measurement reports, with its
``confidence``; ``p`` and ``method`` when a test made it, as :func:`attnscale.lab.paired.
paired_effect` does); :class:`Comparison` is a paired difference a − b read against a smallest
real effect δ (:func:`attnscale.lab.paired.compare_family` builds them). Both serialize
(``model_dump``) to the ``{"mean", "lo", "hi", "n", ...}`` dicts that report.json, the figures
and the page read.

A comparison's reading is one of :data:`READINGS`: ``greater`` / ``less`` (a real effect of
that sign, past ±δ), ``equal`` (within ±δ), ``inconclusive`` (the interval is too wide to
say), or ``not measurable``: every seed's difference is the same number, so the seeds carry no
information about the spread and no test applies (Student 1908: the t statistic divides by the
sample sd; an exact sign test would read any unanimous sign as significant however the arms
were built, e.g. two arms identical by construction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from attnscale.lab.analysis import mean_ci

GREATER, LESS, EQUAL, INCONCLUSIVE = "greater", "less", "equal", "inconclusive"
NOT_MEASURABLE = "not measurable"
READINGS = (GREATER, LESS, EQUAL, INCONCLUSIVE, NOT_MEASURABLE)


def finite(x: float | None) -> bool:
    """``x`` is a finite number (None and NaN are not)."""
    return x is not None and math.isfinite(x)


class Interval(BaseModel):
    """An estimate ``mean`` with the two-sided interval [``lo``, ``hi``] at ``confidence``
    over ``n`` values; ``lo``/``hi`` are None where there is no interval (n < 2). ``p`` (the
    two-sided p-value of mean = 0) and ``method`` (how the interval was made: "t",
    "bootstrap") are None for an interval no test made, and then left out of the dump."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mean: float
    lo: float | None = None
    hi: float | None = None
    n: int = 0
    confidence: float = 0.95
    p: float | None = None
    method: str | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        return {k: v for k, v in out.items() if not (k in ("p", "method") and v is None)}

    @classmethod
    def of(cls, values: Sequence[float], confidence: float = 0.95) -> Interval:
        """Mean of ``values`` with its Student-t interval (mean ± t_{n−1}·sd/√n)."""
        ci = mean_ci(list(values), confidence)
        return cls(mean=ci.mean, lo=ci.low, hi=ci.high, n=ci.n, confidence=confidence)

    def has_interval(self) -> bool:
        """Both bounds are finite numbers."""
        return finite(self.lo) and finite(self.hi)

    def excludes(self, x: float) -> bool:
        """The interval lies wholly above or wholly below ``x``."""
        return self.has_interval() and (self.lo > x or self.hi < x)

    def inside(self, delta: float) -> bool:
        """The interval lies wholly inside (−δ, +δ)."""
        return self.has_interval() and -delta < self.lo and self.hi < delta

    def fmt(self, unit: str = "", digits: int = 3, sign: bool = True) -> str:
        """``+0.12 [+0.05, +0.19] nats`` (``sign=False``: ``0.12 [0.05, 0.19]``), or the mean
        alone without an interval."""
        u, f = f" {unit}" if unit else "", f"{'+' if sign else ''}.{digits}g"
        if not self.has_interval():
            return f"{self.mean:{f}}{u}"
        return f"{self.mean:{f}} [{self.lo:{f}}, {self.hi:{f}}]{u}"


class Comparison(Interval):
    """A paired difference a − b over ``n`` seeds read against δ = ``smallest``.

    ``reading`` is one of :data:`READINGS`, after Holm's correction over the rule's family
    (``p_holm``; ``lo_holm``/``hi_holm`` the interval at the level Holm tested it at);
    ``not_greater``/``not_less`` the non-inferiority readings; ``seeds_to_decide`` the
    planning figure for an inconclusive one; ``why`` says why one could not be read. A
    :data:`NOT_MEASURABLE` one has p = p_holm = NaN, takes no part in the Holm family, and its
    intervals are the point itself."""

    p: float | None = math.nan
    reading: str = INCONCLUSIVE
    p_holm: float = math.nan
    smallest: float = math.nan
    lo_holm: float = math.nan
    hi_holm: float = math.nan
    confidence_holm: float = math.nan
    not_greater: bool = False
    not_less: bool = False
    seeds_to_decide: int | None = None
    method: str | None = "t"
    why: str = ""

    def no_worse(self) -> bool:
        """"Equal or better" (a − b below +δ): the non-inferiority reading alone, one test in
        its own Holm family (or-ing it with the equal/less reading would spend α twice)."""
        return self.not_greater

    def no_better(self) -> bool:
        """The mirror of :meth:`no_worse`: a − b above −δ."""
        return self.not_less

    def greater(self) -> bool:
        """a exceeds b by more than δ."""
        return self.reading == GREATER

    def less(self) -> bool:
        """a is below b by more than δ."""
        return self.reading == LESS

    def equal(self) -> bool:
        """a and b are within ±δ (equivalence)."""
        return self.reading == EQUAL

    def measurable(self) -> bool:
        """The differences have a spread, so a test could read them (not :data:`NOT_MEASURABLE`;
        an inconclusive comparison is measurable)."""
        return self.reading != NOT_MEASURABLE

    def decided(self) -> bool:
        """The reading is greater, less or equal (neither inconclusive nor not measurable)."""
        return self.reading not in (INCONCLUSIVE, NOT_MEASURABLE)

    def past_delta(self) -> bool:
        """The unadjusted interval clears ±δ (Holm may still leave it undecided); never for a
        comparison that is not measurable."""
        return (self.measurable() and self.has_interval()
                and (self.lo > self.smallest or self.hi < -self.smallest))

    def effect(self, unit: str = "", digits: int = 3) -> str:
        """``+0.12 [+0.05, +0.19] nats: greater (Holm p 0.003)``, with why it is unread; for
        one not measurable, ``+0 nats: not measurable — every seed's difference is +0 (the arms
        are identical)``."""
        u = f" {unit}" if unit else ""
        why = f" — {self.why}" if self.why else ""
        if not self.measurable():
            return f"{self.mean:+.{digits}g}{u}: {self.reading}{why}"
        holm = f" (Holm p {self.p_holm:.2g})" if finite(self.p_holm) else ""
        lo = self.lo if self.lo is not None else math.nan
        hi = self.hi if self.hi is not None else math.nan
        return (f"{self.mean:+.{digits}g} [{lo:+.{digits}g}, {hi:+.{digits}g}]{u}: "
                f"{self.reading}{holm}{why}")
