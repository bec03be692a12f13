"""The score registry: every way attnscale turns a query and a key into an attention logit.

A score is one small :class:`Score` entry that holds both

* ``prepare`` -- the fast path: transform q and k (O(N·d) work) so that PyTorch's fused
  ``scaled_dot_product_attention`` with the returned ``scale`` gives exactly this score, and
* ``formula`` -- the plain materialized formula for the (…, Nq, Nk) logits, which
  :func:`attnscale.reference_attention` evaluates in float64 and the tests treat as ground truth.

A score that cannot be written as "transform q and k, then a dot product" (soft-capping) also
gives ``mod``/``mod_grad``: an elementwise function applied to the scaled dot product and its
derivative, which the memory-bounded chunked kernel in :mod:`attnscale.core.attention` uses.

Adding a score means adding one ``register(Score(...))`` call here. Nothing else changes.

Parameters may be Python numbers or tensors. A 1-D tensor of length H is a per-head value
(reshaped to (H, 1, 1)); a tensor of shape (H, D) is a per-head weight over the head dimension.
Parameters named ``k_*`` belong to the key side and have one row per key head (Hkv under GQA).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

Params = Mapping[str, Any]


@dataclass(frozen=True)
class Context:
    """What a score may need besides q and k.

    ``head_dim`` is d. ``n_visible`` is a callable returning the number of keys each query sees,
    shaped to broadcast against (B, H, Nq, 1); it is only evaluated by scores that use it.
    """

    head_dim: int
    n_visible: Callable[[], Tensor]


@dataclass(frozen=True)
class Score:
    """One attention scoring: its defaults, its fast path and its reference formula."""

    name: str
    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)
    positive: tuple[str, ...] = ()  # parameters that must be > 0
    uses_scale: bool = True  # whether the SDPA-style ``scale`` argument means anything here
    # (q, k, scale, params, ctx) -> (q', k', sdpa_scale)
    prepare: Callable[..., tuple[Tensor, Tensor, float]] | None = None
    # (q, k, scale, params, ctx) -> logits (…, Nq, Nk), the plain formula
    formula: Callable[..., Tensor] | None = None
    # Elementwise logit = mod(scale·q·k) for scores that need their own kernel, and d mod/dz
    # written in terms of the output f = mod(z). mod may overwrite z; mod_grad must not touch f.
    mod: Callable[[Tensor, Params], Tensor] | None = None
    mod_grad: Callable[[Tensor, Params], Tensor] | None = None
    # Optional factor the chunked kernel folds into the (c, D) queries so that ``mod`` receives
    # z·prescale: one pass over the (c, N) block fewer. mod_grad stays d mod/dz of the plain z.
    prescale: Callable[[Params], Any] | None = None

    def apply_mod(self, z: Tensor, params: Params) -> Tensor:
        """mod of the plain scaled score z, for callers that do not fold ``prescale`` in."""
        assert self.mod is not None
        return self.mod(z if self.prescale is None else z * self.prescale(params), params)

    @property
    def fused(self) -> bool:
        """True when the score runs on PyTorch's fused SDPA kernel."""
        return self.mod is None


SCORES: dict[str, Score] = {}


def register(score: Score) -> Score:
    """Add ``score`` to the registry (names are unique)."""
    if score.name in SCORES:
        raise ValueError(f"score {score.name!r} is already registered")
    if score.formula is None or score.prepare is None:
        raise ValueError(f"score {score.name!r} needs a formula and a fast path (prepare)")
    SCORES[score.name] = score
    return score


def get_score(score: str | Score) -> Score:
    """Look a score up by name; a :class:`Score` object passes through."""
    if isinstance(score, Score):
        return score
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(f"score must be one of {sorted(SCORES)}, got {score!r}")
    return SCORES[score]


