"""The report's measurements that need no training, and their cache in the results database.

Each ``measure_*`` returns a JSON-ready dict; :func:`measure_all` runs them once per preset and
attnscale version and keeps the answers in the store's ``measurements`` table, so a rerun
reads them back instead of measuring again.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from attnscale.audit.studies import TEXT, Preset
from attnscale.core.attention import attention, reference_attention
from attnscale.lab.store import Store
from attnscale.measure import inspection, jacobian, montecarlo, overhead, theory
from attnscale.measure.stats import attention_stats
from attnscale.util.jsonio import dumps
from attnscale.util.provenance import versions


def measurement_key(kind: str, params: dict[str, Any]) -> str:
    """``kind:`` and the first 16 hex digits of the sha256 of ``params`` as sorted-key JSON."""
    digest = hashlib.sha256(dumps(params, sort_keys=True, default=str).encode()).hexdigest()
    return f"{kind}:{digest[:16]}"


def cached(store: Store, kind: str, params: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """The stored value for (kind, params); on a miss, ``compute()`` stored and returned."""
    key = measurement_key(kind, params)
    value = store.get_measurement(key)
    if value is None:
        value = store.put_measurement(key, compute(), kind=kind, params=params)
    return value


def measure_all(p: Preset, store: Store, say: Callable[[str], None]) -> dict[str, Any]:
    """Every non-training measurement of preset ``p``, from the store when already there."""
    jobs: dict[str, tuple[dict[str, Any], Callable[[], Any]]] = {
        "implementation": ({}, measure_implementation),
        "qk": ({"samples": 20000}, measure_qk),
        "rem": ({"mc": p.mc_samples}, lambda: measure_rem(p)),
        "bench": (dict(p.bench), lambda: overhead.overhead_study(**p.bench)),
        "jacobian": ({"rows": p.jacobian_rows, "law": 1},
                     lambda: jacobian.standard_measurement(rows=p.jacobian_rows)),
        "minilm": ({"sentences": p.inspect_sentences}, lambda: measure_minilm(p)),
        "identity": ({"head_dims": list(p.head_dims), "steps": p.identity_steps},
                     lambda: measure_identity(p)),
    }
    measured = {}
    for kind, (params, compute) in jobs.items():
        say(f"measuring {kind}")
        measured[kind] = cached(store, kind, {**params, "attnscale": versions().get("attnscale")},
                                compute)
    return measured


def measure_implementation() -> dict[str, Any]:
    """C1/C2: attnscale.attention against the float64 reference and torch SDPA."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for causal, mask_kind, gqa in ((False, None, False), (True, None, False),
                                   (False, "bool", False), (True, "float", True)):
        hk = 2 if gqa else 4
        q = torch.randn(2, 4, 33, 16, generator=g)
        k, v = (torch.randn(2, hk, 40, 16, generator=g) for _ in range(2))
        mask = None
        if mask_kind == "bool":
            mask = torch.rand(2, 1, 33, 40, generator=g) > 0.2
            mask[..., 0] = True
        elif mask_kind == "float":
            mask = torch.randn(33, 40, generator=g)
        kw = {"attn_mask": mask, "is_causal": causal, "enable_gqa": gqa}
        ours = attention(q, k, v, **kw)
        ref = reference_attention(q, k, v, **kw)
        sdpa = F.scaled_dot_product_attention(q, k, v, **kw)
        cases.append({"causal": causal, "mask": mask_kind, "gqa": gqa,
                      "err_reference": float((ours - ref).abs().max()),
                      "err_sdpa": float((ours - sdpa).abs().max())})
    # cosine: logits stay in [−τ, τ] whatever the norms of q and k
    max_abs = {}
    for tau in (1.0, 10.0):
        worst = 0.0
        for norm in (1e-3, 1.0, 1e3):
            q = torch.randn(2, 4, 64, 32, generator=g, dtype=torch.float64) * norm
            k = torch.randn(2, 4, 64, 32, generator=g, dtype=torch.float64) / norm
            st = attention_stats(q, k, score="cosine", tau=tau)
            worst = max(worst, float(st.max_abs_logit.max()))
        max_abs[tau] = worst
    q, k, v = (torch.randn(2, 4, 33, 16, generator=g) for _ in range(3))
    cos_err = float((attention(q, k, v, score="cosine", tau=10.0)
                     - reference_attention(q, k, v, score="cosine", tau=10.0)).abs().max())
    return {
        "cases": cases,
        "c1": {"max_err_vs_reference": max(c["err_reference"] for c in cases),
               "max_err_vs_sdpa": max(c["err_sdpa"] for c in cases), "cases": len(cases)},
        "c2": {"max_abs_logit_tau1": max_abs[1.0], "max_abs_logit_tau10": max_abs[10.0],
               "max_err_vs_reference": cos_err},
    }


