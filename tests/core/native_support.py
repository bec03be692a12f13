"""What the native-kernel tests of this folder share (imported by name: pytest puts this folder
on sys.path)."""

from __future__ import annotations

import platform

import torch

from attnscale.util import cppext


def must_build() -> bool:
    """Where the kernels must build (this project's machines): x86 with AVX2 or AVX512, native
    kernels not switched off. Elsewhere a missing kernel is a skip, not a failure."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and \
        cppext.target_isa() is not None
