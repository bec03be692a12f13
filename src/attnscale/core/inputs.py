"""The input contract of :func:`attnscale.attention`, shared by every path that takes its
arguments: SDPA's (``torch.nn.functional.scaled_dot_product_attention``, torch 2.13).

* query (…, H, Nq, D), key (…, Hk, Nk, D), value (…, Hk, Nk, Dv), at least 2-D each; the leading
  dimensions broadcast against each other as in ``torch.matmul``, so a 3-D query works with 4-D
  keys and a batch of 1 serves every batch entry. Dimension −3 is the head dimension: per-head
  score parameters (length H, or (H, D) weights) index it.
* ``attn_mask`` broadcasts to the output's (…, H, Nq, Nk) without adding dimensions; a bool mask
  keeps True entries, a float mask (the query's dtype, or float32) is added to the logits.
* ``is_causal``: query i sees keys 0..i (top-left alignment); may be combined with a mask.
* ``enable_gqa``: H must be a multiple of Hk (and of the value's head count); each key/value
  head serves H/Hk query heads.

:func:`check_inputs` validates all of this and returns :class:`Inputs`: q, k and v reshaped to
the 4-D (B, H, N, D) layout the kernels take (a view whenever the inputs already have it), and
how to give the output its broadcast shape back.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnscale.core.scores import Params

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Inputs:
    """Checked inputs in the kernels' 4-D layout.

    ``q`` (B, H, Nq, D), ``k`` (B, Hk, Nk, D), ``v`` (B, Hk, Nk, Dv) with B the product of the
    broadcast leading dimensions ``lead``; ``mask`` is None or broadcasts to (B, H, Nq, Nk);
    ``key_group`` is how many times each key head was repeated here (1 unless key and value
    head counts differed under GQA), for the key-side per-head parameters.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    lead: tuple[int, ...]
    squeeze_heads: bool  # the broadcast inputs were 2-D: no head dimension to give back
    key_group: int = 1

    def restore(self, out: Tensor) -> Tensor:
        """(B, H, Nq, Dv) -> (…lead, H, Nq, Dv), the broadcast shape SDPA returns."""
        if self.squeeze_heads:
            return out.reshape(out.shape[-2:])
        return out.reshape(*self.lead, *out.shape[1:])


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast of integer shapes (NumPy's rule), or ValueError. Plain Python:
    ``torch.broadcast_shapes`` goes through symbolic-shape guards and cost ~35 µs a call, a
    large share of a small attention call's time."""
    n = max([0, *(len(s) for s in shapes)])  # not max(..., default=0): Dynamo cannot trace it
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s, n - len(s)):
            if d != 1:
                if out[i] not in (1, d):
                    raise ValueError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[i] = d
    return tuple(out)


