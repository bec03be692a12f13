"""The q/k row normalizations with a hand-written backward (attnscale.core.score_ops):
LayerNorm (:class:`CenteredRowScale`), RMSNorm and the unit norm (:class:`RowScale`), on both
of their paths: the native kernel (attnscale.core.native_rows) and, forced, the PyTorch ops.

Each is compared with autograd through its plain formula in float64, on inputs in the two
layouts attention sees -- contiguous (B, H, N, D) and (B, N, H, D) transposed to (B, H, N, D), as
q/k viewed out of a projection -- with dy in either layout (PyTorch's CPU flash backward returns
(B, N, H, D)-ordered gradients).

Tolerances, per row, with u the unit roundoff of the working precision (Higham 2002, §3.1; the
same derivation as ``test_properties.py``): the forward's relative ℓ2 error is e = (d + 4)·u for
RMSNorm and the unit norm, (2d + 8)·κ²·u for LayerNorm (κ = max|x|/σ(x) of the row). The
gradient dx = r·(dy − mean(dy)·1 − y·⟨y, dy⟩·c) (c = 1/d, or 1 for the unit norm) is r times
three terms of norm ≤ ‖dy‖ each (‖y‖²·c ≤ 1); each term carries y's error e and its d-term row
sum's d·u plus a few roundings, and r carries e: ‖δdx‖ ≤ 3·(2e + (d + 4)·u)·r·‖dy‖. A
half-precision input adds one rounding of the output (u_h relative) and of the saved y.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from native_support import must_build

from attnscale.core import native_rows
from attnscale.core.score_ops import CenteredRowScale, RowScale
from attnscale.util import cppext

EPS = 1e-5



@pytest.fixture(params=["native", "python"], autouse=True)
def path(request):
    """Every test runs on the native kernel and on the PyTorch-ops fallback."""
    if request.param == "native":
        status = native_rows.kernel_status()
        if status["path"] != "native":
            if must_build():
                pytest.fail(f"the row-normalization kernel did not build: {status['reason']}")
            pytest.skip(f"no native kernel here: {status['reason']}")
    with native_rows.forced_fallback() if request.param == "python" else nullcontext():
        yield request.param


def layer_plain(x: torch.Tensor, eps: float) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


def rms_plain(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)


def unit_plain(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def layer_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    return 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    return 1 / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)


def unit_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    return 1 / x.norm(dim=-1, keepdim=True).clamp_min(eps)


# name: (fast Function, plain formula, its row scale r, forward error e(x, u))
NORMS = {
    "layer": (lambda x, eps: CenteredRowScale.apply(x, eps), layer_plain, layer_scale,
              lambda x, u: (2 * x.shape[-1] + 8) * kappa(x) ** 2 * u),
    "rms": (lambda x, eps: RowScale.apply(x, eps, True), rms_plain, rms_scale,
            lambda x, u: (x.shape[-1] + 4) * u),
    "unit": (lambda x, eps: RowScale.apply(x, eps, False), unit_plain, unit_scale,
             lambda x, u: (x.shape[-1] + 4) * u),
}


def kappa(x: torch.Tensor) -> torch.Tensor:
    """Per row max|x|/σ(x), the cancellation factor of x − mean(x); shape (…, N, 1)."""
    x = x.double()
    return x.abs().amax(-1, keepdim=True) / x.std(-1, unbiased=False, keepdim=True)


def rows(shape: tuple[int, int, int, int], layout: str, dtype=torch.float32, seed: int = 0,
         offset: float = 0.0) -> torch.Tensor:
    """A (B, H, N, D) tensor, contiguous ("bhnd") or a transposed (B, N, H, D) one ("bnhd")."""
    g = torch.Generator().manual_seed(seed)
    b, h, n, d = shape
    if layout == "bhnd":
        x = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    else:
        x = torch.randn(b, n, h, d, generator=g, dtype=torch.float64).transpose(1, 2)
    return (x + offset).to(dtype)


def row_err(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    return (got.double() - want).norm(dim=-1, keepdim=True)


def reference(name: str, x: torch.Tensor, dy: torch.Tensor, eps: float):
    """(y, dx, r) of the plain formula in float64 on the same input values."""
    _, plain, scale, _ = NORMS[name]
    x64 = x.detach().double().requires_grad_()
    y = plain(x64, eps)
    (dx,) = torch.autograd.grad(y, x64, dy.double())
    return y.detach(), dx, scale(x64.detach(), eps)


def run(name: str, x: torch.Tensor, dy: torch.Tensor, eps: float):
    fast = NORMS[name][0]
    x = x.detach().requires_grad_()
    y = fast(x, eps)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y, dx


def assert_float32_bounds(name: str, x: torch.Tensor, dy: torch.Tensor) -> None:
    """y and dx of the float32 norm within the module docstring's per-row bounds."""
    y, dx = run(name, x, dy, EPS)
    y_ref, dx_ref, r = reference(name, x, dy, EPS)
    u = torch.finfo(torch.float32).eps / 2
    e = NORMS[name][3](x, u)
    assert (row_err(y, y_ref) <= e * y_ref.norm(dim=-1, keepdim=True)).all()
    bound = 3 * (2 * e + (x.shape[-1] + 4) * u) * r * dy.double().norm(dim=-1, keepdim=True)
    assert (row_err(dx, dx_ref) <= bound).all()


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_gradcheck(name, layout):
    x = rows((2, 3, 4, 8), layout, torch.float64, offset=0.5).requires_grad_()
    fast = NORMS[name][0]
    assert torch.autograd.gradcheck(lambda t: fast(t, EPS), (x,))


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("dy_layout", ["bhnd", "bnhd"])
def test_float32_matches_the_float64_formula(name, layout, dy_layout):
    x = rows((2, 3, 7, 64), layout, offset=2.0)  # an offset makes LayerNorm's centring matter
    dy = rows((2, 3, 7, 64), dy_layout, seed=1)
    assert_float32_bounds(name, x, dy)


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_output_and_gradient_keep_the_input_layout(name, layout):
    """y and dx come back in x's memory layout whatever dy's: contiguous for a leaf (its .grad
    needs no copy), (B, N, H, D) for q/k viewed out of a projection."""
    x = rows((2, 3, 5, 16), layout)
    other = "bnhd" if layout == "bhnd" else "bhnd"
    y, dx = run(name, x, rows((2, 3, 5, 16), other, seed=1), EPS)
    assert y.stride() == x.stride()
    assert dx.stride() == x.stride()


