"""The soft-capping kernels against the float64 reference: the native one (attnscale.core.native)
and, forced, the chunked fallback -- every check below runs on both paths.

Tolerance: an elementwise first-order rounding bound in the standard model
fl(a ∘ b) = (a ∘ b)(1 + θ), |θ| ≤ u (Higham 2002, "Accuracy and Stability of Numerical
Algorithms", §3.1), with sums of m terms bounded probabilistically: |error| ≤ γ(m)·Σ|terms|,
γ(m) = λ·√m·u, λ = 6 (Higham & Mary 2019, "A new approach to probabilistic rounding error
analysis", SIAM J. Sci. Comput. 41(5); the worst case m·u is 5-30× looser at these sizes). Every
quantity is evaluated in float64 on the example's own inputs: P the weights, t = tanh(u) and
g = 1 − t², O = P·V, dP = dO·Vᵀ, Δ_i = dO_i·O_i.

* Logits. u_ij = (s/cap)·q_i·k_j is a D-term dot product with the scale folded in; f = cap·tanh(u)
  has slope g_ij; tanh adds a relative E_T·u (E_T = 5 for the kernel's float32 rational tanh,
  asserted in test_fast_tanh_error; 1 for Sleef's float64 tanh), the ×cap, the mask add and the
  max subtraction four more:  δ_ij = γ(D + 2)·s·(|Q|·|K|ᵀ)_ij·g_ij + (E_T + 4)·u·|f_ij| +
  2·u·|mask_ij|. The chunked path computes 2·cap·σ(2z/cap) − cap, whose error is absolute:
  + 2·cap·(C_EXP + 3)·u (as in test_properties.py).
* Weights. p_ij = e^{f_ij}/Σ_l e^{f_il} moves by p_ij·(δ_ij + Σ_l p_il·δ_il) to first order; exp
  adds C_EXP ulp (20 for PyTorch's exp_u20), the row sum and the normalization γ(Nk) + 4u:
  relative error E_ij = δ_ij + (P∘δ)_i· + γ(Nk) + (C_EXP + 4)·u. Below FLT_MIN exp returns 0:
  an absolute term (n + 1)·tiny·max|X| covers it.
* out = P·V:   (P∘E)·|V| + γ(Nk)·P·|V|.
* dV = Pᵀ·dO:  (P∘E)ᵀ·|dO| + (γ(Nq) + γ(G))·Pᵀ·|dO|, G query heads per key head (GQA sum).
* dZ = P∘(dP − Δ)∘g is off by (E + ε_g + 3u)∘W + ε_r·R with W = P∘|dP − Δ|, ε_g = 2·δ/cap +
  (2·E_T + 3)·u (the error of g), R = P∘(|dO|·|V|ᵀ + |dO|·(P·|V|)) (dP and Δ are Dv-term
  sums; O carries out's error) and ε_r = γ(Dv + 1) + max E + γ(Nk). Then dQ = s·dZ·K:
  s·[((E + ε_g + 3u)∘W)·|K| + γ(Nk)·W·|K| + ε_r·R·|K|], and dK = s·dZᵀ·Q alike, with
  γ(Nq) + γ(G) for its sums.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from native_support import must_build

from attnscale import attention, reference_attention
from attnscale.core import native
from attnscale.util import cppext

C_EXP = 20  # ulp of PyTorch's vectorized exp_u20 (float32); Sleef's exp (float64) is 1 ulp
E_TANH = 5  # ulp of the kernel's float32 tanh, relative; asserted in test_fast_tanh_error
PATHS = ["native", "chunked"]



@contextmanager
def using(path: str):
    """Run the block on ``path``: the native kernel (skip or fail where it is missing) or the
    chunked fallback, forced."""
    if path == "native":
        if native.softcap_kernel() is None:
            reason = native.kernel_status()["reason"]
            if must_build():
                pytest.fail(f"the softcap kernel must build here: {reason}")
            pytest.skip(reason)
        yield
    else:
        with native.forced_fallback():
            yield


def make(shape: tuple[int, ...], dtype=torch.float32, seed: int = 0, amp: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * amp).to(dtype)


def qkv(b, h, hk, n, s, d, dv, dtype=torch.float32, seed=0):
    return (make((b, h, n, d), dtype, seed), make((b, hk, s, d), dtype, seed + 1),
            make((b, hk, s, dv), dtype, seed + 2, amp=1.0))


LAMBDA = 6.0  # probabilistic rounding bound: γ(m) = λ·√m·u (module docstring)


def gamma(m: int, u: float) -> float:
    return LAMBDA * math.sqrt(m) * u


def tolerances(path, q, k, v, dout, mask, causal, cap, scale) -> dict[str, torch.Tensor]:
    """The elementwise bounds of the module docstring for out, dq, dk, dv (float64 tensors)."""
    u, tiny = torch.finfo(q.dtype).eps / 2, torch.finfo(q.dtype).tiny
    e_t, c_exp = (E_TANH, C_EXP) if q.dtype == torch.float32 else (1, 1)
    q, k, v, dout = (t.detach().double() for t in (q, k, v, dout))
    b, h, nq, d = q.shape
    nk, dv, g = k.shape[2], v.shape[-1], h // k.shape[1]
    ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = 1 / math.sqrt(d) if scale is None else scale
    caps = torch.as_tensor(cap, dtype=torch.float64).reshape(-1, 1, 1)
    t = torch.tanh(s * q @ ke.transpose(-2, -1) / caps)
    f, add = caps * t, torch.zeros(())
    keep = torch.ones(nq, nk, dtype=torch.bool)
    keep = keep.tril() if causal else keep
    if mask is not None and mask.dtype == torch.bool:
        keep = keep & mask
    elif mask is not None:
        keep = keep & (mask > float("-inf"))
        add = mask.double().masked_fill(~keep, 0.0)
    p = torch.softmax((f + add).masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    delta = (gamma(d + 2, u) * s * (q.abs() @ ke.abs().transpose(-2, -1)) * (1 - t * t)
             + (e_t + 4) * u * f.abs() + 2 * u * add.abs())
    if path == "chunked":
        delta = delta + 2 * caps * (c_exp + 3) * u
    err = delta + (p * delta).sum(-1, keepdim=True) + gamma(nk, u) + (c_exp + 4) * u
    pv = p @ ve.abs()
    w = p * (dout @ ve.transpose(-2, -1) - (dout * (p @ ve)).sum(-1, keepdim=True)).abs()
    r = p * (dout.abs() @ ve.abs().transpose(-2, -1) + (dout.abs() * pv).sum(-1, keepdim=True))
    wz = (err + 2 * delta / caps + (2 * e_t + 6) * u) * w
    eps_r = gamma(dv + 1, u) + float(err.max()) + gamma(nk, u)

    def heads(x):  # (B, H, ·, ·) -> (B, Hkv, ·, ·): the GQA sum over each key head's queries
        return x.reshape(b, h // g, g, *x.shape[2:]).sum(2)

    def floor(x):  # exp underflow: weights below FLT_MIN are 0
        return (max(nq, nk) + 1) * tiny * x.abs().max() if x.numel() else 0.0

    sums = gamma(nq, u) + gamma(g, u)
    return {
        "out": (p * err) @ ve.abs() + gamma(nk, u) * pv + floor(ve),
        "dv": heads((p * err).transpose(-2, -1) @ dout.abs() + sums * p.transpose(-2, -1)
                    @ dout.abs()) + floor(dout),
        "dq": s * (wz @ ke.abs() + gamma(nk, u) * w @ ke.abs() + eps_r * r @ ke.abs())
        + floor(ke),
        "dk": s * heads(wz.transpose(-2, -1) @ q.abs() + sums * w.transpose(-2, -1) @ q.abs()
                        + eps_r * r.transpose(-2, -1) @ q.abs()) + floor(q),
    }


def check(path, q, k, v, mask=None, causal=False, cap=2.0, scale=None, seed=7):
    """Output and gradients of ``attention`` on ``path`` against the float64 reference."""
    gqa = q.shape[1] != k.shape[1]
    kw = {"attn_mask": mask, "is_causal": causal, "scale": scale, "enable_gqa": gqa,
          "score": "softcap", "cap": cap}
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with using(path):
        out = attention(*leaves, **kw)
        assert native.last_path() == path
        dout = make(out.shape, q.dtype, seed, amp=1.0)
        grads = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    if mask is not None and mask.dtype != torch.bool:
        kw["attn_mask"] = mask.double()
    if isinstance(cap, torch.Tensor):
        kw["cap"] = cap.double()
    ref = reference_attention(*ref_leaves, **kw)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double())
    tol = tolerances(path, q, k, v, dout, mask, causal, cap, scale)
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads),
                               strict=True):
        assert got.dtype == q.dtype and got.shape == want.shape, name
        over = (got.detach().double() - want).abs() - tol[name]
        assert not bool((over > 0).any()), f"{name}: error over the bound by {over.max():.3g}"
    return out, grads


# (B, H, Hkv, Nq, Nk, D, Dv): every tail -- lengths and head dims not multiples of the vector
# width (8 or 16 floats) or of the tiles (32/64/256 query rows, 512 keys), Nq ≠ Nk both ways,
# a key tile boundary crossed with a partial last tile, GQA, B = H = 1.
SHAPES = [
    (1, 1, 1, 1, 1, 1, 1),
    (1, 1, 1, 5, 3, 3, 2),
    (2, 3, 3, 17, 33, 5, 7),
    (2, 4, 2, 67, 45, 19, 19),
    (1, 2, 1, 200, 515, 24, 24),
    (1, 1, 1, 770, 530, 9, 9),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(path, shape, causal):
    check(path, *qkv(*shape), causal=causal)


def masks(b, h, n, s, seed=3) -> dict[str, torch.Tensor]:
    """Bool and additive masks in the shapes attention takes, each with a fully masked row."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(b, h, n, s, generator=g) > 0.3
    keep[:, :, 1:2] = False
    padding = torch.ones(b, 1, 1, s, dtype=torch.bool)
    padding[0, ..., : s // 2] = False
    additive = torch.randn(1, h, n, s, generator=g)
    additive[..., :, 0] = float("-inf")
    additive[..., 2:3, :] = float("-inf")
    return {"bool": keep, "bool-padding": padding, "additive": additive,
            "additive-2d": torch.randn(n, s, generator=g)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True], ids=["mask", "mask+causal"])
