"""Native (C++) kernel for the q/k row normalizations of the QK-norm and cosine scores, built on
first use.

``csrc/row_norms.cpp`` computes LayerNorm and RMSNorm without weight and the unit norm over the
last dimension, forward and backward, in one pass over memory each way (the formulas are in
:class:`attnscale.core.score_ops.RowScale` and :class:`~attnscale.core.score_ops.CenteredRowScale`,
which call it). The elementwise-op path it replaces streams each (…, N, D) array 4 times forward
and 6 times backward, and starts as many parallel regions.

The kernel is registered as two PyTorch operators, ``attnscale::row_norm`` ((y, r, dot_scale)
of one normalization) and ``attnscale::row_norm_backward`` (dx), each with a fake
implementation for shapes, so eager code and torch.compile run the same kernel and a compiled
graph holds it without a graph break. The operators themselves are not differentiable (their
Autograd key falls through); the gradient is the backward operator, called from the
``autograd.Function`` of :mod:`attnscale.core.score_ops`, which Dynamo traces. (A
``torch.library.register_autograd`` formula would add 2.5–3× as much Python per call as that
Function: ``benchmarks/op_overhead.py``.)

:func:`normalize_rows` and :func:`rows_grad` return None -- and the caller runs its PyTorch
ops, unchanged -- when the kernel did not build or does not cover the input: not CPU, not
float32/float64 (half precision takes the float32 PyTorch path), or an empty tensor.
``$ATTNSCALE_NATIVE_ISA=off`` turns it off for the process, and :func:`forced_fallback` for a
``with`` block (tests). Loading the build (:mod:`attnscale.util.cppext`: the installed one, else
compiled once per environment) happens on the first qualifying call -- under torch.compile
while Dynamo traces, outside the graph (:func:`kernel_built`) -- and logs one line on this
module's logger.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from attnscale.util import cppext

SOURCE = Path(__file__).parent / "csrc" / "row_norms.cpp"
STEM = "row_norms"
DTYPES = (torch.float32, torch.float64)
KINDS = {"layer": 0, "rms": 1, "unit": 2}  # the kernel's codes
log = logging.getLogger(__name__)
KERNEL = cppext.Kernel(STEM, SOURCE, "the q/k row-normalization kernel", log)
FORWARD_OP = "attnscale::row_norm"
BACKWARD_OP = "attnscale::row_norm_backward"

__all__ = ["BACKWARD_OP", "FORWARD_OP", "KERNEL", "KINDS", "LIBRARY", "covers", "forced_fallback",
           "kernel_built", "kernel_status", "normalize_rows", "row_kernel", "rows_grad"]

LIBRARY = torch.library.Library("attnscale", "FRAGMENT")  # the operators' registrations
LIBRARY.define("row_norm(Tensor x, str kind, float eps) -> (Tensor, Tensor, Tensor)")
LIBRARY.define(
    "row_norm_backward(Tensor y, Tensor dy, Tensor r, Tensor dot_scale, bool centered) -> Tensor")
# Not differentiable themselves: their outputs carry no autograd history (a fallthrough at the
# Autograd key); score_ops' autograd.Function calls both.
LIBRARY.impl("row_norm", torch.library.fallthrough_kernel, "Autograd")
LIBRARY.impl("row_norm_backward", torch.library.fallthrough_kernel, "Autograd")


def row_kernel() -> ModuleType | None:
    """The compiled row-normalization module, or None where it cannot be built (the reason is
    in :func:`kernel_status`). Built or loaded once per process."""
    return KERNEL.module()


@cppext.constant_to_compile
def kernel_built() -> bool:
    """Whether the kernel is built, building or loading it now if it has not been. Constant to
    torch.compile: Dynamo calls it while tracing instead of tracing the build (which it cannot),
    so the first compiled call builds the kernel outside the graph."""
    return KERNEL.module() is not None


def kernel_status() -> dict[str, Any]:
    """{"isa", "cached", "reason", "path": "native" or "python"}, as
    :meth:`attnscale.util.cppext.Kernel.status`. Builds the kernel if needed."""
    return KERNEL.status()


def forced_fallback() -> AbstractContextManager[None]:
    """Inside the block every row normalization takes the PyTorch-ops path (for tests)."""
    return KERNEL.forced_fallback()


def covers(x: Tensor) -> bool:
    """Whether a normalization of x runs on the kernel now: a non-empty float32/float64 CPU
    tensor, the kernel built and not switched off."""
    return (x.device.type == "cpu" and x.dtype in DTYPES and x.dim() >= 1 and x.numel() > 0
            and not KERNEL.forced and kernel_built())


def normalize_rows(x: Tensor, eps: float, kind: str) -> tuple[Tensor, Tensor, Tensor] | None:
    """(y, r, dot_scale) of the row normalization ``kind`` ("layer", "rms" or "unit") over x's
    last dimension (:data:`FORWARD_OP`): y contiguous with x's shape, r and dot_scale (…, N, 1).
    None when the kernel is off or does not cover x (module docstring). Not differentiable:
    :func:`rows_grad` is the backward."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    if not covers(x):
        return None
    y, r, dot_scale = torch.ops.attnscale.row_norm.default(x, kind, float(eps))
    return y, r.unsqueeze(-1), dot_scale.unsqueeze(-1)


