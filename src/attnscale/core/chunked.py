"""Scores with an elementwise transform of the logit (softcap): a query-chunked kernel.

The kernel computes softmax(mod(s·q·kᵀ) + mask)·V one (b, H, chunk, Nk) block at a time and
recomputes the blocks in the backward pass, so memory is O(chunk·Nk) instead of O(Nq·Nk). On
CUDA the same score runs on FlexAttention (``torch.nn.attention.flex_attention``). A score that
names a native CPU kernel (``Score.native``) runs on it when it covers the inputs
(:mod:`attnscale.core.native`); the chunked kernel is its fallback.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnscale.core.inputs import expand_key_head_params
from attnscale.core.native import native_attention, note_path
from attnscale.core.reference import materialized_attention
from attnscale.core.scores import Context, Params, Score

# Elements of one (b, H, chunk, Nk) score block in the chunked kernel: big enough for efficient
# batched matmuls, small enough to stay in cache-sized pieces (8 MiB of float32). 2^21 was the
# fastest of 2^20..2^24 at B=8, H=8, N=1024 on the 2-core CI machine (`attnscale bench`).
CHUNK_ELEMENTS = 1 << 21
CAUSAL_ROWS = 128  # query rows per block under is_causal


def modded_attention(
    sc: Score,
    params: Params,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    ctx: Context,
) -> Tensor:
    """softmax(mod(s·q·kᵀ) + mask)·V for a score with a ``mod``, on the first path that covers
    the inputs: the materialized formula (dropout, learned parameters, a mask with a gradient,
    no keys), FlexAttention (CUDA), the score's native kernel, else the chunked kernel.
    :func:`attnscale.core.native.last_path` names the path taken."""
    learned = any(isinstance(p, Tensor) and p.requires_grad for p in params.values())
    mask_grad = mask is not None and mask.requires_grad
    if dropout_p > 0.0 or learned or mask_grad or k.shape[-2] == 0:
        # The chunked kernel has no dropout, treats parameters and masks as constants, and
        # needs at least one key.
        # Half precision is computed in float32, as the chunked kernel and SDPA's CPU kernels do.
        work = work_dtype(q)
        cast = {n: p.to(work) if isinstance(p, Tensor) and p.is_floating_point() else p
                for n, p in params.items()}
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(work)
        out = materialized_attention(
            sc, cast, q.to(work), k.to(work), v.to(work), mask, dropout_p, is_causal, scale,
            k.shape[1] != q.shape[1],
        )
        note_path("materialized")
        return out.to(q.dtype)
    if q.is_cuda and _flex_available():
        note_path("flex")
        return flex_modded_attention(sc, params, q, k, v, mask, is_causal, scale)
    if sc.native is not None:  # the score's own native kernel, when it covers these inputs
        out = native_attention(sc.native, params, q, k, v, mask, is_causal, scale)
        if out is not None:
            note_path("native")
            return out
    note_path("chunked")
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        params = expand_key_head_params(params, group)
    qp, kp, s = sc.prepare(q, k, scale, params, ctx)
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])  # a view
    return _ChunkedModAttention.apply(qp, kp, v, mask, is_causal, s, sc, params)


class _ChunkedModAttention(torch.autograd.Function):
    """softmax(mod(s·q·kᵀ) + mask)·V computed in query chunks, scores recomputed in backward.

    Forward and backward hold one (B, H, chunk, Nk) block at a time. Under ``is_causal`` a chunk
    only touches the keys it can see, which halves the work. ``mask`` is None or expanded to
    (B, H, Nq, Nk) (a view, no copy).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale, sc, params):  # type: ignore[override]
        out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.empty((*q.shape[:-1], 1), dtype=work_dtype(q), device=q.device)
        for bs, rows, keys, _, logits in _score_blocks(q, k, mask, is_causal, scale, sc, params):
            # Unnormalized softmax: e = exp(ℓ − max), out = (e·V) / Σe, so the normalization
            # touches the (c, Dv) output instead of the (c, nk) block.
            m = logits.amax(-1, keepdim=True)
            m = m.masked_fill(m == float("-inf"), 0.0)  # fully masked row: e = 0, out = 0
            e = logits.sub_(m).exp_()  # (b, H, c, nk), in place
            total = e.sum(-1, keepdim=True)
            out[bs, :, rows] = (e @ v[bs, :, keys].to(e.dtype) / total.clamp_min(1e-30)).to(q.dtype)
            # log Σ exp(ℓ); +inf on dead rows makes exp(ℓ − lse) = 0 in backward
            lse[bs, :, rows] = torch.where(total > 0, m + total.log(), float("inf"))
        ctx.save_for_backward(q, k, v, out, mask, lse)
        ctx.args = (is_causal, scale, sc, params)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, mask, lse = ctx.saved_tensors
        is_causal, scale, sc, params = ctx.args
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        # Softmax backward: dℓ_ij = p_ij (dp_ij − δ_i) with δ_i = Σ_j p_ij dp_ij = dO_i · O_i.
        delta = (grad_out * out).sum(-1, keepdim=True)  # (B, H, Nq, 1)
        for bs, rows, keys, f, logits in _score_blocks(q, k, mask, is_causal, scale, sc, params):
            grad_mod = sc.mod_grad(f, params)  # d mod/dz, before f may be overwritten below
            p = logits.sub_(lse[bs, :, rows].to(logits.dtype)).exp_()  # (b, H, c, nk)
            dout = grad_out[bs, :, rows].to(p.dtype)
            dv[bs, :, keys] += (p.transpose(-2, -1) @ dout).to(dv.dtype)
            dp = dout @ v[bs, :, keys].transpose(-2, -1).to(p.dtype)
            dz = dp.sub_(delta[bs, :, rows].to(p.dtype)).mul_(p).mul_(grad_mod)
            dq[bs, :, rows] = ((dz @ k[bs, :, keys].to(dz.dtype)) * scale).to(dq.dtype)
            dk_block = (dz.transpose(-2, -1) @ q[bs, :, rows].to(dz.dtype)) * scale
            dk[bs, :, keys] += dk_block.to(dk.dtype)
        return dq, dk, dv, None, None, None, None, None


