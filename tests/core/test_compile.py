"""torch.compile over attnscale.attention: every registered score traces into one graph, forward
and backward, with the native kernels inside it as PyTorch operators, and the compiled model
matches eager; ``torch.library.opcheck`` holds the operators' schemas and fake implementations
to the kernels (tests/measure/test_monitor_compile.py does the same for the monitor's)."""

from __future__ import annotations

import pytest
import torch
from native_support import must_build
from torch import nn

from attnscale import attention
from attnscale.core import native, native_rows
from attnscale.core.scores import SCORES, get_score

B, N, E, H = 2, 7, 16, 2  # a 2-head model of width 16 on 7 tokens


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """Both core kernels, built before anything is traced (a missing one fails where kernels
    must build, and skips elsewhere)."""
    missing = [k.status()["reason"] for k in (native.KERNEL, native_rows.KERNEL)
               if k.module() is None]
    if missing:
        if must_build():
            pytest.fail(f"the core kernels must build here: {missing}")
        pytest.skip(f"no native kernels here: {missing}")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Tiny(nn.Module):
    """One attention layer: q, k, v viewed out of a fused projection as (B, N, H, D) and
    transposed to (B, H, N, D), as models do, then attnscale.attention with ``score``."""

    def __init__(self, score: str) -> None:
        super().__init__()
        self.score = score
        self.qkv = nn.Linear(E, 3 * E)
        self.out = nn.Linear(E, E)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(B, N, 3, H, E // H).permute(2, 0, 3, 1, 4)
        y = attention(q, k, v, mask, score=self.score)
        return self.out(y.transpose(1, 2).reshape(B, N, E))


def model_and_inputs(score: str) -> tuple[Tiny, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Tiny(score)
    x = torch.randn(B, N, E, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(B, 1, N, N, dtype=torch.bool)
    mask[1, ..., 5:] = False  # padding keys of the second sequence
    return model, x, mask


def loss_and_grads(model: Tiny, fn, x: torch.Tensor, mask: torch.Tensor):
    model.zero_grad()
    loss = fn(x, mask)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def graph_code(explained) -> str:
    """The traced graphs' code, autograd.Function bodies included."""
    return "\n".join(g.print_readable(print_output=False) for g in explained.graphs)


@pytest.mark.parametrize("score", list(SCORES))
def test_every_score_compiles_into_one_graph_and_matches_eager(score):
    """No graph break, forward or backward (Dynamo traces each autograd.Function's backward
    with its forward); the kernels' operators in the graph where the score uses one; the
    compiled loss and gradients equal eager's within float32 rounding."""
    model, x, mask = model_and_inputs(score)

    def loss_fn(x, mask):
        return model(x, mask).square().mean()

    explained = torch._dynamo.explain(loss_fn)(x, mask)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
    code, sc = graph_code(explained), get_score(score)
    assert ("attnscale.softcap_attention" in code) == (sc.native == "softcap")
    assert ("attnscale.row_norm" in code) == sc.normalizes_q  # cosine and the qk norms
    torch._dynamo.reset()
    eager = loss_and_grads(model, loss_fn, x, mask)
    compiled = loss_and_grads(model, torch.compile(loss_fn), x, mask)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    for name, grad in eager[1].items():
        torch.testing.assert_close(compiled[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_kernels_carry_the_mark_assume_constant_result_sets():
    """cppext.constant_to_compile sets, without importing Dynamo, the mark Dynamo reads: the
    same attributes as torch.compiler.assume_constant_result on a fresh function."""
    def fresh() -> bool:
        return True

    marked = torch.compiler.assume_constant_result(fresh)
    public = dict(vars(marked))
    assert public, "assume_constant_result no longer marks the function: update cppext"
    for fn in (native.kernel_built, native_rows.kernel_built):
        assert {k: vars(fn).get(k) for k in public} == public


def test_a_compiled_call_runs_the_kernels_and_its_second_call_does_not_recompile():
    """The compiled soft-capped call takes the native path (its note is replayed after the
    graph), and the same shapes again reuse the graph."""
    model, x, mask = model_and_inputs("softcap")
    compiled = torch.compile(lambda x, mask: model(x, mask).sum())
    native.note_path("none yet")
    compiled(x, mask).backward()
    assert native.last_path() == "native"
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(x, mask).backward()


def test_forced_fallback_retraces_onto_the_python_paths():
    """forced_fallback is read while tracing (a guard): inside it the compiled function is
    traced again, onto the chunked path, and gives the same result."""
    model, x, mask = model_and_inputs("softcap")
    compiled = torch.compile(lambda x, mask: model(x, mask))
    with torch.no_grad():
        fast = compiled(x, mask)
        with native.forced_fallback():
            slow = compiled(x, mask)
            assert native.last_path() == "chunked"
    torch.testing.assert_close(slow, fast, rtol=1e-5, atol=1e-6)


# -- the operators ---------------------------------------------------------------------------


def tensors(*shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]


def softcap_samples():
    """(args) of the forward operator: GQA, a bool and an additive mask, causal, float64."""
    q, k, v = tensors((2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 3))
    keep = torch.rand(2, 1, 5, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    bias = torch.randn(1, 4, 5, 6, generator=torch.Generator().manual_seed(2))
    caps = [2.0, 3.0, 5.0, 50.0]
    q64, k64, v64 = (t.double() for t in tensors((1, 2, 4, 4), (1, 2, 4, 4), (1, 2, 4, 4)))
    return [(q, k, v, None, False, 0.35, caps), (q, k, v, keep, True, 0.35, caps),
            (q, k, v, bias, False, 0.5, caps), (q64, k64, v64, None, True, 0.5, [4.0, 4.0])]


@pytest.mark.parametrize("sample", range(4))
def test_opcheck_softcap_operators(sample):
    """Schema, fake implementation (shapes, dtypes, strides), autograd registration and
    AOTAutograd dispatch of the forward operator and of the backward one on its outputs."""
    args = softcap_samples()[sample]
    torch.library.opcheck(torch.ops.attnscale.softcap_attention.default, args)
    q, k, v, mask, is_causal, scale, caps = args
    out, lse = torch.ops.attnscale.softcap_attention(*args)
    grad = torch.randn_like(out)
    torch.library.opcheck(torch.ops.attnscale.softcap_attention_backward.default,
                          (grad, q, k, v, out, lse, mask, is_causal, scale, caps))


@pytest.mark.parametrize("kind", sorted(native_rows.KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_row_norm_operators(kind, dtype):
    """The same checks for the row normalization and its backward, on a transposed view (a
    non-unit last stride the implementation copies) and on contiguous rows."""
    (x,) = tensors((2, 3, 5, 8), dtype=dtype)
    for rows in (x, x.transpose(-1, -2)):
        torch.library.opcheck(torch.ops.attnscale.row_norm.default, (rows, kind, 1e-5))
        y, r, dot_scale = torch.ops.attnscale.row_norm(rows, kind, 1e-5)
        (dy,) = tensors(tuple(y.shape), seed=3, dtype=dtype)
        torch.library.opcheck(torch.ops.attnscale.row_norm_backward.default,
                              (y, dy, r, dot_scale, kind == "layer"))


def test_the_operators_carry_no_gradient_of_their_own():
    """Their Autograd key falls through: called directly on inputs that require grad, the
    outputs have no history (the gradient is the autograd.Functions' business), so a backward
    through them raises instead of returning a silent zero."""
    q, k, v = (t.requires_grad_() for t in tensors((1, 2, 4, 4), (1, 2, 4, 4), (1, 2, 4, 4)))
    out, _ = torch.ops.attnscale.softcap_attention(q, k, v, None, False, 0.5, [2.0, 2.0])
    y, _, _ = torch.ops.attnscale.row_norm(q, "rms", 1e-6)
    assert not out.requires_grad and not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()