def resolve_params(score: Score, params: Params, scale: float | None) -> dict[str, Any]:
    """Merge ``params`` over the score's defaults and check names and ranges."""
    unknown = set(params) - set(score.defaults)
    if unknown:
        accepted = sorted(score.defaults) or "none"
        raise ValueError(
            f"score {score.name!r} got unknown parameter(s) {sorted(unknown)}; accepted: {accepted}"
        )
    if scale is not None and not score.uses_scale:
        raise ValueError(
            f"scale must be None for score {score.name!r} (its size is set by "
            f"{sorted(score.defaults) or 'nothing'}); use score='scaled_dot' with scale=..."
        )
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    merged = {**score.defaults, **params}
    for name in score.positive:
        _check_positive(name, merged[name])
    return merged


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a float tensor or a number, got dtype {value.dtype}")
        # A learned parameter is kept positive by its parametrization; checking it would
        # force a device sync on every call.
        if value.requires_grad:
            return
        ok = bool(torch.all(value > 0)) and bool(torch.all(torch.isfinite(value)))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        ok = value > 0 and math.isfinite(value)
    else:
        raise TypeError(f"{name} must be a positive number or tensor, got {type(value).__name__}")
    if not ok:
        raise ValueError(f"{name} must be > 0 and finite, got {value!r}")


def per_head(value: Any) -> Any:
    """Shape a per-head parameter to broadcast against (B, H, N, X).

    Numbers and 0-d tensors pass through; a 1-D tensor of length H becomes (H, 1, 1); an
    (H, D) weight becomes (H, 1, D); a (D,) weight is left as is.
    """
    if not isinstance(value, Tensor) or value.dim() == 0:
        return value
    if value.dim() == 1:
        return value.view(-1, 1, 1)
    if value.dim() == 2:
        return value.unsqueeze(-2)
    return value


def per_head_weight(value: Any) -> Any:
    """Shape an affine weight over the head dimension: (D,) stays, (H, D) becomes (H, 1, D)."""
    if isinstance(value, Tensor) and value.dim() == 2:
        return value.unsqueeze(-2)
    return value


def default_scale(scale: float | None, d: int) -> float:
    """1/√d unless the caller gave ``scale`` (Vaswani et al. 2017, eq. 1)."""
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def dot_logits(q: Tensor, k: Tensor) -> Tensor:
    """Materialized q·kᵀ over the last dimension: (…, Nq, D) × (…, Nk, D) -> (…, Nq, Nk)."""
    return q @ k.transpose(-2, -1)


def _affine(x: Tensor, weight: Any) -> Tensor:
    return x if weight is None else x * per_head_weight(weight).to(x.dtype)


def _layernorm(x: Tensor, eps: Any, weight: Any) -> Tensor:
    return _affine(F.layer_norm(x, x.shape[-1:], eps=float(eps)), weight)


def _rmsnorm(x: Tensor, eps: Any, weight: Any) -> Tensor:
    return _affine(_RowScale.apply(x, float(eps), True), weight)


class _RowScale(torch.autograd.Function):
    """y = x·r(x) over the last dimension, with its backward written out.

    ``rms=True``: r = 1/√(mean(x²) + eps) (RMSNorm without weight). ``rms=False``:
    r = 1/max(‖x‖, eps) (``F.normalize``). With y = x·r, dx = r·(dy − y·⟨y, dy⟩/d) for RMSNorm
    and r·(dy − y·⟨y, dy⟩) for the unit norm (dx = r·dy where the eps clamp is active). Autograd
    through the composite ops takes about twice the passes over (…, N, D), and on CPU in torch
    2.13 that made cosine and qk_rmsnorm ~1.15× SDPA (measured with `attnscale bench`).
    First derivatives only.
    """

    @staticmethod
    def forward(ctx, x: Tensor, eps: float, rms: bool) -> Tensor:  # type: ignore[override]
        # Half-precision rows are measured in float32: ‖x‖² overflows float16 at ‖x‖ > 256.
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=work)  # (…, N, 1)
        if rms:
            r = torch.rsqrt(norm * norm / x.shape[-1] + eps)
            active = None
        else:
            r = 1.0 / norm.clamp_min(eps)
            active = norm > eps
        y = (x * r).to(x.dtype)
        ctx.save_for_backward(y, r, active)
        ctx.rms = rms
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: Tensor):  # type: ignore[override]
        y, r, active = ctx.saved_tensors
        yw, dyw = y.to(r.dtype), dy.to(r.dtype)
        dot = torch.linalg.vecdot(yw, dyw).unsqueeze(-1)  # ⟨y, dy⟩ per row
        dot = dot / y.shape[-1] if ctx.rms else dot * active
        return torch.addcmul(dyw, yw, dot, value=-1.0).mul_(r).to(dy.dtype), None, None


