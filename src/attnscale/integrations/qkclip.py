"""QK-Clip: cap each attention head's largest logit by rescaling its query and key weights.

Kimi Team 2025, "Kimi K2: Open Agentic Intelligence" (arXiv:2507.20534), §2.1 (MuonClip). After
an optimizer step, for every head h with S_h the largest pre-softmax logit of that head on the
step's batch (after the model's own scaling, e.g. q·k/√d) and threshold τ (100 in the paper)::

    γ_h = min(1, τ / S_h)
    W_q[h] ← √γ_h · W_q[h],   W_k[h] ← √γ_h · W_k[h]     (the head's rows, and their biases)

The logit is bilinear in (W_q x + b_q, W_k x + b_k), so the head's logits on the measured batch
are multiplied by exactly γ_h: the head's max ends at τ, and heads at or under τ are untouched
(bitwise). Nothing else changes -- the forward and backward passes, the optimizer's state. "On
the measured batch" means with the layer's inputs as measured: in a deep model, clipping layer l
changes what the layers after it see, so their maxima move too (all layers are clipped from the
one measurement, as in K2).

Choices made here (the docs' "QK-Clip" section says the same):

* S_h is max |logit| (:attr:`attnscale.measure.stats.AttentionStats.max_abs_logit`, which the
  :class:`~attnscale.measure.monitor.Monitor` measures on every path), not K2's signed max q·k.
  It is an upper bound of the signed max, so this clips at least every head K2 would, and since
  |γ·ℓ| = γ|ℓ| it leaves every logit of the measured batch in [−τ, τ]. :func:`qk_clip_`
  takes any per-head maxima, so signed ones work too.
* Grouped-query attention (fewer key heads than query heads): a key head is shared by its group,
  so scaling it would move the other heads' logits too. Only the query rows of head h are scaled,
  by γ_h (not √γ_h): head h's logits scale by exactly γ_h and no other head's change. K2 does the
  same for MLA's shared rotary key (scaled query part q^R by γ, shared k^R untouched).
* The measurement: :class:`QKClip` measures on whatever forward pass its ``measure()`` wraps. K2
  wraps the training forward (the maxima of the pre-update weights, free), then clips after the
  update; a no-grad forward after ``optimizer.step()`` costs a forward more and makes the bound
  exact for the weights that will be used next.

Where the q and k weights are found, with head h at rows [h·d, (h+1)·d) of the q part, d the head
dimension (q width / number of heads):

* :class:`attnscale.core.nn.MultiheadSelfAttention` (and the lab GPT's attention): ``q_proj``,
  ``k_proj``; only for scores whose logit is bilinear in q and k (scaled_dot, dot, mup,
  log_length): a normalized score (cosine, QK-norm) ignores the weights' scale, and soft-cap's
  tanh is not homogeneous, so rescaling could not give γ_h (ValueError);
* :class:`torch.nn.MultiheadAttention`: the fused ``in_proj_weight`` (3E, E), q rows [0, E), k rows
  [E, 2E), or ``q_proj_weight`` / ``k_proj_weight`` when kdim ≠ embed_dim; ``in_proj_bias`` and the
  key bias ``bias_k`` likewise;
* Hugging Face attention modules: separate projections ``q_proj``/``k_proj`` (LLaMA, Mistral,
  Qwen2, ...) or ``query``/``key`` (BERT), and GPT-2's fused ``c_attn``, a ``Conv1D`` whose weight
  is (E, 3E): q and k are *columns* [0, E) and [E, 2E). Modules that normalize q or k after the
  projection (``q_norm``/``k_norm``, e.g. Qwen3, OLMo 2) and GPT-2 cross-attention are refused.

Anything else raises ValueError naming the module, before any weight changes.

Data parallel: :meth:`QKClip.apply` pools S_h across ranks first, so every replica clips the
same heads by the same γ_h. Under FSDP2 (``fully_shard``) each rank scales its own shard of the
(sharded) q and k weights; the result equals one process's clip of the whole batch
(tests/integrations/test_fsdp.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.core.scores import get_score
from attnscale.measure.distributed import all_reduce_monitor
from attnscale.measure.monitor import Monitor
from attnscale.measure.stats import AttentionStats

__all__ = [
    "KIMI_K2_TAU",
    "HeadClip",
    "QKClip",
    "check_clippable_score",
    "check_tau",
    "clip_factors",
    "per_head_max_logit",
    "qk_clip_",
]

KIMI_K2_TAU = 100.0  # the threshold Kimi K2 trained with (arXiv:2507.20534, §2.1)
# Attributes of Hugging Face attention modules that normalize q or k after the projection:
# the logits then ignore the projections' scale.
QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm")
# (query, key) attribute names of separate projections, in the order tried.
SEPARATE = (("q_proj", "k_proj"), ("query", "key"))

Part = tuple[Tensor, int, int]  # (parameter, dimension the heads lie along, offset of the part)
Values = Tensor | np.ndarray | Sequence[float]


@dataclass(frozen=True)
class HeadClip:
    """One clipped head: its layer (module name), head index, measured max logit S and the
    factor γ = τ/S its logits were multiplied by."""

    layer: str
    head: int
    max_logit: float
    gamma: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


@dataclass(frozen=True)
class _Layout:
    """Where one attention module keeps its q and k weights: parts along which the heads lie."""

    q: tuple[Part, ...]
    k: tuple[Part, ...]
    q_width: int  # H·d
    k_width: int  # H_kv·d


def check_clippable_score(score: str) -> None:
    """ValueError unless attnscale score ``score`` has a logit bilinear in q and k, the property
    that makes √γ on W_q and W_k multiply the logits by exactly γ (module docstring)."""
    sc = get_score(score)
    if sc.normalizes_q or sc.mod is not None or sc.dot_factor is None:
        why = ("normalizes q and k, so the projections' scale does not reach its logits"
               if sc.normalizes_q else "is not linear in q·k")
        raise ValueError(f"QK-Clip needs a score whose logit is bilinear in q and k "
                         f"(scaled_dot, dot, mup, log_length); {sc.name!r} {why}")


def clip_factors(max_logit: Values, tau: float) -> np.ndarray:
    """γ_h = min(1, τ/S_h) for per-head maxima ``max_logit`` (H,) and threshold ``tau`` > 0
    (Kimi Team 2025, arXiv:2507.20534). ValueError for a NaN or infinite S_h: a head whose
    logits already overflowed cannot be rescaled back."""
    tau = check_tau(tau)
    s = _per_head("max_logit", max_logit)
    if not np.isfinite(s).all():
        bad = np.flatnonzero(~np.isfinite(s)).tolist()
        raise ValueError(f"max_logit must be finite; heads {bad} are {s[bad].tolist()}")
    with np.errstate(divide="ignore"):
        return np.where(s > tau, tau / np.where(s > tau, s, 1.0), 1.0)


def per_head_max_logit(stats: Mapping[str, AttentionStats]) -> dict[str, np.ndarray]:
    """{layer: max |logit| per head} of :meth:`attnscale.measure.monitor.Monitor.stats`."""
    return {name: np.asarray(s.max_abs_logit, dtype=np.float64) for name, s in stats.items()}


def qk_clip_(model: nn.Module, max_logit: Mapping[str, Values], tau: float = KIMI_K2_TAU
             ) -> list[HeadClip]:
    """Apply QK-Clip in place: for each layer named in ``max_logit`` (a module name of ``model``,
    as :meth:`~attnscale.measure.monitor.Monitor.stats` names them) and each head h with
    S_h = ``max_logit[layer][h]`` > ``tau``, scale the head's W_q and W_k rows (and biases) by
    √(τ/S_h) -- under grouped-query attention its W_q rows by τ/S_h -- so that its logits scale
    by γ_h = τ/S_h (Kimi Team 2025, arXiv:2507.20534; module docstring).

    Returns the clipped heads. Every layer's weights are located, and every S_h checked, before
    any weight changes: a ValueError (unknown layer, unsupported module, wrong head count,
    non-finite S_h) leaves the model as it was.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(max_logit, Mapping):
        raise TypeError(f"max_logit must be a mapping {{layer name: per-head maxima}}, "
                        f"got {type(max_logit).__name__}")
    modules = dict(model.named_modules())
    plans = []
    for name, values in max_logit.items():
        if name not in modules:
            raise ValueError(f"max_logit: model has no module named {name!r}")
        s = _per_head(f"max_logit[{name!r}]", values)
        try:
            gamma = clip_factors(s, tau)
        except ValueError as err:
            raise ValueError(f"layer {name!r}: {err}") from None
        layout = _layout(modules[name], name)
        _check_heads(layout, len(s), name)
        plans.append((name, s, gamma, layout, len(s)))
    clipped: list[HeadClip] = []
    with torch.no_grad():
        for name, s, gamma, layout, n_heads in plans:
            for h in np.flatnonzero(gamma < 1.0).tolist():
                _scale_head(layout, n_heads, h, float(gamma[h]))
                clipped.append(HeadClip(name, h, float(s[h]), float(gamma[h])))
    return clipped


