"""Evaluation of a model on its task's eval sets, plainly and with an evaluation-time log-n factor.

:func:`evaluate` gives, per eval set, the cross-entropy ("loss", nats per labelled position), the
task's metric ("metric") and, for a task that says where its answers sit (the length task), the
attention weight the labelled position puts on the answer ("answer_weight").

:func:`evaluate_log_n` evaluates the same trained model past its training length n with every
attention logit multiplied by the log-n factor

    β(L) = max(1, ln L / ln n)

at eval length L: the inference-time attention scaling of Qwen's ``logn`` attention and YaRN,
which Chen et al. 2025 ("Critical attention scaling in long-context transformers", arXiv
2510.05554) justify with a critical scaling β_n ≍ log n; Scalable-Softmax trains with s·ln(n)
instead (Nakanishi 2025, arXiv 2501.19399). The factor here is one number per eval length: at
the length task's one labelled position, the last, which sees L keys, it equals the per-position
max(1, ln i / ln n) of those methods (in a one-layer model no other position reaches it). Only
scores whose logits are scale·(q'·k') (:data:`SCALED`) take it, through the attention module's
``scale`` (1/√d → β/√d), which :func:`logit_factor` restores afterwards. Its results are stored
beside the plain ones under :func:`log_n_key` ("log_n:n=128"), with the same fields plus
"factor", so plain and log-n losses of one run are paired by construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.core.score_ops import default_scale
from attnscale.lab.models import GPT
from attnscale.lab.probe import forward_with_answer_weights, has_answer_positions, summarize
from attnscale.lab.tasks import IGNORE_INDEX, Batch, Task

__all__ = ["LOG_N", "SCALED", "evaluate", "evaluate_log_n", "labelled_logits", "log_n_factor",
           "log_n_key", "logit_factor", "main_eval_set", "scalable"]

LOG_N = "log_n"  # prefix of the eval sets evaluated with the log-n factor
# scores whose logits are scale·(q'·k'), so a factor on ``scale`` multiplies every logit
SCALED = ("scaled_dot", "qk_layernorm", "qk_rmsnorm")
Results = dict[str, dict[str, float | None]]


def log_n_factor(length: int, n_train: int) -> float:
    """β = max(1, ln L / ln n): the log-n factor at eval length L for training length n > 1."""
    if n_train < 2 or length < 1:
        raise ValueError(f"log_n_factor needs n_train >= 2 and length >= 1, got {n_train}, "
                         f"{length}")
    return max(1.0, math.log(length) / math.log(n_train))


def log_n_key(name: str) -> str:
    """The final_metrics key of eval set ``name`` evaluated with the log-n factor."""
    return f"{LOG_N}:{name}"


def _attention(model: nn.Module) -> list[MultiheadSelfAttention]:
    return [m for m in model.modules() if isinstance(m, MultiheadSelfAttention)]


def scalable(model: nn.Module) -> bool:
    """The model has attention and every attention score is one of :data:`SCALED`."""
    mods = _attention(model)
    return bool(mods) and all(m.score in SCALED for m in mods)


@contextmanager
def logit_factor(model: nn.Module, factor: float) -> Iterator[None]:
    """Within the block every attention logit of ``model`` is multiplied by ``factor``: each
    module's ``scale`` s (None: 1/√d) becomes factor·s; the old values are restored on exit.
    ValueError for a score not in :data:`SCALED` or a factor that is not finite and > 0."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be finite and > 0, got {factor!r}")
    mods = _attention(model)
    other = sorted({m.score for m in mods} - set(SCALED))
    if other:
        raise ValueError(f"a logit factor through `scale` needs scores in {SCALED}; got {other}")
    old = [m.scale for m in mods]
    try:
        for m in mods:
            m.scale = factor * default_scale(m.scale, m.head_dim)
        yield
    finally:
        for m, s in zip(mods, old, strict=True):
            m.scale = s