def _score_blocks(q, k, mask, is_causal, scale, sc, params):
    """Yield (batch slice, row slice, key slice, f, logits) per block of about CHUNK_ELEMENTS.

    A block is (b, H, c, nk): a few batch entries and c query rows of every head, so each
    per-head matmul is (c, D) × (D, nk) with c in the hundreds. f = mod(scale·q·kᵀ) is the
    transformed score block, logits is f with masked entries at −inf. Blocks are float32 for
    half-precision inputs.
    """
    bsz, h, nq, _ = q.shape
    nk = k.shape[-2]
    work = work_dtype(q)
    qscale = scale if sc.prescale is None else sc.prescale(params) * scale
    if isinstance(qscale, Tensor):
        qscale = qscale.to(work)
    c = max(1, min(nq, CHUNK_ELEMENTS // max(1, h * nk)))
    if is_causal:  # finer rows skip more of the hidden upper triangle
        c = min(c, CAUSAL_ROWS)
    nb = max(1, min(bsz, CHUNK_ELEMENTS // max(1, h * c * nk)))
    for b0 in range(0, bsz, nb):
        bs = slice(b0, min(bsz, b0 + nb))
        for start in range(0, nq, c):
            stop = min(nq, start + c)
            keys = slice(0, min(nk, stop) if is_causal else nk)
            # Scaling the (c, D) query chunk is cheaper than scaling the (c, nk) scores.
            qs = q[bs, :, start:stop].to(work) * qscale
            z = qs @ k[bs, :, keys].transpose(-2, -1).to(work)
            f = sc.mod(z, params)  # may work in place on z
            logits = f
            if mask is not None:
                m = mask[bs, :, start:stop, keys]
                logits = (
                    f.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else f + m.to(work)
                )
            if is_causal:
                tri = torch.ones(stop - start, keys.stop, dtype=torch.bool, device=q.device)
                logits = logits.masked_fill(~tri.tril(diagonal=start), float("-inf"))
            yield bs, slice(start, stop), keys, f, logits


def work_dtype(q: Tensor) -> torch.dtype:
    """Half-precision inputs are computed in float32 blocks, like SDPA's CPU kernels."""
    return torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype


def _flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


_FLEX_COMPILED: dict[str, Any] = {}


def flex_modded_attention(sc, params, q, k, v, mask, is_causal, scale) -> Tensor:
    """FlexAttention path (GPU): score_mod receives the already scaled score (PyTorch docs)."""
    from torch.nn.attention.flex_attention import flex_attention

    if "fn" not in _FLEX_COMPILED:
        _FLEX_COMPILED["fn"] = torch.compile(flex_attention, dynamic=False)
    flex = _FLEX_COMPILED["fn"] if q.is_cuda else flex_attention
    d = q.shape[-1]
    s = 1.0 / math.sqrt(d) if scale is None else float(scale)
    additive = None
    if mask is not None:
        additive = (
            mask
            if mask.dtype != torch.bool
            else torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~mask, float("-inf")
            )
        )
        additive = additive.expand(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])

    def score_mod(score, b, h, q_idx, kv_idx):
        out = sc.apply_mod(score, {n: _flex_param(p, h) for n, p in params.items()})
        if additive is not None:
            out = out + additive[b, h, q_idx, kv_idx]
        if is_causal:
            out = torch.where(q_idx >= kv_idx, out, float("-inf"))
        return out

    return flex(q, k, v, score_mod=score_mod, scale=s, enable_gqa=k.shape[1] != q.shape[1])


def _flex_param(value: Any, h: Tensor) -> Any:
    return value[h] if isinstance(value, Tensor) and value.dim() == 1 else value
