"""Native (C++) attention kernels for the scores that cannot run on SDPA, built on first use.

One kernel today: ``csrc/softcap_attention.cpp``, soft-capped attention
softmax(cap·tanh(s·q·kᵀ/cap) + mask)·V (Gemma Team 2024, Gemma 2) with the structure of PyTorch's
CPU flash-attention kernel (Dao et al. 2022, arXiv 2205.14135): tiles of queries × keys, tanh
and the online softmax inside the tile, the backward pass recomputing each tile from q, k and
the saved logsumexp. Memory is O(N·D) plus per-thread tiles; no (N, N) or (chunk, N) buffer.

The kernel is registered as two PyTorch operators, ``attnscale::softcap_attention`` (out and
the row logsumexp) and ``attnscale::softcap_attention_backward`` (dq, dk, dv), each with a fake
implementation for shapes, so eager code and torch.compile (Dynamo, AOTAutograd, Inductor) run
the same kernel and a compiled graph holds it without a graph break. The operators themselves
are not differentiable (their Autograd key falls through); :class:`SoftcapAttention`, an
``autograd.Function`` that Dynamo traces, calls the forward and hands its gradient to the
backward operator. (A ``torch.library.register_autograd`` formula instead adds 2.5–3× as much
Python per forward + backward over a direct kernel call, about 100 µs against 40 at a small
size: ``benchmarks/op_overhead.py``.)

A score names its kernel in the registry (``Score(native="softcap")``);
:func:`attnscale.core.chunked.modded_attention` calls :func:`native_attention`, which returns
None -- and the chunked kernel runs, unchanged -- when the kernel did not build or the inputs
are outside what it covers: not CPU, not float32/float64, an empty dimension, or a cap that is
neither a number nor one value per head. (Dropout, a learned cap and a mask that needs a
gradient never get here: they take the materialized path first.)

Loading the build (:mod:`attnscale.util.cppext`: the installed one, else compiled once per
environment in about 40 s) happens on the first call and logs one line on this module's
logger; under torch.compile it happens while Dynamo traces, outside the graph
(:func:`kernel_built`). ``$ATTNSCALE_NATIVE_ISA=off`` turns native kernels off for the process;
:func:`forced_fallback` does it for a ``with`` block (tests), and :func:`last_path` says which
path the last soft-capped call took.

A soft-capped CPU call that the kernel would take but cannot -- half precision (bfloat16 or
float16: the kernel computes in float32 and float64 only), or no kernel (no compiler, a failed
build, ``$ATTNSCALE_NATIVE_ISA=off``) -- runs the query-chunked Python path, several times
slower, and issues one :class:`NativeFallbackWarning` per reason and process, saying why
(:func:`warn_fallback`). :func:`forced_fallback` is a deliberate choice and warns nothing;
inputs the kernel does not cover by design (a mask shape it does not take, an empty dimension)
are routing, not a fallback, and warn nothing either.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnscale.core.score_ops import default_scale
from attnscale.util import cppext

SOURCE = Path(__file__).parent / "csrc" / "softcap_attention.cpp"
STEM = "softcap_attention"
DTYPES = (torch.float32, torch.float64)
HALF = (torch.bfloat16, torch.float16)
log = logging.getLogger(__name__)
KERNEL = cppext.Kernel(STEM, SOURCE, "the soft-capping attention kernel", log, fallback="chunked")
_paths: dict[str, str | None] = {"last": None}
_warned: set[str] = set()  # the fallback reasons warned about in this process
FORWARD_OP = "attnscale::softcap_attention"
BACKWARD_OP = "attnscale::softcap_attention_backward"

LIBRARY = torch.library.Library("attnscale", "FRAGMENT")  # the operators' registrations
LIBRARY.define(
    "softcap_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, float scale,"
    " float[] caps) -> (Tensor, Tensor)")
LIBRARY.define(
    "softcap_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out,"
    " Tensor lse, Tensor? mask, bool is_causal, float scale, float[] caps)"
    " -> (Tensor, Tensor, Tensor)")
# Not differentiable themselves: their outputs carry no autograd history (a fallthrough at the
# Autograd key); SoftcapAttention calls both.
LIBRARY.impl("softcap_attention", torch.library.fallthrough_kernel, "Autograd")
LIBRARY.impl("softcap_attention_backward", torch.library.fallthrough_kernel, "Autograd")


def softcap_kernel() -> ModuleType | None:
    """The compiled soft-capping kernel module, or None where it cannot be built (the reason is
    in :func:`kernel_status`). Built or loaded once per process."""
    return KERNEL.module()


@cppext.constant_to_compile
def kernel_built() -> bool:
    """Whether the kernel is built, building or loading it now if it has not been. Constant to
    torch.compile: Dynamo calls it while tracing instead of tracing the build (which it cannot),
    so the first compiled call builds the kernel outside the graph."""
    return KERNEL.module() is not None


def loaded_kernel() -> ModuleType:
    """The kernel module for the operators' implementations; RuntimeError naming the reason
    where there is none (a caller asked for the operator without checking
    :func:`kernel_built`)."""
    kernel = KERNEL.module()
    if kernel is None:
        raise RuntimeError(f"{FORWARD_OP}: {KERNEL.what} is not available "
                           f"({KERNEL.status()['reason']})")
    return kernel


def kernel_status() -> dict[str, Any]:
    """{"isa": the capability built for or None, "origin": where the build came from
    ("installed", "cache", "built" or None), "reason": why there is no kernel or None, "path":
    "native" or "chunked" (what a qualifying soft-capped call takes now)}. Builds the kernel
    if needed."""
    return KERNEL.status()


def forced_fallback() -> AbstractContextManager[None]:
    """Inside the block every soft-capped call takes the chunked path (for tests)."""
    return KERNEL.forced_fallback()


def note_path(path: str) -> None:
    """Record which path a modded-score call took ("native", "chunked", "materialized",
    "flex"); :func:`last_path` reads it."""
    _paths["last"] = path


def last_path() -> str | None:
    """The path the last modded-score call in this process took (None before any)."""
    return _paths["last"]


class NativeFallbackWarning(UserWarning):
    """A soft-capped call ran the slower Python path where the native kernel would have run,
    for a reason the user can change (module docstring). Once per reason and process; silence
    it with ``warnings.filterwarnings("ignore", category=NativeFallbackWarning)``."""


def warn_fallback(reason: str) -> None:
    """Issue a :class:`NativeFallbackWarning` for ``reason`` unless this process already did.
    Not while torch.compile traces (the first eager call, or the build at the start of a
    compiled one, warns)."""
    if torch.compiler.is_compiling() or reason in _warned:
        return
    _warned.add(reason)
    warnings.warn(f"attnscale: softcap attention runs on the query-chunked Python path, "
                  f"several times slower than its native kernel: {reason} (warned once per "
                  f"reason)", NativeFallbackWarning, stacklevel=4)


def forget_fallback_warnings() -> None:
    """Forget which fallback reasons were warned about, so each warns again (tests)."""
    _warned.clear()


def head_caps(cap: Any, heads: int) -> list[float] | None:
    """One cap per query head as floats, or None when ``cap`` is neither a number, nor a CPU
    tensor of one value or ``heads`` values, nor free of gradient."""
    if isinstance(cap, Tensor):
        if cap.requires_grad or cap.device.type != "cpu" or cap.numel() not in (1, heads):
            return None
        values = [float(c) for c in cap.detach().reshape(-1).tolist()]
        return values * heads if len(values) == 1 else values
    return [float(cap)] * heads


def qualifies(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> bool:
    """Whether the kernel covers these (B, H, N, D) inputs (device, dtype, mask form; no empty
    dimension)."""
    if q.device.type != "cpu" or q.dtype not in DTYPES or not (q.dtype == k.dtype == v.dtype):
        return False
    if 0 in (*q.shape, *k.shape, *v.shape):
        return False
    if mask is None:
        return True
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    shaped = mask.dim() == 4 and all(m in (1, n) for m, n in zip(mask.shape, full, strict=True))
    return shaped and mask.dtype in (torch.bool, q.dtype) and mask.device.type == "cpu"


def softcap_attention(params: dict[str, Any], q: Tensor, k: Tensor, v: Tensor,
                      mask: Tensor | None, is_causal: bool, scale: float | None) -> Tensor | None:
    """softmax(cap·tanh(s·q·kᵀ/cap) + mask)·V on the native kernel, s = ``scale`` or 1/√d, or
    None when the kernel is off or does not cover the inputs. q (B, H, N, D), k (B, Hkv, S, D),
    v (B, Hkv, S, Dv) with Hkv dividing H; mask None, bool (True = keep) or additive, 4-D and
    broadcasting to (B, H, N, S). Differentiable in q, k and v (:class:`SoftcapAttention`)."""
    if KERNEL.forced:
        return None
    if not qualifies(q, k, v, mask):
        if q.device.type == "cpu" and q.dtype in HALF and not torch.compiler.is_compiling():
            warn_fallback(f"{str(q.dtype).removeprefix('torch.')} inputs (the kernel computes "
                          f"in float32 and float64; cast q, k, v to float32 to use it)")
        return None
    caps = head_caps(params["cap"], q.shape[1])
    if caps is None:
        return None
    if not kernel_built():
        if not torch.compiler.is_compiling():  # (the reason is read outside a traced graph)
            warn_fallback(f"the kernel is not available: {KERNEL.status()['reason']} "
                          f"(`attnscale kernels` says more)")
        return None
    s = default_scale(scale, q.shape[-1])
    return SoftcapAttention.apply(q, k, v, mask, is_causal, s, caps)


KERNELS = {"softcap": softcap_attention}  # the names a Score's ``native`` field may take


def native_attention(name: str, params: dict[str, Any], q: Tensor, k: Tensor, v: Tensor,
                     mask: Tensor | None, is_causal: bool, scale: float | None) -> Tensor | None:
    """Run the native kernel ``name`` (a key of :data:`KERNELS`), or None (see above)."""
    if name not in KERNELS:
        raise ValueError(f"native must name one of {sorted(KERNELS)}, got {name!r}")
    return KERNELS[name](params, q, k, v, mask, is_causal, scale)


# -- the operators ---------------------------------------------------------------------------


@torch.library.impl(FORWARD_OP, "cpu", lib=LIBRARY)
def softcap_forward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                    scale: float, caps: list[float]) -> tuple[Tensor, Tensor]:
    """(out (B, H, N, Dv), lse (B, H, N)) of the kernel's forward pass: out as
    :func:`softcap_attention` describes, lse the log Σ exp of each row's logits (+inf on a row
    that sees no key), which its backward pass reads. ``caps``: one cap per query head."""
    out, lse = loaded_kernel().forward(q, k, v, mask, is_causal, scale, caps)
    return out, lse


@torch.library.register_fake(FORWARD_OP, lib=LIBRARY)
def softcap_forward_fake(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                         scale: float, caps: list[float]) -> tuple[Tensor, Tensor]:
    """The forward's outputs as the kernel allocates them: contiguous, in q's dtype."""
    b, h, n = q.shape[0], q.shape[1], q.shape[2]
    return q.new_empty((b, h, n, v.shape[3])), q.new_empty((b, h, n))


@torch.library.impl(BACKWARD_OP, "cpu", lib=LIBRARY)
def softcap_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                     mask: Tensor | None, is_causal: bool, scale: float,
                     caps: list[float]) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the forward's out given grad_out and the forward's (out, lse): the
    tiles recomputed from q, k and lse (dk, dv summed over the query heads of a GQA group)."""
    dq, dk, dv = loaded_kernel().backward(grad_out, q, k, v, out, lse, mask, is_causal, scale,
                                          caps)
    return dq, dk, dv


@torch.library.register_fake(BACKWARD_OP, lib=LIBRARY)
def softcap_backward_fake(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                          lse: Tensor, mask: Tensor | None, is_causal: bool, scale: float,
                          caps: list[float]) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients as the kernel allocates them: contiguous, shaped as q, k and v."""
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)


class SoftcapAttention(torch.autograd.Function):
    """The kernel's forward (saving out and the row logsumexp) and backward (recomputing the
    tiles from q, k and lse), through its operators (:data:`FORWARD_OP`,
    :data:`BACKWARD_OP`), which torch.compile traces. Once differentiable: no double
    backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale, caps):  # type: ignore[override]
        out, lse = torch.ops.attnscale.softcap_attention.default(q, k, v, mask, is_causal, scale,
                                                                 caps)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.args = (is_causal, scale, caps)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, lse, mask = ctx.saved_tensors
        dq, dk, dv = torch.ops.attnscale.softcap_attention_backward.default(
            grad_out, q, k, v, out, lse, mask, *ctx.args)
        return dq, dk, dv, None, None, None, None
