"""Watch the attention of any model: per-layer, per-head statistics while it runs.

    with Monitor(model, counterfactuals=True) as mon:
        mon.query_mask = inputs["attention_mask"].bool()   # optional: skip padding query rows
        model(**inputs)
    mon.stats()           # {layer name: AttentionStats of the scores the model really used}
    mon.stats("dot")      # the same attention recomputed without the 1/√d factor
    mon.flat_stats()      # {"encoder.layer.0.attention.self/entropy": 1.93, ...} for loggers

What is captured, in TransformerLens terms: the statistics are of ``attn_scores`` -- the
pre-softmax logits after scaling and masking -- and of the ``pattern`` softmax(attn_scores) they
produce (entropy, max weight, effective keys), computed from the q and k entering the attention
function; :data:`attnscale.measure.stats.STATISTICS` says which for each statistic.
``query_mask`` (B, Nq) bool (or broadcasting to it) must fit every recorded call: one with other
query rows (a generation step, cross-attention) raises ValueError; set it to None for those.

Sources, and what happens to the model's output:

* :class:`attnscale.core.nn.MultiheadSelfAttention`, through its ``capture`` hook: the module's own
  code runs, output bitwise unchanged;
* :class:`torch.nn.MultiheadAttention`, through a forward pre-hook that re-projects q and k:
  bitwise unchanged;
* Hugging Face transformers models, through transformers' ``AttentionInterface``: a registered
  attention function stands in for the implementation the model was using, with that
  implementation's mask format (``AttentionMaskInterface``).

  - ``eager``: the statistics are recorded, then the model's own eager function runs: bitwise
    unchanged.
  - ``sdpa``: transformers' sdpa function runs, and its call to
    ``F.scaled_dot_product_attention`` is answered by :meth:`Monitor.sdpa`, so the statistics
    are of SDPA's real arguments. By default SDPA itself runs (bitwise unchanged) and the
    logits are computed a second time for the statistics. With ``compile=True`` one pass gives
    both the output and the statistics: attnscale's native kernel
    (:mod:`attnscale.measure.native`, float32 on x86), else the ``torch.compile``-d
    :func:`attnscale.measure.rowstats.attention_with_sums`.
    The output then equals SDPA's to float rounding (tests hold it within 1e-6; the native
    kernel follows SDPA's CPU kernel step by step and matched it bitwise on MiniLM).

Counterfactuals (``counterfactuals=True``) recompute the statistics as if the model had used
another score on the same q and k: ``dot`` (no 1/√d factor) and ``cosine`` at τ = 1.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from attnscale.core.inputs import check_inputs
from attnscale.core.nn import MultiheadSelfAttention
from attnscale.measure import native
from attnscale.measure.rowstats import attention_with_sums, maybe_compiled
from attnscale.measure.stats import AttentionStats, StatsAccumulator, check_query_mask, flat_means
from attnscale.util.validate import check_int

COUNTERFACTUALS: dict[str, dict[str, Any]] = {
    "dot": {"score": "dot"},
    "cosine_tau1": {"score": "cosine", "tau": 1.0},
}
ACTUAL = "actual"
_HF_NAME = "attnscale_monitor"
_ids = itertools.count()


class Monitor:
    """Context manager collecting attention statistics from ``model`` (see the module docstring).

    Args:
        model: any ``nn.Module``; every attnscale ``MultiheadSelfAttention`` and
            ``nn.MultiheadAttention`` inside it is watched, and a transformers ``PreTrainedModel``
            is watched through its attention interface.
        counterfactuals: also record the statistics under the scores in :data:`COUNTERFACTUALS`.
        every: record one call in ``every`` per layer (1 = every call).
        compile: answer SDPA calls with one fused pass (see the module docstring), and take
            the other statistics (counterfactuals, other sources) from the native kernel's
            statistics-only pass or ``torch.compile`` (:class:`StatsAccumulator`). On MiniLM
            this takes the cost of watching every call from 30-55% of a forward pass to about
            1%, 17% with counterfactuals (``benchmarks/monitor_overhead.py``). The native kernel
            builds once per machine (about 30 s, then cached); ``torch.compile`` compiles on
            first use (a few seconds with a warm inductor cache, longer cold). Off by default so
            that short runs pay nothing up front.
    """

    def __init__(self, model: nn.Module, counterfactuals: bool = False, every: int = 1,
                 compile: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        check_int("every", every, minimum=1)
        self.model = model
        self.counterfactuals = counterfactuals
        self.every = every
        self.compile = bool(compile)
        self.query_mask: Tensor | None = None
        self.names = {id(m): name for name, m in model.named_modules()}
        self._acc: dict[str, dict[str, StatsAccumulator]] = {}
        self._calls: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []
        self._fused_failed = False

    # -- public -------------------------------------------------------------------------------

    def stats(self, variant: str = ACTUAL) -> dict[str, AttentionStats]:
        """{layer name: statistics}, layers in model order. ``variant``: "actual" or a key of
        :data:`COUNTERFACTUALS` (needs ``counterfactuals=True``)."""
        if variant != ACTUAL and variant not in COUNTERFACTUALS:
            raise ValueError(f"variant must be 'actual' or one of {sorted(COUNTERFACTUALS)}")
        return {name: acc[variant].result() for name, acc in self._acc.items() if variant in acc}

    def flat_stats(self, variant: str = ACTUAL) -> dict[str, float]:
        """``{f"{layer}/{statistic}": float}`` of :meth:`stats`, for loggers (JSON-ready): per
        layer the row-weighted mean over heads and rows (max over heads for max_abs_logit),
        named as :data:`attnscale.measure.stats.STATISTICS` describes them."""
        return flat_means(self.stats(variant))

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._acc.clear()
        self._calls.clear()

    def __enter__(self) -> Monitor:
        for module in self.model.modules():
            if isinstance(module, MultiheadSelfAttention):
                self._watch_attnscale(module)
            elif isinstance(module, nn.MultiheadAttention):
                self._watch_torch_mha(module)
        if _is_hf_model(self.model):
            self._watch_hf(self.model)
        if not self._undo:
            raise ValueError(
                "model has no attention this monitor can watch: expected attnscale "
                "MultiheadSelfAttention, torch.nn.MultiheadAttention or a transformers model"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()

    # -- recording ----------------------------------------------------------------------------

    def record(self, module: nn.Module, q: Tensor, k: Tensor, call: dict[str, Any]) -> None:
        """Add one attention call: q (B, H, N, d), k (B, Hkv, N, d), ``call`` the keyword
        arguments of :func:`attnscale.attention` that the model used."""
        name = self._sampled(module)
        if name is not None:
            self._add(name, q, k, call, measured=None)

    def sdpa(self, module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
             attn_mask: Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
             scale: float | None = None, enable_gqa: bool = False, **extra: Any) -> Tensor:
        """Stand-in for ``F.scaled_dot_product_attention`` called by ``module``.

        With ``compile=False`` SDPA itself runs and the statistics are computed beside it, from
        the same q and k. With ``compile=True`` one pass gives both the output and the
        statistics (:func:`_attend_and_measure`); calls that pass cannot reproduce (dropout,
        autograd, half precision, float masks, another device than the CPU, arguments SDPA
        would reject) run SDPA itself as without compile."""
        args = (query, key, value, attn_mask, dropout_p, is_causal)
        kwargs = {"scale": scale, "enable_gqa": enable_gqa, **extra}
        name = self._sampled(module)
        if name is None:
            return F.scaled_dot_product_attention(*args, **kwargs)
        call = {"attn_mask": _stats_mask(attn_mask), "is_causal": is_causal, "scale": scale,
                "enable_gqa": enable_gqa, "score": "scaled_dot"}
        fuse = (self.compile and not extra and not self._fused_failed
                and _fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa))
        if fuse:
            rows = self._rows(query)
            s = query.shape[-1] ** -0.5 if scale is None else scale
            try:
                out, sums, head_max = _attend_and_measure(query, key, value, attn_mask,
                                                          bool(is_causal), s, rows)
            except Exception as err:  # e.g. torch.compile without a C++ compiler
                warnings.warn(f"attnscale monitor: the fused pass failed ({err!r}); SDPA runs "
                              "and the statistics are computed beside it", stacklevel=2)
                self._fused_failed = True
            else:
                self._add(name, query, key, call, measured=(sums, head_max))
                return out
        out = F.scaled_dot_product_attention(*args, **kwargs)  # raises SDPA's own errors
        # The statistics see SDPA's broadcast: leading dimensions flattened to (B, H, N, D).
        try:
            x = check_inputs(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        except (ValueError, TypeError) as err:  # SDPA ran a call outside its own contract
            warnings.warn(f"attnscale monitor: no statistics for {name} ({err})", stacklevel=2)
            return out
        call |= {"attn_mask": _stats_mask(x.mask), "enable_gqa": x.k.shape[1] != x.q.shape[1]}
        self._add(name, x.q, x.k, call, measured=None)
        return out

    def _rows(self, query: Tensor) -> Tensor:
        """The query rows that count, (B, N) bool on the query's device."""
        b, n = query.shape[0], query.shape[2]
        rows = self._query_mask(b, n)
        return (torch.ones(b, n, dtype=torch.bool) if rows is None else rows).to(query.device)

    def _query_mask(self, b: int, n: int) -> Tensor | None:
        """``query_mask`` for a call's (B, Nq); never skipped, which would count padding rows."""
        try:
            return check_query_mask(self.query_mask, b, n)
        except ValueError as err:
            raise ValueError(f"Monitor.{err}; set it for each batch, and to None for calls with "
                             "other query rows (generation steps, cross-attention)") from None

    def _sampled(self, module: nn.Module) -> str | None:
        """The layer name if this call of ``module`` is one to record (every ``every``-th)."""
        name = self.names.get(id(module), f"attention{len(self._acc)}")
        count = self._calls.get(name, 0)
        self._calls[name] = count + 1
        return None if count % self.every else name

    def _add(self, name: str, q: Tensor, k: Tensor, call: dict[str, Any], measured) -> None:
        """Accumulate every variant of one call; ``measured`` the actual variant's
        (sums, max) when the fused kernel already computed them."""
        q, k = q.detach(), k.detach()
        call = {n: v.detach() if isinstance(v, Tensor) else v for n, v in call.items()}
        variants = {ACTUAL: call}
        if self.counterfactuals:
            base = {n: call[n] for n in ("attn_mask", "is_causal", "enable_gqa") if n in call}
            variants |= {label: {**base, **cf} for label, cf in COUNTERFACTUALS.items()}
        accs = self._acc.setdefault(name, {})
        qmask = self._query_mask(q.shape[0], q.shape[2])
        for label, kwargs in variants.items():
            acc = accs.setdefault(label, StatsAccumulator(q.shape[1], compile=self.compile))
            if label == ACTUAL and measured is not None:
                acc.add_sums(*measured)
            else:
                acc.update(q, k, query_mask=qmask, **kwargs)

    # -- sources --------------------------------------------------------------------------------

    def _watch_attnscale(self, module: MultiheadSelfAttention) -> None:
        previous = module.capture

        def capture(mod, q, k, call):
            self.record(mod, q, k, call)
            if previous is not None:  # another observer (e.g. the trainer) keeps working
                previous(mod, q, k, call)

        module.capture = capture

        def undo() -> None:
            module.capture = previous

        self._undo.append(undo)

    def _watch_torch_mha(self, module: nn.MultiheadAttention) -> None:
        def pre_hook(mod, args, kwargs):
            q, k, call = _torch_mha_inputs(mod, args, kwargs)
            self.record(mod, q, k, call)

        handle = module.register_forward_pre_hook(pre_hook, with_kwargs=True)
        self._undo.append(handle.remove)

    def _watch_hf(self, model: nn.Module) -> None:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        original = model.config._attn_implementation
        if original not in ("eager", "sdpa"):
            raise ValueError(
                f"attn_implementation must be 'eager' or 'sdpa' to be monitored, got {original!r}"
            )
        name = f"{_HF_NAME}_{next(_ids)}"

        def monitored(module, query, key, value, attention_mask, **kwargs):
            def record() -> None:
                self.record(module, *_hf_inputs(query, key, attention_mask, kwargs, module))

            if original == "sdpa":  # transformers' own sdpa code, with SDPA itself watched
                with _WatchSDPA(self, module, tuple(query.shape[1:3]), record):
                    return ALL_ATTENTION_FUNCTIONS["sdpa"](
                        module, query, key, value, attention_mask, **kwargs)
            record()
            # the model's own eager code, from its modeling file: bitwise the same output
            fn = sys.modules[type(module).__module__].eager_attention_forward
            return fn(module, query, key, value, attention_mask, **kwargs)

        AttentionInterface.register(name, monitored)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
        model.set_attn_implementation(name)

        def undo() -> None:
            model.set_attn_implementation(original)

        self._undo.append(undo)


