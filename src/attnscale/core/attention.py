"""attention(): PyTorch's scaled_dot_product_attention with a pluggable score, and its reference.

Shapes, mask semantics and causal alignment follow
``torch.nn.functional.scaled_dot_product_attention``:

* query (B, H, Nq, D), key (B, Hk, Nk, D), value (B, Hk, Nk, Dv); 3-D inputs (B, N, D) also work;
* ``attn_mask`` broadcasts to (B, H, Nq, Nk); a bool mask keeps True entries, a float mask is added
  to the logits;
* ``is_causal``: query i sees keys 0..i (top-left alignment, as SDPA); may be combined with a mask;
* ``enable_gqa``: H must be a multiple of Hk, each key/value head serves H/Hk query heads;
* a query whose keys are all masked out returns zeros, with zero gradient (as SDPA in torch 2.13).

Fused scores transform q and k and call SDPA, so they run on PyTorch's fused kernels and never
build the N×N matrix. Scores with an elementwise logit transform (``softcap``) run on a chunked
kernel that recomputes the scores in the backward pass: memory O(chunk·Nk), not O(Nq·Nk).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnscale.core.scores import Context, Params, Score, get_score, resolve_params

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Elements of one (b, H, chunk, Nk) score block in the chunked kernel: big enough for efficient
# batched matmuls, small enough to stay in cache-sized pieces (8 MiB of float32). 2^21 was the
# fastest of 2^20..2^24 at B=8, H=8, N=1024 on the 2-core CI machine (`attnscale bench`).
CHUNK_ELEMENTS = 1 << 21
CAUSAL_ROWS = 128  # query rows per block under is_causal


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    score: str | Score = "scaled_dot",
    **score_params: Any,
) -> Tensor:
    """Attention softmax(logit(q, k) + mask)·V with the logit given by ``score``.

    ``score`` is a name from :data:`attnscale.core.scores.SCORES` (``scaled_dot`` by default, which is
    exactly SDPA) and ``score_params`` are its parameters, e.g. ``score="cosine", tau=10.0``.
    ``scale`` overrides 1/√d for the scores that use it (scaled_dot, qk norms, softcap, log_length).
    Returns (B, H, Nq, Dv).
    """
    sc = get_score(score)
    params = resolve_params(sc, score_params, scale)
    q, k, v, squeeze = _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    mask = _normalize_mask(attn_mask, q.dtype)
    ctx = Context(
        head_dim=q.shape[-1],
        n_visible=lambda: _visible_counts(q.shape[-2], k.shape[-2], mask, is_causal, q.device),
    )
    if sc.fused:
        qp, kp, sdpa_scale = sc.prepare(q, k, scale, params, ctx)
        out = F.scaled_dot_product_attention(
            qp, kp, v, mask, dropout_p, is_causal, scale=sdpa_scale, enable_gqa=enable_gqa
        )
    else:
        out = _modded_attention(sc, params, q, k, v, mask, dropout_p, is_causal, scale, ctx)
    return out.squeeze(1) if squeeze else out


def reference_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    score: str | Score = "scaled_dot",
    **score_params: Any,
) -> Tensor:
    """Ground truth: the score's plain formula, materialized in float64, masked, softmaxed.

    Same signature and semantics as :func:`attention`. Returns the query's dtype. Deterministic,
    so ``dropout_p`` must be 0.
    """
    sc = get_score(score)
    params = resolve_params(sc, score_params, scale)
    q, k, v, squeeze = _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0 for reference_attention, got {dropout_p}")
    params64 = {n: p.double() if isinstance(p, Tensor) else p for n, p in params.items()}
    mask = _normalize_mask(attn_mask, torch.float64)
    out = materialized_attention(
        sc, params64, q.double(), k.double(), v.double(), mask, 0.0, is_causal, scale, enable_gqa
    ).to(query.dtype)
    return out.squeeze(1) if squeeze else out


def materialized_attention(
    sc: Score,
    params: Params,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> Tensor:
    """The naive O(N²)-memory path: build every logit from ``sc.formula``, then softmax.

    Inputs are already checked 4-D tensors. Used as the float64 reference, as the fallback for
    cases the fast kernels don't cover, and as the "naive" baseline in benchmarks.
    """
    if enable_gqa and k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        params = _expand_key_head_params(params, group)
    nq, nk = q.shape[-2], k.shape[-2]
    keep = _keep_matrix(nq, nk, mask, is_causal, q.device)  # (…, Nq, Nk) bool
    ctx = Context(head_dim=q.shape[-1], n_visible=lambda: keep.sum(-1, keepdim=True))
    logits = sc.formula(q, k, scale, params, ctx)  # (B, H, Nq, Nk)
    if mask is not None and mask.dtype != torch.bool:
        logits = logits + mask
    logits = logits.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    weights = weights.masked_fill(~keep.any(-1, keepdim=True), 0.0)  # fully masked rows -> 0
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


def _expand_key_head_params(params: Params, group: int) -> dict[str, Any]:
    """Per-head parameters of the key side (named ``k_*``) follow the key heads; repeat them
    when the key heads are repeated for GQA."""
    return {
        name: p.repeat_interleave(group, dim=0)
        if name.startswith("k_") and isinstance(p, Tensor) and p.dim() >= 1
        else p
        for name, p in params.items()
    }


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------


def _check_inputs(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: Any,
    is_causal: Any,
    enable_gqa: Any,
) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Validate shapes, dtypes and the mask; return 4-D q, k, v and whether to squeeze heads."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} must have a floating dtype (float16, bfloat16, float32, float64), "
                f"got {t.dtype}"
            )
        if t.dim() not in (3, 4):
            raise ValueError(
                f"{name} must be 4-D (B, H, N, D) or 3-D (B, N, D), got shape {tuple(t.shape)}"
            )
    if not (query.dim() == key.dim() == value.dim()):
        raise ValueError(
            "query, key and value must have the same rank, got "
            f"{query.dim()}, {key.dim()} and {value.dim()}"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            "query, key and value must share a dtype, got "
            f"{query.dtype}, {key.dtype}, {value.dtype}"
        )
    squeeze = query.dim() == 3
    q, k, v = (t.unsqueeze(1) if squeeze else t for t in (query, key, value))
    _check_shapes(q, k, v, bool(enable_gqa))
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if attn_mask is not None:
        _check_mask(attn_mask, q, k)
    return q, k, v, squeeze


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"query and key must have the same head dimension, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"key and value must have the same length, got {k.shape[-2]} and {v.shape[-2]}"
        )
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(
            f"query, key and value must have the same batch size, got "
            f"{q.shape[0]}, {k.shape[0]}, {v.shape[0]}"
        )
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if hk != hv:
        raise ValueError(f"key and value must have the same number of heads, got {hk} and {hv}")
    if hq != hk and not enable_gqa:
        raise ValueError(
            f"query has {hq} heads and key/value {hk}: they must be equal, or pass "
            "enable_gqa=True with a query head count that is a multiple of the key head count"
        )
    if enable_gqa and hq % hk != 0:
        raise ValueError(
            f"enable_gqa needs the query head count ({hq}) to be a multiple of the key/value "
            f"head count ({hk})"
        )


def _check_mask(attn_mask: Any, q: Tensor, k: Tensor) -> None:
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            f"attn_mask must be bool (True = keep) or floating (added to the logits), "
            f"got {attn_mask.dtype}"
        )
    target = (q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
    try:
        ok = torch.broadcast_shapes(attn_mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
            f"(B, H, Nq, Nk) = {target}"
        )


def _normalize_mask(attn_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Bool masks keep their dtype, float masks take the query's (as SDPA requires); a 1-D
    mask over keys becomes (1, Nk), since SDPA's kernels want at least 2-D."""
    if attn_mask is None:
        return None
    if attn_mask.dim() < 2:
        attn_mask = attn_mask.reshape(1, -1)
    return attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(dtype)


