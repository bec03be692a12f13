"""Modules built on :func:`attnscale.attention`.

:class:`MultiheadSelfAttention` is a drop-in self-attention block (projections, heads, GQA,
causal) whose score is one argument. The score parameters it can learn come from the score's
registry entry (:attr:`attnscale.core.scores.Score.learnable`, built from
:mod:`attnscale.core.learned`):

* ``temperature`` picks one learned temperature by name, e.g. for cosine "swin" (per-head
  log-scale at ln 10, clamped at ln 100; Swin V2, Liu et al. 2022) or "qknorm" (one scalar at
  g₀ = log₂(L² − L) for a sequence length L; QKNorm, Henry et al. 2020); "fixed" learns none;
* ``learn=True`` (default) learns the parameters a score learns by default: the QK-norms'
  per-head affine weights, log_length's per-head ``s`` (SSMax, Nakanishi 2025).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from attnscale.core.attention import attention
from attnscale.core.learned import SWIN_INIT, SWIN_MAX, Shape
from attnscale.core.scores import SCORES, Score, get_score, resolve_params
from attnscale.util.validate import check_int

__all__ = [
    "SWIN_INIT",
    "SWIN_MAX",
    "MultiheadSelfAttention",
    "apply_rope",
    "check_sizes",
    "check_temperature",
    "temperatures",
]


def temperatures(score: str | Score) -> tuple[str, ...]:
    """The values ``temperature`` may take for ``score``: "fixed" and its named parametrizations."""
    sc = get_score(score)
    return ("fixed", *(n for n, spec in sc.learnable.items() if not spec.default))


def check_temperature(score: str | Score, temperature: str) -> str:
    """``temperature`` if ``score`` offers it; else a ValueError naming the score that does."""
    sc = get_score(score)
    if temperature in temperatures(sc):
        return temperature
    owners = [s.name for s in SCORES.values() if temperature in temperatures(s)]
    if owners:
        raise ValueError(f"temperature={temperature!r} needs score="
                         f"{' or '.join(map(repr, owners))}, got {sc.name!r}")
    offered = sorted({t for s in SCORES.values() for t in temperatures(s)})
    raise ValueError(f"temperature must be one of {offered}, got {temperature!r}")


class MultiheadSelfAttention(nn.Module):
    """Self-attention with a pluggable score. Input and output (B, N, d_model).

    Args:
        d_model: model width; must be divisible by ``n_heads``.
        n_heads: query heads H; head dim d = d_model / H.
        n_kv_heads: key/value heads (GQA); must divide ``n_heads``. Defaults to ``n_heads``.
        score: a name from :data:`attnscale.core.scores.SCORES`.
        causal: default for ``is_causal`` in :meth:`forward`.
        bias: biases in the projections.
        dropout: attention dropout probability during training.
        temperature: "fixed", or one of the score's learned temperatures (:func:`temperatures`).
        seq_len: the sequence length L the module is built for, where a learned initial value
            needs it (QKNorm's g₀ = log₂(L² − L)).
        learn: learn the parameters the score learns by default (QK-norm weights, log-length s).
        rotary: rotary position embedding on q and k (Su et al. 2021), applied before the score.
        rope_base: RoPE frequency base.
        **score_params: fixed score parameters (``tau``, ``cap``, ``c``, ``s``, ``eps``,
            ``scale``...); a learned parameter starts at its fixed value where it has one.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        score: str = "scaled_dot",
        causal: bool = False,
        bias: bool = False,
        dropout: float = 0.0,
        temperature: str = "fixed",
        seq_len: float | None = None,
        learn: bool = True,
        rotary: bool = False,
        rope_base: float = 10000.0,
        **score_params: Any,
    ) -> None:
        super().__init__()
        _reject_renamed(score_params)
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_sizes(d_model, n_heads, n_kv_heads)
        self.score = get_score(score).name
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.causal, self.dropout = causal, dropout
        self.scale = score_params.pop("scale", None)
        self.score_params = score_params
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.temperature = temperature
        self.rotary, self.rope_base = rotary, rope_base
        if rotary and self.head_dim % 2:
            raise ValueError(f"rotary needs an even head dimension, got {self.head_dim}")
        # Diagnostics hook: called as capture(module, q, k, call) with the q and k that enter the
        # score (after projection and RoPE, before the score's own transform) and the keyword
        # arguments of the attention call. attnscale.measure.monitor installs it.
        self.capture: Any = None
        self.learned = self._learned_names(temperature, learn)
        self._init_learned(seq_len)
        # Fail at construction, not at the first forward, on bad score parameters.
        resolve_params(get_score(self.score), self._attention_kwargs()["params"], self.scale)

    def _learned_names(self, temperature: str, learn: bool) -> tuple[str, ...]:
        """The score's parametrizations this module learns: the defaults, plus ``temperature``."""
        sc = get_score(self.score)
        check_temperature(sc, temperature)
        names = [n for n, spec in sc.learnable.items() if spec.default and learn]
        return (*names, temperature) if temperature != "fixed" else tuple(names)

    def _init_learned(self, length: float | None) -> None:
        sc = get_score(self.score)
        fixed = {**sc.defaults, **self.score_params}
        shape = Shape(self.n_heads, self.n_kv_heads, self.head_dim, length)
        self._tensor_names: dict[str, tuple[str, ...]] = {}
        for name in self.learned:
            tensors = sc.learnable[name].init(shape, fixed)
            for tensor_name, value in tensors.items():
                setattr(self, tensor_name, nn.Parameter(value))
            self._tensor_names[name] = tuple(tensors)

    def extra_repr(self) -> str:
        """What ``print(module)`` shows besides the projections: the score and its settings."""
        parts = [f"score={self.score!r}", f"d_model={self.d_model}", f"n_heads={self.n_heads}"]
        if self.n_kv_heads != self.n_heads:
            parts.append(f"n_kv_heads={self.n_kv_heads}")
        parts += [f"{k}={v!r}" for k, v in sorted(self.score_params.items())]
        if self.scale is not None:
            parts.append(f"scale={self.scale!r}")
        parts += [f"{k}=True" for k in ("causal", "rotary") if getattr(self, k)]
        if self.temperature != "fixed":
            parts.append(f"temperature={self.temperature!r}")
        if self.learned:
            parts.append(f"learned={list(self.learned)}")
        return ", ".join(parts)

    def learned_params(self) -> dict[str, Tensor]:
        """The learned score parameters in use, by score parameter name (e.g. ``tau``, ``s``)."""
        sc = get_score(self.score)
        out: dict[str, Tensor] = {}
        for name in self.learned:
            tensors = {n: getattr(self, n) for n in self._tensor_names[name]}
            out.update(sc.learnable[name].value(tensors))
        return out

    def _attention_kwargs(self) -> dict[str, Any]:
        params: dict[str, Any] = {**self.score_params, **self.learned_params()}
        return {"score": self.score, "scale": self.scale, "params": params}

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project (B, N, d_model) to q (B, H, N, d), k and v (B, Hkv, N, d), RoPE applied."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            q, k = apply_rope(q, self.rope_base), apply_rope(k, self.rope_base)
        return q, k, v

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool | None = None
    ) -> Tensor:
        """x (B, N, d_model) -> (B, N, d_model). ``attn_mask`` as in :func:`attnscale.attention`."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, N, {self.d_model}), got shape {tuple(x.shape)}")
        b, n, _ = x.shape
        q, k, v = self.split_heads(x)  # (B, H, N, d), (B, Hkv, N, d) x2
        kw = self._attention_kwargs()
        call = {
            "attn_mask": attn_mask,
            "is_causal": self.causal if is_causal is None else is_causal,
            "enable_gqa": self.n_kv_heads != self.n_heads,
            "score": kw["score"],
            "scale": kw["scale"],
            **kw["params"],
        }
        if self.capture is not None:
            self.capture(self, q, k, call)
        y = attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, **call)
        # y: (B, H, N, d)
        return self.out_proj(y.transpose(1, 2).reshape(b, n, self.d_model))


def apply_rope(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (Su et al. 2021) over (B, H, N, d), position = index along N.

    Pairs (x_i, x_{i+d/2}) rotate by angle pos·base^(−2i/d); rotation keeps ‖x‖, so cosine and
    RMS-normalized scores see the same norms with or without it.
    """
    n, d = x.shape[-2], x.shape[-1]
    cos, sin = rope_tables(n, d, float(base), x.dtype, x.device)  # (N, d/2) each
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


