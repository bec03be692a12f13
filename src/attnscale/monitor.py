"""Watch the attention of any model: per-layer, per-head statistics while it runs.

    with Monitor(model, counterfactuals=True) as mon:
        mon.query_mask = inputs["attention_mask"].bool()   # optional: skip padding query rows
        model(**inputs)
    mon.stats()           # {layer name: AttentionStats of the scores the model really used}
    mon.stats("dot")      # the same attention recomputed without the 1/√d factor

What is captured, in TransformerLens terms: the statistics are of ``attn_scores`` -- the
pre-softmax logits after scaling and masking -- and of the ``pattern`` softmax(attn_scores) they
produce (entropy, max weight, effective keys). They are computed from the q and k entering the
attention function, so the model's own output is untouched: the monitored call runs the model's
original attention code with the same arguments.

Sources:

* :class:`attnscale.nn.MultiheadSelfAttention`, through its ``capture`` hook;
* :class:`torch.nn.MultiheadAttention`, through a forward pre-hook that re-projects q and k;
* Hugging Face transformers models, through transformers' ``AttentionInterface``: a registered
  attention function records the statistics and then calls the implementation the model was
  using (sdpa or eager), with the mask format of that implementation (``AttentionMaskInterface``).

Counterfactuals (``counterfactuals=True``) recompute the statistics as if the model had used
another score on the same q and k: ``dot`` (no 1/√d factor) and ``cosine`` at τ = 1.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attnscale.nn import MultiheadSelfAttention
from attnscale.stats import AttentionStats, StatsAccumulator

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
        compile: fuse the statistics with ``torch.compile`` (about 10× less time per call once
            compiled; the first call compiles, a few seconds with a warm inductor cache, longer
            cold). Off by default so that short runs pay nothing up front.
    """

    def __init__(
        self,
        model: nn.Module,
        counterfactuals: bool = False,
        every: int = 1,
        compile: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.model = model
        self.counterfactuals = counterfactuals
        self.every = every
        self.compile = bool(compile)
        self.query_mask: Tensor | None = None
        self.names = {id(m): name for name, m in model.named_modules()}
        self._acc: dict[str, dict[str, StatsAccumulator]] = {}
        self._calls: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []

    # -- public -------------------------------------------------------------------------------

    def stats(self, variant: str = ACTUAL) -> dict[str, AttentionStats]:
        """{layer name: statistics}, layers in model order. ``variant``: "actual" or a key of
        :data:`COUNTERFACTUALS` (needs ``counterfactuals=True``)."""
        if variant != ACTUAL and variant not in COUNTERFACTUALS:
            raise ValueError(f"variant must be 'actual' or one of {sorted(COUNTERFACTUALS)}")
        return {name: acc[variant].result() for name, acc in self._acc.items() if variant in acc}

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
        name = self.names.get(id(module), f"attention{len(self._acc)}")
        count = self._calls.get(name, 0)
        self._calls[name] = count + 1
        if count % self.every:
            return
        q, k = q.detach(), k.detach()
        call = {n: v.detach() if isinstance(v, Tensor) else v for n, v in call.items()}
        variants = {ACTUAL: call}
        if self.counterfactuals:
            base = {n: call[n] for n in ("attn_mask", "is_causal", "enable_gqa") if n in call}
            variants |= {label: {**base, **cf} for label, cf in COUNTERFACTUALS.items()}
        accs = self._acc.setdefault(name, {})
        qmask = self.query_mask if _fits(self.query_mask, q) else None
        for label, kwargs in variants.items():
            acc = accs.setdefault(label, StatsAccumulator(q.shape[1], compile=self.compile))
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
            q, k, call = _hf_inputs(query, key, attention_mask, kwargs, module)
            self.record(module, q, k, call)
            if original == "eager":  # the model's own eager code lives in its modeling file
                fn = sys.modules[type(module).__module__].eager_attention_forward
            else:
                fn = ALL_ATTENTION_FUNCTIONS[original]
            return fn(module, query, key, value, attention_mask, **kwargs)

        AttentionInterface.register(name, monitored)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
        model.set_attn_implementation(name)

        def undo() -> None:
            model.set_attn_implementation(original)

        self._undo.append(undo)


def _is_hf_model(model: nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model, "set_attn_implementation")


def _fits(query_mask: Tensor | None, q: Tensor) -> bool:
    return query_mask is not None and tuple(query_mask.shape) == (q.shape[0], q.shape[2])


def _hf_inputs(query, key, attention_mask, kwargs, module) -> tuple[Tensor, Tensor, dict]:
    """q, k and attnscale.attention arguments equivalent to one transformers attention call."""
    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool:
        # transformers' eager masks use finfo.min, not −inf, for "masked": make them −inf so the
        # statistics exclude those keys instead of counting a huge negative logit.
        mask = mask.masked_fill(mask <= torch.finfo(mask.dtype).min / 2, float("-inf"))
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
