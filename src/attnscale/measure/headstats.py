"""Per-head attention statistics: what each captures (:data:`STATISTICS`), the record
(:class:`AttentionStats`), its means over heads (:func:`flat_means`), and how the per-head sums
of :func:`attnscale.measure.rowstats.head_sums` (or of the native kernel) become it
(:func:`from_sums`).

Non-finite logits, one rule on every path (the Python code, the ``torch.compile``-d one, the
native kernel and the monitor's counterfactual pass). A logit is scored where a kept query row
sees its key: after scaling (and a float mask's bias), masked-out keys not counted. A kept row
whose scored logits include NaN or ±inf has no defined softmax (NaN) or a degenerate one, so:

* ``nonfinite_fraction`` counts its scored logits, and those of them that are NaN or ±inf;
* ``max_abs_logit`` of its head is +inf (whether the culprit is NaN, +inf or −inf);
* every other statistic -- ``rows``, the logit moments, everything of the pattern, z-loss --
  leaves the row out. A head left with no row reads NaN for them (``rows`` 0), and so do the
  layer means when no head has a row: a layer whose logits are all NaN reads NaN and +inf,
  never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from attnscale.measure.rowstats import ROW_FIELDS, SATURATION, SUM_FIELDS

__all__ = ["STATISTICS", "AttentionStats", "flat_means", "from_sums"]

# What each statistic is computed from, in TransformerLens terms: ``attn_scores`` (its
# ``hook_attn_scores``) are the pre-softmax logits after scaling -- the score's formula, e.g.
# q·k/√d or softcap -- and masking, where a float mask is added and hidden keys drop out;
# ``pattern`` (``hook_pattern``) is softmax(attn_scores) over the keys the query sees (n_i).
# Every statistic but ``rows`` and ``nonfinite_fraction`` averages over the kept query rows
# whose attn_scores are all finite (module docstring).
STATISTICS: dict[str, str] = {
    "rows": "count: query rows averaged (kept, with at least one visible key, every visible "
            "logit finite), summed over heads",
    "logit_mean": "attn_scores: mean over visible (query, key) entries",
    "logit_std": "attn_scores: standard deviation over visible (query, key) entries",
    "max_abs_logit": "attn_scores: max |logit| over visible entries, +inf if any is NaN or ±inf "
                     "(max over heads in means)",
    "nonfinite_fraction": "attn_scores: fraction of the visible entries of kept rows that are "
                          "NaN or ±inf (mean over heads in means)",
    "entropy": "pattern: entropy −Σ_j p_ij ln p_ij in nats",
    "entropy_uniform": "mask only: ln n_i, the entropy of a uniform pattern over the same keys",
    "entropy_normalized": "pattern: entropy / ln n_i, over rows with n_i ≥ 2",
    "max_weight": "pattern: largest weight max_j p_ij",
    "effective_keys": "pattern: participation ratio 1/Σ_j p_ij²",
    "saturated_fraction": f"pattern: fraction of rows whose largest weight exceeds {SATURATION}",
    "jacobian_norm": "pattern: Frobenius norm of the softmax Jacobian diag(p) − ppᵀ",
    "logsumexp": "attn_scores: ln Σ_j exp(logit_ij) over visible keys (softmax normalizer)",
    "z_loss": "attn_scores: logsumexp², PaLM's z-loss (Chowdhery et al. 2022, arXiv:2204.02311)",
}


@dataclass
class AttentionStats:
    """Per-head statistics, each an array of shape (H,), plus the number of rows they average
    (:data:`STATISTICS` says what each captures; the module docstring, non-finite logits)."""

    rows: np.ndarray
    logit_mean: np.ndarray
    logit_std: np.ndarray
    max_abs_logit: np.ndarray
    nonfinite_fraction: np.ndarray
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
        """Aggregate over heads: the total for rows; the max for max_abs_logit; the mean over
        heads that scored a logit for nonfinite_fraction (every head scores the same
        (query, key) pairs unless the mask differs between heads); otherwise the mean over
        heads with a value (not NaN), each weighted by its rows. NaN where no head has a value."""
        out: dict[str, float] = {}
        for f in fields(self):
            value = np.asarray(getattr(self, f.name), dtype=float)
            if f.name == "rows":
                out[f.name] = float(value.sum())
            elif f.name == "max_abs_logit":
                out[f.name] = float(np.max(value)) if value.size else math.nan
            elif f.name == "nonfinite_fraction":
                out[f.name] = _weighted_mean(value, np.ones_like(value))
            else:
                out[f.name] = _weighted_mean(value, self.rows)
        return out

    def to_dict(self) -> dict[str, Any]:
        """{"per_head": {name: [H floats]}, "mean": {name: float}}."""
        per_head = {k: np.asarray(v, dtype=float).tolist() for k, v in asdict(self).items()}
        return {"per_head": per_head, "mean": self.mean()}


def _weighted_mean(value: np.ndarray, weight: np.ndarray) -> float:
    """Σ w·v / Σ w over the heads with w > 0 and v not NaN; NaN when there is none."""
    ok = (np.asarray(weight) > 0) & ~np.isnan(value)
    if not ok.any():
        return math.nan
    w = np.asarray(weight, dtype=float)[ok]
    return float(np.sum(value[ok] * w) / np.sum(w))


def from_sums(totals: np.ndarray, max_abs: np.ndarray) -> AttentionStats:
    """The statistics of per-head sums ``totals`` (H, len(SUM_FIELDS)), in the order of
    :data:`attnscale.measure.rowstats.SUM_FIELDS`, and max |logit| ``max_abs`` (H,): each mean
    is its sum over its count (rows, entries, rows with n_i ≥ 2, scored logits), NaN where the
    count is 0; logit_std = √(E[ℓ²] − E[ℓ]²)."""
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
            nonfinite_fraction=per("nonfinite", "scored"),
            entropy_normalized=per("norm_entropy", "norm_rows"),
            **{name: per(name, "rows") for name in ROW_FIELDS},
        )


def flat_means(layers: Mapping[str, AttentionStats]) -> dict[str, float]:
    """``{f"{layer}/{statistic}": float}``, for loggers: each layer's :meth:`AttentionStats.mean`
    (row-weighted mean over heads and rows; max over heads for max_abs_logit; mean over heads
    for nonfinite_fraction; total for rows). Plain Python floats: finite when every logit was
    (``json.dumps(..., allow_nan=False)`` takes them then); with non-finite logits
    max_abs_logit is inf, and a layer without a finite row reads NaN. What each statistic
    measures: :data:`STATISTICS`."""
    return {f"{layer}/{name}": float(value)
            for layer, s in layers.items() for name, value in s.mean().items()}
