"""Glue between attnscale.measure and training frameworks: Hugging Face Trainer, TensorBoard.

* :func:`log_attention` (:mod:`.tensorboard`): per-layer attention health of one batch, written to
  a TensorBoard ``SummaryWriter`` (or anything with ``add_scalar``) from a plain PyTorch loop;
* :class:`AttentionHealthCallback` (:mod:`.hf`, needs transformers): the same inside a
  ``transformers.Trainer``, through its own logging, with an alarm;
* :mod:`.health`: which statistics are logged, the alarm and the divergence test, framework-free.
"""

from __future__ import annotations

from typing import Any

from attnscale.integrations.health import (
    HEALTH_STATISTICS,
    AlarmEvent,
    AttentionAlarm,
    AttentionHealthWarning,
    HealthThresholds,
    LossDivergence,
    health_scalars,
)
from attnscale.integrations.tensorboard import attention_health, log_attention

__all__ = [
    "HEALTH_STATISTICS",
    "AlarmEvent",
    "AttentionAlarm",
    "AttentionHealthCallback",
    "AttentionHealthWarning",
    "HealthThresholds",
    "LossDivergence",
    "attention_health",
    "health_scalars",
    "log_attention",
]


def __getattr__(name: str) -> Any:
    """``AttentionHealthCallback`` on first use: importing it imports transformers (the ``hf``
    extra), which the rest of this package does not need."""
    if name == "AttentionHealthCallback":
        from attnscale.integrations.hf import AttentionHealthCallback

        return AttentionHealthCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
