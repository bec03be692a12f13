"""The monitor's native kernel: attention with logit statistics, built once per machine.

:func:`fused_kernel` compiles ``csrc/attention_with_sums.cpp`` with
:func:`attnscale.util.cppext.build` (about 30 s once per machine; later processes load the
cached build) and returns it, or None where it cannot be used
-- native kernels switched off (``$ATTNSCALE_NATIVE_ISA=off``), no C++ compiler or ninja, a
failed build -- with the reason in :func:`unavailable_reason`. The vector code is ATen's
``at::vec``: AVX512 or AVX2 on x86 CPUs that have them, else the portable ``generic`` build
(ARM included); :func:`isa` says which one loaded. Callers fall back to the Python version,
:func:`attnscale.measure.rowstats.attention_with_sums`, which is also the reference the kernel
is tested against.

One call reads q and k once and returns the statistics of several scores of them: the
attention's own logits scale·q·k (whose output it computes), and any number of counterfactual
"dot" (s·q·k) and "cosine" (τ·q·k/(‖q‖‖k‖)) variants, from the logits block while it is in cache.

Build it ahead of use with ``python -m attnscale.measure.native --build`` (or
:func:`ensure_built`), which prints one line saying which build loaded. Otherwise the first
:func:`fused_kernel` call in a process builds or loads it and logs ONE line before it blocks, on
the ``logging`` logger ``attnscale.measure.native``: at WARNING when no cached build is found
(the ~30 s compile), at INFO when one is (a load of about a second); later calls are silent.
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

from attnscale.measure.rowstats import SATURATION
from attnscale.util import cppext

SOURCE = Path(__file__).parent / "csrc" / "attention_with_sums.cpp"
STEM = "attention_stats"  # the module is attnscale_attention_stats_<isa>
WHAT = "the monitor's native kernel"
COSINE_EPS = 1e-12  # the cosine score's default norm clamp (attnscale.core.scores)
# Per requested ISA (None: this machine's choice): (kernel, the ISA it was built for) or
# (None, why there is none).
_state: dict[str | None, tuple[Callable | None, str]] = {}
log = logging.getLogger(__name__)


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
    if isa not in _state:
        module, found = cppext.build(STEM, SOURCE, WHAT, log, isa=isa)
        _state[isa] = (None if module is None else _calling(module.attention_with_sums), found)
    return _state[isa][0]


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
    return (f"attnscale: native monitor kernel ready: {found} build "
            f"(attnscale_{STEM}_{str(found).lower()})")


def _calling(kernel: Callable) -> Callable:
    """What every caller would otherwise repeat: the unit last stride the kernel reads, the mask
    expanded to its full shape, the saturation threshold of attnscale.measure.rowstats, and the
    variant axis dropped when there are no variants."""

    def call(q, k, v, keep, is_causal, scale, rows_kept, with_output=True, dot_scales=(),
             cosine_taus=()):
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        if keep is not None:
            keep = keep.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        out, sums, head_max = kernel(
            q, k, v, keep, bool(is_causal), float(scale), rows_kept.contiguous(), SATURATION,
            with_output, [float(s) for s in dot_scales], [float(t) for t in cosine_taus],
            COSINE_EPS)
        if not dot_scales and not cosine_taus:
            return out, sums[0], head_max[0]
        return out, sums, head_max

    return call


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
