"""Per-row softmax statistics of a block of masked logits, as plain tensor code.

One expression graph per function, so ``torch.compile`` fuses each into a few loops; the native
kernel (:mod:`attnscale.measure.native`) computes the same sums and is tested against these.
Per row, with m the max over visible keys and e = exp(ℓ − m): ln Σ exp ℓ = m + ln Σe;
entropy H = ln Σe − Σe(ℓ − m)/Σe; max p = 1/Σe; Σp^k = Σe^k/(Σe)^k; and the Frobenius norm of
the softmax Jacobian J = diag(p) − ppᵀ, ‖J‖_F² = Σp² − 2Σp³ + (Σp²)² (expand Σ_ij J_ij²).

A row whose visible logits include NaN or ±inf adds only to "scored" (its visible logits) and
"nonfinite" (those not finite), and makes its head's max |ℓ| +inf; every other sum leaves it
out (the rule of :mod:`attnscale.measure.headstats`, which the native kernel follows too).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

SATURATION = 0.9  # a row whose largest weight exceeds this counts as saturated
# Statistics averaged over query rows, in the order of the per-row columns of SUM_FIELDS.
ROW_FIELDS = ("entropy", "entropy_uniform", "max_weight", "effective_keys",
              "saturated_fraction", "jacobian_norm", "logsumexp", "z_loss")
# The per-head sums :func:`head_sums` returns, in order: "rows" and "entries" count the rows and
# visible logits of the finite rows the other sums run over; "scored" counts the visible logits
# of every kept row and "nonfinite" those of them that are NaN or ±inf.
SUM_FIELDS = ("rows", *ROW_FIELDS, "norm_entropy", "norm_rows", "entries", "logit_sum",
              "logit_sq", "scored", "nonfinite")


def head_sums(z: Tensor, rows_kept: Tensor, hidden_keys: bool = True) -> tuple[Tensor, Tensor]:
    """Per-head sums of every row statistic of masked logits ``z`` (B, H, c, N).

    −inf in ``z`` marks a hidden key (``hidden_keys=False``: there is none, and the masking
    work is skipped); any other value is a visible logit, NaN and +inf included, so a visible
    logit of −inf must come as NaN (:func:`hide`); ``rows_kept`` (B, 1, c) bool drops query rows;
    a row with no visible key is skipped, and a row with a visible logit that is not finite
    counts only in "scored" and "nonfinite" (and max |ℓ| = +inf). Per row, with m the max over
    visible keys and e = exp(ℓ − m):
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
        vis = z != float("-inf")  # NaN compares unequal: a visible logit that is not finite
        zc = torch.where(vis, zc, torch.zeros_like(zc))
        zv = torch.where(vis, z, torch.zeros_like(z))
        n_vis = vis.sum(-1).to(z.dtype)
    else:
        zv = z
        n_vis = torch.full(z.shape[:-1], z.shape[-1], dtype=z.dtype, device=z.device)
    top = zv.abs().amax(-1)  # (B, H, c): NaN or inf exactly where a visible logit is not finite
    finite = torch.isfinite(top)
    e2 = e * e
    s0 = e.sum(-1)  # (B, H, c)
    valid = (s0 > 0) & rows_kept & finite
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
        (p2 - 2 * p3 + p2 * p2).clamp_min(0).sqrt(),  # jacobian_norm
        lse,
        lse * lse,  # z_loss
    ]
    per_row = [torch.where(valid, x, torch.zeros_like(x)) for x in per_row]
    ent_norm = entropy / torch.log(n_vis.clamp_min(2))
    zero = torch.zeros_like(s0)
    per_row += [
        torch.where(wide, ent_norm, zero),  # norm_entropy
        wide.to(z.dtype),  # norm_rows
        torch.where(valid, n_vis, zero),  # entries
        torch.where(valid, zv.sum(-1), zero),  # logit_sum
        torch.where(valid, (zv * zv).sum(-1), zero),  # logit_sq
        torch.where(rows_kept, n_vis, zero),  # scored
        torch.where(rows_kept, _nonfinite_counts(zv, finite), zero),  # nonfinite
    ]
    sums = torch.stack(per_row, dim=-1).to(torch.float64).sum(dim=(0, 2))  # (H, F)
    row_max = torch.where(valid, top, torch.where(rows_kept & ~finite, float("inf"), zero))
    return sums, row_max.amax(dim=(0, 2))


def _nonfinite_counts(zv: Tensor, finite: Tensor) -> Tensor:
    """Per row, the entries of ``zv`` (hidden keys 0) that are NaN or ±inf; ``finite`` says
    which rows have none. Counting is a pass over the block: eager code on the CPU skips it when
    every row is finite (checking that there costs no device sync); under ``torch.compile`` it
    fuses into the other reductions."""
    if zv.device.type == "cpu" and not torch.compiler.is_compiling() and bool(finite.all()):
        return torch.zeros(finite.shape, dtype=zv.dtype, device=zv.device)
    return (~torch.isfinite(zv)).sum(-1).to(zv.dtype)


def hide(z: Tensor, keep: Tensor) -> Tensor:
    """``z`` in the form :func:`head_sums` reads, in place: −inf where ``keep`` (bool,
    broadcasting to ``z``) is False, after a visible −inf logit (an overflow) became NaN, which
    tells it apart from a hidden key."""
    nan, inf = float("nan"), float("inf")
    return z.nan_to_num_(nan=nan, posinf=inf, neginf=nan).masked_fill_(~keep, -inf)


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
    (the monitor tests hold it within 1e-6); a row with no visible key gives 0 as SDPA
    does. One expression graph: ``torch.compile`` fuses the softmax with the statistics, so the
    monitor pays for one logits product instead of two.
    """
    z = (q @ k.transpose(-2, -1)) * scale  # (B, H, N, S)
    hidden = keep is not None or is_causal
    if is_causal:
        causal = torch.ones(z.shape[-2:], dtype=torch.bool, device=z.device).tril()
        keep = causal if keep is None else keep & causal
    seen = z  # the statistics' view: a visible −inf is a logit that overflowed (hide)
    if keep is not None:
        seen = hide(z.clone(), keep)
        z = z.masked_fill(~keep, float("-inf"))  # the softmax's: a visible −inf weighs 0 (SDPA)
    m, e = _shifted_exp(z, hidden)
    sums, head_max = _sums(seen, m, e, rows_kept, hidden)
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


