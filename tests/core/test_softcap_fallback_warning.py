"""The README's promise: softcap attention that falls back to the Python path (half precision,
no kernel, ATTNSCALE_NATIVE_ISA=off) says why, with one NativeFallbackWarning per reason."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from attnscale import attention
from attnscale.core import native
from attnscale.core.native import NativeFallbackWarning


def softcap(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g).to(dtype) for _ in range(3))
    return attention(q, k, v, is_causal=True, score="softcap", cap=5.0)


def fallback_warnings(calls) -> list[str]:
    """The NativeFallbackWarning messages of ``calls`` (every warning recorded, none filtered
    away by Python's once-per-location default)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in calls:
            call()
    return [str(w.message) for w in caught if issubclass(w.category, NativeFallbackWarning)]


def test_half_precision_warns_once_per_dtype():
    native.forget_fallback_warnings()
    messages = fallback_warnings([lambda: softcap(torch.bfloat16)] * 3
                                 + [lambda: softcap(torch.float16)] * 2)
    assert len(messages) == 2, messages
    assert "bfloat16 inputs" in messages[0] and "float16 inputs" in messages[1]
    assert all("query-chunked Python path" in m for m in messages)
    assert native.last_path() == "chunked"
    assert fallback_warnings([lambda: softcap(torch.bfloat16)]) == []  # still once


def test_a_forced_fallback_is_silent():
    native.forget_fallback_warnings()
    with native.forced_fallback():
        assert fallback_warnings([lambda: softcap(torch.bfloat16)]) == []
    assert issubclass(NativeFallbackWarning, UserWarning)  # shown by default


def test_native_kernels_off_warns_once_with_the_reason():
    """ATTNSCALE_NATIVE_ISA=off in a fresh process: float32 calls warn once naming the switch,
    bfloat16 ones once more for their own reason."""
    code = (
        "import warnings, torch\n"
        "from attnscale import attention\n"
        "from attnscale.core.native import NativeFallbackWarning\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for dtype in (torch.float32, torch.float32, torch.bfloat16, torch.bfloat16):\n"
        "        q = torch.randn(1, 2, 8, 4, dtype=dtype)\n"
        "        attention(q, q, q, score='softcap', cap=5.0)\n"
        "for w in caught:\n"
        "    if issubclass(w.category, NativeFallbackWarning):\n"
        "        print('WARNED', w.message)\n")
    env = {**os.environ, "ATTNSCALE_NATIVE_ISA": "off"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("WARNED")]
    assert len(lines) == 2, out
    assert "ATTNSCALE_NATIVE_ISA=off" in lines[0] and "bfloat16 inputs" in lines[1]


@pytest.fixture(autouse=True)
def _forget():
    yield
    native.forget_fallback_warnings()
