"""What a training run logs besides its loss: per-layer attention statistics, and TensorBoard.

* Attention statistics (:func:`attention_rows`): for each ``MultiheadSelfAttention`` layer, the
  means of :data:`LAYER_STATS` from :class:`attnscale.measure.monitor.Monitor` (the pre-softmax
  scores after scaling and masking, and their softmax pattern), the RMS √mean(x²) of q and k,
  the typical row's logit spread (:func:`row_spread`), and
  the mean of each learned scalar or per-head score parameter, from one extra no-grad forward of
  the first ``stats_batch`` sequences of the current batch (:func:`head`); and, for the
  attention alarm's ``frozen`` rule, the mean ln n_i (``entropy_uniform``) and each head's
  logit std (``logit_std_heads``). :func:`alarm_stats` turns a row's layers into the flat
  ``{"layer/statistic": float}`` dict :class:`attnscale.integrations.alarm.AttentionAlarm` reads.
* TensorBoard (``run(..., tensorboard=DIR)``, ``attnscale train --tensorboard DIR``): each history
  row of :class:`attnscale.lab.train.Trainer` is also written (:func:`write_row`) to event files
  in DIR as scalars ``train/loss``, ``train/lr``, ``train/grad_norm`` (and ``eval/loss``,
  ``eval/metric`` on eval rows), and, when ``stats`` is on, the per-layer statistics of
  :func:`attnscale.integrations.tensorboard.log_attention` (``attention/<layer>/<statistic>``)
  from the same ``stats_batch`` sequences.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.core.reference import attention_logits
from attnscale.integrations.tensorboard import ScalarWriter, log_attention
from attnscale.lab.tasks import Batch
from attnscale.measure.monitor import Monitor

__all__ = ["ALARM_KEYS", "LAYER_STATS", "TENSORBOARD_EXTRA", "alarm_stats", "attention_names",
           "attention_rows", "head", "layer_row", "open_tensorboard", "rms", "row_spread",
           "tensorboard_available", "write_row"]

TENSORBOARD_EXTRA = "hf"  # the pyproject.toml optional-dependency group with tensorboard
LAYER_STATS = ("max_abs_logit", "logit_std", "entropy", "entropy_normalized", "max_weight",
               "saturated_fraction", "logsumexp", "nonfinite_fraction")
# the layer-row statistics the attention alarm reads (plus each head's logit std)
ALARM_KEYS = ("max_abs_logit", "logit_std", "entropy_normalized", "nonfinite_fraction",
              "entropy_uniform")
# stays finite (a fraction) when the logits are not: a diverged layer reads 1, not "missing"
ALWAYS_FINITE = ("nonfinite_fraction",)
# (history row key, TensorBoard tag) of the scalars every row may carry
ROW_SCALARS = (("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
               ("eval_loss", "eval/loss"), ("eval_metric", "eval/metric"))


# --------------------------------------------------------------------------------------------
# Attention statistics of a history row
# --------------------------------------------------------------------------------------------


def attention_rows(model: nn.Module, batch: Batch) -> list[dict[str, float | None]]:
    """Per-layer attention statistics of ``batch`` from one no-grad forward.

    The statistics come from :class:`attnscale.measure.monitor.Monitor`; the q/k RMS and the
    row logit spread (:func:`row_spread`) from each :class:`MultiheadSelfAttention`'s
    ``capture`` hook, which the monitor chains to.
    """
    modules = {n: m for n, m in model.named_modules() if isinstance(m, MultiheadSelfAttention)}
    if not modules:
        return []
    qk: dict[str, tuple[float, float, tuple[float, float]]] = {}
    names = {id(m): n for n, m in modules.items()}
    previous = {n: m.capture for n, m in modules.items()}
    for m in modules.values():
        m.capture = lambda mod, q, k, call: qk.__setitem__(
            names[id(mod)],
            (rms(q), rms(k), row_spread(*attention_logits(q, k, with_keep=True, **call))))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), Monitor(model) as monitor:
            model(batch.tokens, batch.scale)
    finally:
        model.train(was_training)
        for n, m in modules.items():
            m.capture = previous[n]
    stats = monitor.stats()
    rows = []
    for n in modules:
        if n in qk:
            means = stats[n].mean()
            row = layer_row(modules[n], *qk[n], means)
            log_n = means.get("entropy_uniform", math.nan)
            row["entropy_uniform"] = log_n if math.isfinite(log_n) else None
            row["logit_std_heads"] = [float(x) if math.isfinite(x) else None
                                      for x in stats[n].logit_std.tolist()]
            rows.append(row)
    return rows


def attention_names(model: nn.Module) -> list[str]:
    """The module names of ``model``'s ``MultiheadSelfAttention`` layers, in order: the layers
    of :func:`attention_rows`, one row each."""
    return [n for n, m in model.named_modules() if isinstance(m, MultiheadSelfAttention)]


def alarm_stats(names: list[str], layers: list[dict[str, Any]]) -> dict[str, float]:
    """``{f"{name}/{statistic}": value}`` of a history row's ``layers`` (:func:`attention_rows`,
    named by ``names``, :func:`attention_names`): :data:`ALARM_KEYS` and each head's
    ``logit_std_head{h}``, for :meth:`attnscale.integrations.alarm.AttentionAlarm.update`.
    A None (non-finite) value is left out, except max |logit|, which reads +inf when the layer's
    non-finite fraction is above 0 (the logits overflowed)."""
    out: dict[str, float] = {}
    for name, row in zip(names, layers, strict=True):
        for key in ALARM_KEYS:
            if row.get(key) is not None:
                out[f"{name}/{key}"] = float(row[key])
        if row.get("max_abs_logit") is None and (row.get("nonfinite_fraction") or 0) > 0:
            out[f"{name}/max_abs_logit"] = math.inf
        for h, std in enumerate(row.get("logit_std_heads") or []):
            if std is not None:
                out[f"{name}/logit_std_head{h}"] = float(std)
    return out


def head(batch: Batch, n: int) -> Batch:
    """The first ``n`` sequences of ``batch``."""
    scale = None if batch.scale is None else batch.scale[:n]
    return Batch(batch.tokens[:n], batch.targets[:n], scale)


def layer_row(module: MultiheadSelfAttention, q_rms: float, k_rms: float,
              spread: tuple[float, float], means: dict) -> dict:
    """One layer's history row: the monitor's means (None where not finite, and all but
    ``nonfinite_fraction`` None when q or k is not finite), q/k RMS, the row logit spread
    ``row_logit_std`` and ``row_freeze_ratio`` of :func:`row_spread` (None when not finite),
    and the mean of each learned scalar or per-head score parameter (a learned τ, s)."""
    row: dict[str, float | None] = {"q_rms": q_rms, "k_rms": k_rms}
    for name, value in zip(("row_logit_std", "row_freeze_ratio"), spread, strict=True):
        row[name] = value if math.isfinite(value) else None
    finite = math.isfinite(q_rms) and math.isfinite(k_rms)
    for name in LAYER_STATS:
        value = means.get(name)
        usable = value is not None and math.isfinite(value)
        row[name] = value if usable and (finite or name in ALWAYS_FINITE) else None
    for name, value in module.learned_params().items():
        if value.dim() <= 1:  # per-head weights over the head dimension are not logged
            row[name] = float(value.detach().float().mean())
    return row


def row_spread(logits: Tensor, keep: Tensor) -> tuple[float, float]:
    """The typical row's logit spread, over query rows (and heads, batch) that see n_i ≥ 2 keys
    (``keep``, bool, the logits' shape):

    * ``row_logit_std``: mean_i σ_i, σ_i the sample standard deviation (ddof = 1) of row i's
      visible logits;
    * ``row_freeze_ratio``: mean_i σ_i / s_c(n_i), s_c(n) = √(2 ln n) the softmax's freezing
      scale over the n_i keys the row sees (Derrida 1981): 1 is where one key starts to take
      most of the row's weight, whatever the row's length (causal rows see 1..N keys).

    Both NaN when no row counts or any visible logit is not finite (a layer that blew up is
    not a small one). A shift shared by a row, which the softmax ignores, does not count."""
    z, keep = logits.detach().double(), keep.expand_as(logits)
    visible = torch.where(keep, z, torch.zeros((), dtype=z.dtype))
    if not bool(torch.isfinite(visible).all()):
        return math.nan, math.nan
    n = keep.sum(-1)
    rows = n >= 2
    if not bool(rows.any()):
        return math.nan, math.nan
    mean = visible.sum(-1) / n.clamp(min=1)
    sq = torch.where(keep, (visible - mean[..., None]) ** 2, 0.0).sum(-1)
    sigma = (sq[rows] / (n[rows] - 1)).sqrt()
    ratio = sigma / torch.sqrt(2 * torch.log(n[rows].double()))
    return float(sigma.mean()), float(ratio.mean())


def rms(x: Tensor) -> float:
    """√mean(x²) over all entries."""
    return float(x.float().pow(2).mean().sqrt())


# --------------------------------------------------------------------------------------------
# TensorBoard
# --------------------------------------------------------------------------------------------


def write_row(writer: ScalarWriter, row: dict[str, Any], model: nn.Module,
              sample: Batch | None) -> None:
    """Send a history row to ``writer`` at step ``row["step"]``: loss, lr, grad norm and eval
    (those present), then, when ``sample`` is given, the attention statistics of ``model`` on
    it (:func:`attnscale.integrations.tensorboard.log_attention`)."""
    step = row["step"]
    for key, tag in ROW_SCALARS:
        if row.get(key) is not None:
            writer.add_scalar(tag, row[key], step)
    if sample is not None:
        log_attention(model, (sample.tokens, sample.scale), writer, step)


def tensorboard_available() -> bool:
    """Whether ``torch.utils.tensorboard`` imports (it needs the ``tensorboard`` package)."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def open_tensorboard(folder: str | Path) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` writing to ``folder`` (created if needed);
    ValueError naming ``tensorboard`` and the extra to install when the package is missing."""
    if not tensorboard_available():
        raise ValueError(f"tensorboard needs the tensorboard package: "
                         f"pip install 'attnscale[{TENSORBOARD_EXTRA}]'")
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(folder))