# --------------------------------------------------------------------------------------------
# The scores. Each reference ``formula`` is written from the paper's definition, in plain
# tensor algebra, and shares no code with its ``prepare`` fast path.
# --------------------------------------------------------------------------------------------

register(
    Score(
        name="scaled_dot",
        summary="q·k/√d (Vaswani et al. 2017, eq. 1); `scale` overrides 1/√d",
        prepare=lambda q, k, scale, p, ctx: (q, k, default_scale(scale, ctx.head_dim)),
        formula=lambda q, k, scale, p, ctx: dot_logits(q, k) * default_scale(scale, q.shape[-1]),
    )
)

register(
    Score(
        name="dot",
        summary="q·k, unscaled (the thread's counterfactual)",
        uses_scale=False,
        prepare=lambda q, k, scale, p, ctx: (q, k, 1.0),
        formula=lambda q, k, scale, p, ctx: dot_logits(q, k),
    )
)

register(
    Score(
        name="mup",
        summary="q·k·c/d (µP, Yang et al. 2022; c = 8 as in the mup code equals 1/√d at d = 64)",
        defaults={"c": 8.0},
        positive=("c",),
        uses_scale=False,
        prepare=lambda q, k, scale, p, ctx: (q, k, float(p["c"]) / ctx.head_dim),
        formula=lambda q, k, scale, p, ctx: dot_logits(q, k) * p["c"] / q.shape[-1],
    )
)


def _cosine_prepare(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context):
    eps = float(p["eps"])
    qn, kn = _RowScale.apply(q, eps, False), _RowScale.apply(k, eps, False)
    tau = p["tau"]
    if isinstance(tau, Tensor):  # per head or learned: scale the queries
        return qn * per_head(tau).to(q.dtype), kn, 1.0
    return qn, kn, float(tau)  # one τ: SDPA's scale applies it for free


def _cosine_formula(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context) -> Tensor:
    qn = q.norm(dim=-1, keepdim=True).clamp_min(p["eps"])  # (…, Nq, 1)
    kn = k.norm(dim=-1, keepdim=True).clamp_min(p["eps"])  # (…, Nk, 1)
    tau = per_head(p["tau"])
    if isinstance(tau, Tensor):
        tau = tau.to(q.dtype)
    return tau * dot_logits(q, k) / (qn * kn.transpose(-2, -1))


register(
    Score(
        name="cosine",
        summary=(
            "τ·cos(q, k), logits in [-τ, τ]. τ = 1 is the thread's plain cosine; practice uses "
            "τ ≈ 10 (x-transformers) or a learned τ (Swin V2, QKNorm) -- see "
            "attnscale.core.nn.MultiheadSelfAttention(temperature=...)"
        ),
        defaults={"tau": 1.0, "eps": 1e-12},
        positive=("tau", "eps"),
        uses_scale=False,
        prepare=_cosine_prepare,
        formula=_cosine_formula,
    )
)


def _layernorm_formula(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context) -> Tensor:
    def ln(x: Tensor, w: Any) -> Tensor:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased variance, as LayerNorm
        y = (x - mu) / torch.sqrt(var + p["eps"])
        return y if w is None else y * per_head_weight(w).to(x.dtype)

    return dot_logits(ln(q, p["q_weight"]), ln(k, p["k_weight"])) * default_scale(
        scale, q.shape[-1]
    )


def _rmsnorm_formula(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context) -> Tensor:
    def rms(x: Tensor, w: Any) -> Tensor:
        y = x / torch.sqrt((x**2).mean(-1, keepdim=True) + p["eps"])
        return y if w is None else y * per_head_weight(w).to(x.dtype)

    return dot_logits(rms(q, p["q_weight"]), rms(k, p["k_weight"])) * default_scale(
        scale, q.shape[-1]
    )


