"""Glue between attnscale.measure and training frameworks: Hugging Face Trainer, TensorBoard.

* :func:`log_attention` (:mod:`.tensorboard`): per-layer attention health of one batch, written to
  a TensorBoard ``SummaryWriter`` (or anything with ``add_scalar``) from a plain PyTorch loop;
* :class:`AttentionHealthCallback` (:mod:`.hf`, needs transformers): the same inside a
  ``transformers.Trainer``, through its own logging, with an alarm;
* :mod:`.health`: which statistics are logged, the alarm and the divergence test, framework-free;
* :class:`QKClip` and :func:`qk_clip_` (:mod:`.qkclip`): Kimi K2's QK-Clip, which rescales the
  query and key weights of every head whose max logit passed a threshold τ, after each step;
  :class:`QKClipCallback` (:mod:`.hf_qkclip`, needs transformers) does it inside a ``Trainer``.
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
from attnscale.integrations.qkclip import HeadClip, QKClip, per_head_max_logit, qk_clip_
from attnscale.integrations.tensorboard import attention_health, log_attention

__all__ = [
    "HEALTH_STATISTICS",
    "AlarmEvent",
    "AttentionAlarm",
    "AttentionHealthCallback",
    "AttentionHealthWarning",
    "HeadClip",
    "HealthThresholds",
    "LossDivergence",
    "QKClip",
    "QKClipCallback",
    "attention_health",
    "health_scalars",
    "log_attention",
    "per_head_max_logit",
    "qk_clip_",
]


def __getattr__(name: str) -> Any:
    """``AttentionHealthCallback`` and ``QKClipCallback`` on first use: importing them imports
    transformers (the ``hf`` extra), which the rest of this package does not need."""
    if name == "AttentionHealthCallback":
        from attnscale.integrations.hf import AttentionHealthCallback

        return AttentionHealthCallback
    if name == "QKClipCallback":
        from attnscale.integrations.hf_qkclip import QKClipCallback

        return QKClipCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
