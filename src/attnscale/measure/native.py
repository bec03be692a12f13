"""The monitor's native kernel: attention with logit statistics, built on first use.

:func:`fused_kernel` compiles ``csrc/attention_with_sums.cpp`` with PyTorch's C++ extension
builder (about 30 s once per machine; later processes load the cached build) and returns its
``attention_with_sums`` function, or None where it cannot be used -- not an x86 CPU with AVX2,
no C++ compiler or ninja, a failed build -- with the reason in :func:`unavailable_reason`.
Callers fall back to the Python version, :func:`attnscale.measure.rowstats.attention_with_sums`,
which is also the reference the kernel is tested against.

The build lives in PyTorch's extension cache (``~/.cache/torch_extensions``, or
``$TORCH_EXTENSIONS_DIR``). A build killed halfway can leave a lock file there that makes the
next build wait; deleting that folder clears it.

The first :func:`fused_kernel` call in a process logs ONE line before it blocks, on the
``logging`` logger ``attnscale.measure.native``: at WARNING when no cached build is found
(the ~30 s compile), at INFO when one is (a load of about a second); later calls are silent.
Why ``logging``: a library must not write to stdout (it may be a command's machine-readable
output), and the line is progress, not a fault in the caller's code -- ``warnings.warn`` is for
the latter, and under ``-W error`` (common in test suites) it would turn the notice into an
exception. Why WARNING for the build: without any logging set up, Python's last-resort handler
prints WARNING and above to stderr, so a user waiting 30 s sees why; an application silences it
with ``logging.getLogger("attnscale").setLevel(logging.ERROR)``.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import sysconfig
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from attnscale.measure.rowstats import SATURATION

SOURCE = Path(__file__).parent / "csrc" / "attention_with_sums.cpp"
# Flags per vector ISA: the kernel uses at::vec, which picks its width from CPU_CAPABILITY.
FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}
_state: dict[str, object] = {}
log = logging.getLogger(__name__)


def fused_kernel() -> Callable | None:
    """The kernel as ``attend(q, k, v, keep, is_causal, scale, rows_kept, with_output=True)``,
    or None: q (B, H, N, d), k and v (B, Hkv, S, ·) float32 CPU tensors, ``keep`` a bool mask
    broadcasting to (B, H, N, S) or None, ``rows_kept`` (B, N) bool. Returns (out (B, H, N, Dv)
    -- empty when ``with_output`` is false --, sums (H, len(SUM_FIELDS)), max |logit| (H,))."""
    if "kernel" not in _state:
        _state["kernel"], _state["reason"] = _build()
    return _state["kernel"]  # type: ignore[return-value]


def unavailable_reason() -> str | None:
    """Why :func:`fused_kernel` returned None (None if it did not)."""
    fused_kernel()
    return _state["reason"]  # type: ignore[return-value]


def _build() -> tuple[Callable | None, str | None]:
    capability = torch.backends.cpu.get_cpu_capability()
    if platform.machine().lower() not in ("x86_64", "amd64") or capability not in FLAGS:
        return None, f"needs an x86 CPU with AVX2 (this one: {platform.machine()}, {capability})"
    # The builder runs `ninja` from PATH; a venv's own (the `ninja` dependency) is not on PATH
    # when the venv is not activated. PATH is put back afterwards.
    path = os.environ.get("PATH", "")
    scripts = sysconfig.get_path("scripts")
    if shutil.which("ninja") is None and scripts and (Path(scripts) / "ninja").exists():
        os.environ["PATH"] = f"{scripts}{os.pathsep}{path}"
    name = f"attnscale_attention_with_sums_{capability.lower()}"
    _announce(name)
    try:
        from torch.utils.cpp_extension import load

        module = load(
            name=name,
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-fopenmp", *FLAGS[capability]],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as err:  # any build failure means: use the fallback
        reason = f"the native kernel did not build ({type(err).__name__}: {err})"
        warnings.warn(f"attnscale: {reason}; using the slower Python path", stacklevel=3)
        return None, reason
    finally:
        os.environ["PATH"] = path
    return _calling(module.attention_with_sums), None


def _announce(name: str) -> None:
    """The one line logged before the build blocks (see the module docstring)."""
    if _cached(name):
        log.info("attnscale: loading the monitor's native kernel %s from PyTorch's extension "
                 "cache", name)
    else:
        log.warning("attnscale: building the monitor's native kernel %s with "
                    "torch.utils.cpp_extension (about 30 s, once per machine; cached after)", name)


def _cached(name: str) -> bool:
    """Whether a built module ``name`` lies in PyTorch's extension cache: ``$TORCH_EXTENSIONS_DIR``
    or the default root, directly or in the per-Python/per-accelerator folder newer PyTorch adds.
    Only the log level depends on it; the builder itself decides whether to rebuild."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    patterns = [f"{name}/{name}.so", f"*/{name}/{name}.so", f"{name}/{name}.pyd"]
    return any(any(root.glob(pattern)) for pattern in patterns)


def _calling(kernel: Callable) -> Callable:
    """What every caller would otherwise repeat: the unit last stride the kernel reads, the mask
    expanded to its full shape, the saturation threshold of attnscale.measure.rowstats."""

    def attend(q, k, v, keep, is_causal, scale, rows_kept, with_output=True):
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        if keep is not None:
            keep = keep.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return kernel(q, k, v, keep, bool(is_causal), float(scale), rows_kept.contiguous(),
                      SATURATION, with_output)

    return attend