def rows_grad(y: Tensor, dy: Tensor, r: Tensor, dot_scale: Tensor,
              centered: bool) -> Tensor | None:
    """dx = r·dy − dot_scale·⟨y, dy⟩·y − [centered] r·mean(dy), contiguous with y's shape, for
    y, r and dot_scale as :func:`normalize_rows` returned them (:data:`BACKWARD_OP`); None
    when the kernel is off or dy does not match y's dtype and device."""
    if dy.dtype != y.dtype or not covers(dy):
        return None
    return torch.ops.attnscale.row_norm_backward.default(
        y, dy, r.squeeze(-1), dot_scale.squeeze(-1), bool(centered))


# -- the operators ---------------------------------------------------------------------------


def loaded_kernel() -> ModuleType:
    """The kernel module for the operators' implementations; RuntimeError naming the reason
    where there is none (a caller asked for the operator without checking :func:`covers`)."""
    kernel = KERNEL.module()
    if kernel is None:
        raise RuntimeError(f"{FORWARD_OP}: {KERNEL.what} is not available "
                           f"({KERNEL.status()['reason']})")
    return kernel


def unit_rows(t: Tensor) -> Tensor:
    """t, copied only if its rows lack the unit last stride the kernel reads."""
    return t.contiguous() if t.shape[-1] > 1 and t.stride(-1) != 1 else t


@torch.library.impl(FORWARD_OP, "cpu", lib=LIBRARY)
def row_norm_forward(x: Tensor, kind: str, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y, r, dot_scale): y = (x − [kind == "layer"] mean(x))·r contiguous with x's shape, r
    (the row's scale, see :class:`attnscale.core.score_ops.RowScale`) and dot_scale (the factor
    of ⟨y, dy⟩ in the backward pass) of shape x.shape[:-1]."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    y, r, dot_scale = loaded_kernel().forward(unit_rows(x), KINDS[kind], eps)
    return y, r, dot_scale


@torch.library.register_fake(FORWARD_OP, lib=LIBRARY)
def row_norm_forward_fake(x: Tensor, kind: str, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """The forward's outputs as the kernel allocates them: contiguous, in x's dtype."""
    lead = x.shape[:-1]
    return x.new_empty(x.shape), x.new_empty(lead), x.new_empty(lead)


@torch.library.impl(BACKWARD_OP, "cpu", lib=LIBRARY)
def row_norm_backward(y: Tensor, dy: Tensor, r: Tensor, dot_scale: Tensor,
                      centered: bool) -> Tensor:
    """dx = r·dy − dot_scale·⟨y, dy⟩·y − [centered] r·mean(dy), contiguous with y's shape, for
    (y, r, dot_scale) as the forward returned them."""
    return loaded_kernel().backward(y.contiguous(), unit_rows(dy), r.contiguous(),
                                    dot_scale.contiguous(), centered)


@torch.library.register_fake(BACKWARD_OP, lib=LIBRARY)
def row_norm_backward_fake(y: Tensor, dy: Tensor, r: Tensor, dot_scale: Tensor,
                           centered: bool) -> Tensor:
    """dx as the kernel allocates it: contiguous, shaped and typed as y."""
    return y.new_empty(y.shape)
