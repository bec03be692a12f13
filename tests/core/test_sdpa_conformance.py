"""attnscale.attention is a drop-in for SDPA on PyTorch's own sample inputs.

The samples are the OpInfo entry ``nn.functional.scaled_dot_product_attention`` of torch's test
suite (3-D queries with 4-D keys, masks, causal, dropout), drawn in float32, float64 and bfloat16,
with and without ``requires_grad``. For every registered score and every sample:

* attnscale accepts exactly when SDPA accepts, and returns SDPA's output shape;
* ``scaled_dot`` gives SDPA's output and gradients; every other score gives the output and
  gradients of its float64 reference (:func:`attnscale.reference_attention` on the same inputs
  cast to float64);
* a dropout sample has SDPA's output shape, and with ``dropout_p = 0`` the values above.

Tolerance: both sides compute the same softmax(ℓ)·V; they differ by rounding. With u the unit
roundoff of the precision the logits are accumulated in (float32 for bfloat16: SDPA's CPU kernels
and attnscale's chunked kernel accumulate half-precision inputs in float32), L = max|ℓ| over the
sample and m = max|v|, a logit error δ ≤ (d + 6)·u·L + e·L (e the relative rounding of the
score's q/k transform: its operation count times u of the dtype it runs in, plus one rounding
to the input dtype when it runs in float32) moves the output by at most (e^{2δ} − 1)·m, plus the
rounding of the output itself, 4·u_out·m (the same argument as in ``test_properties.py``). Where
that bound exceeds m it says nothing: the value check is skipped (log-length in bfloat16, whose
logits here reach the hundreds, where bfloat16 keeps about 2 significant digits); the test counts
such cases and requires them to be a minority.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attnscale import SCORES, attention, reference_attention

pytest.importorskip("expecttest")  # torch's test helpers import it
common = pytest.importorskip("torch.testing._internal.common_methods_invocations")

OP = next(o for o in common.op_db if o.name == "nn.functional.scaled_dot_product_attention")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
# Relative rounding of each score's q/k transform, in units of the input dtype's u (d = head dim).
TRANSFORM_ULPS = {"scaled_dot": lambda d: 0, "dot": lambda d: 0, "mup": lambda d: 0,
                  "softcap": lambda d: 0, "log_length": lambda d: 3, "cosine": lambda d: d + 4,
                  "qk_rmsnorm": lambda d: d + 4, "qk_layernorm": lambda d: 2 * d + 8}
# Scores whose q/k transform runs in float32 for half-precision inputs (the row norms are taken
# in float32) and is rounded once to the input dtype: e = ulps·u(float32) + u(dtype).
FLOAT32_TRANSFORM = {"cosine", "qk_rmsnorm", "qk_layernorm"}


def sample_list() -> list:
    torch.manual_seed(0)  # OpInfo draws its tensors from the global generator
    out = []
    for dtype in DTYPES:
        for grad in (False, True):
            for i, s in enumerate(OP.sample_inputs("cpu", dtype, requires_grad=grad)):
                tag = f"{str(dtype)[6:]}-{'grad' if grad else 'nograd'}-{i}"
                out.append(pytest.param(s, id=tag))
    return out


SAMPLES = sample_list()


def unit(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def bound(score: str, q, k, v, out_dtype) -> float | None:
    """The rounding bound of the module docstring, or None where it says nothing."""
    q64, k64 = q.detach().double(), k.detach().double()
    d = q.shape[-1]
    logits = reference_logit_size(score, q64, k64)
    u_acc = unit(torch.float32 if out_dtype in (torch.bfloat16, torch.float16) else out_dtype)
    ulps = TRANSFORM_ULPS.get(score)
    if ulps is None:
        return None
    if score in FLOAT32_TRANSFORM and u_acc != unit(out_dtype):
        e = ulps(d) * u_acc + unit(out_dtype)
    else:
        e = ulps(d) * unit(out_dtype)
    delta = ((d + 6) * u_acc + 2 * e) * logits
    m = float(v.detach().abs().max())
    b = (math.expm1(min(2 * delta, 50.0)) + 4 * unit(out_dtype)) * m + 1e-12
    return None if b > m else b


def reference_logit_size(score: str, q, k) -> float:
    """max |ℓ| of the score on these inputs (its plain formula, float64, no mask)."""
    sc = SCORES[score]
    from attnscale.core.scores import Context, resolve_params

    params = resolve_params(sc, {}, None)
    n = k.shape[-2]
    ctx = Context(head_dim=q.shape[-1], n_visible=lambda: torch.full((1, 1), float(n)))
    qb, kb = torch.broadcast_tensors(q[..., :1, :1], k[..., :1, :1])  # broadcast batch dims
    q = q.expand(*qb.shape[:-2], *q.shape[-2:])
    k = k.expand(*kb.shape[:-2], *k.shape[-2:])
    return float(sc.formula(q, k, None, params, ctx).abs().max())


def call(fn, s, **over):
    kw = {**s.kwargs, **over}
    try:
        return fn(s.input, *s.args, **kw), None
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        return None, e


def grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return torch.autograd.grad((out * w).sum(), leaves) if leaves else ()


def to64(s):
    """The sample's tensors as float64 leaves (requires_grad kept)."""
    def cast(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t
    return cast(s.input), [cast(a) for a in s.args], {n: cast(x) for n, x in s.kwargs.items()}


@pytest.mark.parametrize("score", sorted(SCORES))
@pytest.mark.parametrize("s", SAMPLES)
def test_sdpa_sample(s, score):
    want, want_err = call(F.scaled_dot_product_attention, s)
    got, got_err = call(attention, s, score=score)
    assert (want_err is None) == (got_err is None), (want_err, got_err)
    if want_err is not None:
        return
    assert got.shape == want.shape and got.dtype == want.dtype
    if s.kwargs.get("dropout_p", 0.0) > 0:
        want, _ = call(F.scaled_dot_product_attention, s, dropout_p=0.0)
        got, _ = call(attention, s, score=score, dropout_p=0.0)
    check_values(s, score, got, want)


def check_values(s, score, got, sdpa_out):
    q, (k, v), kw = s.input, s.args[:2], {**s.kwargs, "dropout_p": 0.0}
    tol = bound(score, q, k, v, q.dtype)
    if tol is None:
        pytest.skip("the rounding bound is vacuous for this score at these logit sizes")
    inputs = [q, k, v, kw.get("attn_mask")]
    if score == "scaled_dot":
        ref, ref_grads = sdpa_out, grads(sdpa_out, inputs)
        tol *= 2  # two computed values
    else:
        q64, args64, kw64 = to64(s)
        ref = reference_attention(q64, *args64[:2], **{**kw64, "dropout_p": 0.0}, score=score)
        ref_grads = grads(ref, [q64, *args64[:2], kw64.get("attn_mask")])
    torch.testing.assert_close(got.double(), ref.double(), atol=tol, rtol=0)
    got_grads = grads(got, inputs)
    assert len(got_grads) == len(ref_grads)
    for a, b in zip(got_grads, ref_grads, strict=True):
        # Gradients pass through the softmax Jacobian once more: allow 4× the output bound,
        # scaled by the size of the reference gradient.
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a.double(), b.double(), atol=4 * tol * scale, rtol=0)


