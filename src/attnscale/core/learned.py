"""Learned score parameters: how :class:`attnscale.core.nn.MultiheadSelfAttention` makes each one.

A score lists the parameters it can learn in its registry entry
(:attr:`attnscale.core.scores.Score.learnable`), each as a :class:`Learned`: the tensors to
create (they become ``nn.Parameter`` attributes of the module, under these names) and the map
from those tensors to the score's parameters, applied on every forward pass. The ones used in
the literature:

* :func:`swin_temperature`: a per-head log-scale initialized at ln 10 and clamped at ln 100,
  τ = exp(min(θ, ln 100)) (Swin Transformer V2, Liu et al. 2022, arXiv 2111.09883);
* :func:`qknorm_temperature`: one scalar gain g initialized at g₀ = log₂(L² − L) for a sequence
  length L, τ = g (QKNorm, Henry et al. 2020, arXiv 2010.04245);
* :func:`head_weights`: per-head affine weights over the head dimension for QK-norms
  (Dehghani et al. 2023, arXiv 2302.05442);
* :func:`per_head_value`: a per-head copy of a scalar parameter, initialized at its fixed
  value, optionally floored (Scalable-Softmax's ``s``, Nakanishi 2025, arXiv 2501.19399, at
  least :data:`S_FLOOR`: logits s·ln n·q·k/√d with s ≤ 0 would switch attention off or invert
  it, and a learned s at LR 0.03 was seen to cross 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from attnscale.util.validate import check_array

SWIN_INIT = math.log(10.0)  # Swin V2: logit scale initialized at log 10 ...
S_FLOOR = 1e-3  # the learned log-length s is used as max(s, S_FLOOR)
SWIN_MAX = math.log(100.0)  # ... and clamped at log 100 (τ ≤ 100, i.e. temperature ≥ 0.01)


@dataclass(frozen=True)
class Shape:
    """What a learned parameter's initial value may depend on.

    ``heads`` H (query heads), ``kv_heads`` Hkv, ``head_dim`` d, and ``length`` L, the sequence
    length the model is built for (None when the caller did not give one).
    """

    heads: int
    kv_heads: int
    head_dim: int
    length: float | None = None


@dataclass(frozen=True)
class Learned:
    """One learnable parametrization of a score.

    ``supplies``: the score parameters it sets. ``init(shape, params)`` returns the named
    initial tensors (``params`` are the score's fixed parameters merged over its defaults);
    ``value(tensors)`` returns the ``supplies`` parameters they stand for, differentiably.
    ``default``: learned unless the caller asks for fixed parameters (QK-norm weights,
    log-length ``s``); the others (cosine temperatures) are chosen by name.
    """

    summary: str
    supplies: tuple[str, ...]
    init: Callable[[Shape, Mapping[str, Any]], dict[str, Tensor]]
    value: Callable[[Mapping[str, Tensor]], dict[str, Any]]
    default: bool = False


def qknorm_g0(L: ArrayLike) -> float | np.ndarray:
    """QKNorm initial gain g₀ = log₂(L² − L), L the 97.5th percentile of sequence length.

    Henry et al. 2020 (arXiv 2010.04245). L = 72 gives 12.32. Needs L > 1.
    """
    arr = check_array("L", L)
    if (arr <= 1).any():
        raise ValueError(f"L must be finite and > 1, got {L!r}")
    out = np.log2(arr * arr - arr)
    return float(out) if np.ndim(out) == 0 else out


def swin_temperature() -> Learned:
    """τ = exp(min(θ, ln 100)) per head, θ initialized at ln 10 (Swin V2)."""
    return Learned(
        summary="per-head τ = exp(min(θ, ln 100)), θ₀ = ln 10 (Swin V2, Liu et al. 2022)",
        supplies=("tau",),
        init=lambda shape, p: {"logit_scale": torch.full((shape.heads,), SWIN_INIT)},
        value=lambda t: {"tau": torch.exp(t["logit_scale"].clamp(max=SWIN_MAX))},
    )


def _qknorm_init(shape: Shape, params: Mapping[str, Any]) -> dict[str, Tensor]:
    if shape.length is None:
        raise ValueError("temperature='qknorm' needs seq_len (the L in log2(L²−L))")
    return {"gain": torch.tensor(float(qknorm_g0(shape.length)))}


def qknorm_temperature() -> Learned:
    """One scalar τ = g, initialized at g₀ = log₂(L² − L) (QKNorm)."""
    return Learned(
        summary="scalar τ = g, g₀ = log₂(L² − L) (QKNorm, Henry et al. 2020)",
        supplies=("tau",),
        init=_qknorm_init,
        value=lambda t: {"tau": t["gain"]},
    )


def head_weights() -> Learned:
    """Per-head affine weights over the head dimension for q (H, d) and k (Hkv, d), at ones."""
    return Learned(
        summary="per-head weights over the head dimension, initialized at 1",
        supplies=("q_weight", "k_weight"),
        init=lambda shape, p: {
            "q_weight": torch.ones(shape.heads, shape.head_dim),
            "k_weight": torch.ones(shape.kv_heads, shape.head_dim),
        },
        value=lambda t: {"q_weight": t["q_weight"], "k_weight": t["k_weight"]},
        default=True,
    )


def per_head_value(name: str, floor: float | None = None) -> Learned:
    """A per-head copy of the scalar parameter ``name``, initialized at its fixed value; with
    ``floor``, used as max(value, floor), as Swin V2 clamps its temperature (a positive
    parameter that training drives through 0 would otherwise invert the score)."""
    def value(t: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {name: t[name] if floor is None else t[name].clamp_min(floor)}
    return Learned(
        summary=f"per-head {name}, initialized at its fixed value"
                + (f", at least {floor:g}" if floor is not None else ""),
        supplies=(name,),
        init=lambda shape, p: {name: torch.full((shape.heads,), float(p[name]))},
        value=value,
        default=True,
    )
