"""Attention health during training: which statistics to log, when to raise the alarm, and when
the loss has diverged. Pure Python: no framework, no tensors; the callers
(:mod:`attnscale.integrations.hf`, :mod:`attnscale.integrations.tensorboard`) feed it the flat
``{"layer/statistic": float}`` dict of :meth:`attnscale.measure.monitor.Monitor.flat_stats`.

What is logged per layer (:data:`HEALTH_STATISTICS`), each as ``{prefix}/{layer}/{statistic}``:

* ``nonfinite_fraction``: the share of the layer's visible (query, key) logits ℓ (pre-softmax,
  after scaling) that are NaN or ±inf (q·k overflowed, or the weights hold NaN). Rows holding
  one drop out of the other statistics (:mod:`attnscale.measure.headstats`).
* ``max_abs_logit``: max |ℓ| over the layer's heads and visible (query, key) entries; +inf when
  any is NaN or ±inf. Wortsman et al. 2023 (arXiv:2309.14322) see it grow to about
  1e4 before attention-logit divergence in small transformers trained at large learning rates;
  Dehghani et al. 2023 (ViT-22B, arXiv:2302.05442) report the same failure at scale.
* ``logit_std``: the standard deviation of ℓ over visible entries, the s of the thread's theory
  (:mod:`attnscale.measure.theory`: softmax saturates once s passes s_c = √(2 ln n)).
* ``entropy_normalized``: H_i / ln n_i, H_i = −Σ_j p_ij ln p_ij the entropy of row i over its n_i
  visible keys; 1 is uniform attention, 0 one-hot. Zhai et al. 2023 (arXiv:2303.06296) tie
  training instability to its collapse ("entropy collapse").
* ``saturated_fraction``: the share of rows whose largest weight exceeds 0.9.
* ``z_loss``: the mean over rows of (ln Σ_j e^{ℓ_ij})², PaLM's auxiliary z-loss term
  (Chowdhery et al. 2022, arXiv:2204.02311) applied to the attention normalizer.

The means are row-weighted over heads (max over heads for ``max_abs_logit``, the mean over heads
for ``nonfinite_fraction``), as :func:`attnscale.measure.stats.flat_means` computes them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from attnscale.util.validate import check_float, check_int

__all__ = [
    "HEALTH_STATISTICS",
    "AlarmEvent",
    "AttentionAlarm",
    "AttentionHealthWarning",
    "HealthThresholds",
    "LossDivergence",
    "health_scalars",
    "split_key",
]

HEALTH_STATISTICS = ("nonfinite_fraction", "max_abs_logit", "logit_std", "entropy_normalized",
                     "saturated_fraction", "z_loss")
# Checked in this order: a non-finite or huge logit is the root cause, a collapsed entropy
# often its consequence.
ALARM_STATISTICS = ("nonfinite_fraction", "max_abs_logit", "entropy_normalized")


class AttentionHealthWarning(RuntimeWarning):
    """Issued once per layer when :class:`AttentionAlarm` fires. A category of its own, so a
    run can ignore it or make it fatal:
    ``warnings.simplefilter("error", AttentionHealthWarning)``."""


def check_prefix(prefix: object) -> str:
    """``prefix`` if it is a non-empty string without a leading or trailing "/"."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix or prefix != prefix.strip("/"):
        raise ValueError(f"prefix must be non-empty, without a leading or trailing '/'; got "
                         f"{prefix!r}")
    return prefix


def split_key(key: str) -> tuple[str, str]:
    """("layer", "statistic") of a flat key "layer/statistic" (layer names may hold "/")."""
    layer, sep, stat = key.rpartition("/")
    if not sep or not layer or not stat:
        raise ValueError(f"stats keys must look like 'layer/statistic', got {key!r}")
    return layer, stat


def health_scalars(flat: Mapping[str, float], prefix: str = "attention") -> dict[str, float]:
    """``{f"{prefix}/{layer}/{statistic}": value}`` for the :data:`HEALTH_STATISTICS` in
    ``flat`` (a :meth:`Monitor.flat_stats` dict), layers in their order there."""
    prefix = check_prefix(prefix)
    if not isinstance(flat, Mapping):
        raise TypeError(f"flat must be a mapping 'layer/statistic' -> float, got "
                        f"{type(flat).__name__}")
    out = {}
    for key, value in flat.items():
        layer, stat = split_key(key)
        if stat in HEALTH_STATISTICS:
            out[f"{prefix}/{layer}/{stat}"] = float(value)
    return out


