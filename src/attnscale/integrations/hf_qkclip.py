"""QK-Clip inside a Hugging Face ``Trainer`` (Kimi Team 2025, arXiv:2507.20534;
:mod:`attnscale.integrations.qkclip`)::

    clip = QKClipCallback(tau=100.0)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[clip])
    trainer.train()
    clip.clips   # [(global step, HeadClip(layer, head, max_logit, gamma)), ...]

Every optimizer step: a :class:`~attnscale.integrations.qkclip.QKClip` measurement wraps the
step's own training forward passes (entered at ``on_step_begin``, so every micro-batch of a
gradient-accumulation step counts; padding query rows left out as the health callback leaves
them), and at ``on_optimizer_step``, right after ``optimizer.step()``, each head whose max
|logit| passed τ has its W_q and W_k rows scaled by √(τ/max). The monitor lets the model's own
attention compute the output, so the loss and gradients are those of an unclipped step; only the
weights change after it. Under DDP every rank measures its own batch and the per-head maxima
are reduced (max) across ranks before clipping, so the replicas stay identical.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import TrainerCallback

from attnscale.integrations.qkclip import KIMI_K2_TAU, HeadClip, QKClip, check_tau
from attnscale.integrations.tensorboard import padding_query_mask

__all__ = ["QKClipCallback"]


class QKClipCallback(TrainerCallback):
    """Kimi K2's QK-Clip at threshold ``tau`` after every optimizer step (module docstring).

    After training: :attr:`clips`, (global step, :class:`HeadClip`) for every clipped head, and
    :meth:`record`. A model with attention QK-Clip cannot rescale fails at ``on_train_begin``
    (attnscale and ``torch.nn`` attention) or at the first step (Hugging Face modules), with a
    ValueError naming the module."""

    def __init__(self, tau: float = KIMI_K2_TAU) -> None:
        self.tau = check_tau(tau)
        self.clips: list[tuple[int, HeadClip]] = []
        self._clip: QKClip | None = None
        self._measuring: Any = None
        self._hook: Any = None

    def record(self) -> dict[str, Any]:
        """JSON-ready: tau, and every clip as {"step", "layer", "head", "max_logit", "gamma"}."""
        return {"tau": self.tau,
                "clips": [{"step": step, **c.to_dict()} for step, c in self.clips]}

    def on_train_begin(self, args, state, control, model: nn.Module | None = None, **kwargs):
        self._stop()
        self._clip = QKClip(model, self.tau)

    def on_step_begin(self, args, state, control, model: nn.Module | None = None, **kwargs):
        self._stop()
        clip = self._clip
        self._measuring = clip.measure()
        monitor = self._measuring.__enter__()

        def padding_rows(module, args, kwargs):  # each forward: that batch's padding rows
            monitor.query_mask = padding_query_mask(module, kwargs)

        self._hook = model.register_forward_pre_hook(padding_rows, with_kwargs=True)

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._measuring is None:
            return
        self._stop()
        step = state.global_step + 1  # the step whose update this follows
        self.clips += [(step, c) for c in self._clip.apply()]

    def on_train_end(self, args, state, control, **kwargs):
        self._stop()

    def _stop(self) -> None:
        """Close an open measurement (keeping what it recorded) and remove the hook."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._measuring is not None:
            measuring, self._measuring = self._measuring, None
            measuring.__exit__(None, None, None)
