"""What every claim rule returns, and the comparisons the rules share.

A rule reads an evidence dict (numbers the report measured and stored) and returns a
:class:`Verdict`. A "mean ± CI" in evidence is a dict ``{"mean", "lo", "hi", "n"}`` (95%
Student-t interval over seeds, as :meth:`attnscale.lab.analysis.MeanCI.to_dict` writes it);
accuracies are in [0, 1]; losses are final eval losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED, REFUTED, DEPENDS = "supported", "refuted", "depends"
VERDICTS = (SUPPORTED, REFUTED, DEPENDS)

Evidence = dict[str, Any]

NOT_LEARNED = (". Guard: if scaled_dot's accuracy CI stays below twice chance the task was not "
               "learned and the verdict is depends (inconclusive)")


@dataclass
class Verdict:
    """A rule's answer: the verdict, the rule as printed, and the numbers that decided it."""

    verdict: str
    rule: str
    because: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


def fmt_ci(x: dict[str, Any] | None) -> str:
    """``mean [lo, hi]``, or the mean alone for a single seed ("n/a" for None)."""
    if x is None:
        return "n/a"
    if x.get("lo") is None or x.get("hi") is None or x.get("n", 1) < 2:
        return f"{x['mean']:.3g}"
    return f"{x['mean']:.3g} [{x['lo']:.3g}, {x['hi']:.3g}]"


def above(a: dict[str, Any], b: dict[str, Any], margin: float = 0.0) -> bool:
    """a is above b: a's lower CI bound exceeds b's upper bound plus ``margin``
    (for single-seed values, the means are compared)."""
    a_lo = a["lo"] if a.get("lo") is not None else a["mean"]
    b_hi = b["hi"] if b.get("hi") is not None else b["mean"]
    return a_lo > b_hi + margin


def not_learned(acc: dict[str, Any], chance: float) -> bool:
    """The baseline's accuracy CI does not clear twice chance: the task was not learned."""
    hi = acc["hi"] if acc.get("hi") is not None else acc["mean"]
    return hi < 2 * chance


def loglog_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    den = sum((a - mx) ** 2 for a in lx)
    return num / den
