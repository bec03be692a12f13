"""Run by test_kernel_builds.py in a fresh environment: each native kernel computes against its
float64 reference; prints the name of each one that did."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import attnscale
from attnscale.core import native
from attnscale.measure import native as monitor

torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
for score, name in (("softcap", "softcap"), ("qk_rmsnorm", "rows")):
    out = attnscale.attention(q, k, v, score=score)
    ref = attnscale.reference_attention(q, k, v, score=score)
    assert (out.double() - ref).abs().max() < 1e-5, score
    assert score != "softcap" or native.last_path() == "native", native.last_path()
    print(name)
kernel = monitor.fused_kernel()
assert kernel is not None, monitor.unavailable_reason()
out, sums, head_max = kernel(q, k, v, None, False, 8 ** -0.5, torch.ones(1, 16, dtype=torch.bool))
assert (out - F.scaled_dot_product_attention(q, k, v)).abs().max() < 1e-5
assert head_max.shape == (2,) and bool(torch.isfinite(sums).all())
print("monitor")
