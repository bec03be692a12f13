"""Tensor helpers the scores are built from: per-head parameter shapes, the plain dot product,
and q/k normalizations with a hand-written backward (:class:`RowScale`)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "RowScale",
    "affine",
    "check_positive",
    "default_scale",
    "dot_logits",
    "layernorm",
    "per_head",
    "per_head_weight",
    "rmsnorm",
]


def per_head(value: Any) -> Any:
    """Shape a per-head parameter to broadcast against (B, H, N, X).

    Numbers and 0-d tensors pass through; a 1-D tensor of length H becomes (H, 1, 1); an
    (H, D) weight becomes (H, 1, D); a (D,) weight is left as is.
    """
    if not isinstance(value, Tensor) or value.dim() == 0:
        return value
    if value.dim() == 1:
        return value.view(-1, 1, 1)
    if value.dim() == 2:
        return value.unsqueeze(-2)
    return value


def per_head_weight(value: Any) -> Any:
    """Shape an affine weight over the head dimension: (D,) stays, (H, D) becomes (H, 1, D)."""
    if isinstance(value, Tensor) and value.dim() == 2:
        return value.unsqueeze(-2)
    return value


def default_scale(scale: float | None, d: int) -> float:
    """1/√d unless the caller gave ``scale`` (Vaswani et al. 2017, eq. 1)."""
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def dot_logits(q: Tensor, k: Tensor) -> Tensor:
    """Materialized q·kᵀ over the last dimension: (…, Nq, D) × (…, Nk, D) -> (…, Nq, Nk)."""
    return q @ k.transpose(-2, -1)


def affine(x: Tensor, weight: Any) -> Tensor:
    return x if weight is None else x * per_head_weight(weight).to(x.dtype)


def layernorm(x: Tensor, eps: Any, weight: Any) -> Tensor:
    return affine(F.layer_norm(x, x.shape[-1:], eps=float(eps)), weight)


def rmsnorm(x: Tensor, eps: Any, weight: Any) -> Tensor:
    return affine(RowScale.apply(x, float(eps), True), weight)


class RowScale(torch.autograd.Function):
    """y = x·r(x) over the last dimension, with its backward written out.

    ``rms=True``: r = 1/√(mean(x²) + eps) (RMSNorm without weight). ``rms=False``:
    r = 1/max(‖x‖, eps) (``F.normalize``). With y = x·r, dx = r·(dy − y·⟨y, dy⟩/d) for RMSNorm
    and r·(dy − y·⟨y, dy⟩) for the unit norm (dx = r·dy where the eps clamp is active). Autograd
    through the composite ops takes about twice the passes over (…, N, D), and on CPU in torch
    2.13 that made cosine and qk_rmsnorm ~1.15× SDPA (measured with `attnscale bench`).
    First derivatives only.
    """

    @staticmethod
    def forward(ctx, x: Tensor, eps: float, rms: bool) -> Tensor:  # type: ignore[override]
        # Half-precision rows are measured in float32: ‖x‖² overflows float16 at ‖x‖ > 256.
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=work)  # (…, N, 1)
        if rms:
            r = torch.rsqrt(norm * norm / x.shape[-1] + eps)
            active = None
        else:
            r = 1.0 / norm.clamp_min(eps)
            active = norm > eps
        y = (x * r).to(x.dtype)
        ctx.save_for_backward(y, r, active)
        ctx.rms = rms
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: Tensor):  # type: ignore[override]
        y, r, active = ctx.saved_tensors
        yw, dyw = y.to(r.dtype), dy.to(r.dtype)
        dot = torch.linalg.vecdot(yw, dyw).unsqueeze(-1)  # ⟨y, dy⟩ per row
        dot = dot / y.shape[-1] if ctx.rms else dot * active
        return torch.addcmul(dyw, yw, dot, value=-1.0).mul_(r).to(dy.dtype), None, None


def check_positive(name: str, value: Any) -> None:
    """Raise TypeError/ValueError naming ``name`` unless ``value`` is a positive number or a
    positive float tensor (a learned one is trusted: its parametrization keeps it positive)."""
    if isinstance(value, Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a float tensor or a number, got dtype {value.dtype}")
        # A learned parameter is kept positive by its parametrization; checking it would
        # force a device sync on every call.
        if value.requires_grad:
            return
        ok = bool(torch.all(value > 0)) and bool(torch.all(torch.isfinite(value)))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        ok = value > 0 and math.isfinite(value)
    else:
        raise TypeError(f"{name} must be a positive number or tensor, got {type(value).__name__}")
    if not ok:
        raise ValueError(f"{name} must be > 0 and finite, got {value!r}")
