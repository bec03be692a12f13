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
  ‖J‖_F² = Σp² − 2Σp³ + (Σp²)² (ANCHORS.md);
* logsumexp ln Σ_j e^{ℓ_ij} and the z-loss term (logsumexp)² (PaLM's auxiliary loss).

Per-head values average over batch and rows; logit mean/std/max |logit| run over visible entries.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnscale.measure import native
from attnscale.core.attention import _check_inputs, _expand_key_head_params, _normalize_mask
from attnscale.core.scores import Context, Score, get_score, resolve_params

SATURATION = 0.9  # a row whose largest weight exceeds this counts as saturated
CHUNK_ELEMENTS = 1 << 22  # elements of one (B, H, chunk, Nk) block


@dataclass
class AttentionStats:
    """Per-head statistics, each an array of shape (H,), plus the number of rows they average."""

    rows: np.ndarray
    logit_mean: np.ndarray
    logit_std: np.ndarray
    max_abs_logit: np.ndarray
    entropy: np.ndarray
    entropy_uniform: np.ndarray  # mean ln n_i: the entropy if every row were uniform
    entropy_normalized: np.ndarray
    max_weight: np.ndarray
    effective_keys: np.ndarray
    saturated_fraction: np.ndarray
    jacobian_norm: np.ndarray
    logsumexp: np.ndarray
    z_loss: np.ndarray

    def mean(self) -> dict[str, float]:
        """Aggregate over heads: the max for max_abs_logit, a row-weighted mean otherwise."""
        w = self.rows / max(self.rows.sum(), 1)
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "rows":
                out[f.name] = float(value.sum())
            elif f.name == "max_abs_logit":
                out[f.name] = float(np.max(value))
            else:
                out[f.name] = float(np.nansum(value * w))
        return out

    def to_dict(self) -> dict[str, Any]:
        """{"per_head": {name: [H floats]}, "mean": {name: float}}."""
        per_head = {k: np.asarray(v, dtype=float).tolist() for k, v in asdict(self).items()}
        return {"per_head": per_head, "mean": self.mean()}


def logit_stats(
    logits: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    query_mask: Tensor | None = None,
) -> AttentionStats:
    """Statistics of pre-softmax scores ``logits`` (B, H, Nq, Nk) (scaled, not yet masked).

    ``attn_mask`` (bool keep / float additive) and ``is_causal`` as in :func:`attnscale.attention`;
    ``query_mask`` (B, Nq) bool drops query rows (e.g. padding tokens) from the averages.
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
    query chunk at a time; values are not needed. ``query_mask`` (B, Nq) bool drops query rows.
    """
    acc = StatsAccumulator(query.shape[1] if isinstance(query, Tensor) and query.dim() == 4 else 1)
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
    ``compile=True`` uses compiled code: the native kernel's statistics-only pass for float32 on
    the CPU where the score allows (:meth:`_native_update`), else the per-block row reductions
    through ``torch.compile`` (one fused pass instead of about a dozen; the first call
    compiles, a few seconds with a warm cache).
    """

    ROW_FIELDS = ("entropy", "entropy_uniform", "max_weight", "effective_keys",
                  "saturated_fraction", "jacobian_norm", "logsumexp", "z_loss")

    def __init__(self, heads: int, compile: bool = False) -> None:
        self.heads = heads
        self.compile = compile
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
        q, k, _, _ = _check_inputs(query, key, key, attn_mask, 0.0, is_causal, enable_gqa)
        if enable_gqa and k.shape[1] != q.shape[1]:
            group = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(group, dim=1)
            params = _expand_key_head_params(params, group)
        self._check_heads(q.shape[1])
        b, h, nq, d = q.shape
        mask = _normalize_mask(attn_mask, q.dtype)
        qmask = _query_mask(query_mask, b, nq)
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        with torch.no_grad():
            if self.compile and self._native_update(sc, params, q, k, scale, mask, is_causal,
                                                    qmask):
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
        statistics-only mode) where it applies: float32 on the CPU, a bool mask or none, and a
        score that is one scalar times the product of its prepared q and k (no ``mod``, no
        per-row or per-head scale). Returns whether it did."""
        if sc.mod is not None or q.dtype != torch.float32 or q.device.type != "cpu":
            return False
        if mask is not None and mask.dtype != torch.bool:
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
        if torch.isnan(logits).any():
            raise ValueError("logits contain NaN")
        b, h, nq, nk = logits.shape
        self._check_heads(h)
        mask = _normalize_mask(attn_mask, logits.dtype)
        if mask is not None:
            _broadcast_mask(mask, (b, h, nq, nk))
        qmask = _query_mask(query_mask, b, nq)
        work = torch.float64 if logits.dtype == torch.float64 else torch.float32
        with torch.no_grad():
            for rows, keep, bias in _blocks(mask, is_causal, (b, h, nq, nk), logits.device):
                block = logits[:, :, rows].to(work)
                rows_kept = None if qmask is None else qmask[:, None, rows]
                self.add(_apply_mask(block, keep, bias, inplace=False), rows_kept=rows_kept)

    def _check_heads(self, heads: int) -> None:
        if heads != self.heads:
            raise ValueError(f"this accumulator has {self.heads} heads, got {heads}")

    def add(
        self, logits: Tensor, *, rows_kept: Tensor | None = None, hidden_keys: bool = True
    ) -> None:
        """Add one block of masked logits (B, H, c, Nk): −inf marks a key the query does not see.
        ``rows_kept`` (B, 1, c) bool drops query rows. ``hidden_keys=False`` promises there is
        no −inf (every key visible), which skips the masking work."""
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        b, c = logits.shape[0], logits.shape[2]
        if rows_kept is None:
            rows_kept = torch.ones((b, 1, c), dtype=torch.bool, device=logits.device)
        self.add_sums(*maybe_compiled(head_sums, self.compile)(logits, rows_kept, hidden_keys))

    def add_sums(self, sums: Tensor, head_max: Tensor) -> None:
        """Add per-head sums as :func:`head_sums` returns them: (H, len(SUM_FIELDS)) and (H,)."""
        sums, head_max = sums.detach().double(), head_max.detach().double()
        if self._sums is None:
            self._sums, self._max = sums.clone(), head_max.clone()
        else:
            self._sums += sums.to(self._sums.device)
            torch.maximum(self._max, head_max.to(self._max.device), out=self._max)

    def result(self) -> AttentionStats:
        if self._sums is None:
            totals, max_abs = np.zeros((self.heads, len(SUM_FIELDS))), np.zeros(self.heads)
        else:
            totals, max_abs = self._sums.cpu().numpy(), self._max.cpu().numpy()
        t = {name: totals[:, i] for i, name in enumerate(SUM_FIELDS)}

        def per(name: str, count: str) -> np.ndarray:
            return t[name] / np.where(t[count] > 0, t[count], np.nan)

        with np.errstate(invalid="ignore", divide="ignore"):
            mean = per("logit_sum", "entries")
            var = per("logit_sq", "entries") - mean**2
            return AttentionStats(
                rows=t["rows"],
                logit_mean=mean,
                logit_std=np.sqrt(np.maximum(var, 0.0)),
                max_abs_logit=max_abs,
                entropy_normalized=per("norm_entropy", "norm_rows"),
                **{name: per(name, "rows") for name in self.ROW_FIELDS},
            )


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
    """Add the float mask and put −inf on hidden keys."""
    if keep is None:
        return z
    if bias is not None:
        z = z.add_(bias) if inplace else z + bias
        inplace = True
    return z.masked_fill_(~keep, float("-inf")) if inplace else z.masked_fill(~keep, float("-inf"))


class _PerRowScale(Exception):
    """A score asked for per-row visible counts: its scale varies by row."""


# The per-head sums :meth:`StatsAccumulator.add` keeps, in the order ``head_sums`` returns them.
SUM_FIELDS = ("rows", *StatsAccumulator.ROW_FIELDS, "norm_entropy", "norm_rows", "entries",
              "logit_sum", "logit_sq")


def head_sums(z: Tensor, rows_kept: Tensor, hidden_keys: bool = True) -> tuple[Tensor, Tensor]:
    """Per-head sums of every row statistic of masked logits ``z`` (B, H, c, N).

    −inf in ``z`` marks a hidden key (``hidden_keys=False``: there is none, and the masking
    work is skipped); ``rows_kept`` (B, 1, c) bool drops query rows; a row with no visible key
    is skipped. Per row, with m the max over visible keys and e = exp(ℓ − m):
    ln Σ exp ℓ = m + ln Σe; H = ln Σe − Σe(ℓ − m)/Σe; max p = 1/Σe; Σp^k = Σe^k/(Σe)^k.
    Returns the (H, len(SUM_FIELDS)) float64 sums over batch and rows, and max |ℓ| per head (H,).
    Plain tensor code, one expression graph, so ``torch.compile`` fuses it into a few loops.
    Precision: ‖J‖_F = √(Σp² − 2Σp³ + (Σp²)²) subtracts terms of size 1, so in float32 a near
    one-hot row keeps it to about 1e-3 absolute; the other statistics keep float32's accuracy.
    """
    m, e = _shifted_exp(z, hidden_keys)
    return _sums(z, m, e, rows_kept, hidden_keys)


def _shifted_exp(z: Tensor, hidden_keys: bool) -> tuple[Tensor, Tensor]:
    """Row max m (B, H, c, 1), 0 for a row with no visible key, and e = exp(z − m)."""
    m = z.amax(-1, keepdim=True)
    if hidden_keys:
        m = torch.where(m > float("-inf"), m, torch.zeros_like(m))  # fully masked row
    return m, torch.exp(z - m)


def _sums(z: Tensor, m: Tensor, e: Tensor, rows_kept: Tensor, hidden_keys: bool):
    """:func:`head_sums` given the row max and exponentials (shared with the attention
    output in :func:`attention_with_sums`, so they are computed once)."""
    zc = z - m
    if hidden_keys:
        vis = z > float("-inf")
        zc = torch.where(vis, zc, torch.zeros_like(zc))
        zv = torch.where(vis, z, torch.zeros_like(z))
        n_vis = vis.sum(-1).to(z.dtype)
    else:
        zv = z
        n_vis = torch.full(z.shape[:-1], z.shape[-1], dtype=z.dtype, device=z.device)
    e2 = e * e
    s0 = e.sum(-1)  # (B, H, c)
    valid = (s0 > 0) & rows_kept
    s0 = s0.clamp_min(1e-30)
    log_s0 = torch.log(s0)
    lse = m.squeeze(-1) + log_s0
    entropy = log_s0 - (e * zc).sum(-1) / s0
    p2, p3 = e2.sum(-1) / (s0 * s0), (e2 * e).sum(-1) / (s0 * s0 * s0)  # Σp², Σp³
    max_weight = 1.0 / s0  # the row maximum has e = 1
    wide = valid & (n_vis >= 2)
    per_row = [
        torch.ones_like(s0),  # rows
        entropy,
        torch.log(n_vis.clamp_min(1)),  # entropy_uniform
        max_weight,
        1.0 / p2.clamp_min(1e-30),  # effective_keys
        (max_weight > SATURATION).to(z.dtype),  # saturated_fraction
        (p2 - 2 * p3 + p2 * p2).clamp_min(0).sqrt(),  # jacobian_norm, ANCHORS.md
        lse,
        lse * lse,  # z_loss
    ]
    per_row = [torch.where(valid, x, torch.zeros_like(x)) for x in per_row]
    ent_norm = entropy / torch.log(n_vis.clamp_min(2))
    per_row += [
        torch.where(wide, ent_norm, torch.zeros_like(ent_norm)),  # norm_entropy
        wide.to(z.dtype),  # norm_rows
        torch.where(valid, n_vis, torch.zeros_like(n_vis)),  # entries
        torch.where(valid, zv.sum(-1), torch.zeros_like(s0)),  # logit_sum
        torch.where(valid, (zv * zv).sum(-1), torch.zeros_like(s0)),  # logit_sq
    ]
    sums = torch.stack(per_row, dim=-1).to(torch.float64).sum(dim=(0, 2))  # (H, F)
    row_max = torch.where(valid, zv.abs().amax(-1), torch.zeros_like(s0))
    return sums, row_max.amax(dim=(0, 2))


def attention_with_sums(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool, scale: float,
    rows_kept: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Scaled dot-product attention computed from materialized logits, with :func:`head_sums`
    of those same logits: (output (B, H, N, Dv), sums (H, F), max |ℓ| (H,)).

    q (B, H, N, d), k and v (B, H, S, ·) with equal head counts; ``keep`` a bool mask
    broadcasting to (B, H, N, S) (True = attend) or None; ``is_causal`` aligned to the upper left
    like SDPA. The order of operations follows PyTorch's CPU flash kernel (scale after the
    product, normalize after the value product), so the output matches SDPA to float rounding
    (``tests/test_monitor.py`` holds it within 1e-6); a row with no visible key gives 0 as SDPA
    does. One expression graph: ``torch.compile`` fuses the softmax with the statistics, so the
    monitor pays for one logits product instead of two.
    """
    z = (q @ k.transpose(-2, -1)) * scale  # (B, H, N, S)
    hidden = keep is not None or is_causal
    if is_causal:
        causal = torch.ones(z.shape[-2:], dtype=torch.bool, device=z.device).tril()
        keep = causal if keep is None else keep & causal
    if keep is not None:
        z = z.masked_fill(~keep, float("-inf"))
    m, e = _shifted_exp(z, hidden)
    sums, head_max = _sums(z, m, e, rows_kept, hidden)
    total = e.sum(-1, keepdim=True)  # (B, H, N, 1)
    out = torch.where(total > 0, (e @ v) / total.clamp_min(1e-30), torch.zeros((), dtype=v.dtype))
    return out, sums, head_max


_COMPILED: dict[Any, Any] = {}


def maybe_compiled(fn, compile: bool):
    """``fn``, compiled once per process when asked."""
    if not compile:
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn]


def _query_mask(query_mask: Tensor | None, b: int, nq: int) -> Tensor | None:
    if query_mask is None:
        return None
    if not isinstance(query_mask, Tensor) or query_mask.dtype != torch.bool:
        raise TypeError("query_mask must be a bool tensor (B, Nq), True = keep the row")
    if tuple(query_mask.shape) != (b, nq):
        raise ValueError(f"query_mask must have shape (B, Nq) = {(b, nq)}, "
                         f"got {tuple(query_mask.shape)}")
    return query_mask


def uniform_entropy(n: int) -> float:
    """ln n: the entropy of attention spread evenly over n keys."""
    return math.log(n)