@dataclass(frozen=True)
class HealthThresholds:
    """When :class:`AttentionAlarm` fires for a layer. It always fires when a layer has a
    logit that is NaN or ±inf (``nonfinite_fraction`` > 0), whatever the thresholds.

    Args:
        max_logit: fire when the layer's max |logit| exceeds it (or is not finite). 1e4 is where
            Wortsman et al. 2023 (arXiv:2309.14322, Fig. 1) find attention logits of small
            transformers before the loss diverges; healthy models sit orders of magnitude lower
            (all-MiniLM-L6-v2: 6-31 on short sentences).
        entropy_floor: fire when the layer's mean entropy / ln n falls below it. Default 0.1:
            a row at H = 0.1 · ln n spreads its weight over e^H = n^0.1 keys, under 2 keys
            for any n up to 1024, i.e. the layer attends one-hot almost everywhere -- the
            entropy collapse Zhai et al. 2023 (arXiv:2303.06296) observe in unstable runs. A
            trained, healthy model stays well above it (all-MiniLM-L6-v2's six layers: 0.45-0.75)
            and a freshly initialised one is near 1. Set 0 to switch the entropy check off.
    """

    max_logit: float = 1e4
    entropy_floor: float = 0.1

    def __post_init__(self) -> None:
        check_float("max_logit", self.max_logit, low=0.0)
        check_float("entropy_floor", self.entropy_floor, low=0.0, high=1.0, low_inclusive=True)


@dataclass(frozen=True)
class AlarmEvent:
    """One layer's alarm: at ``step``, ``statistic`` ("nonfinite_fraction", "max_abs_logit" or
    "entropy_normalized") had ``value``, beyond ``threshold`` (0 for nonfinite_fraction)."""

    step: int
    layer: str
    statistic: str
    value: float
    threshold: float

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


class AttentionAlarm:
    """Watches per-layer statistics and fires once per layer when attention turns unhealthy:
    a logit that is NaN or ±inf (``nonfinite_fraction`` > 0), max |logit| >
    ``thresholds.max_logit`` (or not finite), or entropy / ln n < ``thresholds.entropy_floor``;
    the first of these that holds is the event.

    Each firing is an :class:`AttentionHealthWarning` through :func:`warnings.warn`, once per
    layer. warnings rather than logging: the category can be filtered or escalated to an error
    by the caller (``warnings.simplefilter``) without touching logging configuration, pytest
    captures it, and it shows by default in a script or notebook where no logging handler is set
    up; the events are also kept here (:attr:`events`, :attr:`fired`) for loggers and records.

    Args:
        thresholds: a :class:`HealthThresholds` (default: its defaults).
        warn: issue the warning (False: record only).
    """

    def __init__(self, thresholds: HealthThresholds | None = None, warn: bool = True) -> None:
        if thresholds is None:
            thresholds = HealthThresholds()
        if not isinstance(thresholds, HealthThresholds):
            raise TypeError(f"thresholds must be a HealthThresholds, got "
                            f"{type(thresholds).__name__}")
        if not isinstance(warn, bool):
            raise TypeError(f"warn must be a bool, got {type(warn).__name__}")
        self.thresholds = thresholds
        self.warn = warn
        self.fired: dict[str, int] = {}  # layer -> the step it first fired
        self.events: list[AlarmEvent] = []

    def update(self, step: int, stats: Mapping[str, float]) -> list[AlarmEvent]:
        """Check one measurement at ``step``; ``stats`` is ``{"layer/statistic": float}``
        (:meth:`Monitor.flat_stats`, or :func:`health_scalars` keys, whose prefix is part of
        the layer name). Returns the events that fired now: at most one per layer, and none for
        a layer that fired before."""
        step = check_int("step", step, minimum=0)
        if not isinstance(stats, Mapping):
            raise TypeError(f"stats must be a mapping 'layer/statistic' -> float, got "
                            f"{type(stats).__name__}")
        layers: dict[str, dict[str, float]] = {}
        for key, value in stats.items():
            layer, stat = split_key(key)
            if stat in ALARM_STATISTICS:
                layers.setdefault(layer, {})[stat] = float(value)
        new = []
        for layer, values in layers.items():
            if layer in self.fired:
                continue
            event = self._check(step, layer, values)
            if event is not None:
                self.fired[layer] = step
                self.events.append(event)
                new.append(event)
                if self.warn:
                    warnings.warn(_message(event), AttentionHealthWarning, stacklevel=2)
        return new

    def _check(self, step: int, layer: str, values: Mapping[str, float]) -> AlarmEvent | None:
        """The event for this layer's values, or None when they are healthy."""
        nonfinite = values.get("nonfinite_fraction")
        if nonfinite is not None and nonfinite > 0:  # NaN (nothing scored) is not > 0
            return AlarmEvent(step, layer, "nonfinite_fraction", nonfinite, 0.0)
        logit = values.get("max_abs_logit")
        if logit is not None and (not math.isfinite(logit) or logit > self.thresholds.max_logit):
            return AlarmEvent(step, layer, "max_abs_logit", logit, self.thresholds.max_logit)
        entropy = values.get("entropy_normalized")
        if entropy is not None and entropy < self.thresholds.entropy_floor:
            return AlarmEvent(step, layer, "entropy_normalized", entropy,
                              self.thresholds.entropy_floor)
        return None

    @property
    def first_step(self) -> int | None:
        """The step of the first alarm, None if none fired."""
        return min(self.fired.values()) if self.fired else None

    def lead_time(self, diverged_step: int) -> int | None:
        """Steps from the first alarm to ``diverged_step`` (the step the loss diverged):
        ``diverged_step − first_step``; negative when the alarm came late, None when it never
        fired."""
        diverged_step = check_int("diverged_step", diverged_step, minimum=0)
        first = self.first_step
        return None if first is None else diverged_step - first

    def reset(self) -> None:
        """Forget every alarm (a new run)."""
        self.fired.clear()
        self.events.clear()