# Cells (score, dtype) where the bound says nothing on every sample: checked on smaller logits.
VACUOUS = {("log_length", torch.bfloat16)}


def test_every_cell_has_value_checks():
    """Each score × dtype gets value checks on PyTorch's samples, except the VACUOUS cells,
    which ``test_vacuous_cells_on_smaller_logits`` checks instead."""
    said: dict[tuple[str, torch.dtype], int] = {}
    for p in SAMPLES:
        s = p.values[0]
        for score in SCORES:
            ok = bound(score, s.input, s.args[0], s.args[1], s.input.dtype) is not None
            said[(score, s.input.dtype)] = said.get((score, s.input.dtype), 0) + ok
    assert {cell for cell, n in said.items() if n == 0} == VACUOUS, said


@pytest.mark.parametrize("s", [p for p in SAMPLES if p.values[0].input.dtype == torch.bfloat16])
def test_vacuous_cells_on_smaller_logits(s):
    """The same samples with q and k divided by 8 (logits by 64): values and gradients."""
    def shrink(t):
        return (t.detach() / 8).requires_grad_(t.requires_grad)

    small = SimpleNamespace(input=shrink(s.input), args=[shrink(s.args[0]), *s.args[1:]],
                            kwargs={**s.kwargs, "dropout_p": 0.0})
    for score, _ in VACUOUS:
        got, err = call(attention, small, score=score)
        assert err is None
        assert bound(score, small.input, small.args[0], small.args[1], torch.bfloat16)
        check_values(small, score, got, None)
