"""The float64 ground truth: every logit built from the score's plain formula, then softmax;
and those logits themselves, in the inputs' dtype (:func:`attention_logits`), for statistics of
a row's scores."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnscale.core.inputs import (
    check_inputs,
    expand_key_head_params,
    keep_matrix,
    normalize_mask,
)
from attnscale.core.scores import Context, Params, Score, get_score, resolve_params


def reference_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    score: str | Score = "scaled_dot",
    **score_params: Any,
) -> Tensor:
    """Ground truth: the score's plain formula, materialized in float64, masked, softmaxed.

    Same signature and semantics as :func:`attention`. Returns the query's dtype. Deterministic,
    so ``dropout_p`` must be 0.
    """
    sc = get_score(score)
    params = resolve_params(sc, score_params, scale)
    x = check_inputs(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if float(dropout_p) != 0.0:
        raise ValueError(f"dropout_p must be 0 for reference_attention, got {dropout_p}")
    params64 = {n: p.double() if isinstance(p, Tensor) else p for n, p in params.items()}
    if x.key_group > 1:
        params64 = expand_key_head_params(params64, x.key_group)
    mask = normalize_mask(x.mask, torch.float64)
    out = materialized_attention(
        sc, params64, x.q.double(), x.k.double(), x.v.double(), mask, 0.0, is_causal, scale,
        x.k.shape[1] != x.q.shape[1],
    ).to(query.dtype)
    return x.restore(out)


def attention_logits(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    score: str | Score = "scaled_dot",
    with_keep: bool = False,
    **score_params: Any,
) -> Tensor | tuple[Tensor, Tensor]:
    """The pre-softmax logits (…, H, Nq, Nk) that :func:`reference_attention` softmaxes, in the
    query's dtype: the score's plain formula, a float mask added, −inf where a key is hidden
    (by a bool mask or ``is_causal``). Arguments as in :func:`attnscale.attention` (no value).
    ``with_keep``: also return which keys each query sees, a bool tensor of the logits' shape,
    so that a visible logit that overflowed to −inf is not taken for a hidden key."""
    sc = get_score(score)
    params = resolve_params(sc, score_params, scale)
    x = check_inputs(query, key, key, attn_mask, 0.0, is_causal, enable_gqa)
    if x.key_group > 1:
        params = expand_key_head_params(params, x.key_group)
    mask = normalize_mask(x.mask, query.dtype)
    logits, keep = masked_logits(sc, params, x.q, x.k, mask, is_causal, scale,
                                 x.k.shape[1] != x.q.shape[1])
    if with_keep:
        return x.restore(logits), x.restore(keep.expand_as(logits))
    return x.restore(logits)


def masked_logits(sc: Score, params: Params, q: Tensor, k: Tensor, mask: Tensor | None,
                  is_causal: bool, scale: float | None,
                  enable_gqa: bool) -> tuple[Tensor, Tensor]:
    """Checked 4-D inputs -> (logits (B, H, Nq, Nk) with −inf at hidden keys, keep (…, Nq, Nk)
    bool)."""
    if enable_gqa and k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        params = expand_key_head_params(params, group)
    keep = keep_matrix(q.shape[-2], k.shape[-2], mask, is_causal, q.device)  # (…, Nq, Nk)
    ctx = Context(head_dim=q.shape[-1], n_visible=lambda: keep.sum(-1, keepdim=True))
    logits = sc.formula(q, k, scale, params, ctx)  # (B, H, Nq, Nk)
    if mask is not None and mask.dtype != torch.bool:
        logits = logits + mask
    return logits.masked_fill(~keep, float("-inf")), keep


def materialized_attention(
    sc: Score,
    params: Params,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> Tensor:
    """The naive O(N²)-memory path: build every logit from ``sc.formula``, then softmax.

    Inputs are already checked 4-D tensors. Used as the float64 reference, as the fallback for
    cases the fast kernels don't cover, and as the "naive" baseline in benchmarks.
    """
    if enable_gqa and k.shape[1] != q.shape[1]:
        v = v.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits, keep = masked_logits(sc, params, q, k, mask, is_causal, scale, enable_gqa)
    weights = torch.softmax(logits, dim=-1)
    weights = weights.masked_fill(~keep.any(-1, keepdim=True), 0.0)  # fully masked rows -> 0
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v
