"""C1: "Attention is softmax(QKᵀ/√d_k)V" (Vaswani et al. 2017, arXiv 1706.03762, §3.2.1).

Measures attnscale's ``scaled_dot`` against the float64 formula and torch SDPA over masks,
causal attention and GQA; supported when every error is under 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import Patch

from attnscale.audit.claim import Claim, Figure, Measurement, Sources, register
from attnscale.audit.evidence import Model
from attnscale.audit.theory_plots import outside, save
from attnscale.audit.verdicts import REFUTED, SUPPORTED, Verdict
from attnscale.core.attention import attention, reference_attention

TOLERANCE = 1e-5
RULE = ("supported if attnscale.attention(score='scaled_dot') matches softmax(QKᵀ/√d)V "
        "(the float64 reference) and torch SDPA within 1e-5 on every tested case; else refuted")


class Case(Model):
    """One tested case and its largest absolute errors."""

    causal: bool
    mask: str | None
    gqa: bool
    err_reference: float
    err_sdpa: float


class Evidence(Model):
    """Every tested case (float32 on CPU)."""

    cases: list[Case]

    def worst(self) -> float:
        """The largest error against either reference."""
        return max(max(c.err_reference, c.err_sdpa) for c in self.cases)


def measure(preset: Any = None) -> dict[str, Any]:
    """attnscale.attention against the float64 reference and torch SDPA, four cases."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for causal, mask_kind, gqa in ((False, None, False), (True, None, False),
                                   (False, "bool", False), (True, "float", True)):
        q = torch.randn(2, 4, 33, 16, generator=g)
        k, v = (torch.randn(2, 2 if gqa else 4, 40, 16, generator=g) for _ in range(2))
        mask = None
        if mask_kind == "bool":
            mask = torch.rand(2, 1, 33, 40, generator=g) > 0.2
            mask[..., 0] = True
        elif mask_kind == "float":
            mask = torch.randn(33, 40, generator=g)
        kw = {"attn_mask": mask, "is_causal": causal, "enable_gqa": gqa}
        ours = attention(q, k, v, **kw)
        cases.append({"causal": causal, "mask": mask_kind, "gqa": gqa,
                      "err_reference": float((ours - reference_attention(q, k, v, **kw))
                                             .abs().max()),
                      "err_sdpa": float((ours - F.scaled_dot_product_attention(q, k, v, **kw))
                                        .abs().max())})
    return {"cases": cases}


def judge(ev: Evidence) -> Verdict:
    """The largest error of attention against the float64 reference and SDPA."""
    if not ev.cases:
        raise ValueError("C1: no case was tested")
    err, n = ev.worst(), len(ev.cases)
    ok = err < TOLERANCE
    plain = [f"attnscale's scaled_dot matches the formula softmax(QKᵀ/√d_k)V and PyTorch's SDPA "
             f"to {err:.1e} over {n} cases (masks, causal, GQA)."
             if ok else f"attnscale's scaled_dot is {err:.1e} from the formula: a bug."]
    return Verdict(SUPPORTED if ok else REFUTED, RULE,
                   f"max abs error {err:.2e} over {n} cases (masks, causal, GQA, float32)",
                   {"max_abs_error": err},
                   headline=f"{'supported' if ok else 'refuted'}: max error {err:.1e}",
                   plain=plain, regime="float32 on CPU", smallest="1e-5 absolute")


def alt(cases: list[Mapping[str, Any]]) -> str:
    """The largest error against the float64 formula and against torch SDPA."""
    ref = max(c["err_reference"] for c in cases)
    sdpa = max(c["err_sdpa"] for c in cases)
    vs_sdpa = ("is bitwise equal to torch SDPA" if sdpa == 0 else
               f"is within {sdpa:.1e} of torch SDPA")
    return (f"Over {len(cases)} cases (causal, masked, GQA) attnscale's scaled_dot is within "
            f"{ref:.1e} of the float64 formula softmax(QKᵀ/√d_k)V, "
            f"{TOLERANCE / max(ref, 1e-30):.0f}× under the 1e-5 tolerance, and {vs_sdpa}.")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Max |error| per tested case against the float64 reference and torch SDPA; an exact
    zero is written "0 (exact)" at the axis floor, never drawn as a tiny bar."""
    cases = ev["cases"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    errs = [c[k] for c in cases for k in ("err_reference", "err_sdpa") if c[k] > 0]
    floor = 10.0 ** (math.floor(math.log10(min(errs, default=1e-7))) - 2)
    handles: list[Any] = []
    for j, (key, label) in enumerate((("err_reference", "vs float64 reference"),
                                      ("err_sdpa", "vs torch SDPA"))):
        for i, c in enumerate(cases):
            x = i + (j - 0.5) * 0.4
            if c[key] > 0:
                ax.bar(x, c[key] - floor, 0.38, bottom=floor, color=f"C{j}")
            else:
                ax.text(x, floor * 1.6, "0 (exact)", rotation=90, ha="center", va="bottom",
                        fontsize=8, color=f"C{j}")
        handles.append(Patch(color=f"C{j}", label=label))
    handles.append(ax.axhline(TOLERANCE, color="red", ls=":", label="tolerance $10^{-5}$"))
    ax.set(yscale="log", ylim=(floor, 1e-4), xlim=(-0.6, len(cases) - 0.4),
           ylabel="max |error|, float32")
    labels = [f"{'causal' if c['causal'] else 'full'}, {c['mask'] or 'no'} mask"
              f"{', GQA' if c['gqa'] else ''}" for c in cases]
    ax.set_xticks(range(len(cases)), labels, fontsize=8)
    ax.set_title(f"C1: attnscale.attention(score='scaled_dot') against "
                 rf"$\mathrm{{softmax}}(QK^\top/\sqrt{{d_k}})V$, {len(cases)} cases", fontsize=10)
    outside(ax, handles=handles)
    return [save(fig, folder, "c1_exactness", alt(cases))]


def gather(src: Sources) -> dict[str, Any]:
    return src.measured["exactness"]


CLAIM = register(Claim(
    id="C1", text="Attention is softmax(QKᵀ/√d_k)V.",
    measures="exactness against a float64 reference", rule=RULE, evidence=Evidence,
    gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("exactness", lambda p: {}, measure),),
    scale=lambda p: "float32 on CPU, small shapes with masks, causal and GQA"))
