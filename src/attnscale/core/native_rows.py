"""Native (C++) kernel for the q/k row normalizations of the QK-norm and cosine scores, built on
first use.

``csrc/row_norms.cpp`` computes LayerNorm and RMSNorm without weight and the unit norm over the
last dimension, forward and backward, in one pass over memory each way (the formulas are in
:class:`attnscale.core.score_ops.RowScale` and :class:`~attnscale.core.score_ops.CenteredRowScale`,
which call it). The elementwise-op path it replaces streams each (…, N, D) array 4 times forward
and 6 times backward, and starts as many parallel regions.

:func:`normalize_rows` and :func:`rows_grad` return None -- and the caller runs its PyTorch
ops, unchanged -- when the kernel did not build or does not cover the inputs: not CPU, not
float32/float64 (half precision takes the float32 PyTorch path), an empty tensor, or a
torch.compile trace. ``$ATTNSCALE_NATIVE_ISA=off`` turns it off for the process, and
:func:`forced_fallback` for a ``with`` block (tests). The build (:mod:`attnscale.util.cppext`,
about 40 s once per machine, then cached) happens on the first qualifying call and logs one
line on this module's logger.
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

__all__ = ["KERNEL", "KINDS", "forced_fallback", "kernel_status", "normalize_rows",
           "row_kernel", "rows_grad"]


def row_kernel() -> ModuleType | None:
    """The compiled row-normalization module, or None where it cannot be built (the reason is
    in :func:`kernel_status`). Built or loaded once per process."""
    return KERNEL.module()


def kernel_status() -> dict[str, Any]:
    """{"isa", "cached", "reason", "path": "native" or "python"}, as
    :meth:`attnscale.util.cppext.Kernel.status`. Builds the kernel if needed."""
    return KERNEL.status()


def forced_fallback() -> AbstractContextManager[None]:
    """Inside the block every row normalization takes the PyTorch-ops path (for tests)."""
    return KERNEL.forced_fallback()


def _covers(x: Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype in DTYPES and x.dim() >= 1 and x.numel() > 0
            and not torch.compiler.is_compiling())


def _ready(t: Tensor) -> tuple[ModuleType, Tensor] | None:
    # The kernel reads rows with a unit last stride; None: it is off or does not cover t.
    kernel = KERNEL.active() if _covers(t) else None
    if kernel is None:
        return None
    return kernel, (t.contiguous() if t.shape[-1] > 1 and t.stride(-1) != 1 else t)


def normalize_rows(x: Tensor, eps: float, kind: str) -> tuple[Tensor, Tensor, Tensor] | None:
    """(y, r, dot_scale) of the row normalization ``kind`` ("layer", "rms" or "unit") over x's
    last dimension: y contiguous with x's shape, r and dot_scale (…, N, 1). None when the
    kernel is off or does not cover x (module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    ready = _ready(x)
    if ready is None:
        return None
    kernel, x = ready
    y, r, dot_scale = kernel.forward(x, KINDS[kind], float(eps))
    return y, r.unsqueeze(-1), dot_scale.unsqueeze(-1)


def rows_grad(y: Tensor, dy: Tensor, r: Tensor, dot_scale: Tensor,
              centered: bool) -> Tensor | None:
    """dx = r·dy − dot_scale·⟨y, dy⟩·y − [centered] r·mean(dy), contiguous with y's shape, for
    y, r and dot_scale as :func:`normalize_rows` returned them; None when the kernel is off or
    dy does not match y's dtype and device."""
    ready = _ready(dy) if dy.dtype == y.dtype else None
    if ready is None:
        return None
    kernel, dy = ready
    return kernel.backward(y, dy, r, dot_scale, bool(centered))
