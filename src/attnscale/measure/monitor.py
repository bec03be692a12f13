"""Watch the attention of any model: per-layer, per-head statistics while it runs.

    with Monitor(model, counterfactuals=True) as mon:
        mon.query_mask = inputs["attention_mask"].bool()   # optional: skip padding query rows
        model(**inputs)
    mon.stats()           # {layer name: AttentionStats of the scores the model really used}
    mon.stats("dot")      # the same attention recomputed without the 1/√d factor
    mon.flat_stats()      # {"encoder.layer.0.attention.self/entropy": 1.93, ...} for loggers
    mon.paths             # Counter({"native": 24}): which code computed the statistics

What is captured, in TransformerLens terms: the statistics are of ``attn_scores`` -- the
pre-softmax logits after scaling and masking -- and of the ``pattern`` softmax(attn_scores) they
produce (entropy, max weight, effective keys), computed from the q and k entering the attention
function; :data:`attnscale.measure.stats.STATISTICS` says which for each statistic. A row whose
logits include NaN or ±inf counts in ``nonfinite_fraction`` and makes max |logit| +inf, and is
left out of the other statistics, on every path alike (:mod:`attnscale.measure.headstats`).
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
    are of SDPA's real arguments. Where it can, one pass of attnscale's native kernel
    (:mod:`attnscale.measure.native`, float32 on the CPU) gives both the output and the
    statistics -- of the model's own scores and of the counterfactuals -- reading q and k once.
    The output then equals SDPA's to float rounding (tests hold it within 1e-6; the kernel
    follows SDPA's CPU kernel step by step and matched it bitwise on MiniLM). Elsewhere SDPA
    itself runs (bitwise unchanged) and the logits are computed a second time.

Which code computes the statistics (``compile``, and :attr:`Monitor.backend`):

* ``None`` (default): the native kernel where it applies (float32 on the CPU, a bool mask, a
  float mask that only hides keys, or none), else the Python code
  (:class:`attnscale.measure.stats.StatsAccumulator`). The kernel is the installed build (made at
  install), else compiled once per environment (about 20 s, then cached) on the first monitored
  call; where it cannot build, one warning says so and the Python
  code runs. ``$ATTNSCALE_NATIVE_ISA=off`` switches it off.
* ``True``: a fused pass for every call it can reproduce: the native kernel, else the
  ``torch.compile``-d :func:`attnscale.measure.rowstats.attention_with_sums` (compiled on first
  use, a few seconds with a warm cache).
* ``False``: SDPA itself and the Python statistics, always.

Under torch.compile the SDPA calls of transformers' sdpa code keep SDPA itself in the graph --
the output is the compiled model's own, bitwise -- and hand q, k, v and the mask to one opaque
operator (:func:`attnscale.measure.monitor_calls.record_compiled`), which computes the
statistics at run time as an eager call would (a statistics-only pass of the native kernel):
a monitored model compiles into one graph, and its next call reuses it. The other sources
record through :meth:`Monitor.record`, which is a graph break.

On all-MiniLM-L6-v2 (8 × 128 and 8 × 512 tokens, every call sampled, 2 CPU cores) a monitored
forward pass takes 0.90–0.99× the time of a plain one by default -- the kernel's pass is
quicker than SDPA's at these shapes --, 0.98–1.04× with counterfactuals, 1.5–2.7× with
``compile=False`` (``benchmarks/monitor_overhead.py``; ``benchmarks/recorded/``).

Counterfactuals (``counterfactuals=True``) are the statistics as if the model had used
another score on the same q and k: ``dot`` (no 1/√d factor) and ``cosine`` at τ = 1.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from attnscale.core.inputs import check_inputs
from attnscale.core.nn import MultiheadSelfAttention
from attnscale.measure import monitor_calls as calls
from attnscale.measure import native
from attnscale.measure.rowstats import SUM_FIELDS, attention_with_sums, maybe_compiled
from attnscale.measure.stats import AttentionStats, StatsAccumulator, check_query_mask, flat_means
from attnscale.util.validate import check_int

COUNTERFACTUALS: dict[str, dict[str, Any]] = {
    "dot": {"score": "dot"},
    "cosine_tau1": {"score": "cosine", "tau": 1.0},
}
# The same counterfactuals as variants of the native kernel: ("dot", s) has logits s·q·k,
# ("cosine", τ) τ·cos(q, k) (attnscale.measure.native.fused_kernel).
NATIVE_COUNTERFACTUALS: dict[str, tuple[str, float]] = {
    "dot": ("dot", 1.0),
    "cosine_tau1": ("cosine", 1.0),
}
ACTUAL = "actual"
NONFINITE = SUM_FIELDS.index("nonfinite")
BACKENDS = ("native", "compiled", "python")


class Monitor:
    """Context manager collecting attention statistics from ``model`` (see the module docstring).

    Args:
        model: any ``nn.Module``; every attnscale ``MultiheadSelfAttention`` and
            ``nn.MultiheadAttention`` inside it is watched, and a transformers ``PreTrainedModel``
            is watched through its attention interface.
        counterfactuals: also record the statistics under the scores in :data:`COUNTERFACTUALS`.
        every: record one call in ``every`` per layer (1 = every call).
        compile: which code computes the statistics (module docstring): None (default) the
            native kernel where it applies, else Python; True forces a fused pass (native, else
            ``torch.compile``); False forces SDPA plus the Python statistics.

    After a run, :attr:`paths` counts the statistics each path computed (one per recorded call
    and variant): "native" (the kernel), "compiled" (``torch.compile``) or "python";
    :attr:`compiled_calls` (a 0-d int64 tensor) the SDPA calls that torch.compile-d code
    handed over (module docstring).
    """

    def __init__(self, model: nn.Module, counterfactuals: bool = False, every: int = 1,
                 compile: bool | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        check_int("every", every, minimum=1)
        if compile not in (None, True, False):
            raise TypeError(f"compile must be None, True or False, got {compile!r}")
        self.model = model
        self.counterfactuals = counterfactuals
        self.every = every
        self.compile = compile
        self.query_mask: Tensor | None = None
        self.names = {id(m): name for name, m in model.named_modules()}
        self.paths: Counter[str] = Counter()
        self._acc: dict[str, dict[str, StatsAccumulator]] = {}
        self._calls: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []
        self._fused_failed = False
        # Under torch.compile: this monitor's key in calls.MONITORS, and the count of SDPA calls
        # its compiled graphs handed over (a tensor the recording operator updates in place).
        self.key = calls.register_monitor(self)
        self.compiled_calls = torch.zeros((), dtype=torch.int64)
        # record: a graph break under torch.compile, since traced, the monitor's Python state
        # (call counters, the accumulators created on first use) would become guards that fail
        # on every next call. Disabled here rather than by a decorator on the class, which
        # would import Dynamo (about 1 s) in every process that imports the monitor.
        self.record = torch.compiler.disable(self.record)

    # -- public -------------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """The path float32 CPU calls take: "native" where the kernel is built (building or
        loading it on first use) unless ``compile=False``, else "compiled" with
        ``compile=True`` and "python" otherwise. Other calls (float64, float masks with a real
        bias, another device) take the Python path; :attr:`paths` counts what really ran."""
        if self.compile is not False and native.fused_kernel() is not None:
            return "native"
        return "compiled" if self.compile else "python"

    def stats(self, variant: str = ACTUAL) -> dict[str, AttentionStats]:
        """{layer name: statistics}, layers in model order. ``variant``: "actual" or a key of
        :data:`COUNTERFACTUALS` (needs ``counterfactuals=True``)."""
        if variant != ACTUAL and variant not in COUNTERFACTUALS:
            raise ValueError(f"variant must be 'actual' or one of {sorted(COUNTERFACTUALS)}")
        return {name: acc[variant].result() for name, acc in self._acc.items() if variant in acc}

    def flat_stats(self, variant: str = ACTUAL) -> dict[str, float]:
        """``{f"{layer}/{statistic}": float}`` of :meth:`stats`, for loggers: per layer the
        row-weighted mean over heads and rows (max over heads for max_abs_logit, mean over
        heads for nonfinite_fraction), named as :data:`attnscale.measure.stats.STATISTICS`
        describes them. Finite (JSON-ready) when every logit was; a layer with non-finite
        logits reads nonfinite_fraction > 0 and max_abs_logit inf, and NaN where no row was
        finite (:func:`attnscale.measure.stats.flat_means`)."""
        return flat_means(self.stats(variant))

    def accumulators(self) -> dict[tuple[str, str], StatsAccumulator]:
        """{(layer, variant): accumulator}, sorted by name (the same order on every rank that
        recorded the same layers): what :func:`attnscale.measure.distributed.all_reduce_monitor`
        pools across ranks."""
        return {(name, label): self._acc[name][label]
                for name in sorted(self._acc) for label in sorted(self._acc[name])}

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._acc.clear()
        self._calls.clear()
        self.paths.clear()
        self.compiled_calls.zero_()

    def __enter__(self) -> Monitor:
        for module in self.model.modules():
            if isinstance(module, MultiheadSelfAttention):
                self._undo.append(calls.watch_attnscale(self, module))
            elif isinstance(module, nn.MultiheadAttention):
                self._undo.append(calls.watch_torch_mha(self, module))
        if calls.is_hf_model(self.model):
            self._undo.append(calls.watch_hf(self, self.model))
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
        arguments of :func:`attnscale.attention` that the model used. Not traced by torch.compile
        (``__init__``)."""
        name = self._sampled(id(module))
        if name is not None:
            self._add(name, q, k, call, measured={})

    def sdpa(self, module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
             attn_mask: Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
             scale: float | None = None, enable_gqa: bool = False, **extra: Any) -> Tensor:
        """Stand-in for ``F.scaled_dot_product_attention`` called by ``module``.

        Where the fused pass applies (:attr:`backend` "native" for float32 on the CPU, or
        "compiled" with ``compile=True``) one pass gives both the output and the statistics
        (:func:`_attend_and_measure`); calls that pass cannot reproduce (dropout, autograd,
        half precision, float masks, another device than the CPU, arguments SDPA would reject)
        and ``compile=False`` run SDPA itself, and the statistics are computed beside it.
        While torch.compile traces, SDPA itself stays in the graph -- the output is the
        compiled model's own, bitwise -- and one opaque operator computes the statistics as
        :meth:`measure_sdpa` (:func:`attnscale.measure.monitor_calls.record_compiled`)."""
        args = (query, key, value, attn_mask, dropout_p, is_causal)
        kwargs = {"scale": scale, "enable_gqa": enable_gqa, **extra}
        if torch.compiler.is_compiling():
            out = F.scaled_dot_product_attention(*args, **kwargs)
            calls.record_compiled(self, module, query, key, value, attn_mask, is_causal, scale,
                                  enable_gqa)
            return out
        name = self._sampled(id(module))
        if name is None:
            return F.scaled_dot_product_attention(*args, **kwargs)
        call = calls.sdpa_call(attn_mask, is_causal, scale, enable_gqa)
        path = self._fused_path(query)
        if path and not extra and not self._fused_failed and calls.fusable(
                query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
            out = self._fused(name, path, query, key, value, call, with_output=True)
            if out is not None:
                return out
        out = F.scaled_dot_product_attention(*args, **kwargs)  # raises SDPA's own errors
        self._beside(name, query, key, value, attn_mask, dropout_p, call)
        return out

    def measure_sdpa(self, module: int, query: Tensor, key: Tensor, value: Tensor,
                     attn_mask: Tensor | None, is_causal: bool, scale: float | None,
                     enable_gqa: bool) -> None:
        """Add the statistics of one SDPA call of the module with ``id`` ``module`` whose output
        was computed elsewhere (by compiled code): a statistics-only pass of the native kernel
        where :meth:`sdpa` would take it, else the statistics beside it."""
        name = self._sampled(module)
        if name is None:
            return
        call = calls.sdpa_call(attn_mask, is_causal, scale, enable_gqa)
        if self._fused_path(query) == "native" and not self._fused_failed and calls.fusable(
                query, key, value, attn_mask, 0.0, is_causal, enable_gqa) and self._fused(
                name, "native", query, key, value, call, with_output=False) is not None:
            return
        self._beside(name, query, key, value, attn_mask, 0.0, call)

    def _fused(self, name: str, path: str, query: Tensor, key: Tensor, value: Tensor,
               call: dict[str, Any], with_output: bool) -> Tensor | None:
        """The output (empty without ``with_output``) of an SDPA call that
        :func:`attnscale.measure.monitor_calls.fusable` accepted, its statistics added, from
        one fused pass on ``path``; None, after one warning, where that pass failed. ``call``:
        :func:`attnscale.measure.monitor_calls.sdpa_call`."""
        scale = call["scale"]
        s = query.shape[-1] ** -0.5 if scale is None else scale
        cf = self.counterfactuals and path == "native" and s > 0
        rows = self._rows(query)  # a query_mask that does not fit raises here
        try:
            out, measured = _attend_and_measure(query, key, value, call["attn_mask"],
                                                bool(call["is_causal"]), s, rows, cf, with_output)
        except Exception as err:  # e.g. torch.compile without a C++ compiler
            warnings.warn(f"attnscale monitor: the fused pass failed ({err!r}); SDPA runs "
                          "and the statistics are computed beside it", stacklevel=3)
            self._fused_failed = True
            return None
        self.paths[path] += len(measured)
        self._add(name, query, key, call, measured)
        return out

    def _beside(self, name: str, query: Tensor, key: Tensor, value: Tensor,
                attn_mask: Tensor | None, dropout_p: float, call: dict[str, Any]) -> None:
        """Add the statistics of an SDPA call that SDPA itself answered, from its arguments as
        SDPA broadcasts them (leading dimensions flattened to (B, H, N, D))."""
        try:
            x = check_inputs(query, key, value, attn_mask, dropout_p, call["is_causal"],
                             call["enable_gqa"])
        except (ValueError, TypeError) as err:  # SDPA ran a call outside its own contract
            warnings.warn(f"attnscale monitor: no statistics for {name} ({err})", stacklevel=3)
            return
        call = {**call, "attn_mask": calls.stats_mask(x.mask),
                "enable_gqa": x.k.shape[1] != x.q.shape[1]}
        self._add(name, x.q, x.k, call, measured={})

    def _fused_path(self, query: Tensor) -> str | None:
        """Which fused pass may answer an SDPA call with this query: "native", "compiled"
        (``compile=True`` only) or None (SDPA itself runs)."""
        if self.compile is False:
            return None
        if query.dtype == torch.float32 and query.device.type == "cpu" and (
                native.fused_kernel() is not None):
            return "native"
        return "compiled" if self.compile else None

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

    def _sampled(self, module: int) -> str | None:
        """The layer name if this call of the module with ``id`` ``module`` is one to record
        (every ``every``-th). A call during a backward pass (activation checkpointing's
        recomputation of a forward already seen) is neither recorded nor counted."""
        if calls.in_backward():
            return None
        name = self.names.get(module, f"attention{len(self._acc)}")
        count = self._calls.get(name, 0)
        self._calls[name] = count + 1
        return None if count % self.every else name

    def _add(self, name: str, q: Tensor, k: Tensor, call: dict[str, Any],
             measured: dict[str, tuple[Tensor, Tensor]]) -> None:
        """Accumulate every variant of one call; ``measured`` {variant: (sums, max)} those a
        fused pass already computed. The counterfactuals left take one statistics-only pass of
        the native kernel where it applies (:meth:`_native_counterfactuals`)."""
        q, k = q.detach(), k.detach()
        call = {n: v.detach() if isinstance(v, Tensor) else v for n, v in call.items()}
        variants = {ACTUAL: call}
        if self.counterfactuals:
            base = {n: call[n] for n in ("attn_mask", "is_causal", "enable_gqa") if n in call}
            variants |= {label: {**base, **cf} for label, cf in COUNTERFACTUALS.items()}
        accs = self._acc.setdefault(name, {})
        qmask = self._query_mask(q.shape[0], q.shape[2])
        if self.counterfactuals:
            measured = self._counterfactuals_measured(q, k, call, qmask, measured)
        for label, kwargs in variants.items():
            acc = accs.setdefault(label, StatsAccumulator(q.shape[1], compile=self.compile))
            if label in measured:
                acc.add_sums(*measured[label])
            else:
                acc.update(q, k, query_mask=qmask, **kwargs)
                self.paths[acc.path] += 1

    def _counterfactuals_measured(self, q: Tensor, k: Tensor, call: dict[str, Any],
                                  qmask: Tensor | None, measured: dict[str, tuple[Tensor, Tensor]]
                                  ) -> dict[str, tuple[Tensor, Tensor]]:
        """``measured`` with the counterfactuals one kernel pass gives
        (:meth:`_native_counterfactuals`), unless the call's own logits are not all finite: the
        kernel derives its variants from scale·q·k, so they would inherit an overflow of that
        product (a huge scale, say) that their own scores do not have. Those calls keep only
        the actual statistics here; :class:`StatsAccumulator` computes each counterfactual from
        q and k by its own score."""
        if not set(COUNTERFACTUALS) <= set(measured) and not _nonfinite(measured.get(ACTUAL)):
            measured = {**self._native_counterfactuals(q, k, call, qmask, ACTUAL in measured),
                        **measured}
        if _nonfinite(measured.get(ACTUAL)):
            return {ACTUAL: measured[ACTUAL]}
        return measured

    def _native_counterfactuals(self, q: Tensor, k: Tensor, call: dict[str, Any],
                                qmask: Tensor | None, have_actual: bool
                                ) -> dict[str, tuple[Tensor, Tensor]]:
        """{variant: (sums, max)} of the counterfactuals -- and of the actual scores when they
        are scale·q·k and not yet measured -- from ONE statistics-only kernel call that reads q
        and k once; {} where the kernel does not apply (then the Python code runs)."""
        kernel = native.fused_kernel() if self.compile is not False else None
        usable, keep = calls.keep_mask(call.get("attn_mask"))
        if (kernel is None or not usable or q.dtype != torch.float32 or q.device.type != "cpu"
                or k.dtype != torch.float32 or q.dim() != 4 or k.dim() != 4
                or q.shape[1] % k.shape[1]):
            return {}
        scale = call.get("scale")
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        actual = (not have_actual and call.get("score") == "scaled_dot"
                  and isinstance(scale, (int, float)) and scale > 0
                  and set(call) <= {"attn_mask", "is_causal", "scale", "enable_gqa", "score"})
        dots, taus, labels = _kernel_variants(list(COUNTERFACTUALS))
        if not actual:  # the first dot variant stands in for the attention's own logits
            scale, dots = dots[0], dots[1:]
        rows = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool) if qmask is None else qmask
        try:
            _, sums, mx = kernel(q, k, k, keep, bool(call.get("is_causal")), scale, rows, False,
                                 dots, taus)
        except RuntimeError:  # e.g. a mask that does not broadcast: the Python code decides
            return {}
        labels = [ACTUAL] * actual + labels
        self.paths["native"] += len(labels)
        return {label: (sums[i], mx[i]) for i, label in enumerate(labels)}


