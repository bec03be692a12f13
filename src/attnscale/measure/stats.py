"""Attention statistics per head: logit size, entropy, max weight, effective keys, saturation.

Two entry points:

* :func:`logit_stats` takes pre-softmax scores (after scaling, before masking) (B, H, Nq, Nk);
* :func:`attention_stats` takes (q, k, score, mask, is_causal) like :func:`attnscale.attention` and
  builds the logits itself from the score's formula.

Both work in query chunks, so the full B·H·Nq·Nk tensor is never held at once. Masked keys are
excluded everywhere; each query row uses its own number of visible keys n_i, and fully masked rows
are skipped. Per row i with weights p = softmax(ℓ) over its visible keys:

* entropy H_i = −Σ_j p_ij ln p_ij (nats), and H_i / ln n_i (rows with n_i ≥ 2) -- Zhai et al. 2023;
* max weight max_j p_ij, effective number of keys 1/Σ_j p_ij² (participation ratio);
* saturated: max weight > 0.9;
* Frobenius norm of the softmax Jacobian J = diag(p) − ppᵀ:
  ‖J‖_F² = Σp² − 2Σp³ + (Σp²)²;
* logsumexp ln Σ_j e^{ℓ_ij} and the z-loss term (logsumexp)² (PaLM's auxiliary loss).

Per-head values average over batch and rows; logit mean/std/max |logit| run over visible entries.
A row with a visible logit that is NaN or ±inf counts only in ``nonfinite_fraction`` and makes
max |logit| +inf (the rule, and what each statistic captures: :mod:`attnscale.measure.headstats`,
whose names this module re-exports).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnscale.core.inputs import check_inputs, expand_key_head_params, normalize_mask
from attnscale.core.scores import Context, Score, get_score, resolve_params
from attnscale.measure import native
from attnscale.measure.headstats import STATISTICS, AttentionStats, flat_means, from_sums
from attnscale.measure.monitor_calls import keep_mask
from attnscale.measure.rowstats import (
    ROW_FIELDS,
    SATURATION,
    SUM_FIELDS,
    attention_with_sums,
    head_sums,
    hide,
    maybe_compiled,
)

__all__ = [
    "SATURATION",
    "STATISTICS",
    "SUM_FIELDS",
    "AttentionStats",
    "StatsAccumulator",
    "attention_stats",
    "attention_with_sums",
    "check_query_mask",
    "flat_means",
    "head_sums",
    "logit_stats",
    "maybe_compiled",
]

CHUNK_ELEMENTS = 1 << 22  # elements of one (B, H, chunk, Nk) block

def logit_stats(
    logits: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    query_mask: Tensor | None = None,
) -> AttentionStats:
    """Statistics of pre-softmax scores ``logits`` (B, H, Nq, Nk) (scaled, not yet masked).

    ``attn_mask`` (bool keep / float additive) and ``is_causal`` as in :func:`attnscale.attention`;
    ``query_mask`` (B, Nq) bool drops query rows (e.g. padding tokens) from the averages. NaN and
    ±inf at visible entries are measured (``nonfinite_fraction``), not rejected.
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() != 4:
        raise ValueError("logits must be a floating tensor of shape (B, H, Nq, Nk)")
    acc = StatsAccumulator(logits.shape[1])
    acc.update_logits(logits, attn_mask, is_causal, query_mask)
    return acc.result()


def attention_stats(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    score: str | Score = "scaled_dot",
    query_mask: Tensor | None = None,
    **score_params: Any,
) -> AttentionStats:
    """Statistics of the attention that ``attnscale.attention(query, key, ...)`` computes.

    Logits come from the score's plain formula (the same one the float64 reference uses), one
    query chunk at a time; values are not needed. Inputs broadcast as in
    :func:`attnscale.attention`; the statistics are per head (dimension −3 of the broadcast
    query) and average over the leading dimensions, flattened to B. ``query_mask`` (B, Nq) bool
    drops query rows.
    """
    heads = check_inputs(query, key, key, attn_mask, 0.0, is_causal, enable_gqa).q.shape[1]
    acc = StatsAccumulator(heads)
    acc.update(query, key, attn_mask, is_causal, scale, enable_gqa, score=score,
               query_mask=query_mask, **score_params)
    return acc.result()


