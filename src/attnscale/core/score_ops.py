"""Tensor helpers the scores are built from: per-head parameter shapes, the plain dot product,
and q/k normalizations with a hand-written backward (:class:`RowScale`,
:class:`CenteredRowScale`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnscale.core.native_rows import normalize_rows, rows_grad

__all__ = [
    "CenteredRowScale",
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
    return affine(CenteredRowScale.apply(x, float(eps)), weight)


def rmsnorm(x: Tensor, eps: Any, weight: Any) -> Tensor:
    return affine(RowScale.apply(x, float(eps), True), weight)


def _work_dtype(x: Tensor) -> torch.dtype:
    # Half-precision rows are measured in float32: ‖x‖² overflows float16 at ‖x‖ > 256.
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _memory_order(x: Tensor) -> list[int]:
    """A permutation of x's dimensions, the last one kept last, under which x is contiguous
    (the identity when there is none: x overlaps itself or has gaps).

    The row ops run on ``x.permute(order)``: every pass is then a contiguous sweep, the per-row
    results line up with the rows in memory, and outputs allocated contiguous there come back in
    x's layout. For q/k viewed (B, N, H, D) out of a projection and transposed to (B, H, N, D),
    the PyTorch ops sweep that way about 1.4× faster than over the transposed view.
    """
    lead = sorted(range(x.dim() - 1), key=lambda i: -x.stride(i))  # stable: ties keep order
    order = [*lead, x.dim() - 1]
    return order if x.permute(order).is_contiguous() else list(range(x.dim()))


def _inverse(order: list[int]) -> list[int]:
    inv = [0] * len(order)
    for i, o in enumerate(order):
        inv[o] = i
    return inv


def _scaled_rows_grad(y: Tensor, dy: Tensor, r: Tensor, dot_scale: Tensor,
                      centered: bool = False) -> Tensor:
    """dx = r·dy − c·y − [centered] r·mean(dy) with c = dot_scale·⟨y, dy⟩ per row, in r's dtype
    of work; r and dot_scale are (…, N, 1).

    dx takes y's memory layout, and so x's: the layout x's own gradient wants, contiguous for a
    leaf and (B, N, H, D) for q/k viewed out of a projection. PyTorch's CPU flash backward hands
    dy over in (B, N, H, D) order whatever q's layout, so following dy instead would cost a
    contiguous leaf a transposing copy. One buffer of x's size: the products y·dy are summed,
    then overwritten by dx.
    """
    yw, dyw = y.to(r.dtype), dy.to(r.dtype)
    dx = yw * dyw  # y first: the product takes y's layout
    coef = dx.sum(-1, keepdim=True).mul_(dot_scale).neg_()  # −c
    torch.mul(yw, coef, out=dx)
    if centered:
        dx.sub_(dyw.sum(-1, keepdim=True).mul_(r / y.shape[-1]))
    return dx.addcmul_(dyw, r).to(dy.dtype)


def _normalize_rows(x: Tensor, eps: float, kind: str) -> tuple[Tensor, Tensor, Tensor]:
    """(y, r, dot_scale) of the row normalization ``kind`` (see :class:`RowScale`), y in x's
    layout and dtype, r and dot_scale (…, N, 1) in the dtype of work."""
    d = x.shape[-1]
    if kind == "layer":
        xw = x.to(_work_dtype(x))
        y = xw - xw.mean(-1, keepdim=True)  # x first: y takes x's memory layout
        norm = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
        r = torch.rsqrt(norm * norm / d + eps)
        return y.mul_(r).to(x.dtype), r, r / d
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=_work_dtype(x))
    if kind == "rms":
        r = torch.rsqrt(norm * norm / d + eps)
        dot_scale = r / d
    else:
        r = 1.0 / norm.clamp_min(eps)
        dot_scale = r * (norm > eps)  # the clamp's derivative is 0
    return (x * r).to(x.dtype), r, dot_scale  # x first: the product takes x's layout


def _row_forward(ctx: Any, x: Tensor, eps: float, kind: str) -> Tensor:
    # The native kernel when it covers x (attnscale.core.native_rows), else PyTorch ops; both
    # on x's rows in memory order, so y comes back in x's layout.
    order = _memory_order(x)
    xp = x.permute(order)
    native = normalize_rows(xp, eps, kind)
    y, r, dot_scale = native or _normalize_rows(xp, eps, kind)
    ctx.save_for_backward(y, r, dot_scale)
    ctx.order, ctx.centered, ctx.native = order, kind == "layer", native is not None
    return y.permute(_inverse(order))


def _row_backward(ctx: Any, dy: Tensor) -> Tensor:
    y, r, dot_scale = ctx.saved_tensors
    dyp = dy.permute(ctx.order)
    # the kernel's backward reads the contiguous y, r its forward saved: only after it ran
    dx = rows_grad(y, dyp, r, dot_scale, ctx.centered) if ctx.native else None
    if dx is None:
        dx = _scaled_rows_grad(y, dyp, r, dot_scale, ctx.centered)
    return dx.permute(_inverse(ctx.order))


class RowScale(torch.autograd.Function):
    """y = x·r(x) over the last dimension, with its backward written out.

    ``rms=True``: r = 1/√(mean(x²) + eps) (RMSNorm without weight). ``rms=False``:
    r = 1/max(‖x‖, eps) (``F.normalize``). With y = x·r, dx = r·(dy − y·⟨y, dy⟩/d) for RMSNorm
    and r·(dy − y·⟨y, dy⟩) for the unit norm (dx = r·dy where the eps clamp is active).

    Computed by the native kernel of :mod:`attnscale.core.native_rows` (one pass over memory
    each way; its PyTorch operators, which torch.compile traces) where it covers x, else by
    PyTorch ops (a reduction and an elementwise pass
    forward, four passes backward; autograd through the composite ops takes about twice as
    many). Half precision is computed in float32 and rounded once. y and dx keep x's memory
    layout. First derivatives only.
    """

    @staticmethod
    def forward(ctx, x: Tensor, eps: float, rms: bool) -> Tensor:  # type: ignore[override]
        return _row_forward(ctx, x, eps, "rms" if rms else "unit")

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: Tensor):  # type: ignore[override]
        return _row_backward(ctx, dy), None, None


class CenteredRowScale(torch.autograd.Function):
    """y = (x − μ)·r over the last dimension (LayerNorm without weight or bias, Ba et al. 2016,
    arXiv 1607.06450), with its backward written out.

    μ = mean(x), r = 1/√(mean((x − μ)²) + eps), the biased variance taken after centring (two
    passes, no cancellation in E[x²] − μ²), as ``F.layer_norm``. With y = (x − μ)·r,
    dx = r·(dy − mean(dy) − y·⟨y, dy⟩/d).

    Computed as :class:`RowScale` is: the native kernel where it covers x, else PyTorch ops (four
    passes forward, six backward). y and dx keep x's memory layout; ``F.layer_norm`` makes its
    input contiguous first and is slower on rows as short as a head dimension. First
    derivatives only.
    """

    @staticmethod
    def forward(ctx, x: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        return _row_forward(ctx, x, eps, "layer")

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: Tensor):  # type: ignore[override]
        return _row_backward(ctx, dy), None


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
