"""Paired comparisons read from training evidence, for the rules.

Evidence holds, per cell and arm, an :class:`attnscale.audit.evidence.Arm`: a value per
reported seed, the LR each was read at, and whether that choice is censored. A comparison is arm
a minus arm b over the seeds both have; :func:`family` reads a claim's comparisons with Holm's
correction (:func:`attnscale.lab.paired.compare_family`) over the family the rule combines and
returns its :class:`attnscale.lab.interval.Comparison` results. A comparison with fewer than
three paired seeds, or with a censored arm, reads ``inconclusive``; one whose per-seed differences
are all the same number reads ``not measurable`` (:data:`attnscale.lab.paired.NOT_MEASURABLE`),
censored or not: no test reads differences that are all equal.

Which comparisons share a Holm family follows the rule's logic: comparisons a rule reads
through "some" or "or" (one real effect anywhere decides) share one; a comparison a rule only
ever reads through "every" or "and" is tested alone at the full level, since an
intersection-union test needs no correction (Berger 1982, Technometrics 24(4)). Holm over more
than the rule combines only costs power; over less, it inflates the error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from attnscale.audit.evidence import Arm
from attnscale.lab.interval import Comparison
from attnscale.lab.paired import INCONCLUSIVE, MIN_SEEDS, compare_family

ArmLike = Arm | Mapping[str, Any] | None
Pair = tuple[ArmLike, ArmLike]


def as_arm(arm: ArmLike) -> Arm | None:
    """An :class:`Arm` (validated from a mapping), or None for a missing arm."""
    return arm if arm is None or isinstance(arm, Arm) else Arm.model_validate(arm)


def values(arm: ArmLike) -> dict[str, float]:
    """seed -> value of one arm (empty for a missing arm)."""
    a = as_arm(arm)
    return dict(a.values) if a else {}


def paired_seeds(a: ArmLike, b: ArmLike) -> int:
    """How many seeds both arms have."""
    return len(set(values(a)) & set(values(b)))


def undecided(why: str, smallest: float) -> Comparison:
    """A comparison that could not be read, and why."""
    nan = math.nan
    return Comparison(mean=nan, lo=nan, hi=nan, n=0, reading=INCONCLUSIVE, smallest=smallest,
                      why=why)


def family(pairs: Mapping[str, Pair], smallest: float | Mapping[str, float],
           holm_over: Sequence[Sequence[str]] | None = None) -> dict[str, Comparison]:
    """name -> :class:`Comparison` (``why`` says why one could not be read).

    ``holm_over``: the Holm families, as lists of names; a name in none of them is read alone.
    None: one family of every comparison. Holm runs over the comparisons that can be read."""
    groups = [list(pairs)] if holm_over is None else [list(g) for g in holm_over]
    unknown = sorted({k for g in groups for k in g} - set(pairs))
    if unknown:
        raise ValueError(f"holm_over names comparisons that are not in pairs: {unknown}")
    named = [k for g in groups for k in g]
    if len(named) != len(set(named)):
        raise ValueError(f"holm_over names a comparison in two families: "
                         f"{sorted({k for k in named if named.count(k) > 1})}")
    grouped = {k for g in groups for k in g}
    groups += [[k] for k in pairs if k not in grouped]
    out: dict[str, Comparison] = {}
    for g in groups:
        out.update(_read_family({k: pairs[k] for k in g}, smallest))
    return {k: out[k] for k in pairs}


def _read_family(pairs: Mapping[str, Pair],
                 smallest: float | Mapping[str, float]) -> dict[str, Comparison]:
    """One Holm family of :func:`family`."""
    def delta(k: str) -> float:
        return float(smallest[k] if isinstance(smallest, Mapping) else smallest)
    out: dict[str, Comparison] = {}
    ready = {}
    arms = {k: (as_arm(a), as_arm(b)) for k, (a, b) in pairs.items()}
    for k, (a, b) in arms.items():
        if a is None or b is None:
            out[k] = undecided("an arm has no runs", delta(k))
        elif paired_seeds(a, b) < MIN_SEEDS:
            out[k] = undecided(f"{paired_seeds(a, b)} paired seeds (< {MIN_SEEDS})", delta(k))
        else:
            ready[k] = (values(a), values(b))
    if ready:
        read = compare_family(ready, {k: delta(k) for k in ready})
        for k, c in read.items():
            out[k] = c if not any(arm.censored for arm in arms[k]) else censored(c)
    return {k: out[k] for k in pairs}


def censored(c: Comparison) -> Comparison:
    """A comparison with an arm whose best LR is at the edge of its grid: inconclusive with no
    seeds to plan (more seeds cannot fix a censored LR); one not measurable stays so, saying
    both."""
    why = "best LR at the edge of the grid (censored)"
    if not c.measurable():
        return c.model_copy(update=dict(why=f"{c.why}; {why}"))
    return c.model_copy(update=dict(reading=INCONCLUSIVE, not_greater=False, not_less=False,
                                    seeds_to_decide=None, why=why))


def no_worse(c: Comparison | Mapping[str, Any]) -> bool:
    """:meth:`Comparison.no_worse`, also for a comparison read back from report.json."""
    return c.no_worse() if isinstance(c, Comparison) else bool(c.get("not_greater"))


def no_better(c: Comparison | Mapping[str, Any]) -> bool:
    """:meth:`Comparison.no_better`, also for a comparison read back from report.json."""
    return c.no_better() if isinstance(c, Comparison) else bool(c.get("not_less"))


def mean(arm: ArmLike) -> float:
    """Mean over seeds of one arm's values (nan when missing)."""
    xs = list(values(arm).values())
    return sum(xs) / len(xs) if xs else math.nan


def readings(comparisons: Mapping[str, Comparison]) -> list[str]:
    """The readings of a family, in order."""
    return [c.reading for c in comparisons.values()]
