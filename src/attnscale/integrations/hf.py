"""Attention health inside a Hugging Face ``Trainer``: a callback that measures one training step
in ``every_n_steps`` through :class:`attnscale.measure.monitor.Monitor`, logs it through the
Trainer's own ``log`` (so every ``report_to`` backend receives it) and raises an alarm before the
loss diverges.

    trainer = Trainer(model=model, args=TrainingArguments(..., report_to=["tensorboard"]), ...)
    health = AttentionHealthCallback(trainer, every_n_steps=50, stop=False)  # registers itself
    trainer.train()
    health.record()   # {"alarm_step": ..., "diverged_step": ..., "lead_time": ..., ...}

How a sampled step is measured: the Monitor wraps the step's own training forward (entered at
``on_step_begin``, left at ``on_step_end``), so no extra forward pass runs. Under autograd (and
with attention dropout) the Monitor lets the model's own SDPA call compute the output and
computes the statistics beside it from the detached q and k: the training output, the loss and
the gradients are those of an unmonitored step (tests check bitwise equality of the trained
weights). The statistics are of the logits of that step's batch (all its micro-batches under
gradient accumulation), with padding query rows left out; attention dropout acts after the
softmax and does not touch them. Outside sampled steps no hook is installed.

How the values reach ``report_to``: transformers calls the reporting callbacks (TensorBoard,
W&B, ...) before user callbacks, and a callback gets no trainer handle, so editing the ``logs``
dict in ``on_log`` would come too late for them. The callback therefore keeps a reference to
the Trainer (given to the constructor or :meth:`AttentionHealthCallback.attach`) and calls
``trainer.log(values)`` in ``on_step_end`` of a sampled step, as TRL's callbacks do; the
Trainer adds the entry to ``state.log_history`` and every reporter writes it at that global
step (TensorBoard under ``train/attention/...``). ``trainer.log`` resets ``control.should_log``,
which the callback restores, so the Trainer's own loss log of that step still happens.

Not on the console (:func:`log_to_reporters`): ``trainer.log`` also reaches the Trainer's console
callbacks (``ProgressCallback``, ``PrinterCallback``, the notebook's), which print every log
dict: over a thousand characters of statistics at every sampled step. Unless ``verbose=True``,
they are left out of that one call (the handler's callback list is swapped for the call and
restored), so TensorBoard, W&B and every other ``report_to`` backend, ``state.log_history`` and
any user callback still receive the values, and the console shows the Trainer's own loss logs
and the alarm's warnings only. A one-line summary goes to the ``logging`` logger
``attnscale.integrations.hf`` at INFO (silent unless logging is configured).

Under data parallelism (DDP, ``torchrun``): each rank measures its own batch and the statistics
are pooled across ranks at the sampled step's end
(:func:`attnscale.measure.distributed.all_reduce_monitor`: sums add, max |logit| takes the max,
so means are weighted by rows), so every rank logs, judges and records the same numbers; only
the main process's reporters write them (the Trainer's own rule). The alarm therefore fires at
the same step on every rank and ``stop=True`` ends every rank there together; the logged loss
the divergence test reads is already averaged across ranks by the Trainer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from torch import nn
from transformers import TrainerCallback

from attnscale.integrations.health import (
    AttentionAlarm,
    HealthThresholds,
    LossDivergence,
    check_prefix,
    health_scalars,
    per_head_scalars,
)
from attnscale.integrations.tensorboard import padding_query_mask
from attnscale.measure.distributed import all_reduce_monitor
from attnscale.measure.monitor import Monitor
from attnscale.util.validate import check_int

__all__ = ["CONSOLE_CALLBACKS", "AttentionHealthCallback", "attach_callback", "log_to_reporters"]

LOGGER = logging.getLogger(__name__)
# the Trainer's callbacks that print every log dict to the console (transformers 4.x and 5.x)
CONSOLE_CALLBACKS = ("ProgressCallback", "PrinterCallback", "NotebookProgressCallback")


def attach_callback(callback: Any, trainer: Any) -> Any:
    """Add ``callback`` to ``trainer`` (a ``transformers.Trainer``) unless it is there already
    (e.g. passed as ``Trainer(callbacks=[...])``); returns ``trainer``. TypeError naming
    ``trainer`` when it is not one (it needs ``log`` and ``callback_handler``)."""
    handler = getattr(trainer, "callback_handler", None)
    if not callable(getattr(trainer, "log", None)) or handler is None:
        raise TypeError(f"trainer must be a transformers.Trainer, got {type(trainer).__name__}")
    if not any(cb is callback for cb in handler.callbacks):
        trainer.add_callback(callback)
    return trainer


def log_to_reporters(trainer: Any, values: Mapping[str, float], console: bool = False) -> None:
    """``trainer.log(values)``, so every ``report_to`` backend (TensorBoard, W&B, ...),
    ``state.log_history`` and every callback receive ``values``; with ``console`` False, the
    callbacks of :data:`CONSOLE_CALLBACKS` (and their subclasses), which print each log dict,
    are left out of this one call. The Trainer's ``control.should_log``, which ``trainer.log``
    clears, is kept, so the Trainer's own loss log of the step still happens."""
    handler = trainer.callback_handler
    control = getattr(trainer, "control", None)
    should_log = getattr(control, "should_log", None)
    kept = handler.callbacks
    if not console:
        handler.callbacks = [cb for cb in kept if not any(
            c.__name__ in CONSOLE_CALLBACKS for c in type(cb).__mro__)]
    try:
        trainer.log(dict(values))
    finally:
        handler.callbacks = kept  # the same list object: add/remove_callback still act on it
    # trainer.log replaced trainer.control by the handler's return: the same object, cleared
    control = getattr(trainer, "control", control)
    if should_log is not None and control is not None:
        control.should_log = should_log