def measure_qk(samples: int = 20000, seed: int = 0) -> dict[str, Any]:
    """C8/C12: q·k for unit-variance independent components, and its real-init size."""
    rng = np.random.default_rng(seed)
    by_d = []
    for d in (16, 64, 256, 1024):
        dots = np.einsum("ij,ij->i", rng.standard_normal((samples, d)),
                         rng.standard_normal((samples, d)))
        by_d.append({"d": d, "mean": float(dots.mean()),
                     "se_mean": float(dots.std(ddof=1) / math.sqrt(samples)),
                     "std": float(dots.std(ddof=1)),
                     "std_scaled": float((dots / math.sqrt(d)).std(ddof=1))})
    real_init = {str(dm): {score: float(theory.init_logit_std(dm, 64, 0.02, score))
                           for score in ("dot", "scaled_dot")} for dm in (256, 768, 4096)}
    return {"by_d": by_d, "real_init": real_init}


def measure_rem(p: Preset) -> dict[str, Any]:
    """C9/C10: exact finite-n softmax statistics against s, with Monte Carlo checks."""
    curves = []
    for n in (64, 512, 4096):
        sc = float(theory.rem_critical_scale(n))
        s = [round(x, 4) for x in np.linspace(0.1, 3 * sc, 25)]
        curves.append({
            "n": n, "s": s, "s_c": sc,
            "entropy_norm": [float(theory.expected_entropy(n, x)) / math.log(n) for x in s],
            "max_weight": [float(theory.expected_max_weight(n, x)) for x in s],
            "jacobian": [float(theory.rms_jacobian_norm(n, x)) for x in s],
            "at_10_sc": float(theory.rms_jacobian_norm(n, 10 * sc)),
        })
    zs = []
    for n in (64, 512):
        for x in (0.5, 2.0, 4.0, 8.0):
            mc = montecarlo.mc_softmax_stats(n, x, samples=p.mc_samples, seed=1)
            exact = float(theory.expected_entropy(n, x))
            zs.append(abs(mc["entropy"].mean - exact) / max(mc["entropy"].se, 1e-12))
    # measured q/k gradient norms through attention, unscaled vs scaled, d = 64, n = 512
    g = torch.Generator().manual_seed(0)
    norms = {}
    for score in ("dot", "scaled_dot"):
        q, k, v = (torch.randn(4, 4, 512, 64, generator=g, requires_grad=True) for _ in range(3))
        out = attention(q, k, v, score=score)
        out.backward(torch.randn(out.shape, generator=g))
        norms[score] = float(q.grad.norm() + k.grad.norm())
    return {
        "curves": curves,
        "max_abs_z": max(zs),
        "max_weight_unscaled_64_512": float(theory.expected_max_weight(512, 8.0)),
        "max_weight_scaled_64_512": float(theory.expected_max_weight(512, 1.0)),
        "grad_norm": norms,
        "grad_ratio_64": norms["dot"] / norms["scaled_dot"],
    }


def measure_identity(p: Preset) -> dict[str, Any]:
    """C7: the absorbed-scale identity in float64 at every d_k of the head-dimension study
    (unit init, LR 1e-2, seed 0): {"exact": [...], "partial": [...]}, where "partial" (the
    largest d_k only: it is context) leaves Adam's ε and the clip uncorrected
    (:func:`attnscale.lab.identity.absorbed_identity`)."""
    from attnscale.lab.identity import absorbed_identity

    out: dict[str, Any] = {"exact": [], "partial": []}
    steps = p.identity_steps
    for d in p.head_dims:
        config = {**TEXT, "n_heads": 1, "d_model": d, "init": "unit", "lr": 1e-2, "seed": 0,
                  "steps": steps, "warmup_steps": 2}
        for kind in ("exact", "partial") if d == p.head_dims[-1] else ("exact",):
            r = absorbed_identity(config, steps, partial=kind == "partial")
            out[kind].append({k: v for k, v in r.items() if k != "losses"})
    return out


def measure_minilm(p: Preset) -> dict[str, Any]:
    """Q2: all-MiniLM-L6-v2 on the default sentences."""
    result = inspection.inspect_model("minilm", inspection.default_sentences(p.inspect_sentences))
    result["summary"] = inspection.summary(result)
    return result