class _WatchSDPA(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` calls made inside it (in this thread) to
    :meth:`Monitor.sdpa`, so the statistics are those of SDPA's real arguments -- after the
    model's own key/value head repetition and mask handling -- and cost no second logits
    product. Every other torch call passes through unchanged.

    ``heads_rows`` is (H, N) of the query the model passed in. A call whose query has another
    layout -- transformers packs the query heads of grouped-query decoding into the row axis --
    runs SDPA itself, and ``fallback()`` records the statistics from the model's own arguments.
    """

    def __init__(self, monitor: Monitor, module: nn.Module, heads_rows: tuple[int, int],
                 fallback: Callable[[], None]) -> None:
        super().__init__()
        self.monitor, self.module = monitor, module
        self.heads_rows, self.fallback = heads_rows, fallback

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        query = args[0] if args else kwargs["query"]
        if tuple(query.shape[1:3]) == self.heads_rows:
            return self.monitor.sdpa(self.module, *args, **kwargs)
        self.fallback()
        return func(*args, **kwargs)


def _attend_and_measure(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool,
                        scale: float, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """SDPA's output and the statistics of its logits in one pass: attnscale's native kernel
    for float32 on an x86 CPU (:mod:`attnscale.measure.native`), else the ``torch.compile``-d Python
    version, :func:`attnscale.measure.rowstats.attention_with_sums`. ``rows`` (B, N) bool."""
    kernel = native.fused_kernel() if q.device.type == "cpu" and q.dtype == torch.float32 else None
    if kernel is not None:
        return kernel(q, k, v, keep, is_causal, scale, rows)
    if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat the key/value heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    fused = maybe_compiled(attention_with_sums, True)
    return fused(q, k, v, keep, is_causal, scale, rows[:, None, :])


def _fusable(query: Tensor, key: Tensor, value: Tensor, attn_mask, dropout_p: float,
             is_causal: bool, enable_gqa: bool) -> bool:
    """Whether the fused pass reproduces this SDPA call: no dropout, no autograd, float32 or
    float64 on the CPU, one batch size, a bool mask or none, and arguments SDPA itself accepts
    (anything else runs SDPA, which raises its own errors)."""
    tensors = (query, key, value)
    if not all(isinstance(t, Tensor) and t.dim() == 4 and t.numel() for t in tensors):
        return False
    b, h, n, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    return (
        dropout_p == 0.0
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        and all(t.device.type == "cpu" and t.dtype == query.dtype for t in tensors)
        and query.dtype in (torch.float32, torch.float64)
        and key.shape[0] == value.shape[0] == b and key.shape[3] == d
        and tuple(value.shape[1:3]) == (hkv, s)
        and (h == hkv or (enable_gqa and h % hkv == 0))
        and (attn_mask is None or (_bool_mask_fits(attn_mask, (b, h, n, s)) and not is_causal))
    )


def _bool_mask_fits(mask: Tensor, shape: tuple[int, ...]) -> bool:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.device.type != "cpu":
        return False
    try:
        return torch.broadcast_shapes(mask.shape, shape) == shape
    except RuntimeError:
        return False


def _stats_mask(mask: Tensor | None) -> Tensor | None:
    """A mask as the statistics read it: transformers' float masks use finfo.min, not −inf,
    for "masked"; make that −inf so the statistics exclude those keys instead of counting a huge
    negative logit."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask.masked_fill(mask <= torch.finfo(mask.dtype).min / 2, float("-inf"))


def _is_hf_model(model: nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model, "set_attn_implementation")


def _hf_inputs(query, key, attention_mask, kwargs, module) -> tuple[Tensor, Tensor, dict]:
    """q, k and attnscale.attention arguments equivalent to one transformers attention call."""
    mask = _stats_mask(attention_mask)
    if mask is not None:
        mask = mask[..., : key.shape[-2]]
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", False)
    is_causal = bool(is_causal and mask is None and query.shape[-2] > 1)
    call: dict[str, Any] = {
        "attn_mask": mask,
        "is_causal": is_causal,
        "enable_gqa": key.shape[1] != query.shape[1],
        "scale": kwargs.get("scaling"),
        "score": "scaled_dot",
    }
    if kwargs.get("softcap"):
        call |= {"score": "softcap", "cap": float(kwargs["softcap"])}
    return query, key, call


def _torch_mha_inputs(mod: nn.MultiheadAttention, args, kwargs) -> tuple[Tensor, Tensor, dict]:
    """Re-project q and k of a torch.nn.MultiheadAttention call; masks to attnscale semantics."""
    names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask")
    bound = dict(zip(names, args, strict=False)) | kwargs
    query, key = bound["query"], bound["key"]
    if not mod.batch_first and query.dim() == 3:
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    if query.dim() == 2:
        query, key = query.unsqueeze(0), key.unsqueeze(0)
    e, h = mod.embed_dim, mod.num_heads
    if mod._qkv_same_embed_dim:
        w_q, w_k = mod.in_proj_weight[:e], mod.in_proj_weight[e : 2 * e]
    else:
        w_q, w_k = mod.q_proj_weight, mod.k_proj_weight
    b_q = b_k = None
    if mod.in_proj_bias is not None:
        b_q, b_k = mod.in_proj_bias[:e], mod.in_proj_bias[e : 2 * e]
    with torch.no_grad():
        q = nn.functional.linear(query, w_q, b_q)  # (B, N, E)
        k = nn.functional.linear(key, w_k, b_k)
    b, n, s = q.shape[0], q.shape[1], k.shape[1]
    q = q.view(b, n, h, e // h).transpose(1, 2)  # (B, H, N, d)
    k = k.view(b, s, h, e // h).transpose(1, 2)
    keep = _torch_mha_mask(bound.get("attn_mask"), bound.get("key_padding_mask"), b, h, n, s)
    causal = bool(bound.get("is_causal", False)) and keep is None
    return q, k, {"attn_mask": keep, "is_causal": causal, "score": "scaled_dot"}


def _torch_mha_mask(attn_mask, key_padding_mask, b, h, n, s) -> Tensor | None:
    """nn.MultiheadAttention masks (bool True = *blocked*, float = additive) as one additive
    (B, H, N, S) mask with −inf for blocked entries, or None."""
    out = None

    def additive(m: Tensor) -> Tensor:
        if m.dtype == torch.bool:
            return torch.zeros(m.shape).masked_fill(m, float("-inf"))
        return m.float()

    if attn_mask is not None:
        m = additive(attn_mask)
        out = m.view(b, h, n, s) if m.dim() == 3 else m.expand(b, h, n, s)
    if key_padding_mask is not None:
        pad = additive(key_padding_mask).view(b, 1, 1, s)
        out = pad.expand(b, h, n, s) if out is None else out + pad
    return out
