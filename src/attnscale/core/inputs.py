"""The input contract of :func:`attnscale.attention`, shared by every path that takes its
arguments. Shapes, mask semantics and causal alignment follow
``torch.nn.functional.scaled_dot_product_attention``:

* query (B, H, Nq, D), key (B, Hk, Nk, D), value (B, Hk, Nk, Dv); 3-D inputs (B, N, D) also work;
* ``attn_mask`` broadcasts to (B, H, Nq, Nk); a bool mask keeps True entries, a float mask is added
  to the logits;
* ``is_causal``: query i sees keys 0..i (top-left alignment, as SDPA); may be combined with a mask;
* ``enable_gqa``: H must be a multiple of Hk, each key/value head serves H/Hk query heads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnscale.core.scores import Params

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)




def check_inputs(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: Any,
    is_causal: Any,
    enable_gqa: Any,
) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Validate shapes, dtypes and the mask; return 4-D q, k, v and whether to squeeze heads."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} must have a floating dtype (float16, bfloat16, float32, float64), "
                f"got {t.dtype}"
            )
        if t.dim() not in (3, 4):
            raise ValueError(
                f"{name} must be 4-D (B, H, N, D) or 3-D (B, N, D), got shape {tuple(t.shape)}"
            )
    if not (query.dim() == key.dim() == value.dim()):
        raise ValueError(
            "query, key and value must have the same rank, got "
            f"{query.dim()}, {key.dim()} and {value.dim()}"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            "query, key and value must share a dtype, got "
            f"{query.dtype}, {key.dtype}, {value.dtype}"
        )
    squeeze = query.dim() == 3
    q, k, v = (t.unsqueeze(1) if squeeze else t for t in (query, key, value))
    _check_shapes(q, k, v, bool(enable_gqa))
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if attn_mask is not None:
        _check_mask(attn_mask, q, k)
    return q, k, v, squeeze


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"query and key must have the same head dimension, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"key and value must have the same length, got {k.shape[-2]} and {v.shape[-2]}"
        )
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(
            f"query, key and value must have the same batch size, got "
            f"{q.shape[0]}, {k.shape[0]}, {v.shape[0]}"
        )
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if hk != hv:
        raise ValueError(f"key and value must have the same number of heads, got {hk} and {hv}")
    if hq != hk and not enable_gqa:
        raise ValueError(
            f"query has {hq} heads and key/value {hk}: they must be equal, or pass "
            "enable_gqa=True with a query head count that is a multiple of the key head count"
        )
    if enable_gqa and hq % hk != 0:
        raise ValueError(
            f"enable_gqa needs the query head count ({hq}) to be a multiple of the key/value "
            f"head count ({hk})"
        )


def _check_mask(attn_mask: Any, q: Tensor, k: Tensor) -> None:
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            f"attn_mask must be bool (True = keep) or floating (added to the logits), "
            f"got {attn_mask.dtype}"
        )
    target = (q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
    try:
        ok = torch.broadcast_shapes(attn_mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
            f"(B, H, Nq, Nk) = {target}"
        )


def normalize_mask(attn_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Bool masks keep their dtype, float masks take the query's (as SDPA requires); a 1-D
    mask over keys becomes (1, Nk), since SDPA's kernels want at least 2-D."""
    if attn_mask is None:
        return None
    if attn_mask.dim() < 2:
        attn_mask = attn_mask.reshape(1, -1)
    return attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(dtype)


def keep_matrix(
    nq: int, nk: int, mask: Tensor | None, is_causal: bool, device: torch.device
) -> Tensor:
    """Bool (…, Nq, Nk): True where the query may attend to the key."""
    keep = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if is_causal:
        keep = keep.tril()
    if mask is not None:
        keep = keep & (mask if mask.dtype == torch.bool else mask > float("-inf"))
    return keep


def visible_counts(
    nq: int, nk: int, mask: Tensor | None, is_causal: bool, device: torch.device
) -> Tensor:
    """Number of keys each query sees, shaped (…, Nq, 1). Cheap when there is no mask."""
    if mask is None:
        if not is_causal:
            return torch.full((1, 1), float(nk), device=device)
        return (torch.arange(1, nq + 1, device=device).clamp(max=nk).float()).unsqueeze(-1)
    return keep_matrix(nq, nk, mask, is_causal, device).sum(-1, keepdim=True).float()


def expand_key_head_params(params: Params, group: int) -> dict[str, Any]:
    """Per-head parameters of the key side (named ``k_*``) follow the key heads; repeat them
    when the key heads are repeated for GQA."""
    return {
        name: p.repeat_interleave(group, dim=0)
        if name.startswith("k_") and isinstance(p, Tensor) and p.dim() >= 1
        else p
        for name, p in params.items()
    }