def _nonfinite(measured: tuple[Tensor, Tensor] | None) -> bool:
    """Whether sums (H, len(SUM_FIELDS)) and max |logit| count a non-finite logit."""
    return measured is not None and bool(measured[0][..., NONFINITE].any())


def _kernel_variants(labels: list[str]) -> tuple[list[float], list[float], list[str]]:
    """The kernel's (dot_scales, cosine_taus) for counterfactuals ``labels``, and the labels in
    the order of the variants it returns (dot ones first)."""
    dots = [label for label in labels if NATIVE_COUNTERFACTUALS[label][0] == "dot"]
    cosines = [label for label in labels if NATIVE_COUNTERFACTUALS[label][0] == "cosine"]
    return ([NATIVE_COUNTERFACTUALS[label][1] for label in dots],
            [NATIVE_COUNTERFACTUALS[label][1] for label in cosines], dots + cosines)


def _attend_and_measure(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool,
                        scale: float, rows: Tensor, counterfactuals: bool = False,
                        with_output: bool = True
                        ) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]]]:
    """SDPA's output and {variant: (sums, max)} of its logits in one pass: attnscale's native
    kernel for float32 on the CPU (:mod:`attnscale.measure.native`), which with
    ``counterfactuals`` also gives those of :data:`COUNTERFACTUALS` from the same pass (and
    without ``with_output`` only the statistics, the output empty), else the
    ``torch.compile``-d Python version, :func:`attnscale.measure.rowstats.attention_with_sums`,
    for the actual logits alone. ``rows`` (B, N) bool."""
    kernel = native.fused_kernel() if q.device.type == "cpu" and q.dtype == torch.float32 else None
    if kernel is not None:
        dots, taus, labels = _kernel_variants(list(COUNTERFACTUALS) if counterfactuals else [])
        out, sums, mx = kernel(q, k, v, keep, is_causal, scale, rows, with_output, dots, taus)
        if not labels:
            return out, {ACTUAL: (sums, mx)}
        return out, {label: (sums[i], mx[i]) for i, label in enumerate([ACTUAL, *labels])}
    if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat the key/value heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    fused = maybe_compiled(attention_with_sums, True)
    out, sums, mx = fused(q, k, v, keep, is_causal, scale, rows[:, None, :])
    return out, {ACTUAL: (sums, mx)}