def _keep_matrix(
    nq: int, nk: int, mask: Tensor | None, is_causal: bool, device: torch.device
) -> Tensor:
    """Bool (…, Nq, Nk): True where the query may attend to the key."""
    keep = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if is_causal:
        keep = keep.tril()
    if mask is not None:
        keep = keep & (mask if mask.dtype == torch.bool else mask > float("-inf"))
    return keep


def _visible_counts(
    nq: int, nk: int, mask: Tensor | None, is_causal: bool, device: torch.device
) -> Tensor:
    """Number of keys each query sees, shaped (…, Nq, 1). Cheap when there is no mask."""
    if mask is None:
        if not is_causal:
            return torch.full((1, 1), float(nk), device=device)
        return (torch.arange(1, nq + 1, device=device).clamp(max=nk).float()).unsqueeze(-1)
    return _keep_matrix(nq, nk, mask, is_causal, device).sum(-1, keepdim=True).float()


# ---------------------------------------------------------------------------------------------
# Scores with an elementwise transform of the logit (softcap): query-chunked, recomputing kernel
# ---------------------------------------------------------------------------------------------


def _modded_attention(
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
    learned = any(isinstance(p, Tensor) and p.requires_grad for p in params.values())
    mask_grad = mask is not None and mask.requires_grad
    if dropout_p > 0.0 or learned or mask_grad:
        # The chunked kernel has no dropout and treats parameters and masks as constants.
        return materialized_attention(
            sc, params, q, k, v, mask, dropout_p, is_causal, scale, k.shape[1] != q.shape[1]
        )
    if q.is_cuda and _flex_available():
        return _flex_attention(sc, params, q, k, v, mask, is_causal, scale)
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        params = _expand_key_head_params(params, group)
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
        lse = torch.empty((*q.shape[:-1], 1), dtype=_work_dtype(q), device=q.device)
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
    work = _work_dtype(q)
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


def _work_dtype(q: Tensor) -> torch.dtype:
    """Half-precision inputs are computed in float32 blocks, like SDPA's CPU kernels."""
    return torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype


def _flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


_FLEX_COMPILED: dict[str, Any] = {}


def _flex_attention(sc, params, q, k, v, mask, is_causal, scale) -> Tensor:
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
