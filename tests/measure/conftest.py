"""Fixtures for the native kernel: where it must build, a failed build fails the test."""

from __future__ import annotations

import os
import shutil

import pytest

from attnscale.measure import native
from attnscale.util import cppext


def _should_build() -> bool:
    """Whether the native kernel must build here: native kernels not switched off
    (``$ATTNSCALE_NATIVE_ISA``) and a C++ compiler on PATH. The generic ISA builds on any CPU,
    so a failure anywhere else is a bug, not a skip."""
    compiler = os.environ.get("CXX", "c++")
    return os.environ.get(cppext.ENV, "").strip() != "off" and shutil.which(compiler) is not None


def _require(isa: str | None):
    fn = native.fused_kernel(isa)
    if fn is None:
        reason = native.unavailable_reason(isa)
        if _should_build():
            pytest.fail(f"the native kernel ({isa or 'default'} ISA) must build here: {reason}")
        pytest.skip(reason)
    return fn


@pytest.fixture(scope="session")
def kernel_should_build() -> bool:
    return _should_build()


@pytest.fixture(scope="session")
def kernel():
    """The native kernel this machine uses (AVX512, AVX2 or generic)."""
    return _require(None)


@pytest.fixture(scope="session")
def generic_kernel():
    """The portable build (``CPU_CAPABILITY=DEFAULT``), which any CPU compiles."""
    return _require("generic")
