"""The audit's interval type and comparison result: :class:`attnscale.lab.interval.Interval`
and :class:`attnscale.lab.interval.Comparison`, re-exported so the rules import them from the
audit layer. There is one type family: :func:`attnscale.lab.paired.compare_family` returns these
very objects and :func:`attnscale.audit.compare.family` passes them on.
"""

from __future__ import annotations

from attnscale.lab.interval import Comparison, Interval

__all__ = ["Comparison", "Interval"]
