"""How much attention the query puts on the answer: the retrieval weight against length.

For a retrieval task the prediction at the labelled (query) position i needs the token at one
position a (the answer: the pair holding the query's key). With the attention pattern
p = softmax(logit(q_i, k_·)) of a head, the answer weight is p_{i,a}. A fixed 1/√d logit with a
gap g between the answer and the m other visible keys gives p_{i,a} = e^g / (e^g + m), which
falls as the context grows ("attention fading"); log-length scaling multiplies the logits by
s·ln(n) to hold it up (Nakanishi 2025, "Scalable-Softmax", arXiv 2501.19399).

How it is measured: every :class:`attnscale.core.nn.MultiheadSelfAttention` of the model is
watched through its ``capture`` hook, which sees the q and k that enter the score and the exact
keyword arguments of the module's attention call (score, its parameters, mask, causality). The
hook calls :func:`attnscale.attention` once more with the same q, k and arguments and a one-hot
value vector e_a: the output at row i is then Σ_j p_{i,j}·[j = a] = p_{i,a}, the model's own
pattern, for every score and mask, with no N×N matrix kept. The model's output is unchanged.

A task exposes where the answer sits through a method ``answer_positions(batch) -> (B,)``
(:class:`attnscale.lab.tasks.LengthTask` has one); the query is the batch's one labelled
position per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from attnscale.core.attention import attention
from attnscale.core.nn import MultiheadSelfAttention
from attnscale.lab.tasks import IGNORE_INDEX, Batch, Task

Out = TypeVar("Out")

__all__ = [
    "answer_attention",
    "forward_with_answer_weights",
    "has_answer_positions",
    "query_positions",
    "summarize",
    "watch_answer",
]


def has_answer_positions(task: Task) -> bool:
    """True if ``task`` says where each sequence's answer sits (``answer_positions(batch)``)."""
    return callable(getattr(task, "answer_positions", None))


def query_positions(batch: Batch) -> Tensor:
    """(B,) int64: the one labelled position of each sequence; ValueError if a row has 0 or 2+."""
    labelled = batch.targets != IGNORE_INDEX  # (B, T)
    if not bool((labelled.sum(dim=1) == 1).all()):
        raise ValueError("batch must have exactly one labelled position per sequence")
    return labelled.long().argmax(dim=1)


def _check_positions(name: str, pos: Tensor, b: int, t: int) -> Tensor:
    if not isinstance(pos, Tensor) or pos.shape != (b,) or pos.dtype.is_floating_point:
        raise ValueError(f"{name} must be an integer tensor of shape ({b},); got {pos!r}")
    if bool(((pos < 0) | (pos >= t)).any()):
        raise ValueError(f"{name} must lie in [0, {t}); got {pos.tolist()}")
    return pos.long()


@contextmanager
def watch_answer(model: nn.Module, query: Tensor, answer: Tensor) -> Iterator[list[Tensor]]:
    """Within the block, each attention call of ``model`` appends its (B, H) answer weights
    p[b, h, query[b], answer[b]] to the yielded list (one entry per layer and forward).

    Previous ``capture`` hooks keep running (chained) and are restored on exit.
    """
    modules = [m for m in model.modules() if isinstance(m, MultiheadSelfAttention)]
    found: list[Tensor] = []
    previous = {id(m): m.capture for m in modules}

    def capture(mod: MultiheadSelfAttention, q: Tensor, k: Tensor, call: dict[str, Any]) -> None:
        found.append(_weights(q.detach(), k.detach(), call, query, answer))
        if previous[id(mod)] is not None:
            previous[id(mod)](mod, q, k, call)

    for m in modules:
        m.capture = capture
    try:
        yield found
    finally:
        for m in modules:
            m.capture = previous[id(m)]


