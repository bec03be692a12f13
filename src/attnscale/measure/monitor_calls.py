"""How :class:`attnscale.measure.monitor.Monitor` reads each source's attention calls: the hooks
it puts on attnscale and ``torch.nn.MultiheadAttention`` modules and on transformers models, q,
k and the :func:`attnscale.attention` arguments equivalent to a transformers or
``torch.nn.MultiheadAttention`` call, masks in the form the statistics read, which calls one
fused pass (:mod:`attnscale.measure.native`) reproduces, the SDPA calls of transformers' sdpa
code (:class:`WatchSDPA`), and those calls under torch.compile (:func:`record_compiled`)."""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from attnscale.core.nn import MultiheadSelfAttention

HF_NAME = "attnscale_monitor"  # the prefix of the attention functions registered with transformers
_ids = itertools.count()
# monitored attention functions registered with transformers -> the implementation each stands
# in for ("eager", "sdpa" or another monitor's): monitors of one model nest (a health callback
# and QK-Clip watch the same step)
_WATCHING: dict[str, str] = {}


class Watcher(Protocol):
    """What the hooks of this module need of their monitor
    (:class:`attnscale.measure.monitor.Monitor`, which imports this module, so it is named by
    its methods rather than imported): ``key`` and ``compiled_calls`` as
    :func:`record_compiled` reads them."""

    key: int
    compiled_calls: Tensor

    def record(self, module: nn.Module, q: Tensor, k: Tensor, call: dict[str, Any]) -> None: ...

    def sdpa(self, module: nn.Module, *args: Any, **kwargs: Any) -> Tensor: ...

    def measure_sdpa(self, module: int, query: Tensor, key: Tensor, value: Tensor,
                     attn_mask: Tensor | None, is_causal: bool, scale: float | None,
                     enable_gqa: bool) -> None: ...


def fusable(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any, dropout_p: float,
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
        and (attn_mask is None or (bool_mask_fits(attn_mask, (b, h, n, s)) and not is_causal))
    )


