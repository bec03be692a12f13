"""attention(): PyTorch's scaled_dot_product_attention with a pluggable score.

The input contract is SDPA's (:mod:`attnscale.core.inputs`); a query whose keys are all masked
out returns zeros, with zero gradient (as SDPA in torch 2.13).

Fused scores transform q and k and call SDPA, so they run on PyTorch's fused kernels and never
build the N×N matrix. Scores with an elementwise logit transform (``softcap``) run on the chunked
kernel of :mod:`attnscale.core.chunked`. :func:`reference_attention` is the float64 ground truth.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from attnscale.core.chunked import modded_attention
from attnscale.core.inputs import (
    check_inputs,
    expand_key_head_params,
    fold_causal,
    normalize_mask,
    visible_counts,
)
from attnscale.core.reference import materialized_attention, reference_attention
from attnscale.core.scores import Context, Score, get_score, resolve_params

__all__ = ["attention", "materialized_attention", "reference_attention"]


def attention(
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
    """Attention softmax(logit(q, k) + mask)·V with the logit given by ``score``.

    ``score`` is a name from :data:`attnscale.SCORES` (``scaled_dot`` by default, which is
    exactly SDPA) and ``score_params`` are its parameters, e.g. ``score="cosine", tau=10.0``.
    ``scale`` overrides 1/√d for the scores that use it (scaled_dot, qk norms, softcap, log_length).
    Inputs follow SDPA's contract (:mod:`attnscale.core.inputs`): (…, H, Nq, D) queries, leading
    dimensions broadcast. Returns (…, H, Nq, Dv), the shape SDPA returns.
    """
    sc = get_score(score)
    params = resolve_params(sc, score_params, scale)
    x = check_inputs(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    q, k, v = x.q, x.k, x.v  # (B, H, Nq, D), (B, Hk, Nk, D), (B, Hk, Nk, Dv)
    dropout_p = float(dropout_p)  # NumPy and 0-d tensor values are accepted, as by SDPA
    if x.key_group > 1:
        params = expand_key_head_params(params, x.key_group)
    mask = normalize_mask(x.mask, q.dtype)
    ctx = Context(
        head_dim=q.shape[-1],
        n_visible=lambda: visible_counts(q.shape[-2], k.shape[-2], mask, is_causal, q.device),
    )
    if sc.fused:
        qp, kp, sdpa_scale = sc.prepare(q, k, scale, params, ctx)
        if isinstance(sdpa_scale, (int, float)) and sdpa_scale == 0:
            # every logit is 0; PyTorch's CPU flash kernel returns NaN for scale=0 when causal
            qp, sdpa_scale = qp * 0, 1.0
        gqa = k.shape[1] != q.shape[1]
        causal = is_causal
        if mask is not None and is_causal:
            mask, causal = fold_causal(mask, q.shape[-2], k.shape[-2]), False
        out = F.scaled_dot_product_attention(
            qp, kp, v, mask, dropout_p, causal, scale=sdpa_scale, enable_gqa=gqa
        )
    else:
        out = modded_attention(sc, params, q, k, v, mask, dropout_p, is_causal, scale, ctx)
    return x.restore(out)