def labelled_logits(model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
    """(logits (N, V), labels (N,)) at the batch's N labelled positions (target ≠ IGNORE_INDEX).

    A :class:`GPT` reads out only there (its ``at``), which equals ``model(...)[labelled]`` up to
    float rounding; any other model's (B, T, V) logits are indexed."""
    keep = batch.targets != IGNORE_INDEX  # (B, T)
    if isinstance(model, GPT):
        logits = model(batch.tokens, batch.scale, at=keep)  # (N, V)
    else:
        logits = model(batch.tokens, batch.scale)[keep]  # (B, T, V) -> (N, V)
    return logits, batch.targets[keep]


def _evaluate_set(model: nn.Module, task: Task, batches: list[Batch],
                  probe: bool) -> dict[str, float | None]:
    """Loss, metric (and answer weight when ``probe``) of one eval set, under no_grad, from the
    logits at the labelled positions only (:func:`labelled_logits`)."""
    nats, total, count, weights = 0.0, 0.0, 0, []
    for b in batches:
        if probe:
            (logits, labels), w = forward_with_answer_weights(
                model, b, task.answer_positions(b), forward=labelled_logits)
            weights.append(w)  # (layers, B, heads)
        else:
            logits, labels = labelled_logits(model, b)  # (N, V), (N,)
        nats += float(F.cross_entropy(logits, labels, reduction="sum"))
        s, n = task.labelled_metric_sum(logits, labels)
        total, count = total + s, count + n
    out: dict[str, float | None] = {"loss": nats / count, "metric": total / count}
    if probe:
        out["answer_weight"] = summarize(torch.cat(weights, dim=1))["max"]
    return out


def evaluate(model: nn.Module, task: Task,
             factors: Mapping[str, float] | None = None) -> Results:
    """{eval set: {"loss": cross-entropy, "metric": task metric}} on the task's eval sets.

    For a task that says where its answers sit (``answer_positions``, e.g. ``length``) each set
    also holds "answer_weight": the attention weight the labelled position puts on the answer,
    mean over the set's sequences, max over heads and layers
    (:func:`attnscale.lab.probe.forward_with_answer_weights`, from the same forward pass).
    ``factors`` {eval set: β}: only those sets, each with its logits multiplied by β
    (:func:`logit_factor`). A model with non-finite weights gets None everywhere.
    """
    probe = has_answer_positions(task)
    sets = task.eval_batches()
    names = list(sets) if factors is None else [k for k in sets if k in factors]
    empty: dict[str, float | None] = {"loss": None, "metric": None}
    if probe:
        empty["answer_weight"] = None
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        return {name: dict(empty) for name in names}
    was_training = model.training
    model.eval()
    out: Results = {}
    try:
        with torch.no_grad():
            for name in names:
                if factors is None:
                    out[name] = _evaluate_set(model, task, sets[name], probe)
                    continue
                with logit_factor(model, factors[name]):
                    out[name] = _evaluate_set(model, task, sets[name], probe)
    finally:
        model.train(was_training)
    return out


def evaluate_log_n(model: nn.Module, task: Task) -> Results:
    """{:func:`log_n_key` (set): results of :func:`evaluate` with the log-n factor, and
    "factor": β} for each eval length L past the training length n (``task.eval_lengths``,
    sets named "n=<L>"); empty when the task has no such length or the model is not
    :func:`scalable`."""
    n = getattr(task, "seq_len", None)
    longer = {f"n={L}": log_n_factor(L, n) for L in getattr(task, "eval_lengths", ())
              if n is not None and n < L}
    if not longer or not scalable(model):
        return {}
    results = evaluate(model, task, longer)
    return {log_n_key(k): {**v, "factor": longer[k]} for k, v in results.items()}


def main_eval_set(task: Task, results: Mapping[str, Any]) -> str:
    """The eval set that ``final_metric`` reports: the training length's, else the first."""
    own = f"n={task.seq_len}"
    return own if own in results else next(iter(results))