def _weights(q: Tensor, k: Tensor, call: dict[str, Any], query: Tensor, answer: Tensor) -> Tensor:
    """(B, H) weight of row query[b] on key answer[b], from the module's own attention call.

    Without an ``attn_mask`` only the query rows are computed: row query[b] alone, with the keys
    it sees (all, or 0..query[b] under ``is_causal``) as a mask, which is the same softmax row
    (the scores see the same q, k and number of visible keys); with one, every row."""
    b, hk, n, _ = k.shape  # (B, Hkv, N, d)
    if query.shape != (b,) or bool((answer >= n).any()) or bool((query >= q.shape[-2]).any()):
        raise ValueError(f"query/answer positions do not fit a batch of {b} sequences of {n} keys")
    rows, query, answer = torch.arange(b), query.to(q.device), answer.to(q.device)
    onehot = torch.zeros(b, hk, n, 1, dtype=q.dtype, device=q.device)
    onehot[rows, :, answer] = 1.0  # e_a as the value of every key head
    kwargs = {name: v.detach() if isinstance(v, Tensor) else v for name, v in call.items()}
    with torch.no_grad():
        if kwargs.get("attn_mask") is not None:
            out = attention(q, k, onehot, **kwargs)  # (B, H, Nq, 1): p[..., i, a], every row i
            return out[rows, :, query, 0].float().cpu()  # (B, H)
        keys = torch.arange(n, device=q.device)
        sees = keys <= query[:, None] if kwargs.get("is_causal") else keys.expand(b, n) >= 0
        kwargs.update(attn_mask=sees[:, None, None, :], is_causal=False)  # (B, 1, 1, N)
        out = attention(q[rows, :, query].unsqueeze(2), k, onehot, **kwargs)  # (B, H, 1, 1)
    return out[:, :, 0, 0].float().cpu()  # (B, H)


def forward_with_answer_weights(
    model: nn.Module, batch: Batch, answer: Tensor,
    forward: Callable[[nn.Module, Batch], Out] | None = None,
) -> tuple[Out | Tensor, Tensor]:
    """(output, weights (L, B, H)) from one forward of ``model`` on ``batch``.

    weights[l, b, h] is the attention weight that head h of the l-th attention call puts, at the
    labelled position of sequence b, on position ``answer[b]``. The output is
    ``forward(model, batch)``, by default ``model(tokens, scale)``: the logits (B, T, V). An empty
    (0, B, 0) weight tensor if the model has no MultiheadSelfAttention.
    """
    b, t = batch.tokens.shape
    answer = _check_positions("answer", answer, b, t)
    query = query_positions(batch)
    with watch_answer(model, query, answer) as found:
        out = model(batch.tokens, batch.scale) if forward is None else forward(model, batch)
    weights = torch.stack(found) if found else torch.zeros(0, b, 0)
    return out, weights


def summarize(weights: Tensor) -> dict[str, Any]:
    """Per-layer answer weight of (L, B, H) weights pooled over sequences.

    ``heads[l][h]`` = mean over sequences of weights[l, :, h]; ``layers[l]`` = max over heads of
    that mean (the head that retrieves); ``max`` = max over layers (None with no layers).
    """
    if weights.dim() != 3:
        raise ValueError(f"weights must be (L, B, H); got shape {tuple(weights.shape)}")
    heads = weights.double().mean(dim=1)  # (L, H)
    layers = [float(row.max()) for row in heads] if heads.shape[-1] else []
    return {"layers": layers, "heads": heads.tolist(), "max": max(layers) if layers else None}


def answer_attention(model: nn.Module, task: Task) -> dict[str, dict[str, Any]]:
    """{eval set: :func:`summarize` of the answer weights over the set's sequences}.

    The weight each layer's query row (the labelled position) puts on the answer's position
    (``task.answer_positions``), mean over eval sequences per head, max over heads per layer,
    and ``max`` over layers. The model is run in eval mode under no_grad and left as it was.
    """
    if not has_answer_positions(task):
        raise ValueError(f"task {task.name!r} does not expose answer_positions(batch)")
    was_training = model.training
    model.eval()
    out: dict[str, dict[str, Any]] = {}
    try:
        with torch.no_grad():
            for name, batches in task.eval_batches().items():
                found = [forward_with_answer_weights(model, b, task.answer_positions(b))[1]
                         for b in batches]
                out[name] = summarize(torch.cat(found, dim=1))
    finally:
        model.train(was_training)
    return out
