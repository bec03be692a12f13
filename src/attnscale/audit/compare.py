"""Paired comparisons read from training evidence, for the rules.

Evidence holds, per cell and arm, a value per reported seed (``{"values": {seed: v}, "lrs":
..., "censored": bool}``, :class:`attnscale.audit.selection.ArmValues`). A comparison is arm a
minus arm b over the seeds both have; :func:`family` reads a claim's comparisons with Holm's
correction (:func:`attnscale.lab.paired.compare_family`) over the family the rule combines. A
comparison with fewer than three paired seeds, or with a censored arm, reads ``inconclusive``.

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
            "confidence_holm": nan, "not_greater": False, "not_less": False,
            "seeds_to_decide": None, "why": why}


def family(pairs: Mapping[str, Pair], smallest: float | Mapping[str, float],
           holm_over: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
    """name -> comparison dict (mean, lo, hi, n, p, reading, p_holm, smallest, lo_holm, hi_holm,
    confidence_holm, not_greater, not_less; ``why`` for one that could not be read).

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
    out: dict[str, Any] = {}
    for g in groups:
        out.update(_read_family({k: pairs[k] for k in g}, smallest))
    return {k: out[k] for k in pairs}


def _read_family(pairs: Mapping[str, Pair],
                 smallest: float | Mapping[str, float]) -> dict[str, Any]:
    """One Holm family of :func:`family`."""
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
            if censored:
                out[k].update(reading=INCONCLUSIVE, not_greater=False, not_less=False,
                              seeds_to_decide=None,  # more seeds cannot fix a censored LR
                              why="best LR at the edge of the grid (censored)")
    return {k: out[k] for k in pairs}


def no_worse(c: Mapping[str, Any]) -> bool:
    """"Equal or better" (a − b below +δ): the non-inferiority reading alone, one test with its
    own Holm family (or-ing it with the equal/less reading would spend α twice)."""
    return bool(c.get("not_greater"))


def no_better(c: Mapping[str, Any]) -> bool:
    """The mirror of :func:`no_worse`: a − b above −δ."""
    return bool(c.get("not_less"))


def mean(arm: Mapping[str, Any] | None) -> float:
    """Mean over seeds of one arm's values (nan when missing)."""
    xs = list(values(arm).values())
    return sum(xs) / len(xs) if xs else math.nan


def readings(comparisons: Mapping[str, Any]) -> list[str]:
    """The readings of a family, in order."""
    return [c["reading"] for c in comparisons.values()]
