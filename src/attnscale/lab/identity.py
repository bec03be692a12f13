"""The absorbed-scale identity, checked numerically: unscaled attention with the
reparametrization of :mod:`attnscale.lab.build` (``absorb_scale``) trains step for step like
scaled attention.

Both arms are built from one config (same seed, so the same init stream and batches) and stepped
together in float64, where the identity holds to rounding; the check reports the largest loss
difference and the largest relative difference between W_q and W_q'/c over the steps, and how
many steps clipping was active (the identity must survive it). ``partial=True`` drops the two
corrections that make it exact (Adam's ε and the clipping norm) to show why they are needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from attnscale.lab.build import absorb_factor, qk_projections
from attnscale.lab.config import TrainConfig
from attnscale.lab.train import Trainer
from attnscale.util.validate import check_int

__all__ = ["absorbed_identity"]


@contextmanager
def float64() -> Iterator[None]:
    """Build and run in float64 (the default dtype), restored afterwards."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _undo_corrections(trainer: Trainer, config: TrainConfig) -> None:
    """The absorbed arm with plain ε and a clip on its own norm: LR and init scaling only."""
    for group in trainer.optimizer.param_groups:
        group["eps"] = config.optim.adam_eps
    trainer.config = config.replace(absorb_scale=False)


def absorbed_identity(config: TrainConfig | dict[str, Any], steps: int = 30,
                      partial: bool = False) -> dict[str, Any]:
    """Step ``scaled_dot`` and ``dot`` with ``absorb_scale`` together for ``steps`` steps.

    Returns {"steps", "d_k", "factor", "max_loss_diff", "max_weight_rel_diff", "clipped_steps",
    "losses": [(scaled, absorbed)] per step}. ``config``'s score and absorb_scale are set here.
    """
    steps = check_int("steps", steps, 1)
    base = TrainConfig.model_validate(config) if isinstance(config, dict) else config
    scaled = base.replace(score="scaled_dot", absorb_scale=False,
                          steps=max(base.optim.steps, steps), log_every=1)
    absorbed = scaled.replace(score="dot", absorb_scale=True)
    c = absorb_factor(absorbed)
    with float64():
        a, b = Trainer(scaled), Trainer(absorbed)
        if partial:
            _undo_corrections(b, absorbed)
        losses, worst_w = [], 0.0
        for _ in range(steps):
            losses.append((a.step(), b.step()))
            with torch.no_grad():
                for pa, pb in zip(qk_projections(a.model), qk_projections(b.model),
                                  strict=True):
                    rel = float((pa - pb / c).abs().max() / pa.abs().max().clamp_min(1e-300))
                    worst_w = max(worst_w, rel)
    clipped = sum(row["grad_norm"] > scaled.optim.grad_clip > 0 for row in a.history)
    return {"steps": steps, "d_k": scaled.model.d_model // scaled.model.n_heads, "factor": c,
            "partial": partial, "max_loss_diff": max(abs(x - y) for x, y in losses),
            "max_weight_rel_diff": worst_w, "clipped_steps": clipped, "losses": losses}
