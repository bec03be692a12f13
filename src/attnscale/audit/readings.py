"""Readings of training evidence that several claims share: the head-dimension study's gaps
(C7, C10, C12, C13) and rivals against scaled dot on text (C6, C11, Q1).

A difference "a − b" of losses is positive when a is worse; comparisons are
:class:`attnscale.audit.interval.Comparison` results of :func:`attnscale.audit.compare.family`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnscale.audit.compare import Pair, family, mean
from attnscale.audit.evidence import HeadDim, LRText
from attnscale.audit.interval import Comparison
from attnscale.audit.verdicts import LOSS_DELTA

UNIT = "unit"  # Vaswani's regime: q and k components of unit variance at init
GPT2 = "gpt2"  # GPT-2's init: weights of std 0.02 behind LayerNorm, q·k ≪ 1 at init
REGIMES = {"unit": "q, k components of unit variance at init (Vaswani's assumption)",
           "gpt2": "GPT-2 init (weights std 0.02 behind LayerNorm: q·k ≪ 1 at init)"}


def cell(init: str, d: Any) -> str:
    """The head-dimension study's cell label."""
    return f"init={init} d_model={d}"


def gap_pairs(ev: HeadDim, init: str, arm: str = "dot") -> dict[str, Pair]:
    """d_k -> (``arm``, scaled_dot) per-seed clipped losses in one init regime."""
    return {str(d): (ev.arm(init, d, arm), ev.arm(init, d, "scaled_dot"))
            for d in ev.head_dims}


def gaps(ev: HeadDim, init: str, arm: str = "dot") -> dict[str, Comparison]:
    """``arm`` − scaled_dot clipped loss at each d_k of one init regime (Holm within)."""
    return family(gap_pairs(ev, init, arm), LOSS_DELTA)


def split(comps: Mapping[str, Comparison], prefix: str) -> dict[str, Comparison]:
    """The comparisons named ``prefix`` + key, keyed by what follows the prefix."""
    return {k[len(prefix):]: c for k, c in comps.items() if k.startswith(prefix)}


def entropy_text(ev: HeadDim, init: str, d: Any) -> str:
    """Layer-1 attention entropy / ln n at init and at the end, dot and scaled_dot, one cell."""
    parts = []
    for arm in ("dot", "scaled_dot"):
        start = mean(ev.arm(init, d, arm, "entropy_init"))
        end = mean(ev.arm(init, d, arm, "entropy_end"))
        parts.append(f"{arm} {start:.2f} → {end:.2f}")
    return f"layer-1 entropy/ln n at d_k={d} ({init} init): " + ", ".join(parts)


def gap_text(comps: Mapping[str, Comparison]) -> str:
    """``d_k=16: +0.01 [...] nats: equal (Holm p …), d_k=64: …``."""
    return ", ".join(f"d_k={d}: {c.effect('nats')}" for d, c in comps.items())


def text_pairs(ev: LRText, rivals: tuple[str, ...], base: str = "scaled_dot"
               ) -> dict[str, Pair]:
    """rival − base clipped loss in every width cell of the LR study."""
    return {f"{cell_}: {r}": (row.get(r), row.get(base))
            for cell_, row in ev.loss.items() for r in rivals if r in row}


def text_evidence(unit: Mapping[str, Any], gpt2: Mapping[str, Any]) -> dict[str, Any]:
    """The text LR study's evidence (:func:`attnscale.audit.evidence.lr_text_evidence`) with
    its GPT-2-init context study's cells added to its tables (their labels name the init)."""
    out = dict(unit)
    for key in ("loss", "sweep", "entropy_init"):
        out[key] = {**unit.get(key, {}), **gpt2.get(key, {})}
    return out