class QKClip:
    """QK-Clip for a training loop: measure each head's max logit during a forward pass, then
    clip after the optimizer step (module docstring; Kimi Team 2025, arXiv:2507.20534)::

        clip = QKClip(model, tau=100.0)
        for batch in batches:
            with clip.measure():
                loss = loss_fn(model(batch))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            clipped = clip.apply()     # [HeadClip(layer, head, max_logit, gamma), ...]

    The measurement is a :class:`~attnscale.measure.monitor.Monitor` (attnscale attention,
    ``nn.MultiheadAttention``, Hugging Face models): S_h is max |logit| over every call recorded
    since the last :meth:`apply`. ``measure(query_mask=...)`` leaves padding query rows out.
    attnscale and ``torch.nn`` attention this module cannot clip raises ValueError here, not
    mid-training; a Hugging Face module, at the first :meth:`apply` that measured it.
    """

    def __init__(self, model: nn.Module, tau: float = KIMI_K2_TAU) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.tau = check_tau(tau)
        self.monitor = Monitor(model)
        self.last_max_logit: dict[str, np.ndarray] = {}  # S_h of the last apply, pre-clip
        for name, module in model.named_modules():  # fail now on attention it cannot clip
            if isinstance(module, (MultiheadSelfAttention, nn.MultiheadAttention)):
                _layout(module, name)

    @contextmanager
    def measure(self, query_mask: Tensor | None = None) -> Iterator[Monitor]:
        """Record the attention of the forward passes inside the block (adds to what earlier
        blocks recorded until :meth:`apply`)."""
        with self.monitor as monitor:
            monitor.query_mask = query_mask
            try:
                yield monitor
            finally:
                monitor.query_mask = None

    def max_logit(self) -> dict[str, np.ndarray]:
        """{layer: max |logit| per head} recorded since the last :meth:`apply`."""
        return per_head_max_logit(self.monitor.stats())

    def apply(self) -> list[HeadClip]:
        """Clip every head whose recorded max |logit| exceeds τ (:func:`qk_clip_`), forget the
        recording, and return the clipped heads ([] if nothing was recorded);
        :attr:`last_max_logit` keeps the per-head maxima it judged (before clipping). Under
        torch.distributed every rank must call it at the same step: the maxima are first
        reduced across ranks (:func:`attnscale.measure.distributed.all_reduce_monitor`), so
        every replica clips the same heads by the same γ."""
        all_reduce_monitor(self.monitor)
        maxima = self.max_logit()
        self.monitor.reset()
        self.last_max_logit = maxima  # what a logger reports: the maxima before clipping
        return qk_clip_(self.model, maxima, self.tau)


