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
* ``entropy_uniform``: the mean over rows of ln n_i, the entropy of uniform attention over the
  keys each row sees; s_c = √(2 ln n) is the freezing scale the alarm's ``frozen`` rule and
  ``attnscale check`` compare each head's logit std with.
* ``saturated_fraction``: the share of rows whose largest weight exceeds 0.9.
* ``z_loss``: the mean over rows of (ln Σ_j e^{ℓ_ij})², PaLM's auxiliary z-loss term
  (Chowdhery et al. 2022, arXiv:2204.02311) applied to the attention normalizer.

Per head (:func:`head_scalars`): ``max_abs_logit_head{h}``, each head's max |logit|, and
``logit_std_head{h}``, each head's logit std (what the ``frozen`` rule reads: one frozen head
is enough, and the layer's mean std hides it).

The alarm's rules (levels and growth rates, every one recorded each time it holds) are in
:mod:`attnscale.integrations.alarm`, re-exported here.

The means are row-weighted over heads (max over heads for ``max_abs_logit``, the mean over heads
for ``nonfinite_fraction``), as :func:`attnscale.measure.stats.flat_means` computes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from attnscale.integrations.alarm import (
    RULES,
    AlarmEvent,
    AttentionAlarm,
    AttentionHealthWarning,
    HealthThresholds,
    split_key,
)
from attnscale.util.validate import check_float, check_int

__all__ = [
    "HEAD_STATISTICS",
    "HEALTH_STATISTICS",
    "RULES",
    "AlarmEvent",
    "AttentionAlarm",
    "AttentionHealthWarning",
    "HealthThresholds",
    "LossDivergence",
    "head_scalars",
    "health_scalars",
    "per_head_scalars",
    "split_key",
]

HEALTH_STATISTICS = ("nonfinite_fraction", "max_abs_logit", "logit_std", "entropy_normalized",
                     "entropy_uniform", "saturated_fraction", "z_loss")
HEAD_STATISTICS = ("max_abs_logit", "logit_std")  # logged per head as "{statistic}_head{h}"


def check_prefix(prefix: object) -> str:
    """``prefix`` if it is a non-empty string without a leading or trailing "/"."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix or prefix != prefix.strip("/"):
        raise ValueError(f"prefix must be non-empty, without a leading or trailing '/'; got "
                         f"{prefix!r}")
    return prefix


def head_scalars(per_head: Mapping[str, Sequence[float]], prefix: str = "attention",
                 statistic: str = "max_abs_logit") -> dict[str, float]:
    """``{f"{prefix}/{layer}/{statistic}_head{h}": value}``: each head's value of ``per_head``
    ({layer: [one float per head]}, e.g. ``AttentionStats.max_abs_logit`` of
    :meth:`Monitor.stats`). The layer's ``max_abs_logit`` is the max of its heads'; the
    per-head values say which head grows (the names end in ``_head{h}``, so the alarm's layer
    rules, which read ``max_abs_logit``, do not count them twice; its ``frozen`` rule reads
    ``logit_std_head{h}``)."""
    prefix = check_prefix(prefix)
    if not isinstance(per_head, Mapping):
        raise TypeError(f"per_head must be a mapping layer -> per-head values, got "
                        f"{type(per_head).__name__}")
    if not isinstance(statistic, str) or not statistic or "/" in statistic:
        raise ValueError(f"statistic must be a non-empty name without '/', got {statistic!r}")
    return {f"{prefix}/{layer}/{statistic}_head{h}": float(v)
            for layer, values in per_head.items() for h, v in enumerate(values)}


def per_head_scalars(stats: Mapping[str, Any], prefix: str = "attention") -> dict[str, float]:
    """:func:`head_scalars` of every statistic of :data:`HEAD_STATISTICS` from ``stats``
    ({layer: :class:`attnscale.measure.headstats.AttentionStats`}, :meth:`Monitor.stats`)."""
    return {key: value for name in HEAD_STATISTICS
            for key, value in head_scalars({layer: list(getattr(s, name).tolist())
                                            for layer, s in stats.items()},
                                           prefix, name).items()}


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