def _blocks(mask, is_causal, shape, device) -> Iterator[tuple[slice, Tensor | None, Tensor | None]]:
    b, h, nq, nk = shape
    chunk = _chunk_rows(b * h * nk, nq)
    for start in range(0, nq, chunk):
        rows = slice(start, min(nq, start + chunk))
        keep, bias = _block_mask(mask, is_causal, rows, nk, shape, device)
        yield rows, keep, bias


def _n_visible(keep: Tensor | None, nk: int) -> Tensor:
    if keep is None:
        return torch.full((1, 1), float(nk))
    return keep.sum(-1, keepdim=True)


def _chunk_rows(per_row: int, nq: int) -> int:
    return max(1, min(nq, CHUNK_ELEMENTS // max(1, per_row)))


def _broadcast_mask(mask: Tensor, shape: tuple[int, ...]) -> None:
    try:
        ok = torch.broadcast_shapes(mask.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to {shape}")


def _block_mask(mask, is_causal, rows: slice, nk: int, shape, device):
    """(keep, additive bias) for query rows ``rows``; keep broadcasts to (B, H, c, Nk)."""
    c = rows.stop - rows.start
    if mask is None and not is_causal:
        return None, None  # every key visible
    keep = torch.ones(c, nk, dtype=torch.bool, device=device)
    if is_causal:
        keep = keep.tril(diagonal=rows.start)
    bias = None
    if mask is not None:
        m = mask.expand(shape)[:, :, rows]
        if m.dtype == torch.bool:
            keep = keep & m
        else:
            keep = keep & (m > float("-inf"))
            bias = torch.where(keep, m, torch.zeros((), dtype=m.dtype, device=device))
    return keep, bias


class StatsAccumulator:
    """Running per-head sums over many attention calls; :meth:`result` gives the statistics.

    Block math runs in float32 (float64 for float64 inputs); sums accumulate in float64.
    ``compile``: False runs the per-block row reductions as plain tensor code; None (what the
    monitor passes by default) takes the native kernel's statistics-only pass for float32 on
    the CPU where the score and mask allow (:meth:`_native_update`), else that tensor code;
    True the same, with the tensor code through ``torch.compile`` (one fused pass instead of about a
    dozen; the first call compiles, a few seconds with a warm cache). ``path`` says which ran
    last: "native", "compiled" or "python".
    """

    ROW_FIELDS = ROW_FIELDS

    def __init__(self, heads: int, compile: bool | None = False) -> None:
        self.heads = heads
        self.compile = compile
        self.path = "python"
        # Kept as tensors where the blocks live, so a call costs two small in-place ops and no
        # host copy (the monitor adds one per layer per forward pass); numpy in result().
        self._sums: Tensor | None = None  # (H, len(SUM_FIELDS)) float64
        self._max: Tensor | None = None  # (H,) float64

    def update(
        self,
        query: Tensor,
        key: Tensor,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        *,
        score: str | Score = "scaled_dot",
        query_mask: Tensor | None = None,
        **score_params: Any,
    ) -> None:
        """Add the attention of one call, given as in :func:`attnscale.attention`.

        The logits come from the score's fast path (``prepare``, or ``mod`` for soft-capping),
        which the attention tests hold equal to its reference formula.
        """
        sc = get_score(score)
        params = resolve_params(sc, score_params, scale)
        x = check_inputs(query, key, key, attn_mask, 0.0, is_causal, enable_gqa)
        q, k = x.q, x.k  # (B, H, Nq, D), (B, Hk, Nk, D)
        if x.key_group > 1:
            params = expand_key_head_params(params, x.key_group)
        if k.shape[1] != q.shape[1]:
            group = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(group, dim=1)
            params = expand_key_head_params(params, group)
        self._check_heads(q.shape[1])
        b, h, nq, d = q.shape
        mask = normalize_mask(x.mask, q.dtype)
        qmask = check_query_mask(query_mask, b, nq)
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        with torch.no_grad():
            if self.compile is not False and self._native_update(sc, params, q, k, scale, mask,
                                                                 is_causal, qmask):
                self.path = "native"
                return
            nk = k.shape[-2]
            for rows, keep, bias in _blocks(mask, is_causal, (b, h, nq, nk), q.device):
                ctx = Context(head_dim=d, n_visible=lambda keep=keep: _n_visible(keep, nk))
                logits = _score_block(sc, params, q[:, :, rows], k, scale, ctx, work)
                rows_kept = None if qmask is None else qmask[:, None, rows]
                masked = _apply_mask(logits, keep, bias, inplace=True)
                self.add(masked, rows_kept=rows_kept, hidden_keys=keep is not None)

    def _native_update(self, sc: Score, params, q: Tensor, k: Tensor, scale, mask, is_causal,
                       qmask) -> bool:
        """Add the statistics in one pass of the native kernel (:mod:`attnscale.measure.native`, its
        statistics-only mode) where it applies: float32 on the CPU, a bool mask, a float mask
        that only hides keys (0 where visible, −inf elsewhere, as padding masks are; read as the
        bool mask it is, :func:`attnscale.measure.monitor_calls.keep_mask`) or none, and a
        score that is one scalar times the product of its prepared q and k (no ``mod``, no
        per-row or per-head scale). Returns whether it did."""
        if sc.mod is not None or q.dtype != torch.float32 or q.device.type != "cpu":
            return False
        usable, mask = keep_mask(mask)
        if not usable:  # a real bias: it changes the logits, which the kernel does not add
            return False
        kernel = native.fused_kernel()
        if kernel is None:
            return False
        b, nq, d = q.shape[0], q.shape[2], q.shape[3]

        def per_row_counts() -> Tensor:  # a length-dependent scale: not this path
            raise _PerRowScale

        try:
            qp, kp, s = sc.prepare(q, k, scale, params, Context(d, per_row_counts))
        except _PerRowScale:
            return False
        if isinstance(s, Tensor):
            if s.numel() != 1:
                return False
            s = s.item()
        rows = torch.ones(b, nq, dtype=torch.bool) if qmask is None else qmask
        _, sums, head_max = kernel(qp, kp, kp, mask, is_causal, s, rows, False)
        self.add_sums(sums, head_max)
        return True

    def update_logits(
        self,
        logits: Tensor,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        query_mask: Tensor | None = None,
    ) -> None:
        """Add pre-softmax scores (B, H, Nq, Nk) (scaled, not yet masked)."""
        b, h, nq, nk = logits.shape
        self._check_heads(h)
        mask = normalize_mask(attn_mask, logits.dtype)
        if mask is not None:
            _broadcast_mask(mask, (b, h, nq, nk))
        qmask = check_query_mask(query_mask, b, nq)
        work = torch.float64 if logits.dtype == torch.float64 else torch.float32
        with torch.no_grad():
            for rows, keep, bias in _blocks(mask, is_causal, (b, h, nq, nk), logits.device):
                block = logits[:, :, rows].to(work)
                rows_kept = None if qmask is None else qmask[:, None, rows]
                self.add(_apply_mask(block, keep, bias, inplace=False), rows_kept=rows_kept,
                         hidden_keys=keep is not None)

    def _check_heads(self, heads: int) -> None:
        if heads != self.heads:
            raise ValueError(f"this accumulator has {self.heads} heads, got {heads}")

    def add(
        self, logits: Tensor, *, rows_kept: Tensor | None = None, hidden_keys: bool = True
    ) -> None:
        """Add one block of masked logits (B, H, c, Nk): −inf marks a key the query does not see,
        NaN or +inf a visible logit that is not finite (:func:`attnscale.measure.rowstats.hide`
        puts a visible −inf as NaN). ``rows_kept`` (B, 1, c) bool drops query rows.
        ``hidden_keys=False`` says every key is visible (a −inf is then an overflowed logit),
        which skips the masking work."""
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        b, c = logits.shape[0], logits.shape[2]
        if rows_kept is None:
            rows_kept = torch.ones((b, 1, c), dtype=torch.bool, device=logits.device)
        self.path = "compiled" if self.compile else "python"
        self.add_sums(*maybe_compiled(head_sums, bool(self.compile))(logits, rows_kept,
                                                                     hidden_keys))

    def add_sums(self, sums: Tensor, head_max: Tensor) -> None:
        """Add per-head sums as :func:`head_sums` returns them: (H, len(SUM_FIELDS)) and (H,)."""
        sums, head_max = sums.detach().double(), head_max.detach().double()
        if self._sums is None:
            self._sums, self._max = sums.clone(), head_max.clone()
        else:
            self._sums += sums.to(self._sums.device)
            torch.maximum(self._max, head_max.to(self._max.device), out=self._max)

    def totals(self) -> tuple[Tensor, Tensor]:
        """(per-head sums (H, len(SUM_FIELDS)) float64, per-head max |logit| (H,) float64) of
        everything added so far: zeros for a head that has seen nothing. What
        :meth:`set_totals` takes back, e.g. after summing over data-parallel ranks."""
        if self._sums is None:
            return (torch.zeros(self.heads, len(SUM_FIELDS), dtype=torch.float64),
                    torch.zeros(self.heads, dtype=torch.float64))
        return self._sums, self._max

    def set_totals(self, sums: Tensor, max_abs: Tensor) -> None:
        """Replace the running sums and max |logit| (shapes as :meth:`totals` gives them)."""
        if sums.shape != (self.heads, len(SUM_FIELDS)) or max_abs.shape != (self.heads,):
            raise ValueError(f"totals of shape {tuple(sums.shape)}, {tuple(max_abs.shape)} for "
                             f"an accumulator of {self.heads} heads")
        self._sums, self._max = sums.to(torch.float64), max_abs.to(torch.float64)

    def result(self) -> AttentionStats:
        """The statistics of everything added so far
        (:func:`attnscale.measure.headstats.from_sums`); NaN, and max_abs_logit 0, for a head
        that has seen nothing."""
        if self._sums is None:
            return from_sums(np.zeros((self.heads, len(SUM_FIELDS))), np.zeros(self.heads))
        return from_sums(self._sums.cpu().numpy(), self._max.cpu().numpy())


def _score_block(sc: Score, params, q: Tensor, k: Tensor, scale, ctx: Context, work) -> Tensor:
    """Logits (B, H, c, Nk) of query rows ``q`` from the score's fast path, in ``work`` dtype."""
    qp, kp, s = sc.prepare(q.to(work), k.to(work), scale, params, ctx)
    # Scaling the (c, d) queries, not the (c, Nk) block. Contiguous operands: models hand over
    # q and k as head-transposed views, and the strided batched matmul was slower in a model
    # than copying them first (MiniLM, benchmarks/monitor_overhead.py).
    if sc.prescale is not None:  # folded into the queries, as the chunked kernel does
        s = sc.prescale(params) * s
        s = s.to(work) if isinstance(s, Tensor) else s
    z = (qp * s).contiguous() @ kp.contiguous().transpose(-2, -1)
    return z if sc.mod is None else sc.mod(z, params)


def _apply_mask(z: Tensor, keep: Tensor | None, bias: Tensor | None, inplace: bool) -> Tensor:
    """Add the float mask and put −inf on hidden keys (a visible −inf becomes NaN: :func:`hide`)."""
    if keep is None:
        return z
    if bias is not None:
        z = z.add_(bias) if inplace else z + bias
    elif not inplace:
        z = z.clone()
    return hide(z, keep)


class _PerRowScale(Exception):
    """A score asked for per-row visible counts: its scale varies by row."""


def check_query_mask(query_mask: Tensor | None, b: int, nq: int) -> Tensor | None:
    """``query_mask`` as a (B, Nq) bool tensor (True = keep the row), or None.

    Any shape that broadcasts to (B, Nq) is accepted -- (Nq,) or (1, Nq) for every sequence
    alike -- and expanded; another shape raises ValueError naming the expected and given shapes.
    """
    if query_mask is None:
        return None
    if not isinstance(query_mask, Tensor) or query_mask.dtype != torch.bool:
        raise TypeError("query_mask must be a bool tensor (B, Nq), True = keep the row")
    try:
        fits = torch.broadcast_shapes(query_mask.shape, (b, nq)) == (b, nq)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"query_mask must have shape (B, Nq) = {(b, nq)} (or broadcast to it), "
                         f"got {tuple(query_mask.shape)}")
    return query_mask.expand(b, nq)


def uniform_entropy(n: int) -> float:
    """ln n: the entropy of attention spread evenly over n keys."""
    return math.log(n)