# -- locating q and k ---------------------------------------------------------------------------


def _layout(module: nn.Module, name: str) -> _Layout:
    """Where ``module`` (named ``name`` in the model) keeps its q and k weights; ValueError
    naming the module where that is unknown or rescaling would not scale its logits."""
    where = f"module {name!r} ({type(module).__name__})"
    if isinstance(module, MultiheadSelfAttention):
        try:
            check_clippable_score(module.score)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        return _separate(module.q_proj, module.k_proj)
    if isinstance(module, nn.MultiheadAttention):
        return _torch_mha(module)
    cap = getattr(module, "attn_logit_softcapping", None) or getattr(
        getattr(module, "config", None), "attn_logit_softcapping", None)
    if cap:
        raise ValueError(f"{where} soft-caps its logits (attn_logit_softcapping={cap}): tanh is "
                         "not homogeneous, so rescaling W_q, W_k cannot scale them by γ")
    position = getattr(module, "position_embedding_type", "absolute")
    if position not in (None, "absolute"):
        raise ValueError(f"{where} adds relative position scores ({position!r}), which scale by "
                         "√γ, not γ, when W_q and W_k do")
    norms = [n for n in QK_NORMS if getattr(module, n, None) is not None]
    if norms:
        raise ValueError(f"{where} normalizes q or k after the projection ({', '.join(norms)}): "
                         "rescaling W_q, W_k does not change its logits")
    for q_name, k_name in SEPARATE:
        q, k = getattr(module, q_name, None), getattr(module, k_name, None)
        if isinstance(q, nn.Linear) and isinstance(k, nn.Linear):
            return _separate(q, k)
    c_attn = getattr(module, "c_attn", None)
    if type(c_attn).__name__ == "Conv1D":
        if getattr(module, "is_cross_attention", False):
            raise ValueError(f"{where}: GPT-2 cross-attention (q from q_attn) is not supported")
        return _gpt2_conv1d(c_attn, where)
    raise ValueError(
        f"{where}: cannot find its query and key projections; QK-Clip knows attnscale "
        "MultiheadSelfAttention, torch.nn.MultiheadAttention and Hugging Face modules with "
        "q_proj/k_proj, query/key (nn.Linear) or GPT-2's fused c_attn (Conv1D)")


def _separate(q: nn.Linear, k: nn.Linear) -> _Layout:
    """Two ``nn.Linear``: heads along the output rows of each weight and bias."""
    qs = tuple((p, 0, 0) for p in (q.weight, q.bias) if p is not None)
    ks = tuple((p, 0, 0) for p in (k.weight, k.bias) if p is not None)
    return _Layout(qs, ks, q.out_features, k.out_features)