def check_inputs(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: Any,
    is_causal: Any,
    enable_gqa: Any,
) -> Inputs:
    """Validate every argument as SDPA does (ValueError/TypeError naming it) and return the
    inputs in 4-D layout."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, "
                        f"{key.dtype}, {value.dtype}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same head dimension, got "
                         f"{query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length, got "
                         f"{key.shape[-2]} and {value.shape[-2]}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    dropout_p = _real_number("dropout_p", dropout_p)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1], got {dropout_p!r}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    lead, heads = _broadcast_batch(query, key, value, enable_gqa)
    hq, hk, hv = heads
    squeeze = query.dim() == key.dim() == value.dim() == 2
    q = _to_4d(query, lead, hq)
    k, v = _to_4d(key, lead, hk), _to_4d(value, lead, hv)
    group = 1
    if hk != hv:  # GQA with different key and value head counts: serve every query head
        group = hq // hk
        k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hv, dim=1)
    mask = None
    if attn_mask is not None:
        # The mask is added to the logits q·kᵀ, so it may not add dimensions to their shape
        # (the value's leading dimensions broadcast later, in the product with v).
        if hk == hq:
            logits = broadcast_shape(query.shape[:-2], key.shape[:-2])
        else:  # GQA: SDPA repeats the key heads first
            logits = (*broadcast_shape(query.shape[:-3], key.shape[:-3]), hq)
        n = (q.shape[-2], k.shape[-2])
        mask = _check_mask(attn_mask, query.dtype, (*logits, *n), (*lead, hq, *n))
    return Inputs(q, k, v, mask, lead, squeeze, group)


def _real_number(name: str, value: Any) -> float:
    """A Python, NumPy or 0-d tensor real number as a float (SDPA takes all three)."""
    if isinstance(value, Tensor) and value.dim() == 0 and not value.dtype.is_complex:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have a floating dtype (float16, bfloat16, float32, "
                        f"float64), got {t.dtype}")
    if t.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (…, N, D), got shape "
                         f"{tuple(t.shape)}")


def _heads(t: Tensor) -> int:
    return t.shape[-3] if t.dim() >= 3 else 1


def _broadcast_batch(
    q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool
) -> tuple[tuple[int, ...], tuple[int, int, int]]:
    """The broadcast leading dimensions (all but heads, N and D) and the three head counts."""
    hq, hk, hv = _heads(q), _heads(k), _heads(v)
    if enable_gqa and min(q.dim(), k.dim(), v.dim()) < 3:
        raise ValueError("enable_gqa needs query, key and value of at least 3 dimensions "
                         "(…, H, N, D)")
    if not enable_gqa or (hq == hk == hv):
        shapes = [t.shape[:-2] for t in (q, k, v)]
        try:
            batch = broadcast_shape(*shapes)
        except ValueError:
            raise ValueError(
                "the leading dimensions of query, key and value must broadcast (as in "
                f"torch.matmul), got {[tuple(s) for s in shapes]}; for fewer key/value heads "
                "than query heads pass enable_gqa=True"
            ) from None
        h = batch[-1] if batch else 1
        return tuple(batch[:-1]), (h, h, h)
    if hq % hk or hq % hv:
        raise ValueError(f"enable_gqa needs the query head count ({hq}) to be a multiple of "
                         f"the key ({hk}) and value ({hv}) head counts")
    shapes = [t.shape[:-3] for t in (q, k, v)]
    try:
        lead = broadcast_shape(*shapes)
    except ValueError:
        raise ValueError("the batch dimensions of query, key and value must broadcast, got "
                         f"{[tuple(s) for s in shapes]}") from None
    return tuple(lead), (hq, hk, hv)


def _to_4d(t: Tensor, lead: tuple[int, ...], heads: int) -> Tensor:
    """``t`` broadcast to (…lead, heads, N, X) and flattened to (prod(lead), heads, N, X); a view
    when ``t`` already has that shape."""
    full = (*lead, heads, *t.shape[-2:])
    if t.shape == full and len(full) == 4:
        return t
    return t.expand(full).reshape(math.prod(lead), heads, *t.shape[-2:])


def _check_mask(
    attn_mask: Any, dtype: torch.dtype, logits: tuple[int, ...], target: tuple[int, ...]
) -> Tensor:
    """The mask, checked against the shape of the logits, in a form that broadcasts to the 4-D
    (B, H, Nq, Nk) of ``target`` (…lead, H, Nq, Nk)."""
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in (dtype, torch.float32):
        raise TypeError(
            f"attn_mask must be bool (True = keep) or floating in the query's dtype ({dtype}) "
            f"or float32 (added to the logits), got {attn_mask.dtype}"
        )
    if attn_mask.dim() < 2:
        raise ValueError(f"attn_mask must have at least 2 dimensions (…, Nq, Nk), got shape "
                         f"{tuple(attn_mask.shape)}")
    try:
        ok = broadcast_shape(tuple(attn_mask.shape), logits) == logits
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"the logits' (…, H, Nq, Nk) = {logits}")
    if len(target) <= 4:  # a 4-D view: SDPA's kernels combine a 4-D mask with is_causal
        return attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    b = math.prod(target[:-3])
    return attn_mask.expand(target).reshape(b, *target[-3:])


def normalize_mask(attn_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Bool masks keep their dtype, float masks take ``dtype`` (the computation's)."""
    if attn_mask is None:
        return None
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
    """Per-head parameters of the key side (named ``k_*``, shape (Hk, D)) follow the key heads;
    repeat them when the key heads are repeated for GQA. A (D,) weight is shared by every head
    and stays as it is."""
    return {
        name: p.repeat_interleave(group, dim=0)
        if name.startswith("k_") and isinstance(p, Tensor) and p.dim() == 2
        else p
        for name, p in params.items()
    }


def fold_causal(mask: Tensor, nq: int, nk: int) -> Tensor:
    """``mask`` with the causal rule (query i sees keys 0..i) folded in: bool masks lose the
    hidden keys, float masks get −inf there. SDPA refuses a mask together with ``is_causal`` on
    some of its kernels (those without a fused causal mask), so attnscale combines them itself."""
    keep = torch.ones(nq, nk, dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return mask & keep
    return mask.masked_fill(~keep, float("-inf"))
