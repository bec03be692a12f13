"""How :class:`attnscale.measure.monitor.Monitor` reads each source's attention calls: q, k and
the :func:`attnscale.attention` arguments equivalent to a transformers or
``torch.nn.MultiheadAttention`` call, masks in the form the statistics read, which calls one
fused pass (:mod:`attnscale.measure.native`) reproduces, and the SDPA calls of transformers'
sdpa code (:class:`WatchSDPA`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode


class AnswersSDPA(Protocol):
    """What :class:`WatchSDPA` needs of its monitor (:class:`attnscale.measure.monitor.Monitor`,
    which imports this module, so it is named by its one method rather than imported)."""

    def sdpa(self, module: nn.Module, *args: Any, **kwargs: Any) -> Tensor: ...


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

    def __init__(self, monitor: AnswersSDPA, module: nn.Module, heads_rows: tuple[int, int],
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