def _torch_mha(mha: nn.MultiheadAttention) -> _Layout:
    """``nn.MultiheadAttention``: the fused (3E, E) in_proj_weight (q rows [0, E), k rows
    [E, 2E)) or q_proj_weight and k_proj_weight; in_proj_bias alike; bias_k (1, 1, E) is an
    extra key, so it scales with the key rows."""
    e = mha.embed_dim
    if mha.in_proj_weight is not None:  # q, k, v fused (kdim = vdim = embed_dim)
        qs, ks = [(mha.in_proj_weight, 0, 0)], [(mha.in_proj_weight, 0, e)]
    else:
        qs, ks = [(mha.q_proj_weight, 0, 0)], [(mha.k_proj_weight, 0, 0)]
    if mha.in_proj_bias is not None:
        qs.append((mha.in_proj_bias, 0, 0))
        ks.append((mha.in_proj_bias, 0, e))
    if mha.bias_k is not None:
        ks.append((mha.bias_k, 2, 0))
    return _Layout(tuple(qs), tuple(ks), e, e)


def _gpt2_conv1d(c_attn: nn.Module, where: str) -> _Layout:
    """GPT-2's ``Conv1D`` c_attn computes x @ W + b with W (E, 3E): q, k, v are the column
    blocks [0, E), [E, 2E), [2E, 3E) of W (not rows, as nn.Linear would have) and of b."""
    w = c_attn.weight
    if w.dim() != 2 or w.shape[1] % 3:
        raise ValueError(f"{where}: c_attn weight {tuple(w.shape)} is not (E, 3E)")
    e = w.shape[1] // 3
    qs, ks = [(w, 1, 0)], [(w, 1, e)]
    if getattr(c_attn, "bias", None) is not None:
        qs.append((c_attn.bias, 0, 0))
        ks.append((c_attn.bias, 0, e))
    return _Layout(tuple(qs), tuple(ks), e, e)


def _scale_head(layout: _Layout, n_heads: int, head: int, gamma: float) -> None:
    """Multiply head ``head``'s logits by ``gamma``: its q and k slices by √γ, or under
    grouped-query attention (fewer key heads) its q slice by γ alone (module docstring)."""
    d = layout.q_width // n_heads
    if layout.k_width // d == n_heads:
        root = math.sqrt(gamma)
        _mul(layout.q, head, d, root)
        _mul(layout.k, head, d, root)
    else:
        _mul(layout.q, head, d, gamma)


def _check_heads(layout: _Layout, n_heads: int, name: str) -> None:
    """ValueError naming the layer unless ``n_heads`` query heads of one dimension d split its
    q width, and its key heads (k width / d) divide them."""
    d, rest = divmod(layout.q_width, n_heads)
    if rest or d == 0 or layout.k_width % d or n_heads % (layout.k_width // d):
        raise ValueError(f"max_logit[{name!r}] has {n_heads} heads, which do not split the "
                         f"layer's q width {layout.q_width} and k width {layout.k_width}")


def _mul(parts: tuple[Part, ...], head: int, d: int, factor: float) -> None:
    """Multiply the slice [head·d, (head+1)·d) of each part, in place. A sharded parameter
    (FSDP2's DTensor) is multiplied whole by a vector that is ``factor`` on the slice and 1
    elsewhere, replicated (every rank builds it: no collective), so each rank scales its own
    shard: a slice of a DTensor is a copy, and scaling it in place would change nothing."""
    for param, dim, offset in parts:
        if _is_dtensor(param):
            from torch.distributed.tensor import DTensor, Replicate

            shape = [1] * param.dim()
            shape[dim] = param.shape[dim]
            local = param.to_local()
            scale = torch.ones(shape, dtype=param.dtype, device=local.device)
            scale.narrow(dim, offset + head * d, d).fill_(factor)
            mesh = param.device_mesh
            param.mul_(DTensor.from_local(scale, mesh, [Replicate()] * mesh.ndim,
                                          run_check=False))
        else:
            param.narrow(dim, offset + head * d, d).mul_(factor)


def _is_dtensor(t: Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor  # imported on use: it loads the whole package

    return isinstance(t, DTensor)


def check_tau(tau: float) -> float:
    """``tau`` as a float if it is a finite number > 0; TypeError / ValueError naming it."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)):
        raise TypeError(f"tau must be a number, got {type(tau).__name__}")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be finite and > 0, got {tau!r}")
    return float(tau)


def _per_head(name: str, values: Values) -> np.ndarray:
    """``values`` as a float64 (H,) array; ValueError naming ``name`` unless 1-D and non-empty."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().numpy()
    try:
        s = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D sequence of numbers, one per head") from None
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"{name} must be 1-D with one value per head, got shape {s.shape}")
    return s
