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

What reaches the Trainer's loggers: given the Trainer (``QKClipCallback(tau, trainer=trainer)``
or :meth:`QKClipCallback.attach`), at each step the Trainer logs its loss, the callback logs
through ``trainer.log`` (every ``report_to`` backend: TensorBoard under ``train/qkclip/...``)
``qkclip/{layer}/clipped_heads`` (head clips since the previous log), ``qkclip/{layer}/max_logit``
(the largest max |logit| S_h measured since then, before clipping: how far past τ the heads
pushed) and ``qkclip/clipped_heads`` (all layers). Like the health callback it keeps them off
the console unless ``verbose=True`` (:func:`attnscale.integrations.hf.log_to_reporters`).
Without the Trainer the clips are in :attr:`QKClipCallback.clips` and :meth:`record` only.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn
from transformers import TrainerCallback

from attnscale.integrations.hf import attach_callback, log_to_reporters
from attnscale.integrations.qkclip import KIMI_K2_TAU, HeadClip, QKClip, check_tau
from attnscale.integrations.tensorboard import padding_query_mask

__all__ = ["QKClipCallback"]

LOGGER = logging.getLogger(__name__)


class QKClipCallback(TrainerCallback):
    """Kimi K2's QK-Clip at threshold ``tau`` after every optimizer step (module docstring).

    Args:
        tau: the threshold τ on each head's max |logit|.
        trainer: the ``transformers.Trainer`` to log clip counts and maxima through (module
            docstring); the callback adds itself to it. None: :meth:`attach` it, or the clips
            stay in :attr:`clips` only.
        verbose: also print the logged values on the console.

    After training: :attr:`clips`, (global step, :class:`HeadClip`) for every clipped head, and
    :meth:`record`. A model with attention QK-Clip cannot rescale fails at ``on_train_begin``
    (attnscale and ``torch.nn`` attention) or at the first step (Hugging Face modules), with a
    ValueError naming the module."""

    def __init__(self, tau: float = KIMI_K2_TAU, *, trainer: Any = None,
                 verbose: bool = False) -> None:
        self.tau = check_tau(tau)
        if not isinstance(verbose, bool):
            raise TypeError(f"verbose must be a bool, got {type(verbose).__name__}")
        self.verbose = verbose
        self.clips: list[tuple[int, HeadClip]] = []
        self.trainer: Any = None
        self._clip: QKClip | None = None
        self._measuring: Any = None
        self._hook: Any = None
        self._pending: dict[str, list[float]] = {}  # layer -> [clips, max S_h] since last log
        if trainer is not None:
            self.attach(trainer)

    def attach(self, trainer: Any) -> QKClipCallback:
        """Log through ``trainer`` (a ``transformers.Trainer``) and add this callback to it
        unless it is there already."""
        self.trainer = attach_callback(self, trainer)
        return self

    def record(self) -> dict[str, Any]:
        """JSON-ready: tau, and every clip as {"step", "layer", "head", "max_logit", "gamma"}."""
        return {"tau": self.tau,
                "clips": [{"step": step, **c.to_dict()} for step, c in self.clips]}

    def on_train_begin(self, args, state, control, model: nn.Module | None = None, **kwargs):
        self._stop()
        self._clip = QKClip(model, self.tau)
        self._pending = {}
        if self.trainer is None:
            LOGGER.info("QKClipCallback has no Trainer to log through: clips are kept in "
                        ".clips and .record() only; pass trainer= or call attach(trainer)")

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
        clipped = self._clip.apply()
        self.clips += [(step, c) for c in clipped]
        for layer, maxima in self._clip.last_max_logit.items():
            pending = self._pending.setdefault(layer, [0.0, float("-inf")])
            pending[0] += sum(c.layer == layer for c in clipped)
            pending[1] = max(pending[1], float(maxima.max(initial=float("-inf"))))

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer is None or not control.should_log or not self._pending:
            return
        values = {f"qkclip/{layer}/{name}": value for layer, (clips, top) in self._pending.items()
                  for name, value in (("clipped_heads", clips), ("max_logit", top))}
        values["qkclip/clipped_heads"] = sum(clips for clips, _ in self._pending.values())
        self._pending = {}
        log_to_reporters(self.trainer, values, console=self.verbose)

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
