"""Attention health from a plain PyTorch loop into TensorBoard (or any ``add_scalar`` logger).

    writer = torch.utils.tensorboard.SummaryWriter("runs/x")
    for step, batch in enumerate(loader):
        ...
        if step % 50 == 0:
            log_attention(model, batch, writer, step)   # {"attention/<layer>/max_abs_logit": ...}

:func:`log_attention` runs one extra forward pass of ``batch`` under ``torch.no_grad`` through a
:class:`attnscale.measure.monitor.Monitor` and writes the per-layer statistics of
:data:`attnscale.integrations.health.HEALTH_STATISTICS` as scalars.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnscale.integrations.health import check_prefix, head_scalars, health_scalars
from attnscale.measure.monitor import Monitor
from attnscale.util.validate import check_int

__all__ = ["ScalarWriter", "attention_health", "log_attention", "padding_query_mask",
           "run_batch"]


class ScalarWriter(Protocol):
    """What :func:`log_attention` needs of a writer: ``torch.utils.tensorboard.SummaryWriter``,
    ``tensorboardX``, or anything with the same ``add_scalar``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> Any: ...


def run_batch(model: nn.Module, batch: Any) -> Any:
    """``model(**batch)`` for a mapping (Hugging Face inputs), ``model(*batch)`` for a tuple or
    list (e.g. attnscale's lab models take ``(tokens, scale)``), ``model(batch)`` for a tensor."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    if isinstance(batch, Tensor):
        return model(batch)
    raise TypeError(f"batch must be a mapping, a tuple/list or a tensor, got "
                    f"{type(batch).__name__}")


def padding_query_mask(model: nn.Module, inputs: Mapping[str, Any]) -> Tensor | None:
    """The (B, N) bool query mask that drops padding rows from the statistics: the batch's 2-D
    ``attention_mask`` (1 = real token), for models whose every attention has those query rows.
    None when there is no such mask, when it keeps every row, or for encoder-decoder models
    (their decoder rows are not the encoder's mask)."""
    mask = inputs.get("attention_mask")
    config = getattr(model, "config", None)
    if (not isinstance(mask, Tensor) or mask.dim() != 2
            or getattr(config, "is_encoder_decoder", False)):
        return None
    keep = mask.bool()
    return None if bool(keep.all()) else keep


def attention_health(model: nn.Module, batch: Any, *, prefix: str = "attention",
                     per_head: bool = False) -> dict[str, float]:
    """``{f"{prefix}/{layer}/{statistic}": float}`` of one forward pass of ``batch``
    (:func:`run_batch`) through a :class:`Monitor`, under ``torch.no_grad`` and in eval mode
    (dropout off, so the statistics are of the model itself; its mode is restored afterwards).
    Padding rows of a mapping batch with an ``attention_mask`` are left out
    (:func:`padding_query_mask`); a layer with non-finite logits reads nonfinite_fraction > 0
    and max_abs_logit inf (:mod:`attnscale.measure.headstats`). ``per_head``: also each head's
    max |logit| as ``{prefix}/{layer}/max_abs_logit_head{h}`` (:func:`head_scalars`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    prefix = check_prefix(prefix)
    if not isinstance(per_head, bool):
        raise TypeError(f"per_head must be a bool, got {type(per_head).__name__}")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), Monitor(model) as monitor:
            if isinstance(batch, Mapping):
                monitor.query_mask = padding_query_mask(model, batch)
            run_batch(model, batch)
    finally:
        model.train(was_training)
    values = health_scalars(monitor.flat_stats(), prefix)
    if per_head:
        heads = {name: s.max_abs_logit.tolist() for name, s in monitor.stats().items()}
        values.update(head_scalars(heads, prefix))
    return values


def log_attention(model: nn.Module, batch: Any, writer: ScalarWriter, step: int, *,
                  prefix: str = "attention", per_head: bool = False) -> dict[str, float]:
    """Measure ``batch`` (:func:`attention_health`), write each value with
    ``writer.add_scalar(tag, value, step)`` and return them. Tags are
    ``{prefix}/{layer}/{statistic}`` for the statistics of
    :data:`attnscale.integrations.health.HEALTH_STATISTICS` (and, with ``per_head``,
    ``{prefix}/{layer}/max_abs_logit_head{h}``)."""
    add_scalar = getattr(writer, "add_scalar", None)
    if not callable(add_scalar):
        raise TypeError(f"writer must have an add_scalar(tag, value, step) method, got "
                        f"{type(writer).__name__}")
    step = check_int("step", step, minimum=0)
    values = attention_health(model, batch, prefix=prefix, per_head=per_head)
    for tag, value in values.items():
        add_scalar(tag, value, step)
    return values
