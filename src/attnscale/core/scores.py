"""The score registry: every way attnscale turns a query and a key into an attention logit.

A score is one small :class:`Score` entry that holds everything attnscale knows about it:

* ``prepare`` -- the fast path: transform q and k (O(N·d) work) so that PyTorch's fused
  ``scaled_dot_product_attention`` with the returned ``scale`` gives exactly this score, and
* ``formula`` -- the plain materialized formula for the (…, Nq, Nk) logits, which
  :func:`attnscale.reference_attention` evaluates in float64 and the tests treat as ground truth;
* its defaults, the parameters it can learn (:mod:`attnscale.core.learned`), its labels for
  tables (``label``) and figures (``tex``, matplotlib mathtext), the parameters benchmarks use,
  and its theory hooks (below).

A score that cannot be written as "transform q and k, then a dot product" (soft-capping) also
gives ``mod``/``mod_grad``: an elementwise function applied to the scaled dot product and its
derivative, which the memory-bounded chunked kernel in :mod:`attnscale.core.attention` uses.

Theory hooks, for q and k with i.i.d. N(0, 1) components (:mod:`attnscale.measure.theory`
computes exact softmax statistics from them, :mod:`attnscale.measure.montecarlo` samples them):

* ``dot_factor(d, n, params)`` -> c when the logit is mod(c·q·k) (mod = identity for fused
  scores): given q, the logits before ``mod`` are i.i.d. N(0, (c·‖q‖)²). n is the number of
  keys (None if unknown);
* ``cosine_law(d, params)`` -> (m, t) when the logit is t·cos(q', k') for independent isotropic
  q', k' in m dimensions (τ·cos and the QK-norms).

Adding a score means adding one ``register(Score(...))`` call (here, or anywhere before use);
bench, theory, training, sweeps and figures pick it up. :func:`registered` adds one for the
duration of a ``with`` block.

Parameters may be numbers or tensors: a 1-D tensor of length H is a per-head value, an (H, D)
tensor a per-head weight over the head dimension; ``k_*`` parameters have one row per key head.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnscale.core.learned import (
    S_FLOOR,
    Learned,
    head_weights,
    per_head_value,
    qknorm_temperature,
    swin_temperature,
)
from attnscale.core.score_ops import (
    RowScale,
    check_positive,
    default_scale,
    dot_logits,
    layernorm,
    per_head,
    per_head_weight,
    rmsnorm,
)
from attnscale.util.validate import check_int

Params = Mapping[str, Any]
__all__ = [
    "SCORES", "Context", "Params", "Score", "default_scale", "dot_logits", "get_score",
    "per_head", "per_head_weight", "register", "registered", "resolve_params", "unregister",
]  # fmt: skip


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
    """One attention scoring: defaults, fast path, reference formula, labels and theory hooks."""

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
    native: str | None = None  # its CPU kernel in attnscale.core.native.KERNELS, if it has one
    label: str = ""  # plain text for tables and selectors; defaults to the name
    tex: str = ""  # matplotlib mathtext for figures; defaults to the label
    learnable: Mapping[str, Learned] = field(default_factory=dict)  # by parametrization name
    bench_params: dict[str, Any] = field(default_factory=dict)  # over defaults, as practice uses
    normalizes_q: bool = False  # the logit sees only q's direction (‖q‖ drops out)
    dot_factor: Callable[[int, int | None, Params], float] | None = None  # theory, see above
    cosine_law: Callable[[int, Params], tuple[int, float]] | None = None  # theory, see above

    def __post_init__(self) -> None:  # frozen: fill the label defaults through object.__setattr__
        object.__setattr__(self, "label", self.label or self.name)
        object.__setattr__(self, "tex", self.tex or self.label)

    def apply_mod(self, z: Tensor, params: Params) -> Tensor:
        """mod of the plain scaled score z, for callers that do not fold ``prescale`` in."""
        assert self.mod is not None
        return self.mod(z if self.prescale is None else z * self.prescale(params), params)

    @property
    def fused(self) -> bool:
        """True when the score runs on PyTorch's fused SDPA kernel."""
        return self.mod is None

    @property
    def has_theory(self) -> bool:
        """True when :mod:`attnscale.measure.theory` can compute its softmax statistics exactly."""
        return self.cosine_law is not None or (self.dot_factor is not None and self.fused)

    def scalar_params(self) -> tuple[str, ...]:
        """Names of its number-valued parameters (the ones a config file can set)."""
        return tuple(n for n, v in self.defaults.items() if isinstance(v, (int, float)))


SCORES: dict[str, Score] = {}


def register(score: Score) -> Score:
    """Add ``score`` to the registry (names are unique)."""
    if score.name in SCORES:
        raise ValueError(f"score {score.name!r} is already registered")
    if score.formula is None or score.prepare is None:
        raise ValueError(f"score {score.name!r} needs a formula and a fast path (prepare)")
    SCORES[score.name] = score
    return score


def unregister(name: str) -> Score:
    """Remove the score ``name`` from the registry and return it."""
    return SCORES.pop(get_score(name).name)