def _message(event: AlarmEvent) -> str:
    if event.statistic == "nonfinite_fraction":
        what = f"attention logits not finite ({event.value:.3g} of them NaN or ±inf)"
    elif event.statistic == "max_abs_logit" and not math.isfinite(event.value):
        what = f"attention logits not finite (max |logit| {event.value})"
    elif event.statistic == "max_abs_logit":
        what = f"max |attention logit| {event.value:.4g} > {event.threshold:.4g}"
    else:
        what = f"attention entropy / ln n {event.value:.3g} < {event.threshold:.3g} (collapse)"
    return (f"attention health alarm at step {event.step}, layer {event.layer}: {what}; "
            "reported once per layer")


class LossDivergence:
    """Decides when a training loss has diverged: the first logged step where the loss (or the
    gradient norm) is not finite, or the loss exceeds ``jump`` times the lowest loss logged
    before it (the ratio test needs a positive best loss).

    The ratio test is there because transformers' Trainer replaces a NaN/inf step loss by the
    running average (``logging_nan_inf_filter``, on by default), so a divergence often shows
    as a loss several times its best value and a non-finite gradient norm, never as a NaN loss.

    Args:
        jump: the loss ratio to the lowest earlier loss that counts as a divergence (> 1);
            None checks finiteness only. Default 2: a loss twice its best logged value.
    """

    def __init__(self, jump: float | None = 2.0) -> None:
        self.jump = None if jump is None else check_float("jump", jump, low=1.0)
        self.best: float | None = None
        self.diverged_step: int | None = None

    def update(self, step: int, loss: float | None, grad_norm: float | None = None) -> bool:
        """Take one logged (step, loss, grad_norm); returns whether the run has diverged (at
        this step or before). ``loss`` None (a log without a loss) changes nothing."""
        step = check_int("step", step, minimum=0)
        if self.diverged_step is not None or loss is None:
            return self.diverged_step is not None
        loss = float(loss)
        broken = not math.isfinite(loss) or (
            grad_norm is not None and not math.isfinite(float(grad_norm)))
        if not broken and self.jump is not None and self.best is not None and self.best > 0:
            broken = loss > self.jump * self.best
        if broken:
            self.diverged_step = step
        else:
            self.best = loss if self.best is None else min(self.best, loss)
        return broken

    def reset(self) -> None:
        self.best = None
        self.diverged_step = None