class AttentionHealthCallback(TrainerCallback):
    """Per-layer attention health every ``every_n_steps`` optimizer steps, with an alarm.

    Logged at each sampled step s (steps every_n_steps, 2·every_n_steps, ...), through
    ``trainer.log`` to every ``report_to`` backend: ``{prefix}/{layer}/{statistic}`` for the
    statistics of :data:`attnscale.integrations.health.HEALTH_STATISTICS` (the share of
    non-finite logits, max |logit|, logit std, entropy / ln n, mean ln n, saturated fraction,
    z-loss), each head's max |logit| and logit std as ``{prefix}/{layer}/max_abs_logit_head{h}``
    and ``{prefix}/{layer}/logit_std_head{h}``, and ``{prefix}/alarms``, the number of layers
    on which a rule has fired so far. The alarm (:class:`AttentionAlarm`) checks levels and
    growth rates at each sampled step and records every rule each time it holds; its rate
    rules fit a slope over the samples of the last ``thresholds.growth_window`` steps (the last
    two samples when ``every_n_steps`` is longer).

    Args:
        trainer: the ``transformers.Trainer`` to log through; the callback adds itself to it.
            None: call :meth:`attach` before training.
        every_n_steps: measure one optimizer step in this many.
        thresholds: when the alarm fires (:class:`HealthThresholds`, its defaults tuned on the
            zoo of ``benchmarks/alarm_zoo.py``).
        stop: end training (``control.should_training_stop``) at the step the alarm fires.
        prefix: the first part of every logged key.
        loss_jump: the loss divergence test (:class:`LossDivergence`): a logged loss above
            ``loss_jump`` times the lowest earlier one, or a non-finite loss or gradient norm;
            None: non-finite only.
        warn: issue an :class:`AttentionHealthWarning` once per (layer, rule) when it fires.
        verbose: also print the statistics on the console (the Trainer's progress or printer
            callback). False: they reach every ``report_to`` backend and
            ``state.log_history``, and the console shows nothing of them
            (:func:`log_to_reporters`).

    After training: :attr:`alarm` (its ``fired`` {layer: step} and ``events``),
    :attr:`alarm_step`, :attr:`diverged_step`, :attr:`lead_time`, :attr:`history` (step,
    values) of every sampled step, and :meth:`record`.
    """

    def __init__(self, trainer: Any = None, *, every_n_steps: int = 50,
                 thresholds: HealthThresholds | None = None, stop: bool = False,
                 prefix: str = "attention", loss_jump: float | None = 2.0,
                 warn: bool = True, verbose: bool = False) -> None:
        self.every_n_steps = check_int("every_n_steps", every_n_steps, minimum=1)
        for name, flag in (("stop", stop), ("verbose", verbose)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        self.verbose = verbose
        self.prefix = check_prefix(prefix)
        self.stop = stop
        self.alarm = AttentionAlarm(thresholds, warn=warn)
        self.divergence = LossDivergence(loss_jump)
        self.history: list[tuple[int, dict[str, float]]] = []
        self.stopped_at: int | None = None
        self.trainer: Any = None
        self._monitor: Monitor | None = None
        self._hook: Any = None
        if trainer is not None:
            self.attach(trainer)

    def attach(self, trainer: Any) -> AttentionHealthCallback:
        """Log through ``trainer`` (a ``transformers.Trainer``) and add this callback to it
        unless it is there already (e.g. passed as ``Trainer(callbacks=[...])``)."""
        self.trainer = attach_callback(self, trainer)
        return self

    # -- what the run found -------------------------------------------------------------------

    @property
    def alarm_step(self) -> int | None:
        """The step of the first alarm (None: it never fired)."""
        return self.alarm.first_step

    @property
    def diverged_step(self) -> int | None:
        """The logged step at which the loss diverged (:class:`LossDivergence`), or None."""
        return self.divergence.diverged_step

    @property
    def lead_time(self) -> int | None:
        """diverged_step − alarm_step: how many steps the alarm came before the divergence
        (negative: after it); None unless both happened."""
        diverged = self.diverged_step
        return None if diverged is None else self.alarm.lead_time(diverged)

    def record(self) -> dict[str, Any]:
        """What the run found, JSON-ready."""
        return {
            "every_n_steps": self.every_n_steps,
            "thresholds": asdict(self.alarm.thresholds),
            "alarm_step": self.alarm_step,
            "fired": dict(self.alarm.fired),
            "rule_steps": dict(self.alarm.rule_steps),
            "rule_counts": self.alarm.counts(),
            "events": [event.to_dict() for event in self.alarm.events],
            "events_dropped": self.alarm.dropped,
            "diverged_step": self.diverged_step,
            "lead_time": self.lead_time,
            "stopped_at": self.stopped_at,
            "sampled_steps": [step for step, _ in self.history],
        }

    # -- Trainer events -----------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model: nn.Module | None = None, **kwargs):
        if self.trainer is None:
            raise RuntimeError(
                "AttentionHealthCallback logs through the Trainer: create it with "
                "AttentionHealthCallback(trainer, ...) or call callback.attach(trainer)")
        self._close()  # a monitor left open by a run that raised
        with Monitor(model):  # fails now, not at the first sampled step, on a model it can't watch
            pass

    def on_step_begin(self, args, state, control, model: nn.Module | None = None, **kwargs):
        if (state.global_step + 1) % self.every_n_steps == 0:
            self._open(model)

    def on_step_end(self, args, state, control, **kwargs):
        if self._monitor is None:
            return
        flat, heads = self._close(pooled=True)
        step = state.global_step
        values = {**health_scalars(flat, self.prefix), **heads}
        # the alarm reads the layer statistics and each head's logit std, named by layer alone
        events = self.alarm.update(step, {**flat, **{k.removeprefix(f"{self.prefix}/"): v
                                                    for k, v in heads.items()}})
        self.history.append((step, values))
        alarms = float(len(self.alarm.fired))
        log_to_reporters(self.trainer, {**values, f"{self.prefix}/alarms": alarms},
                         console=self.verbose)
        LOGGER.info("%s", _summary(step, flat, alarms))
        if events and self.stop:
            control.should_training_stop = True
            self.stopped_at = step

    def on_log(self, args, state, control, logs: dict[str, float] | None = None, **kwargs):
        if logs and "loss" in logs:
            self.divergence.update(state.global_step, logs["loss"], logs.get("grad_norm"))

    def on_train_end(self, args, state, control, **kwargs):
        self._close()

    # -- the monitor of a sampled step --------------------------------------------------------

    def _open(self, model: nn.Module) -> None:
        monitor = Monitor(model)

        def padding_rows(module, args, kwargs):  # each forward: that batch's padding rows
            monitor.query_mask = padding_query_mask(module, kwargs)

        monitor.__enter__()
        self._hook = model.register_forward_pre_hook(padding_rows, with_kwargs=True)
        self._monitor = monitor

    def _close(self, pooled: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """Remove the hooks; the flat statistics recorded (:meth:`Monitor.flat_stats`, where a
        layer with non-finite logits reads nonfinite_fraction > 0 and max_abs_logit inf) and
        the per-head ones (:func:`per_head_scalars`, under the prefix); ({}, {}) if no monitor
        was open. ``pooled``: under
        torch.distributed, first pool every rank's recording (a collective, so only at a
        sampled step's end, which every rank reaches together; never in the clean-up paths)."""
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return {}, {}
        self._hook.remove()
        monitor.__exit__(None, None, None)
        if pooled:
            all_reduce_monitor(monitor)
        return monitor.flat_stats(), per_head_scalars(monitor.stats(), self.prefix)


def _summary(step: int, flat: Mapping[str, float], alarms: float) -> str:
    """One line for the logger: the step, the largest max |logit| and the lowest entropy / ln n
    over the layers, and how many layers have alarmed."""
    def pick(stat: str, best: Any) -> float:
        values = [v for k, v in flat.items() if k.rsplit("/", 1)[-1] == stat and not math.isnan(v)]
        return best(values) if values else math.nan
    return (f"attention at step {step}: max |logit| {pick('max_abs_logit', max):.4g}, "
            f"lowest entropy / ln n {pick('entropy_normalized', min):.3g}, "
            f"{alarms:.0f} layer(s) alarmed")
