"""The monitor's native kernel: attention with logit statistics, built at install.

:func:`fused_kernel` loads ``csrc/attention_with_sums.cpp``'s build through
:func:`attnscale.util.cppext.build` (the installed build, else a just-in-time one, compiled in
about 20 s once per environment) and returns it, or None where it cannot be used
-- native kernels switched off (``$ATTNSCALE_NATIVE_ISA=off``), no C++ compiler or ninja, a
failed build -- with the reason in :func:`unavailable_reason`. The vector code is ATen's
``at::vec``: AVX512 or AVX2 on x86 CPUs that have them, else the portable ``generic`` build
(ARM included); :func:`isa` says which one loaded. Callers fall back to the Python version,
:func:`attnscale.measure.rowstats.attention_with_sums`, which is also the reference the kernel
is tested against.

One call reads q and k once and returns the statistics of several scores of them: the
attention's own logits scale·q·k (whose output it computes), and any number of counterfactual
"dot" (s·q·k) and "cosine" (τ·q·k/(‖q‖‖k‖)) variants, from the logits block while it is in cache.

The kernel runs as the PyTorch operator ``attnscale::attention_stats`` (:data:`STATS_OP`; not
differentiable, with a fake implementation for shapes), whose ``isa`` argument names the build,
so eager code and torch.compile call it alike and a compiled graph holds it without a graph
break.

Build it ahead of use with ``python -m attnscale.measure.native --build`` (or
:func:`ensure_built`), which prints one line saying which build loaded. Otherwise the first
:func:`fused_kernel` call in a process builds or loads it and logs ONE line before it blocks, on
the ``logging`` logger ``attnscale.measure.native``: at WARNING when it must compile (about
30 s), at INFO when it loads a build; later calls are silent.
Why ``logging``: a library must not write to stdout (it may be a command's machine-readable
output), and the line is progress, not a fault in the caller's code -- ``warnings.warn`` is for
the latter, and under ``-W error`` (common in test suites) it would turn the notice into an
exception. Why WARNING for the build: without any logging set up, Python's last-resort handler
prints WARNING and above to stderr, so a user waiting 30 s sees why; an application silences it
with ``logging.getLogger("attnscale").setLevel(logging.ERROR)``. A failed build warns once
(``warnings.warn``) and every caller takes its Python path.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from attnscale.measure.rowstats import SATURATION, SUM_FIELDS
from attnscale.util import cppext

SOURCE = Path(__file__).parent / "csrc" / "attention_with_sums.cpp"
STEM = SOURCE.stem  # the build is attention_with_sums_<isa>
WHAT = "the monitor's native kernel"
COSINE_EPS = 1e-12  # the cosine score's default norm clamp (attnscale.core.scores)
# Per requested ISA (None: this machine's choice): (kernel, the ISA it was built for, module)
# or (None, why there is none, None).
_state: dict[str | None, tuple[Callable | None, str, ModuleType | None]] = {}
log = logging.getLogger(__name__)
STATS_OP = "attnscale::attention_stats"
LIBRARY = torch.library.Library("attnscale", "FRAGMENT")  # the operator's registrations
LIBRARY.define(
    "attention_stats(Tensor q, Tensor k, Tensor v, Tensor? keep, bool is_causal, float scale,"
    " Tensor rows_kept, float saturation, bool with_output, float[] dot_scales,"
    " float[] cosine_taus, float eps, str? isa) -> (Tensor, Tensor, Tensor)")
# Not differentiable (statistics; the monitor takes its output only where autograd is off): its
# outputs carry no autograd history.
LIBRARY.impl("attention_stats", torch.library.fallthrough_kernel, "Autograd")


def fused_kernel(isa: str | None = None) -> Callable | None:
    """The kernel, or None when it cannot be used (see :func:`unavailable_reason`), as

        kernel(q, k, v, keep, is_causal, scale, rows_kept, with_output=True,
               dot_scales=(), cosine_taus=()) -> (out, sums, max_abs_logit)

    q (B, H, N, d), k and v (B, Hkv, S, ·) float32 CPU tensors (H a multiple of Hkv: grouped
    queries as SDPA's ``enable_gqa``); ``keep`` a bool mask broadcasting to (B, H, N, S)
    (True = attend) or None; ``rows_kept`` (B, N) bool, the query rows the statistics count.
    ``out`` is softmax(scale·q·kᵀ masked)·v (B, H, N, Dv), empty when ``with_output`` is false.
    Without variants ``sums`` is (H, len(SUM_FIELDS)) and ``max_abs_logit`` (H,), of the logits
    scale·q·k, as :func:`attnscale.measure.rowstats.head_sums` gives them. With ``dot_scales``
    (logits s·q·k, s > 0) or ``cosine_taus`` (τ·q·k/(max(‖q‖, ε)·max(‖k‖, ε)),
    ε = :data:`COSINE_EPS`, as ``F.normalize``) they are (V, H, F) and (V, H), V = 1 + the
    variants: the attention's own logits first, then the dot and the cosine variants in order.
    Variants need scale > 0. A kept row whose visible logits scale·q·k include NaN or ±inf
    counts only in "scored" and "nonfinite" and makes max |logit| +inf, in every variant alike
    (the rule of :mod:`attnscale.measure.headstats`; variants are computed from those logits,
    so they inherit them -- including an overflow of scale·q·k that their own score would not
    have, which the monitor avoids by recomputing such calls' counterfactuals).

    ``isa``: one of :data:`attnscale.util.cppext.FLAGS` to build for (e.g. ``"generic"``, the
    portable build any CPU compiles); None takes :func:`attnscale.util.cppext.target_isa`,
    which ``$ATTNSCALE_NATIVE_ISA`` can force. Built or loaded once per process and ISA."""
    return loaded(isa)[0]


def loaded(isa: str | None) -> tuple[Callable | None, str, ModuleType | None]:
    """(:func:`fused_kernel`'s callable, the ISA built for, the module), or (None, why there is
    none, None), for the build ``isa``; built or loaded on first use."""
    if isa not in _state:
        module, found = cppext.build(STEM, SOURCE, WHAT, log, isa=isa)
        _state[isa] = (None if module is None else _calling(isa), found, module)
    return _state[isa]


def unavailable_reason(isa: str | None = None) -> str | None:
    """Why :func:`fused_kernel` returned None (None if it did not)."""
    kernel = fused_kernel(isa)
    return None if kernel is not None else _state[isa][1]


def isa(requested: str | None = None) -> str | None:
    """The capability the loaded kernel was built for ("AVX512", "AVX2", "generic"), or None
    when there is none."""
    return _state[requested][1] if fused_kernel(requested) is not None else None


def ensure_built() -> str:
    """Build (or load from the cache) the kernel for this machine now, and return one line
    saying which build is in use or why none is. Meant for install steps and command lines."""
    kernel = fused_kernel()
    if kernel is None:
        return (f"attnscale: no native monitor kernel ({unavailable_reason()}); the monitor "
                "takes its Python path")
    found = isa()
    origin = cppext.ORIGINS.get((STEM, str(found)), ("loaded", ""))[0]
    return f"attnscale: native monitor kernel ready: {found} build ({STEM}, {origin})"


def _calling(isa: str | None) -> Callable:
    """What every caller would otherwise repeat: the unit last stride the kernel reads, the mask
    expanded to its full shape, the saturation threshold of attnscale.measure.rowstats, and the
    variant axis dropped when there are no variants; the call goes to :data:`STATS_OP` with
    ``isa``."""

    def call(q, k, v, keep, is_causal, scale, rows_kept, with_output=True, dot_scales=(),
             cosine_taus=()):
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        if keep is not None:
            keep = keep.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        out, sums, head_max = torch.ops.attnscale.attention_stats.default(
            q, k, v, keep, bool(is_causal), float(scale), rows_kept.contiguous(), SATURATION,
            with_output, [float(s) for s in dot_scales], [float(t) for t in cosine_taus],
            COSINE_EPS, isa)
        if not dot_scales and not cosine_taus:
            return out, sums[0], head_max[0]
        return out, sums, head_max

    return call


@torch.library.impl(STATS_OP, "cpu", lib=LIBRARY)
def attention_stats(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool,
                    scale: float, rows_kept: Tensor, saturation: float, with_output: bool,
                    dot_scales: list[float], cosine_taus: list[float], eps: float,
                    isa: str | None) -> tuple[Tensor, Tensor, Tensor]:
    """(out, sums (V, H, F), max |logit| (V, H)) of the kernel built for ``isa``, as
    :func:`fused_kernel` describes them (always with the variant axis; F =
    len(SUM_FIELDS)). RuntimeError naming the reason where that build is not available."""
    _, found, module = loaded(isa)
    if module is None:
        raise RuntimeError(f"{STATS_OP}: no {WHAT} for isa={isa!r} ({found})")
    out, sums, head_max = module.attention_with_sums(
        q, k, v, keep, is_causal, scale, rows_kept, saturation, with_output, dot_scales,
        cosine_taus, eps)
    return out, sums, head_max


@torch.library.register_fake(STATS_OP, lib=LIBRARY)
def attention_stats_fake(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool,
                         scale: float, rows_kept: Tensor, saturation: float, with_output: bool,
                         dot_scales: list[float], cosine_taus: list[float], eps: float,
                         isa: str | None) -> tuple[Tensor, Tensor, Tensor]:
    """The outputs as the kernel allocates them: out (B, H, N, Dv) laid out as (B, N, H, Dv),
    SDPA's own output layout (or empty without ``with_output``); the sums in float64."""
    b, h, n = q.shape[0], q.shape[1], q.shape[2]
    variants = 1 + len(dot_scales) + len(cosine_taus)
    if with_output:
        out = q.new_empty((b, n, h, v.shape[3])).permute(0, 2, 1, 3)
    else:
        out = q.new_empty((0,))
    sums = q.new_empty((variants, h, len(SUM_FIELDS)), dtype=torch.float64)
    return out, sums, q.new_empty((variants, h), dtype=torch.float64)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnscale.measure.native --build``: build or load the kernel now and print
    one line saying which build is in use (exit status 0 either way: the monitor works
    without it)."""
    parser = argparse.ArgumentParser(prog="python -m attnscale.measure.native",
                                     description="Build the monitor's native kernel once.")
    parser.add_argument("--build", action="store_true", required=True,
                        help="build (or load from the cache) and report which build is in use")
    parser.parse_args(argv)
    print(ensure_built())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
