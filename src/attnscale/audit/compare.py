"""Paired comparisons read from training evidence, for the rules.

Evidence holds, per cell and arm, a value per reported seed (``{"values": {seed: v}, "lrs":
..., "censored": bool}``, :class:`attnscale.audit.selection.ArmValues`). A comparison is arm a
minus arm b over the seeds both have; :func:`family` reads all of one claim's comparisons with
Holm's correction (:func:`attnscale.lab.paired.compare_family`). A comparison with fewer than
three paired seeds, or with a censored arm, reads ``inconclusive``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from attnscale.lab.paired import INCONCLUSIVE, MIN_SEEDS, compare_family

Pair = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]


def values(arm: Mapping[str, Any] | None) -> dict[str, float]:
    """seed -> value of one arm (empty for a missing arm)."""
    return dict(arm["values"]) if arm else {}


def paired_seeds(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> int:
    """How many seeds both arms have."""
    return len(set(values(a)) & set(values(b)))


def undecided(why: str, smallest: float) -> dict[str, Any]:
    """A comparison that could not be read, and why."""
    nan = math.nan
    return {"mean": nan, "lo": nan, "hi": nan, "n": 0, "p": nan, "reading": INCONCLUSIVE,
            "p_holm": nan, "smallest": smallest, "lo_holm": nan, "hi_holm": nan,
            "confidence_holm": nan, "why": why}


def family(pairs: Mapping[str, Pair], smallest: float | Mapping[str, float]) -> dict[str, Any]:
    """name -> comparison dict (mean, lo, hi, n, p, reading, p_holm, smallest, lo_holm, hi_holm,
    confidence_holm; ``why`` for one that could not be read). Holm's correction runs over the
    comparisons that can be read."""
    def delta(k: str) -> float:
        return float(smallest[k] if isinstance(smallest, Mapping) else smallest)
    out: dict[str, Any] = {}
    ready = {}
    for k, (a, b) in pairs.items():
        if a is None or b is None:
            out[k] = undecided("an arm has no runs", delta(k))
        elif paired_seeds(a, b) < MIN_SEEDS:
            out[k] = undecided(f"{paired_seeds(a, b)} paired seeds (< {MIN_SEEDS})", delta(k))
        else:
            ready[k] = (values(a), values(b))
    if ready:
        read = compare_family(ready, {k: delta(k) for k in ready})
        for k, c in read.items():
            out[k] = c.to_dict()
            censored = [x for x, arm in zip("ab", pairs[k], strict=True) if arm.get("censored")]
            if censored and c.reading != INCONCLUSIVE:
                out[k].update(reading=INCONCLUSIVE, why="best LR at the edge of the grid "
                              "(censored)")
    return {k: out[k] for k in pairs}


def mean(arm: Mapping[str, Any] | None) -> float:
    """Mean over seeds of one arm's values (nan when missing)."""
    xs = list(values(arm).values())
    return sum(xs) / len(xs) if xs else math.nan


def readings(comparisons: Mapping[str, Any]) -> list[str]:
    """The readings of a family, in order."""
    return [c["reading"] for c in comparisons.values()]
