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

from attnscale.attention import _check_inputs, _expand_key_head_params, _normalize_mask
from attnscale.scores import Context, Score, get_score, resolve_params

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
    """

    ROW_FIELDS = ("entropy", "entropy_uniform", "max_weight", "effective_keys",
                  "saturated_fraction", "jacobian_norm", "logsumexp", "z_loss")

    def __init__(self, heads: int) -> None:
        z = lambda: np.zeros(heads)  # noqa: E731
        self.heads = heads
        self.rows, self.norm_rows, self.entries = z(), z(), z()
        self.row_sums = {name: z() for name in self.ROW_FIELDS}
        self.norm_entropy = z()
        self.logit_sum, self.logit_sq, self.max_abs = z(), z(), z()

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
        """Add the attention of one call, given as in :func:`attnscale.attention`."""
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
        with torch.no_grad():
            nk = k.shape[-2]
            for rows, keep, bias in _blocks(mask, is_causal, (b, h, nq, nk), q.device):
                ctx = Context(head_dim=d, n_visible=lambda keep=keep: _n_visible(keep, nk))
                logits = sc.formula(q[:, :, rows], k, scale, params, ctx)  # (B, H, c, Nk)
                rows_kept = None if qmask is None else qmask[:, None, rows]
                self.add(logits if bias is None else logits + bias, keep, rows_kept)

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
        with torch.no_grad():
            for rows, keep, bias in _blocks(mask, is_causal, (b, h, nq, nk), logits.device):
                block = logits[:, :, rows]
                rows_kept = None if qmask is None else qmask[:, None, rows]
                self.add(block if bias is None else block + bias, keep, rows_kept)

    def _check_heads(self, heads: int) -> None:
        if heads != self.heads:
            raise ValueError(f"this accumulator has {self.heads} heads, got {heads}")

    def add(self, logits: Tensor, keep: Tensor | None, rows_kept: Tensor | None = None) -> None:
        """Add one block of logits (B, H, c, Nk). ``keep`` (broadcastable bool) marks visible
        keys, None = all visible; ``rows_kept`` (B, 1, c) bool drops query rows."""
        # Every full-size (B, H, c, Nk) pass costs; row-level (B, H, c) work is cheap.
        if logits.dtype != torch.float64:
            logits = logits.float()
        b, h, c, nk = logits.shape
        if keep is None:
            masked, visible = logits, logits
            n_vis = torch.full((b, h, c), nk, dtype=logits.dtype, device=logits.device)
        else:
            keep = keep.expand(logits.shape)
            masked = logits.masked_fill(~keep, float("-inf"))
            visible = logits.masked_fill(~keep, 0.0)
            n_vis = keep.sum(-1).to(logits.dtype)  # (B, H, c)
        lse = torch.logsumexp(masked, dim=-1)  # (B, H, c), −inf on fully masked rows
        valid = torch.isfinite(lse)
        logp = masked - lse.masked_fill(~valid, 0.0).unsqueeze(-1)
        p = logp.exp()  # 0 on masked keys
        if keep is not None:
            logp.clamp_(min=torch.finfo(logp.dtype).min)  # p·logp = 0, not NaN, where p = 0
        s2 = torch.linalg.vecdot(p, p)
        s3 = torch.linalg.vecdot(p * p, p)
        max_weight = p.amax(-1)
        per_row = {
            "entropy": -torch.linalg.vecdot(p, logp),
            "entropy_uniform": torch.log(n_vis.clamp_min(1)),
            "max_weight": max_weight,
            "effective_keys": 1.0 / s2.clamp_min(1e-30),
            "saturated_fraction": (max_weight > SATURATION).to(logits.dtype),
            "jacobian_norm": (s2 - 2 * s3 + s2 * s2).clamp_min(0).sqrt(),
            "logsumexp": lse,
            "z_loss": lse * lse,
        }
        if rows_kept is not None:
            valid = valid & rows_kept
        zero = torch.zeros((), dtype=logits.dtype, device=logits.device)
        for name, value in per_row.items():
            self.row_sums[name] += _head_sum(torch.where(valid, value, zero))
        self.rows += _head_sum(valid)
        wide = valid & (n_vis >= 2)
        ent_norm = per_row["entropy"] / torch.log(n_vis.clamp_min(2))
        self.norm_entropy += _head_sum(torch.where(wide, ent_norm, zero))
        self.norm_rows += _head_sum(wide)
        self.entries += _head_sum(torch.where(valid, n_vis, zero))
        self.logit_sum += _head_sum(torch.where(valid, visible.sum(-1), zero))
        self.logit_sq += _head_sum(torch.where(valid, torch.linalg.vecdot(visible, visible), zero))
        row_max = torch.maximum(visible.amax(-1), -visible.amin(-1))  # max |logit| per row
        head_max = torch.where(valid, row_max, zero).amax(dim=(0, 2))
        self.max_abs = np.maximum(self.max_abs, head_max.double().cpu().numpy())

    def result(self) -> AttentionStats:
        with np.errstate(invalid="ignore", divide="ignore"):
            rows = np.where(self.rows > 0, self.rows, np.nan)
            mean = self.logit_sum / np.where(self.entries > 0, self.entries, np.nan)
            var = self.logit_sq / np.where(self.entries > 0, self.entries, np.nan) - mean**2
            norm_rows = np.where(self.norm_rows > 0, self.norm_rows, np.nan)
            return AttentionStats(
                rows=self.rows,
                logit_mean=mean,
                logit_std=np.sqrt(np.maximum(var, 0.0)),
                max_abs_logit=self.max_abs,
                entropy_normalized=self.norm_entropy / norm_rows,
                **{name: s / rows for name, s in self.row_sums.items()},
            )


def _head_sum(x: Tensor) -> np.ndarray:
    """Sum a row-level (B, H, c) tensor over batch and rows, in float64."""
    return x.sum(dim=(0, 2), dtype=torch.float64).cpu().numpy()


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
