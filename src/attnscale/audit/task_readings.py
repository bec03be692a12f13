"""Readings the task studies' rules share (C3 salience, C4 temperature, Q3 length).

A task the baseline did not learn (its mean accuracy below twice chance) cannot tell the
scores apart, so its rule answers ``inconclusive`` (:func:`not_learned`).
"""

from __future__ import annotations

from typing import Any

from attnscale.audit.compare import ArmLike, mean
from attnscale.audit.verdicts import INCONCLUSIVE, Verdict

# The cosine arms of the task studies, in the order the rules read them.
COSINES = ("cosine_tau1", "cosine_tau2", "cosine_tau4", "cosine_tau10", "cosine_learned")


def learned(arm: ArmLike, chance: float) -> bool:
    """The arm's mean accuracy is at least twice chance (mean ≥ 2·chance)."""
    return mean(arm) >= 2 * chance


def not_learned(name: str, arm: ArmLike, chance: float, rule: str, **kw: Any) -> Verdict:
    """The inconclusive verdict of a task that ``name`` did not learn."""
    return Verdict(INCONCLUSIVE, rule, f"{name} reached {mean(arm):.3g} accuracy (chance "
                   f"{chance:.3g}): this budget did not learn the task", **kw)
