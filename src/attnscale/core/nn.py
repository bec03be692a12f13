"""Modules built on :func:`attnscale.attention`.

:class:`MultiheadSelfAttention` is a drop-in self-attention block (projections, heads, GQA,
causal) whose score is one argument, with the learnable score parameters used in the literature:

* cosine temperature: ``temperature="swin"`` -- a per-head log-scale initialized at ln 10 and
  clamped at ln 100 (Swin V2, Liu et al. 2022); ``temperature="qknorm"`` -- one scalar g initialized
  at g₀ = log₂(L² − L) for a sequence length L (QKNorm, Henry et al. 2020);
  ``temperature="fixed"`` uses ``tau``;
* qk norms: per-head affine weights over the head dimension (``norm_affine=True``);
* log_length: a per-head learnable ``s`` (SSMax, Nakanishi 2025).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnscale.core.attention import attention
from attnscale.core.scores import get_score, resolve_params

Temperature = Literal["fixed", "swin", "qknorm"]
SWIN_INIT = math.log(10.0)  # Swin V2: logit scale initialized at log 10 ...
SWIN_MAX = math.log(100.0)  # ... and clamped at log 100 (τ ≤ 100, i.e. temperature ≥ 0.01)


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
        temperature: for ``score="cosine"``: "fixed" (τ = ``tau``), "swin" or "qknorm".
        qknorm_length: L for ``temperature="qknorm"``.
        norm_affine: learnable per-head weights for ``qk_layernorm`` / ``qk_rmsnorm``.
        learn_s: learnable per-head ``s`` for ``log_length``.
        rotary: rotary position embedding on q and k (Su et al. 2021), applied before the score.
        rope_base: RoPE frequency base.
        **score_params: fixed score parameters (``tau``, ``cap``, ``c``, ``s``, ``eps``, ``scale``).
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
        temperature: Temperature = "fixed",
        qknorm_length: float | None = None,
        norm_affine: bool = True,
        learn_s: bool = True,
        rotary: bool = False,
        rope_base: float = 10000.0,
        **score_params: Any,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _check_sizes(d_model, n_heads, n_kv_heads)
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
        self._init_score_parameters(temperature, qknorm_length, norm_affine, learn_s)
        # Fail at construction, not at the first forward, on bad score parameters.
        resolve_params(get_score(self.score), self._attention_kwargs()["params"], self.scale)

    def _init_score_parameters(
        self, temperature: str, qknorm_length: float | None, norm_affine: bool, learn_s: bool
    ) -> None:
        if temperature not in ("fixed", "swin", "qknorm"):
            raise ValueError(
                f"temperature must be 'fixed', 'swin' or 'qknorm', got {temperature!r}"
            )
        if temperature != "fixed" and self.score != "cosine":
            raise ValueError(
                f"temperature={temperature!r} needs score='cosine', got {self.score!r}"
            )
        if temperature == "swin":
            self.logit_scale = nn.Parameter(torch.full((self.n_heads,), SWIN_INIT))
        elif temperature == "qknorm":
            if qknorm_length is None:
                raise ValueError("temperature='qknorm' needs qknorm_length (the L in log2(L²−L))")
            from attnscale.measure.theory import qknorm_g0  # scipy: imported only when needed

            self.gain = nn.Parameter(torch.tensor(float(qknorm_g0(qknorm_length))))
        if self.score in ("qk_layernorm", "qk_rmsnorm") and norm_affine:
            self.q_weight = nn.Parameter(torch.ones(self.n_heads, self.head_dim))
            self.k_weight = nn.Parameter(torch.ones(self.n_kv_heads, self.head_dim))
        if self.score == "log_length" and learn_s:
            s0 = float(self.score_params.pop("s", 1.0))
            self.s = nn.Parameter(torch.full((self.n_heads,), s0))

    def tau(self) -> Tensor | float | None:
        """The cosine temperature in use: per-head (swin), scalar (qknorm) or fixed."""
        if hasattr(self, "logit_scale"):
            return torch.exp(self.logit_scale.clamp(max=SWIN_MAX))
        if hasattr(self, "gain"):
            return self.gain
        return self.score_params.get("tau")

    def _attention_kwargs(self) -> dict[str, Any]:
        params: dict[str, Any] = dict(self.score_params)
        if self.score == "cosine" and self.temperature != "fixed":
            params["tau"] = self.tau()
        if hasattr(self, "q_weight"):
            params["q_weight"], params["k_weight"] = self.q_weight, self.k_weight
        if hasattr(self, "s"):
            params["s"] = self.s
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
    inv_freq = base ** (-torch.arange(0, d // 2, device=x.device, dtype=torch.float64) * 2 / d)
    angles = torch.arange(n, device=x.device, dtype=torch.float64)[:, None] * inv_freq  # (N, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _check_sizes(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