def _qk_norm_score(name: str, norm: Callable, formula: Callable, eps: float, summary: str):
    """A QK-norm score: normalize q and k over the head dimension, then scaled dot product."""

    def prepare(q, k, scale, p, ctx):
        qn = norm(q, p["eps"], p["q_weight"])
        kn = norm(k, p["eps"], p["k_weight"])
        return qn, kn, default_scale(scale, ctx.head_dim)

    return Score(
        name=name,
        summary=summary,
        defaults={"eps": eps, "q_weight": None, "k_weight": None},
        positive=("eps",),
        prepare=prepare,
        formula=formula,
    )


register(
    _qk_norm_score(
        "qk_layernorm",
        _layernorm,
        _layernorm_formula,
        1e-5,
        "LN(q)·LN(k)/√d, LayerNorm over the head dim, optional per-head weights "
        "(Dehghani et al. 2023; Wortsman et al. 2023)",
    )
)

register(
    _qk_norm_score(
        "qk_rmsnorm",
        _rmsnorm,
        _rmsnorm_formula,
        1e-6,
        "RMS(q)·RMS(k)/√d, RMSNorm over the head dim, optional per-head weights "
        "(modded-nanogpt uses no weight and scale 0.12 at d = 128)",
    )
)


def _softcap_formula(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context) -> Tensor:
    cap = per_head(p["cap"])
    if isinstance(cap, Tensor):
        cap = cap.to(q.dtype)
    z = dot_logits(q, k) * default_scale(scale, q.shape[-1])
    return cap * torch.tanh(z / cap)


def _softcap_mod(z: Tensor, p: Params) -> Tensor:
    # z arrives as 2z/cap (``prescale``) and cap·tanh(z/cap) = 2cap·σ(2z/cap) − cap, the same
    # function: torch 2.13's CPU tanh kernel is ~6× slower than its sigmoid (5.3 vs 0.84 ms on
    # 4M floats, measured). Absolute error ≤ cap·2⁻²³ in float32. In place: the chunked kernel
    # hands over a scratch block it does not reuse.
    cap = per_head(p["cap"])
    return z.sigmoid_().mul_(2.0 * cap).sub_(cap)


def _softcap_prescale(p: Params) -> Any:
    return 2.0 / per_head(p["cap"])


def _softcap_mod_grad(f: Tensor, p: Params) -> Tensor:
    # d/dz cap·tanh(z/cap) = 1 − tanh² = 1 − (f/cap)²; a new tensor, f is left intact.
    cap = per_head(p["cap"])
    return torch.mul(f, f).mul_(-1.0 / (cap * cap)).add_(1.0)


register(
    Score(
        name="softcap",
        summary="cap·tanh((q·k/√d)/cap), Gemma 2 uses cap = 50 for attention (Gemma Team 2024)",
        defaults={"cap": 50.0},
        positive=("cap",),
        prepare=lambda q, k, scale, p, ctx: (q, k, default_scale(scale, ctx.head_dim)),
        formula=_softcap_formula,
        mod=_softcap_mod,
        mod_grad=_softcap_mod_grad,
        prescale=_softcap_prescale,
    )
)


def _log_length_prepare(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context):
    s = per_head(p["s"])
    log_n = torch.log(ctx.n_visible().clamp_min(1).to(q.dtype))  # broadcasts to (B, H, Nq, 1)
    return q * (s * log_n), k, default_scale(scale, ctx.head_dim)


def _log_length_formula(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context) -> Tensor:
    s = per_head(p["s"])
    if isinstance(s, Tensor):
        s = s.to(q.dtype)
    n = ctx.n_visible().to(q.dtype).clamp_min(1)
    return s * torch.log(n) * dot_logits(q, k) * default_scale(scale, q.shape[-1])


register(
    Score(
        name="log_length",
        summary=(
            "s·ln(n)·q·k/√d, Scalable-Softmax (Nakanishi 2025); n = keys the query sees "
            "(position+1 under is_causal, minus keys masked out by attn_mask)"
        ),
        defaults={"s": 1.0},
        positive=("s",),
        prepare=_log_length_prepare,
        formula=_log_length_formula,
    )
)