@pytest.mark.parametrize("name", list(NORMS))
def test_broadcast_gradient(name):
    """dy with stride 0 (the gradient of a sum) gives the formula's gradient."""
    x = rows((1, 2, 3, 8), "bnhd", torch.float64, offset=1.0)
    dy = torch.ones(1, 1, 1, 1, dtype=torch.float64).expand(x.shape)
    _, dx = run(name, x, dy, EPS)
    _, dx_ref, _ = reference(name, x, dy, EPS)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(NORMS))
def test_degenerate_rows_follow_the_eps_clamp(name):
    """Rows where eps decides: constant rows (LayerNorm's variance is 0, r = 1/√eps), zero rows
    and, for the unit norm, rows with ‖x‖ below eps (r = 1/eps, dx = r·dy). Compared in
    float64 with autograd through the plain formula."""
    x = rows((1, 2, 4, 8), "bnhd", torch.float64)
    x[0, 0, 0] = 0.0
    x[0, 0, 1] = 3.25  # constant
    x[0, 1, 2] *= 1e-9
    dy = rows((1, 2, 4, 8), "bhnd", torch.float64, seed=2)
    for eps in (EPS, 1e-3):
        y, dx = run(name, x, dy, eps)
        y_ref, dx_ref, _ = reference(name, x, dy, eps)
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(dx, dx_ref, rtol=1e-10, atol=1e-12)


def test_layernorm_matches_torch_layer_norm():
    """The same function as F.layer_norm without weight or bias (values and gradients)."""
    x = rows((2, 3, 5, 16), "bnhd", torch.float64, offset=-1.5).requires_grad_()
    dy = rows((2, 3, 5, 16), "bnhd", torch.float64, seed=3)
    ours = torch.autograd.grad(CenteredRowScale.apply(x, EPS), x, dy)[0]
    theirs = torch.autograd.grad(F.layer_norm(x, (16,), eps=EPS), x, dy)[0]
    torch.testing.assert_close(CenteredRowScale.apply(x, EPS), F.layer_norm(x, (16,), eps=EPS))
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_works_in_float32(name, dtype):
    """Half-precision rows are normalized in float32 and rounded once, and rows with
    ‖x‖ > 256 (whose ‖x‖² overflows float16) stay finite."""
    x = (rows((1, 2, 6, 64), "bnhd") * 40 + 20).to(dtype)
    dy = rows((1, 2, 6, 64), "bhnd", seed=4).to(dtype)
    y, dx = run(name, x, dy, EPS)
    assert y.dtype == dtype and dx.dtype == dtype
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()
    y_ref, dx_ref, r = reference(name, x, dy, EPS)
    u, uh = torch.finfo(torch.float32).eps / 2, torch.finfo(dtype).eps / 2
    e = NORMS[name][3](x, u) + uh
    assert (row_err(y, y_ref) <= e * y_ref.norm(dim=-1, keepdim=True)).all()
    bound = (3 * (2 * e + (x.shape[-1] + 4) * u) * r * dy.double().norm(dim=-1, keepdim=True)
             + uh * dx_ref.norm(dim=-1, keepdim=True))
    assert (row_err(dx, dx_ref) <= bound).all()