def in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread now (a forward called from
    there is activation checkpointing's recomputation). torch has no public query for this;
    ``torch.utils.checkpoint`` itself reads the same graph-task id (-1 outside backward)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


def bool_mask_fits(mask: Tensor, shape: tuple[int, ...]) -> bool:
    """Whether ``mask`` is a CPU bool tensor broadcasting to ``shape``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.device.type != "cpu":
        return False
    try:
        return torch.broadcast_shapes(mask.shape, shape) == shape
    except RuntimeError:
        return False


def keep_mask(mask: Tensor | None) -> tuple[bool, Tensor | None]:
    """(usable, keep): the bool mask (True = attend) equivalent to an attention mask, for the
    native kernel, which reads bool masks only. A float mask counts when its visible entries are
    all 0 (only −inf elsewhere, as padding masks are); otherwise (False, None)."""
    if mask is None or mask.dtype == torch.bool:
        return True, mask
    keep = mask > float("-inf")
    if bool(torch.where(keep, mask, torch.zeros((), dtype=mask.dtype)).any()):
        return False, None  # a real bias: the logits change, not only which keys count
    return True, keep


def sdpa_call(attn_mask: Tensor | None, is_causal: bool, scale: float | None,
              enable_gqa: bool) -> dict[str, Any]:
    """The :func:`attnscale.attention` arguments equivalent to an SDPA call, its mask as the
    statistics read it (:func:`stats_mask`)."""
    return {"attn_mask": stats_mask(attn_mask), "is_causal": is_causal, "scale": scale,
            "enable_gqa": enable_gqa, "score": "scaled_dot"}


def stats_mask(mask: Tensor | None) -> Tensor | None:
    """A mask as the statistics read it: transformers' float masks use finfo.min, not −inf,
    for "masked"; make that −inf so the statistics exclude those keys instead of counting a huge
    negative logit."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask.masked_fill(mask <= torch.finfo(mask.dtype).min / 2, float("-inf"))


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` looks like a transformers ``PreTrainedModel`` (duck-typed: transformers
    is an optional dependency)."""
    return hasattr(model, "config") and hasattr(model, "set_attn_implementation")


def hf_inputs(query: Tensor, key: Tensor, attention_mask: Tensor | None, kwargs: dict[str, Any],
              module: nn.Module) -> tuple[Tensor, Tensor, dict]:
    """q, k and attnscale.attention arguments equivalent to one transformers attention call."""
    mask = stats_mask(attention_mask)
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


def torch_mha_inputs(mod: nn.MultiheadAttention, args: tuple, kwargs: dict[str, Any]
                     ) -> tuple[Tensor, Tensor, dict]:
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
    keep = torch_mha_mask(bound.get("attn_mask"), bound.get("key_padding_mask"), b, h, n, s)
    causal = bool(bound.get("is_causal", False)) and keep is None
    return q, k, {"attn_mask": keep, "is_causal": causal, "score": "scaled_dot"}


def torch_mha_mask(attn_mask: Tensor | None, key_padding_mask: Tensor | None, b: int, h: int,
                   n: int, s: int) -> Tensor | None:
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


class WatchSDPA(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` calls made inside it (in this thread) to
    :meth:`attnscale.measure.monitor.Monitor.sdpa`, so the statistics are those of SDPA's real
    arguments -- after the model's own key/value head repetition and mask handling -- and cost
    no second logits product. Every other torch call passes through unchanged.

    ``heads_rows`` is (H, N) of the query the model passed in. A call whose query has another
    layout -- transformers packs the query heads of grouped-query decoding into the row axis --
    runs SDPA itself, and ``fallback()`` records the statistics from the model's own arguments.
    """

    def __init__(self, monitor: Watcher, module: nn.Module, heads_rows: tuple[int, int],
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


# -- the sources' hooks ---------------------------------------------------------------------------


def watch_attnscale(monitor: Watcher, module: MultiheadSelfAttention) -> Callable[[], None]:
    """Record every attention call of ``module`` through its ``capture`` hook (an observer
    already there keeps working); returns what undoes it. Monitors may exit in any order: one
    that exits under another turns into a pass-through, which the one above skips when it
    exits in turn."""
    def capture(mod, q, k, call):
        if capture.alive:
            monitor.record(mod, q, k, call)
        if capture.previous is not None:  # another observer (e.g. the trainer) keeps working
            capture.previous(mod, q, k, call)

    capture.alive, capture.previous = True, module.capture
    module.capture = capture

    def undo() -> None:
        capture.alive = False
        if module.capture is capture:  # on top: put back the nearest observer still alive
            below = capture.previous
            while below is not None and getattr(below, "alive", True) is False:
                below = below.previous
            module.capture = below

    return undo


def watch_torch_mha(monitor: Watcher, module: nn.MultiheadAttention) -> Callable[[], None]:
    """Record every call of ``module`` through a forward pre-hook that re-projects q and k
    (:func:`torch_mha_inputs`); returns what undoes it."""

    def pre_hook(mod, args, kwargs):
        q, k, call = torch_mha_inputs(mod, args, kwargs)
        monitor.record(mod, q, k, call)

    return module.register_forward_pre_hook(pre_hook, with_kwargs=True).remove


def watch_hf(monitor: Watcher, model: nn.Module) -> Callable[[], None]:
    """Stand in for the attention implementation of transformers model ``model`` ("eager" or
    "sdpa", else ValueError) with a registered attention function that records each call and
    runs that implementation (module docstring of :mod:`attnscale.measure.monitor`); returns
    what puts the original back."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = model.config._attn_implementation
    if original not in ("eager", "sdpa") and original not in _WATCHING:
        raise ValueError(
            f"attn_implementation must be 'eager' or 'sdpa' to be monitored, got {original!r}"
        )
    name = f"{HF_NAME}_{next(_ids)}"

    def monitored(module, query, key, value, attention_mask, **kwargs):
        def record() -> None:
            monitor.record(module, *hf_inputs(query, key, attention_mask, kwargs, module))

        target = _WATCHING.get(name, original)  # what this monitor stands in for now
        if target in _WATCHING:  # inside another monitor: record, then let it run
            record()
            return ALL_ATTENTION_FUNCTIONS[target](
                module, query, key, value, attention_mask, **kwargs)
        if target == "sdpa":  # transformers' own sdpa code, with SDPA itself watched
            with WatchSDPA(monitor, module, tuple(query.shape[1:3]), record):
                return ALL_ATTENTION_FUNCTIONS["sdpa"](
                    module, query, key, value, attention_mask, **kwargs)
        record()
        # the model's own eager code, from its modeling file: bitwise the same output
        fn = sys.modules[type(module).__module__].eager_attention_forward
        return fn(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(name, monitored)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    _WATCHING[name] = original
    model.set_attn_implementation(name)

    def undo() -> None:
        target = _WATCHING.pop(name)
        for other, inner in _WATCHING.items():  # a monitor entered after this one and still
            if inner == name:                   # watching now stands in for what this one did
                _WATCHING[other] = target
        if model.config._attn_implementation == name:
            model.set_attn_implementation(target)

    return undo


# -- SDPA calls under torch.compile -------------------------------------------------------------

# The live monitors by key, for the recording operator, which can take only numbers and tensors.
MONITORS: weakref.WeakValueDictionary[int, Watcher] = weakref.WeakValueDictionary()
RECORD_OP = "attnscale::monitor_sdpa"
LIBRARY = torch.library.Library("attnscale", "FRAGMENT")  # the operator's registrations
LIBRARY.define(
    "monitor_sdpa(Tensor(a!) calls, int monitor, int module, Tensor query, Tensor key,"
    " Tensor value, Tensor? attn_mask, bool is_causal, float? scale, bool enable_gqa) -> ()")
# Statistics only: no gradient flows through it (record_compiled hands it detached tensors).
LIBRARY.impl("monitor_sdpa", torch.library.fallthrough_kernel, "Autograd")


def register_monitor(monitor: Watcher) -> int:
    """A new key under which :data:`MONITORS` holds ``monitor`` (weakly) while it lives."""
    key = next(_ids)
    MONITORS[key] = monitor
    return key


def record_compiled(monitor: Watcher, module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                    attn_mask: Tensor | None, is_causal: bool, scale: float | None,
                    enable_gqa: bool) -> None:
    """Hand one SDPA call of traced code to ``monitor`` (its key in :data:`MONITORS`, its
    ``compiled_calls`` counter) through :data:`RECORD_OP`: one opaque call in the graph, where
    Dynamo would otherwise trace the monitor's Python state (counters, dicts of accumulators,
    checks of the values) and break the graph or recompile on every call. At run time the
    operator calls :meth:`Watcher.measure_sdpa`, which does what an eager call does without
    computing the output."""
    detached = [None if t is None else t.detach() for t in (query, key, value, attn_mask)]
    torch.ops.attnscale.monitor_sdpa.default(monitor.compiled_calls, monitor.key, id(module),
                                             *detached, bool(is_causal), scale, bool(enable_gqa))


@torch.library.impl(RECORD_OP, "CompositeExplicitAutograd", lib=LIBRARY)
def monitor_sdpa(calls: Tensor, monitor: int, module: int, query: Tensor, key: Tensor,
                 value: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None,
                 enable_gqa: bool) -> None:
    """Add the statistics of one SDPA call to the monitor with key ``monitor`` (for the
    module with ``id`` ``module``), and count it in ``calls``. RuntimeError where no such
    monitor lives (a compiled graph outliving its monitor)."""
    target = MONITORS.get(monitor)
    if target is None:
        raise RuntimeError(f"{RECORD_OP}: no live Monitor has key {monitor}")
    target.measure_sdpa(module, query, key, value, attn_mask, is_causal, scale, enable_gqa)
    calls.add_(1)


@torch.library.register_fake(RECORD_OP, lib=LIBRARY)
def monitor_sdpa_fake(calls: Tensor, monitor: int, module: int, query: Tensor, key: Tensor,
                      value: Tensor, attn_mask: Tensor | None, is_causal: bool,
                      scale: float | None, enable_gqa: bool) -> None:
    """Nothing to allocate: the operator only updates ``calls`` in place."""
