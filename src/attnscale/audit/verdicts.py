"""What every claim rule returns, the smallest effects the rules share, and how a failure is
named.

A rule reads its claim's typed evidence (:mod:`attnscale.audit.claim`) and returns a
:class:`Verdict`. In the plain numbers report.json stores, an interval is the dict form of
:class:`attnscale.audit.interval.Interval` (``{"mean", "lo", "hi", "n", ...}``); accuracies
are in [0, 1]; losses are final eval losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED, REFUTED, DEPENDS, INCONCLUSIVE = "supported", "refuted", "depends", "inconclusive"
VERDICTS = (SUPPORTED, REFUTED, DEPENDS, INCONCLUSIVE)
# Not a verdict: the rule raised, its evidence is missing, or its figure failed to draw. The page
# shows the exception, report.json lists it under "errors" and `attnscale report` exits 1.
ERROR = "error"


class MissingEvidence(LookupError):
    """Evidence a rule needs was not measured (for example every run of an arm failed).

    Raised by evidence collection and by rules, with a message naming what is missing; the
    report shows it as an error, never as a verdict."""


def failure(e: BaseException) -> str:
    """An exception as the page and report.json name it: missing evidence, or a bug."""
    if isinstance(e, MissingEvidence):
        return f"missing evidence: {e}"
    if isinstance(e, KeyError):
        return f"missing evidence or a bug: no key {e}"
    return f"a bug: {type(e).__name__}: {e}"


# The smallest real effects the rules share, and why (printed with each rule).
LOSS_DELTA = 0.02
LOSS_WHY = ("0.02 nats: about 1% of these models' eval loss, and below the spread of one arm "
            "across LRs near its optimum, so a smaller gap would not change which score to use")
ACC_DELTA = 0.05
ACC_WHY = "5 accuracy points: one eval answer in twenty"


@dataclass
class Verdict:
    """A rule's answer: the verdict, the rule as printed, and the numbers that decided it.

    ``headline`` is the verdict in a few words with its effect (e.g. "supported, small: +3.1%
    [2.0%, 4.2%]"; the bare verdict when empty); ``plain`` holds two or three sentences, built
    from the verdict and its numbers, on what the thread got right, what it got wrong and what
    the answer depends on; ``regime`` names the regime the evidence is from (e.g. "q, k
    components of unit variance at init"); ``smallest`` states the smallest effect the rule
    treats as real, and why.
    """

    verdict: str
    rule: str
    because: str
    numbers: dict[str, Any] = field(default_factory=dict)
    headline: str = ""
    plain: list[str] = field(default_factory=list)
    regime: str = ""
    smallest: str = ""
    # undecided because the reading changes with the LR choice (attnscale.audit.lr_choice),
    # not for want of seeds: no seeds-to-decide figure applies
    by_lr_choice: bool = False

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if not self.headline:
            self.headline = self.verdict


# A verdict's numbers may show comparisons that do not decide it (GPT-2-init context, trained
# arms beside an evaluation-time factor): their names contain this word.
CONTEXT = "(context)"


def undecided_comparisons(numbers: Any, name: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every inconclusive comparison in a verdict's numbers, however nested, with its path (one
    ``not measurable`` has no seeds to plan, so it is not among them; nor is a comparison shown
    as context, whose name contains :data:`CONTEXT`: seeds there would decide no verdict)."""
    if CONTEXT in name:
        return []
    if isinstance(numbers, dict):
        if numbers.get("reading") == INCONCLUSIVE and "seeds_to_decide" in numbers:
            return [(name, numbers)]
        return [x for k, v in numbers.items()
                for x in undecided_comparisons(v, f"{name} {k}".strip())]
    return []


def seeds_sentence(numbers: Any) -> str | None:
    """For an inconclusive verdict: how many paired seeds the measured spread says would decide
    its nearest undecided comparison, or None where none can be planned."""
    found = [(k, c) for k, c in undecided_comparisons(numbers) if c.get("seeds_to_decide")]
    if not found:
        return None
    name, c = min(found, key=lambda kc: kc[1]["seeds_to_decide"])
    lean = "inside ±δ" if abs(c["mean"]) < c["smallest"] else "past ±δ"
    return (f"At its measured mean ({c['mean']:+.3g}, {lean}) and spread, about "
            f"{c['seeds_to_decide']} paired seeds (here {c['n']}) would decide the nearest "
            f"undecided comparison ({name}); a planning figure, since new seeds move the mean.")


def aggregate(readings: list[str], favour: set[str], against: set[str]) -> str:
    """A claim's verdict from its comparisons' readings: SUPPORTED if every reading favours the
    claim, REFUTED if every reading is against it, DEPENDS if some favour and some are against,
    INCONCLUSIVE otherwise (no readings, or undecided ones and only one side decided). A reading
    in neither set, such as ``inconclusive`` or ``not measurable``
    (:data:`attnscale.lab.paired.NOT_MEASURABLE`), counts as undecided."""
    pro = [r in favour for r in readings]
    con = [r in against for r in readings]
    if readings and all(pro):
        return SUPPORTED
    if readings and all(con):
        return REFUTED
    if any(pro) and any(con):
        return DEPENDS
    return INCONCLUSIVE


def loglog_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    den = sum((a - mx) ** 2 for a in lx)
    return num / den
