"""Training runs: one :class:`TrainConfig` in, one JSON-able :class:`RunResult` out.

The recipe is the small-scale-proxy setup of Wortsman et al. 2023 (arXiv 2309.14322): a pre-LN
:class:`attnscale.lab.models.GPT` without biases, AdamW with β = (0.9, 0.95) and ε = 1e-8, gradient
clipping at 1, independent weight decay 1e-4, optional z-loss, linear warmup then cosine decay.

* Learning rate at step t (0-based), peak η, warmup w, T steps, floor η_min = min_lr_ratio·η::

      η_t = η·(t+1)/w                                          for t < w
      η_t = η_min + ½(η − η_min)(1 + cos(π (t − w)/(T − w)))   otherwise

* Independent weight decay (Wortsman et al. 2023, §3.2.2): each step multiplies a weight matrix
  by 1 − (η_t/η)·λ, i.e. the decay follows the schedule but not the peak learning rate. With
  PyTorch's AdamW (which decays by η_t·wd) this is wd = λ/η. Only the weights of linear and
  embedding layers decay; LayerNorm weights and learnable score parameters do not.
* z-loss (PaLM, Chowdhery et al. 2022; Wortsman et al. 2023 use 1e-4): loss += z_loss·mean(log Z)²
  where log Z = logsumexp of the output logits at the labelled positions.
* Divergence: a run stops, with status ``"diverged"`` and its ``diverged_step``, when the training
  loss or the gradient norm is NaN/inf, or when, from step :data:`DIVERGENCE_GRACE_STEPS` on, the
  loss exceeds ``divergence_factor`` × the loss of step 0 (default 3: for cross-entropy the step-0
  loss is about ln(vocab), a uniform guess, so 3× that is a model far worse than guessing, which
  an ordinary loss spike does not reach; the grace steps let warmup transients pass). The update
  of the divergent step is not applied. :func:`run` never raises for divergence.
* QK-Clip (``qk_clip`` = τ, off by default; Kimi Team 2025, arXiv:2507.20534): the training
  forward of each step is monitored, and after the optimizer step every head whose max |logit|
  on that batch exceeded τ has its W_q and W_k rows scaled by √(τ/max)
  (:mod:`attnscale.integrations.qkclip`). As in K2 the maxima are those of the weights before
  the update, so the next step's logits are bounded by τ up to what one update adds. History
  rows then hold ``qk_clipped``: the (step, head) clips since the previous row.
* Logging: every ``log_every`` steps (and at the last step) a history row records the state at
  the *start* of that step: step, loss (mean training loss since the previous row), lr,
  grad_norm, and per layer the attention statistics of :class:`attnscale.measure.monitor.Monitor`
  (max |logit|, entropy, max weight, ...) and the RMS of q and k, from one extra no-grad forward
  of the current batch's first ``stats_batch`` (16) sequences (16 sequences of 64 tokens are
  1024 query rows per head; the whole batch would double the cost of logging). Every
  ``eval_every`` steps a row also holds the eval loss and metric.
* Attention alarm: with ``stats`` on, every history row's per-layer statistics go to an
  :class:`attnscale.integrations.alarm.AttentionAlarm` with its shipped rules (a NaN logit, max
  |logit| above 1e4, fast logit growth, frozen heads: docs/alarm.md). :func:`run` issues one
  :class:`~attnscale.integrations.alarm.AttentionHealthWarning` at the end of a run on which a
  rule fired, naming each layer, rule and first step (so ``attnscale train`` never ends a run
  whose attention blew up with a silent "done"), logs the first firing at INFO (logger
  ``attnscale.lab.train``), and the record keeps the alarm (``RunResult.alarm``). The rows are
  sampled every ``log_every`` steps, from the extra no-grad forward, so the growth rule fits
  its slope over the rows of its window (the last two when they are further apart).
* TensorBoard (``run(..., tensorboard=DIR)``, ``attnscale train --tensorboard DIR``): each history
  row also goes to event files in DIR; tags in :mod:`attnscale.lab.runlog`, which also computes
  the per-layer statistics of the rows.
* Determinism: the model is initialized from ``torch.manual_seed(seed)`` and the task's batches
  are a function of (seed, step), so the same config on the same machine gives identical
  metrics. ``threads`` (default 1) sets torch's intra-op threads during the run: on a busy
  machine small multi-threaded ops are much slower than single-threaded ones.
* Speed without a change of recipe: subnormal floats are flushed to zero during a run
  (:func:`flush_denormals`), a :class:`GPT` computes its readout only at the labelled positions,
  in training and in evaluation (:func:`labelled_logits`), and AdamW is torch's fused kernel
  (:func:`build_optimizer`); each changes results by float rounding only. A process draws a
  task's batches once for every run of the same task settings and seed
  (:mod:`attnscale.lab.tasks.cache`), which changes nothing at all.

The defaults are the MQAR quick config (see :class:`attnscale.lab.config.TrainConfig`).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnscale.integrations.alarm import AttentionAlarm, AttentionHealthWarning
from attnscale.integrations.qkclip import QKClip
from attnscale.integrations.tensorboard import ScalarWriter
from attnscale.lab.build import (
    absorb_factor,
    build_model,
    build_optimizer,
    build_task,
    clip_gradients,
    lr_at,
    qk_projections,
)
from attnscale.lab.config import TrainConfig
from attnscale.lab.evaluation import evaluate, evaluate_log_n, labelled_logits, main_eval_set
from attnscale.lab.models import GPTConfig
from attnscale.lab.runlog import (
    LAYER_STATS,
    TENSORBOARD_EXTRA,
    alarm_stats,
    attention_names,
    attention_rows,
    head,
    open_tensorboard,
    tensorboard_available,
    write_row,
)
from attnscale.lab.tasks import Batch
from attnscale.util import provenance
from attnscale.util.jsonio import jsonable

__all__ = [
    "DIVERGENCE_GRACE_STEPS",
    "LAYER_STATS",
    "TENSORBOARD_EXTRA",
    "RunResult",
    "TrainConfig",
    "Trainer",
    "absorb_factor",
    "alarm_message",
    "attention_rows",
    "build_model",
    "build_optimizer",
    "build_task",
    "evaluate",
    "head",
    "lr_at",
    "open_tensorboard",
    "qk_projections",
    "run",
    "tensorboard_available",
]

DIVERGENCE_GRACE_STEPS = 10
LOGGER = logging.getLogger(__name__)

Progress = Callable[[int, float], None]  # (steps done, training loss of the last step)


@dataclass
class RunResult:
    """The record of one run. ``to_dict()`` is JSON-serializable (NaN/inf become None).

    ``final_loss`` / ``final_metric``: eval-set cross-entropy (nats per labelled position) and the
    task's metric (``metric_name``) of the final weights, on the task's first eval set (for
    ``length``, the training length); ``final_metrics`` has both for every eval set (``length``:
    one per eval length, and for a model of scaled scores each length past n again with the
    log-n factor, ``log_n:n=<L>``: :func:`attnscale.lab.evaluation.evaluate_log_n`). A diverged
    run is evaluated as it stands (None if its weights are not finite). ``steps`` counts
    applied optimizer updates; ``initial_loss`` is the step-0 loss.
    ``tensorboard``: the folder the run wrote TensorBoard event files to, if any.
    ``alarm``: what the attention alarm saw (:meth:`Trainer.alarm_record`): its first step
    (None: it never fired), the first step of each (layer, rule) and how often each rule held.
    """

    status: Literal["done", "diverged"]
    final_loss: float | None
    final_metric: float | None
    final_metrics: dict[str, dict[str, float | None]]
    metric_name: str
    diverged_step: int | None
    steps: int
    initial_loss: float | None
    history: list[dict[str, Any]]
    config: dict[str, Any]
    task: dict[str, Any]
    model: dict[str, Any]
    seed: int
    versions: dict[str, str]
    git_rev: str
    elapsed_s: float
    num_params: int = 0
    tensorboard: str | None = None
    alarm: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable data."""
        return jsonable(asdict(self))


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def losses(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(cross-entropy, mean (log Z)²) of logits (N, V) against labels (N,)."""
    log_z = torch.logsumexp(logits, dim=-1)  # (N,)
    return F.cross_entropy(logits, labels), (log_z * log_z).mean()


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, restoring the old value after."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextmanager
def flush_denormals() -> Iterator[None]:
    """Run the block with subnormal floats flushed to zero (``torch.set_flush_denormal``).

    On x86 arithmetic on a subnormal (|x| < 1.2e-38 in float32) is tens of times slower, and
    the softmax of large logits underflows into them: an unscaled run at d_k = 256 took 1.5×
    as long as with flushing. A value that small moves no loss or statistic. Where the CPU
    cannot flush (no SSE3), the block runs as before. Flushing is off after the block (torch
    cannot read the setting, so an earlier ``set_flush_denormal(True)`` is not restored)."""
    flushed = torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushed:
            torch.set_flush_denormal(False)


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------


class Trainer:
    """One run, one step at a time (``run`` drives it; the overhead benchmark interleaves two).

    ``model`` replaces the :class:`GPT` that ``config`` describes (it must map (tokens, scale)
    to logits (B, T, V)); attention statistics are logged for its MultiheadSelfAttention modules.
    ``writer`` (a TensorBoard ``SummaryWriter`` or anything with its ``add_scalar``) also
    receives every history row (module docstring).
    """

    def __init__(self, config: TrainConfig, model: nn.Module | None = None,
                 writer: ScalarWriter | None = None) -> None:
        self.config = config
        self.task = build_task(config)
        self.model = build_model(config, self.task) if model is None else model
        self.model.train()
        self.optimizer = build_optimizer(self.model, config)
        self.history: list[dict[str, Any]] = []
        self.next_step = 0
        self.initial_loss: float | None = None
        self.diverged_step: int | None = None
        self.writer = writer
        self._window: list[float] = []  # training losses since the last history row
        clip = config.optim.qk_clip
        self.qk_clip = None if clip is None else QKClip(self.model, clip)
        self._clipped = 0  # heads clipped since the last history row
        # the shipped rules, fed each history row's layers; run() warns once, at the end
        self.alarm = AttentionAlarm(warn=False)
        self._layer_names = attention_names(self.model)

    @property
    def done(self) -> bool:
        """True after the last step or a divergence."""
        return self.diverged_step is not None or self.next_step >= self.config.optim.steps

    def step(self) -> float:
        """One optimizer step; returns its training loss (cross-entropy, without z-loss)."""
        cfg, s = self.config, self.next_step
        batch = self.task.train_batch(s, cfg.optim.batch_size)
        lr = lr_at(s, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        with nullcontext() if self.qk_clip is None else self.qk_clip.measure():
            ce, z = losses(*labelled_logits(self.model, batch))
        self.optimizer.zero_grad(set_to_none=True)
        (ce + cfg.optim.z_loss * z if cfg.optim.z_loss else ce).backward()
        grad_norm = clip_gradients(self.model, cfg)  # exact under absorb_scale (lab.build)
        loss = ce.item()
        if self.initial_loss is None:
            self.initial_loss = loss
        self._window.append(loss)
        diverged = self._diverged(s, loss, grad_norm)
        last = s == cfg.optim.steps - 1
        if diverged or s % cfg.run.log_every == 0 or last or self._eval_due(s):
            self.history.append(self._row(s, batch, lr, grad_norm, z.item(), diverged))
            if self.writer is not None:
                sample = head(batch, cfg.run.stats_batch) if cfg.run.stats else None
                write_row(self.writer, self.history[-1], self.model, sample)
        if diverged:
            self.diverged_step = s
        else:
            self.optimizer.step()
            if self.qk_clip is not None:
                self._clipped += len(self.qk_clip.apply())
            self.next_step = s + 1
        return loss

    def _diverged(self, step: int, loss: float, grad_norm: float) -> bool:
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return True
        limit = self.config.run.divergence_factor * (self.initial_loss or math.inf)
        return step >= DIVERGENCE_GRACE_STEPS and loss > limit

    def _eval_due(self, step: int) -> bool:
        every = self.config.run.eval_every
        return every is not None and step % every == 0

    def _row(
        self, step: int, batch: Batch, lr: float, grad_norm: float, z: float, diverged: bool
    ) -> dict[str, Any]:
        row: dict[str, Any] = {
            "step": step,
            "loss": float(np.mean(self._window)),
            "lr": lr,
            "grad_norm": grad_norm,
            "log_z_sq": z,
        }
        self._window = []
        if self.qk_clip is not None:
            row["qk_clipped"], self._clipped = self._clipped, 0
        if diverged:
            row["diverged"] = True
        if self._eval_due(step):
            results = evaluate(self.model, self.task)
            main = results[main_eval_set(self.task, results)]
            row.update(eval_loss=main["loss"], eval_metric=main["metric"])
            if len(results) > 1:
                row["eval_metrics"] = {k: v["metric"] for k, v in results.items()}
        if self.config.run.stats:
            layers = attention_rows(self.model, head(batch, self.config.run.stats_batch))
            if layers:
                row["layers"] = layers
                logits = [r["max_abs_logit"] for r in layers if r["max_abs_logit"] is not None]
                row["max_abs_logit"] = max(logits) if logits else None
                self._watch(step, layers)
        return row

    def _watch(self, step: int, layers: list[dict[str, Any]]) -> None:
        """Feed one row's layers to the alarm; log the first firing when it happens."""
        first = self.alarm.first_step is None
        events = self.alarm.update(step, alarm_stats(self._layer_names, layers))
        if events and first:
            LOGGER.info("attention alarm at step %d: %s", step,
                           "; ".join(f"{e.layer} {e.rule}" for e in events))

    def alarm_record(self) -> dict[str, Any]:
        """The alarm's findings, JSON-ready: ``alarm_step`` (first firing, None if none),
        ``fired`` ({layer: first step}), ``rule_steps`` ({rule: first step}), ``rule_counts``
        (how many (row, layer) pairs each rule held on) and ``first`` (the first event of each
        (layer, rule), as dicts)."""
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for event in self.alarm.events:
            seen.setdefault((event.layer, event.rule), event.to_dict())
        return {"alarm_step": self.alarm.first_step, "fired": dict(self.alarm.fired),
                "rule_steps": dict(self.alarm.rule_steps), "rule_counts": self.alarm.counts(),
                "first": list(seen.values())}

    def result(self, elapsed_s: float) -> RunResult:
        """Evaluate the final weights and assemble the record."""
        results = evaluate(self.model, self.task)
        main = results[main_eval_set(self.task, results)]
        results.update(evaluate_log_n(self.model, self.task))  # past n, with the log-n factor
        model_config = getattr(self.model, "config", None)
        return RunResult(
            status="diverged" if self.diverged_step is not None else "done",
            final_loss=main["loss"],
            final_metric=main["metric"],
            final_metrics=results,
            metric_name=self.task.metric_name,
            diverged_step=self.diverged_step,
            steps=self.next_step,
            initial_loss=self.initial_loss,
            history=self.history,
            config=self.config.flat(),
            task=self.task.config,
            model=asdict(model_config) if isinstance(model_config, GPTConfig) else {},
            seed=self.config.seed,
            versions=provenance.versions(),
            git_rev=provenance.git_revision(),
            elapsed_s=elapsed_s,
            num_params=sum(p.numel() for p in self.model.parameters()),
            alarm=self.alarm_record(),
        )


def run(config: TrainConfig | Mapping[str, Any], progress: Progress | None = None,
        tensorboard: str | Path | None = None) -> RunResult:
    """Train one model as ``config`` says and return its record; never raises for divergence.

    ``progress(steps_done, loss)`` is called after every step (the CLI drives its bar with it).
    ``tensorboard``: a folder to write TensorBoard event files to (module docstring), noted in
    the record. Bad configs raise ValueError (pydantic's ValidationError) before anything runs.
    """
    cfg = config if isinstance(config, TrainConfig) else TrainConfig(**config)
    writer = None if tensorboard is None else open_tensorboard(tensorboard)
    start = time.perf_counter()
    try:
        with num_threads(cfg.run.threads), flush_denormals():
            trainer = Trainer(cfg, writer=writer)
            while not trainer.done:
                loss = trainer.step()
                if progress is not None:
                    progress(trainer.next_step, loss)
            result = trainer.result(time.perf_counter() - start)
    finally:
        if writer is not None:
            writer.close()  # flushes the event file
    result.tensorboard = None if tensorboard is None else str(tensorboard)
    if result.alarm and result.alarm["alarm_step"] is not None:
        warnings.warn(alarm_message(result), AttentionHealthWarning, stacklevel=2)
    return result


def alarm_message(result: RunResult) -> str:
    """One paragraph: the run's status and, per layer, each rule that fired and its first step
    (with the value that crossed its threshold), then the largest max |logit| logged."""
    alarm = result.alarm or {}
    parts = []
    for e in alarm.get("first", []):
        value = f"{e['value']:.3g} vs {e['threshold']:.3g}"
        parts.append(f"{e['layer']}: {e['rule']} from step {e['step']} ({value})")
    peak = [r["max_abs_logit"] for r in result.history if r.get("max_abs_logit") is not None]
    tail = f"; largest max |logit| logged {max(peak):.4g}" if peak else ""
    return (f"attention health alarm during training (run {result.status}, first at step "
            f"{alarm.get('alarm_step')}): " + "; ".join(parts) + tail
            + ". See docs/alarm.md; the run record's 'alarm' has every step.")