@contextmanager
def registered(score: Score) -> Iterator[Score]:
    """Register ``score`` for the duration of the ``with`` block (tests, experiments)."""
    register(score)
    try:
        yield score
    finally:
        unregister(score.name)


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
    if isinstance(scale, Tensor) and scale.dim() == 0:  # SDPA takes a 0-d tensor too
        scale = scale.item()
    real = isinstance(scale, numbers.Real) and not isinstance(scale, bool)
    if scale is not None and not (real and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    merged = {**score.defaults, **params}
    for name in score.positive:
        check_positive(name, merged[name])
    return merged


# --------------------------------------------------------------------------------------------
# The scores. Each reference ``formula`` is written from the paper's definition, in plain
# tensor algebra, and shares no code with its ``prepare`` fast path.
# --------------------------------------------------------------------------------------------

register(
    Score(
        name="scaled_dot",
        summary="q·k/√d (Vaswani et al. 2017, eq. 1); `scale` overrides 1/√d",
        label="scaled dot: q·k/√d",
        tex=r"$q\cdot k/\sqrt{d}$",
        dot_factor=lambda d, n, p: 1.0 / math.sqrt(d),
        prepare=lambda q, k, scale, p, ctx: (q, k, default_scale(scale, ctx.head_dim)),
        formula=lambda q, k, scale, p, ctx: dot_logits(q, k) * default_scale(scale, q.shape[-1]),
    )
)

register(
    Score(
        name="dot",
        summary="q·k, unscaled (the thread's counterfactual)",
        label="dot: q·k (unscaled)",
        tex=r"$q\cdot k$",
        uses_scale=False,
        dot_factor=lambda d, n, p: 1.0,
        prepare=lambda q, k, scale, p, ctx: (q, k, 1.0),
        formula=lambda q, k, scale, p, ctx: dot_logits(q, k),
    )
)

MUP_C = 8.0  # µP's attention constant c: the one place it is written


register(
    Score(
        name="mup",
        summary=(
            "q·k·c/d (µP, Yang et al. 2022, arXiv 2203.03466; c = 8 as in the mup code equals "
            "1/√d at d = 64)"
        ),
        defaults={"c": MUP_C},
        label="µP: c·q·k/d",
        tex=r"$c\,q\cdot k/d$",
        positive=("c",),
        uses_scale=False,
        dot_factor=lambda d, n, p: float(p["c"]) / d,
        prepare=lambda q, k, scale, p, ctx: (q, k, float(p["c"]) / ctx.head_dim),
        formula=lambda q, k, scale, p, ctx: dot_logits(q, k) * p["c"] / q.shape[-1],
    )
)


def _cosine_prepare(q: Tensor, k: Tensor, scale: Any, p: Params, ctx: Context):
    eps = float(p["eps"])
    qn, kn = RowScale.apply(q, eps, False), RowScale.apply(k, eps, False)
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
        label="cosine: τ·cos(q, k)",
        tex=r"$\tau\cos(q, k)$",
        positive=("tau", "eps"),
        uses_scale=False,
        learnable={"swin": swin_temperature(), "qknorm": qknorm_temperature()},
        bench_params={"tau": 10.0},  # x-transformers' fixed τ
        normalizes_q=True,
        cosine_law=lambda d, p: (d, float(p["tau"])),
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


def _qk_norm_score(
    name: str, norm: Callable, formula: Callable, eps: float, summary: str, **labels: Any
) -> Score:
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
        learnable={"affine": head_weights()},
        normalizes_q=True,
        **labels,
    )


register(
    _qk_norm_score(
        "qk_layernorm",
        layernorm,
        _layernorm_formula,
        1e-5,
        "LN(q)·LN(k)/√d, LayerNorm over the head dim, optional per-head weights "
        "(Dehghani et al. 2023; Wortsman et al. 2023)",
        label="QK-LayerNorm: LN(q)·LN(k)/√d",
        tex=r"$\mathrm{LN}(q)\cdot\mathrm{LN}(k)/\sqrt{d}$",
        # LayerNorm centres q and k: √d·cos in the d − 1 dims orthogonal to (1, …, 1).
        cosine_law=lambda d, p: (d - 1, math.sqrt(d)),
    )
)

register(
    _qk_norm_score(
        "qk_rmsnorm",
        rmsnorm,
        _rmsnorm_formula,
        1e-6,
        "RMS(q)·RMS(k)/√d, RMSNorm over the head dim, optional per-head weights "
        "(modded-nanogpt uses no weight and scale 0.12 at d = 128)",
        label="QK-RMSNorm: RMS(q)·RMS(k)/√d",
        tex=r"$\mathrm{RMS}(q)\cdot\mathrm{RMS}(k)/\sqrt{d}$",
        cosine_law=lambda d, p: (d, math.sqrt(d)),  # RMS(q)·RMS(k)/√d = √d·cos(q, k)
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
        defaults={"cap": 50.0},  # Gemma 2's attention cap: the one place it is written
        label="soft-cap: c·tanh((q·k/√d)/c)",
        tex=r"$c\,\tanh(q\cdot k/(c\sqrt{d}))$",
        positive=("cap",),
        dot_factor=lambda d, n, p: 1.0 / math.sqrt(d),
        prepare=lambda q, k, scale, p, ctx: (q, k, default_scale(scale, ctx.head_dim)),
        formula=_softcap_formula,
        mod=_softcap_mod,
        mod_grad=_softcap_mod_grad,
        prescale=_softcap_prescale,
        native="softcap",
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


def _keys(n: int | None) -> int:
    """The number of keys n, which the log-length law needs and cannot default."""
    if n is None:
        raise ValueError("n (number of keys) is required for log_length")
    return check_int("n", n, minimum=1)


register(
    Score(
        name="log_length",
        summary=(
            "s·ln(n)·q·k/√d, Scalable-Softmax (Nakanishi 2025); n = keys the query sees "
            "(position+1 under is_causal, minus keys masked out by attn_mask)"
        ),
        defaults={"s": 1.0},
        label="log-length: s·ln(n)·q·k/√d",
        tex=r"$s\,\ln(n)\,q\cdot k/\sqrt{d}$",
        positive=("s",),
        prepare=_log_length_prepare,
        formula=_log_length_formula,
        learnable={"s": per_head_value("s", floor=S_FLOOR)},
        dot_factor=lambda d, n, p: float(p["s"]) * math.log(_keys(n)) / math.sqrt(d),
    )
)