@pytest.mark.parametrize("kind", ["bool", "bool-padding", "additive", "additive-2d"])
def test_masks(path, kind, causal):
    b, h, n, s = 2, 4, 37, 530
    q, k, v = qkv(b, h, 2, n, s, 20, 20)
    out, grads = check(path, q, k, v, mask=masks(b, h, n, s)[kind], causal=causal)
    if kind in ("bool", "additive"):  # row 1 (bool) / 2 (additive) sees no key: 0, no NaN
        row = 1 if kind == "bool" else 2
        assert torch.all(out[:, :, row] == 0) and torch.all(grads[0][:, :, row] == 0)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("path", PATHS)
def test_per_head_cap_and_scale(path):
    q, k, v = qkv(2, 4, 2, 40, 70, 16, 16)
    cap = torch.tensor([0.5, 1.0, 5.0, 50.0])
    check(path, q, k, v, cap=cap, causal=True, scale=0.3)


@pytest.mark.parametrize("path", PATHS)
def test_layouts(path):
    """(B, N, H, D) views transposed to (B, H, N, D), a broadcast batch, a gradient with zero
    strides (out.sum()) -- the kernel reads strides or copies."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, D) storage
               for t in qkv(2, 3, 3, 9, 9, 8, 8))
    assert not q.is_contiguous()
    check(path, q, k, v)
    q1, k1, v1 = qkv(1, 2, 2, 11, 13, 8, 8)
    check(path, q1.expand(3, -1, -1, -1), k1, v1)
    leaves = [t.clone().requires_grad_() for t in (q1, k1, v1)]
    with using(path):
        attention(*leaves, score="softcap", cap=2.0).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


@pytest.mark.parametrize("path", PATHS)
def test_gradcheck_float64(path):
    """gradcheck through the path itself: the native kernel has a float64 instantiation."""
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 1, 6, 9, 3, 4, dtype=torch.float64))
    mask = masks(1, 2, 6, 9)["additive"].double()
    with using(path):
        assert torch.autograd.gradcheck(
            lambda a, b, c: attention(a, b, c, attn_mask=mask, is_causal=True, enable_gqa=True,
                                      score="softcap", cap=1.5), (q, k, v))
        assert native.last_path() == path


@pytest.mark.parametrize("path", PATHS)
@given(b=st.integers(1, 2), hk=st.integers(1, 2), group=st.integers(1, 3),
       n=st.integers(1, 40), s=st.integers(1, 40), d=st.integers(1, 20),
       causal=st.booleans(), kind=st.sampled_from([None, "bool", "additive"]),
       cap=st.floats(0.5, 60.0), seed=st.integers(0, 2**16))
def test_property_random_shapes(path, b, hk, group, n, s, d, causal, kind, cap, seed):
    q, k, v = qkv(b, hk * group, hk, n, s, d, d, seed=seed)
    mask = None if kind is None else masks(b, hk * group, n, s, seed)[kind]
    check(path, q, k, v, mask=mask, causal=causal, cap=cap)


def test_path_and_isa():
    """Which path runs and which capability was built; forcing the fallback changes both."""
    q, k, v = qkv(1, 2, 2, 8, 8, 4, 4)
    status = native.kernel_status()
    if must_build():
        assert status["path"] == "native" and status["isa"] == cppext.target_isa()
    if status["isa"] is not None:
        expected = "DEFAULT" if status["isa"] == "generic" else status["isa"]
        assert native.softcap_kernel().capability() == expected
    attention(q, k, v, score="softcap", cap=2.0)
    assert native.last_path() == status["path"]
    with native.forced_fallback():
        assert native.kernel_status()["path"] == "chunked"
        attention(q, k, v, score="softcap", cap=2.0)
        assert native.last_path() == "chunked"
    attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), score="softcap", cap=2.0)
    assert native.last_path() == "chunked"  # half precision: not covered, the fallback runs
    learned = torch.tensor(2.0, requires_grad=True)
    attention(q, k, v, score="softcap", cap=learned)
    assert native.last_path() == "materialized"


def test_uncovered_inputs_take_the_fallback(monkeypatch):
    """An empty dimension takes the chunked path; a torch.compile trace takes the kernel (its
    operator, tests/core/test_compile.py)."""
    q, k, v = qkv(1, 2, 2, 8, 8, 4, 4)
    attention(q[:, :, :0], k, v, score="softcap", cap=2.0)
    assert native.last_path() == "chunked"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    attention(q, k, v, score="softcap", cap=2.0)
    assert native.last_path() == ("native" if native.softcap_kernel() is not None else "chunked")


def test_off_switch(monkeypatch):
    """$ATTNSCALE_NATIVE_ISA=off: no kernel, the reason says why, the chunked path runs."""
    monkeypatch.setenv(cppext.ENV, "off")
    monkeypatch.setattr(native.KERNEL, "state", {})  # load again, under the switch
    assert native.softcap_kernel() is None
    status = native.kernel_status()
    assert status["path"] == "chunked" and "off" in status["reason"]
    check("chunked", *qkv(1, 2, 2, 9, 9, 4, 4))


def test_fast_tanh_error():
    """The kernel's float32 tanh: relative error ≤ E_TANH·u against float64 tanh wherever
    tanh(x) is a normal float (|x| ≥ 1e-30; below, only the absolute error, < 1e-36, matters),
    and |tanh| ≤ 1."""
    with using("native"):
        kernel = native.softcap_kernel()
    dense = torch.linspace(-10, 10, 1 << 22)
    tiny = torch.logspace(-30, 0, 1 << 18)
    x = torch.cat([dense, tiny, -tiny, torch.tensor([0.0, 7.9, 8.0, 1e3, -1e3])])
    y, want = kernel.fast_tanh(x).double(), torch.tanh(x.double())
    u = 2.0**-24
    rel = ((y - want).abs() / want.abs().clamp_min(1e-300))[x != 0]
    assert float(rel.max()) <= E_TANH * u
    assert float(y.abs().max()) <= 1.0
    below = torch.logspace(-38, -30, 1000)
    assert float((kernel.fast_tanh(below).double() - below.double()).abs().max()) < 1e-36


@pytest.mark.slow
def test_generic_build_matches_reference(monkeypatch):
    """The portable build (CPU_CAPABILITY=DEFAULT, at::vec's plain C++) compiles and agrees with
    the reference, with BLAS GEMMs and with the ATen GEMM fallback. One ~40 s build."""
    if not must_build():
        pytest.skip("no C++ toolchain expected here")
    module, isa = cppext.build(native.STEM, native.SOURCE, "the soft-capping kernel (generic)",
                               logging.getLogger(__name__), isa="generic")
    assert module is not None, isa
    assert isa == "generic" and module.capability() == "DEFAULT"
    native.softcap_kernel()  # the process's own build first, then the generic one in its place
    monkeypatch.setattr(native.KERNEL, "state", {**native.KERNEL.state, "module": module})
    q, k, v = qkv(2, 4, 2, 67, 530, 19, 19)
    mask = masks(2, 4, 67, 530)["bool"]
    check("native", q, k, v, mask=mask, causal=True)
    previous = module.set_blas(False)
    try:
        assert module.gemm_backend() == "aten"
        check("native", q, k, v, mask=mask, causal=True)
        check("native", *qkv(1, 2, 1, 6, 9, 3, 4, dtype=torch.float64), causal=True)
    finally:
        module.set_blas(previous)


def test_bound_detects_a_small_error():
    """The bound has teeth: a cap off by 0.1% (logits off by ~1e-3) fails the check."""
    q, k, v = qkv(2, 4, 2, 67, 45, 19, 19)
    out = attention(q, k, v, is_causal=True, enable_gqa=True, score="softcap", cap=2.0)
    dout = make(out.shape)
    ref = reference_attention(q.double(), k.double(), v.double(), is_causal=True,
                              enable_gqa=True, score="softcap", cap=2.002)
    tol = tolerances("native", q, k, v, dout, None, True, 2.0, None)["out"]
    assert bool(((out.double() - ref).abs() > tol).any())