@functools.lru_cache(maxsize=64)
def rope_tables(n: int, d: int, base: float, dtype: torch.dtype,
                device: torch.device) -> tuple[Tensor, Tensor]:
    """(cos, sin) of the rotary angles pos·base^(−2i/d), each (N, d/2) in ``dtype``, computed in
    float64. Cached: a small model's training step spent a tenth of its time rebuilding them
    (the cached tensors are never written to)."""
    # plain tensors even when first asked for under inference_mode, which a later training
    # forward could not save for backward
    with torch.inference_mode(False), torch.no_grad():
        inv_freq = base ** (-torch.arange(0, d // 2, device=device, dtype=torch.float64) * 2 / d)
        angles = torch.arange(n, device=device, dtype=torch.float64)[:, None] * inv_freq
        return angles.cos().to(dtype), angles.sin().to(dtype)  # (N, d/2) each


def check_sizes(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    """Check that the head layout exists: positive ints, H divides d_model, H_kv divides H.

    Raises TypeError for a non-int (``True`` included) and ValueError otherwise, naming the
    argument.
    """
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        check_int(name, value, minimum=1)
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")


RENAMED = {"norm_affine": "learn", "learn_s": "learn", "qknorm_length": "seq_len"}
"""Keywords :class:`MultiheadSelfAttention` once took, and the keyword that replaced each."""


def _reject_renamed(score_params: dict[str, Any]) -> None:
    """A TypeError naming the new keyword, before an old one reads as an unknown score parameter."""
    for old, new in RENAMED.items():
        if old in score_params:
            raise TypeError(f"MultiheadSelfAttention() no longer takes {old}=; use {new}= instead")