@pytest.mark.parametrize("name", list(NORMS))
def test_empty_input(name):
    x = torch.zeros(2, 0, 8, requires_grad=True)
    y = NORMS[name][0](x, EPS)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("view", ["gaps", "strided rows", "expanded", "3-d"])
def test_irregular_strides(name, view):
    """Inputs that no permutation makes contiguous, and other ranks."""
    base = rows((2, 4, 5, 16), "bnhd", torch.float64, offset=0.5)
    x = {"gaps": base[:, ::2, 1:], "strided rows": base[..., ::2],
         "expanded": base[:1, :1].expand(3, 2, 5, 16), "3-d": base[0]}[view]
    dy = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    y, dx = run(name, x, dy, EPS)
    y_ref, dx_ref, _ = reference(name, x, dy, EPS)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(NORMS))
def test_the_native_path_runs_the_kernel(name, path, monkeypatch):
    """Forward and backward go through the kernel on the native path, never on the other."""
    kernel, calls = native_rows.row_kernel(), []

    class Spy:
        def forward(self, *args):
            calls.append("forward")
            return kernel.forward(*args)

        def backward(self, *args):
            calls.append("backward")
            return kernel.backward(*args)

    # the operators' implementations and the path choice both read KERNEL.module()
    monkeypatch.setattr(native_rows.KERNEL, "module", Spy)
    x, dy = rows((1, 2, 3, 8), "bnhd"), rows((1, 2, 3, 8), "bhnd", seed=1)
    run(name, x, dy, EPS)
    assert calls == (["forward", "backward"] if path == "native" else [])
    calls.clear()
    run(name, x.half(), dy.half(), EPS)  # half precision: the float32 PyTorch ops
    assert calls == []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    run(name, x, dy, EPS)  # a torch.compile trace takes the kernel too (tests/core/test_compile.py)
    assert calls == (["forward", "backward"] if path == "native" else [])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NORMS))
def test_generic_build_matches_the_formula(name, path, monkeypatch):
    """The portable build (CPU_CAPABILITY=DEFAULT, at::vec's plain C++) compiles and meets the
    same float32 bounds, forward and backward. One ~20 s build, shared by the three norms."""
    if path != "native" or not must_build():
        pytest.skip("the generic build is checked once, where kernels must build")
    module, isa = cppext.build(native_rows.STEM, native_rows.SOURCE,
                               "the q/k row-normalization kernel (generic)",
                               logging.getLogger(__name__), isa="generic")
    assert module is not None, isa
    assert isa == "generic"
    monkeypatch.setattr(native_rows.KERNEL, "state", {**native_rows.KERNEL.state,
                                                      "module": module})
    assert native_rows.KERNEL.active() is module
    x, dy = rows((2, 3, 7, 64), "bnhd", offset=2.0), rows((2, 3, 7, 64), "bhnd", seed=1)
    assert_float32_bounds(name, x, dy)


@pytest.mark.parametrize("name", list(NORMS))
def test_a_fallback_forward_has_a_fallback_backward(name, path):
    """A forward on the PyTorch ops (forced, or not covered) keeps its backward there: the
    kernel's backward reads buffers only its own forward lays out. q sliced out of a fused qkv
    projection has gaps between rows, so the fallback's saved y is not contiguous."""
    if path != "native":
        pytest.skip("switches between the paths itself")
    qkv = rows((2, 3, 5, 3 * 16), "bnhd", torch.float64, offset=0.5)
    x = qkv[..., :16].detach().requires_grad_()  # (B, H, N, D) with gaps
    with native_rows.forced_fallback():
        y = NORMS[name][0](x, EPS)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))  # outside the switch
    y_ref, dx_ref, _ = reference(name, x, torch.ones_like(y), EPS)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-10, atol=1e-12)
