"""``attnscale report``: measure every claim, judge it by its printed rule, write one page.

The pipeline:

1. **Measure** what each claim needs: exactness checks, theory and Monte Carlo, the kernel
   benchmark, the MiniLM inspection (each cached in the results database's ``measurements``
   table) and the training studies (run through the sweep runner into the same database, so a
   rerun resumes and skips finished runs).
2. **Collect evidence** per claim from those stored measurements (pure functions of the store).
3. **Judge** each claim with its rule from :mod:`attnscale.audit.claims`.
4. **Write** ``DIR/index.html`` (self-contained: figures embedded, no network requests),
   ``DIR/report.json`` and ``DIR/figures/*.png``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscale.audit import claims as C
from attnscale.util.provenance import git_revision, versions

SCHEMA_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Presets and studies
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """How much to measure. ``standard`` is what ``make report`` runs."""

    name: str
    seeds: tuple[int, ...]
    lrs: tuple[float, ...]
    widths: tuple[int, ...]
    steps: int
    text_steps: int
    head_dims: tuple[int, ...]
    bench_n: tuple[int, ...]
    bench_repeats: int
    mc_samples: int
    inspect_sentences: int
    lr_scores: tuple[str, ...]
    dk_lrs: tuple[float, ...] = (3e-3, 1e-2, 3e-2)


# Every variant the training studies compare: name -> TrainConfig overrides.
VARIANTS: dict[str, dict[str, Any]] = {
    "scaled_dot": {"score": "scaled_dot"},
    "dot": {"score": "dot"},
    "mup": {"score": "mup"},
    "cosine_tau1": {"score": "cosine", "tau": 1.0},
    "cosine_tau10": {"score": "cosine", "tau": 10.0},
    "cosine_learned": {"score": "cosine", "temperature": "swin"},
    "qk_layernorm": {"score": "qk_layernorm"},
    "qk_rmsnorm": {"score": "qk_rmsnorm"},
    "softcap": {"score": "softcap", "cap": 5.0},
    "log_length": {"score": "log_length"},
}

ALL_VARIANTS = tuple(VARIANTS)

PRESETS: dict[str, Preset] = {
    # For the tests: every stage runs, nothing is learned. Not offered on the command line.
    "tiny": Preset("tiny", seeds=(0,), lrs=(1e-2,), widths=(16,), steps=8, text_steps=8,
                   head_dims=(8, 16), bench_n=(64,), bench_repeats=1, mc_samples=100,
                   inspect_sentences=2, lr_scores=("scaled_dot", "dot", "cosine_tau1",
                                                   "cosine_tau10", "cosine_learned",
                                                   "qk_layernorm"), dk_lrs=(1e-2,)),
    "quick": Preset("quick", seeds=(0,), lrs=(3e-3, 3e-2), widths=(32,), steps=150,
                    text_steps=150, head_dims=(8, 32), bench_n=(256, 1024), bench_repeats=2,
                    mc_samples=300, inspect_sentences=8,
                    lr_scores=("scaled_dot", "dot", "cosine_tau1", "cosine_tau10",
                               "cosine_learned", "qk_layernorm"), dk_lrs=(1e-2,)),
    "standard": Preset("standard", seeds=(0, 1), lrs=(3e-3, 1e-2, 3e-2, 1e-1),
                       widths=(32, 64), steps=300, text_steps=250, head_dims=(8, 32, 64),
                       bench_n=(256, 1024), bench_repeats=3, mc_samples=1000,
                       inspect_sentences=64, lr_scores=ALL_VARIANTS, dk_lrs=(3e-3, 1e-2)),
    "full": Preset("full", seeds=(0, 1, 2), lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
                   widths=(64, 128), steps=1500, text_steps=1000, head_dims=(8, 32, 128),
                   bench_n=(256, 1024, 2048), bench_repeats=3, mc_samples=3000,
                   inspect_sentences=256, lr_scores=ALL_VARIANTS, dk_lrs=(1e-3, 3e-3, 1e-2)),
}

# The thread's alternatives, the modern ones and the baseline, for the MQAR accuracy study.
MQAR_VARIANTS = ("scaled_dot", "dot", "cosine_tau1", "cosine_tau10", "cosine_learned")
# MQAR in Zoology's layout with 4 pairs and a 256-token vocabulary; an attention-only 2-layer,
# 1-head model sits at chance for a seed-dependent 200-1300 steps, then jumps to ~100% (the
# training lab's calibration at lr 1e-3; at lr 3e-3 and 1e-2 neither seed left chance in 1000
# steps). The standard preset gives it 1500 steps.
MQAR = {"task": "mqar", "seq_len": 64, "num_kv_pairs": 4, "vocab_size": 256, "n_layers": 2,
        "n_heads": 1, "d_model": 128, "mlp": False, "batch_size": 32}
MQAR_STEPS = {"tiny": 8, "quick": 200, "standard": 1500, "full": 3000}
TEXT = {"task": "text", "seq_len": 64, "n_heads": 2, "n_layers": 2, "batch_size": 16}


def study_specs(p: Preset) -> dict[str, dict[str, Any]]:
    """The training studies of preset ``p`` as sweep specs ({name, base, axes, variant}).

    lr_text: every score × LR grid × seed on char-level text at the wider width (C6, C12, Q1),
    lr_text_narrow: the same at the narrower widths, one seed (C11 compares widths);
    lr_mqar: cosine variants and baselines on MQAR (C4, C6); salience (C3), in the "items" layout
    (the answer is the attended token itself, so no induction circuit is needed and 300 steps
    learn it; the "pairs" layout stayed at chance at this budget); head_dim: unscaled
    vs scaled over d_k at one head (C7, C13); length: train at n, test at 2n, 4n (Q3).
    """
    def variants(names):
        return [{"name": n, **VARIANTS[n]} for n in names]

    warm = min(25, p.steps // 4)
    log = max(1, min(50, p.steps // 4))
    run = {"steps": p.steps, "warmup_steps": warm, "log_every": log}
    text_run = {"steps": p.text_steps, "warmup_steps": min(25, p.text_steps // 4),
                "log_every": max(1, min(50, p.text_steps // 4))}
    mqar_scores = [v for v in MQAR_VARIANTS if v in p.lr_scores]
    mqar_steps = MQAR_STEPS.get(p.name, p.steps)
    two_seeds = list(p.seeds) + [s + 10 for s in p.seeds]
    wide, narrow = p.widths[-1], p.widths[:-1]
    specs = {
        "lr_text": {"name": "lr_text", "base": {**TEXT, **text_run, "d_model": wide},
                    "axes": {"lr": list(p.lrs), "seed": list(p.seeds)},
                    "variant": variants(p.lr_scores)},
        "lr_mqar": {"name": "lr_mqar",
                    "base": {**MQAR, "steps": mqar_steps, "warmup_steps": min(100, mqar_steps // 4),
                             "log_every": max(1, min(100, mqar_steps // 4)), "lr": 1e-3},
                    "axes": {"seed": list(p.seeds)},
                    "variant": variants(mqar_scores)},
        "salience": {"name": "salience",
                     "base": {"task": "salience", "layout": "items", "d_model": p.widths[-1],
                              "n_heads": 2, "n_layers": 2, "batch_size": 32, "lr": 3e-3, **run},
                     "axes": {"seed": two_seeds},
                     "variant": variants(("scaled_dot", "cosine_tau1", "cosine_tau10",
                                          "cosine_learned"))},
        "head_dim": {"name": "head_dim", "base": {**TEXT, **text_run, "n_heads": 1},
                     "axes": {"d_model": list(p.head_dims), "lr": list(p.dk_lrs),
                              "seed": list(p.seeds)},
                     "variant": variants(("scaled_dot", "dot"))},
        "length": {"name": "length",
                   "base": {"task": "length", "seq_len": 32, "pos": "none", "d_model": 64,
                            "n_heads": 2, "n_layers": 2, "batch_size": 32, "lr": 3e-3, **run},
                   "axes": {"seed": two_seeds},
                   "variant": variants(("scaled_dot", "log_length"))},
    }
    if narrow:  # the second width of the LR sweep (C11), one seed
        specs["lr_text_narrow"] = {
            "name": "lr_text_narrow", "base": {**TEXT, **text_run},
            "axes": {"lr": list(p.lrs), "d_model": list(narrow), "seed": list(p.seeds[:1])},
            "variant": variants(p.lr_scores)}
    return specs


# ---------------------------------------------------------------------------------------------
# Cached measurements (theory, benchmarks, inspection) in the results database
# ---------------------------------------------------------------------------------------------


class MeasurementCache:
    """A ``measurements`` table beside the runs: key -> JSON value with its provenance."""

    def __init__(self, db: str | Path) -> None:
        self.conn = sqlite3.connect(str(db), timeout=30, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS measurements (key TEXT PRIMARY KEY, kind TEXT, "
            "params TEXT, value TEXT, created REAL, versions TEXT, git_rev TEXT)"
        )

    def get_or_compute(self, kind: str, params: dict[str, Any], fn: Callable[[], Any]) -> Any:
        """The stored value for (kind, params), computing and storing it on a miss."""
        key = kind + ":" + hashlib.sha256(
            json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]
        row = self.conn.execute("SELECT value FROM measurements WHERE key = ?", (key,)).fetchone()
        if row is not None:
            return json.loads(row[0])
        value = _jsonable(fn())
        self.conn.execute(
            "INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key, kind, json.dumps(params, sort_keys=True, default=str), json.dumps(value),
             time.time(), json.dumps(versions()), git_revision()),
        )
        return value

    def close(self) -> None:
        self.conn.close()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# ---------------------------------------------------------------------------------------------
# Measurements that need no training
# ---------------------------------------------------------------------------------------------


def measure_implementation() -> dict[str, Any]:
    """C1/C2: attnscale.attention against the float64 reference and torch SDPA."""
    import torch
    import torch.nn.functional as F

    from attnscale.core.attention import attention, reference_attention
    from attnscale.measure.stats import attention_stats

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


def measure_bench(p: Preset) -> dict[str, Any]:
    """C5: every score against SDPA at the largest N; cosine and scaled_dot at every N
    (B=8, H=8, D=64, float32, fwd+bwd)."""
    from attnscale.measure import bench

    rows, facts = bench.run(n_values=p.bench_n[-1:], causal_values=(False,),
                            repeats=p.bench_repeats, naive=False)
    if len(p.bench_n) > 1:
        more, _ = bench.run(n_values=p.bench_n[:-1], causal_values=(False,),
                            scores=("scaled_dot", "cosine"), repeats=p.bench_repeats,
                            naive=False)
        rows = more + rows
    return {"rows": [r.to_dict() for r in rows], "facts": facts}


def measure_qk(samples: int = 20000, seed: int = 0) -> dict[str, Any]:
    """C8/C12: q·k for unit-variance independent components, and its real-init size."""
    from attnscale.measure import theory

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
    import torch

    from attnscale.measure import montecarlo, theory

    curves = []
    for n in (64, 512, 4096):
        sc = float(theory.rem_critical_scale(n))
        s = [round(x, 4) for x in np.linspace(0.1, 3 * sc, 25)]
        curves.append({
            "n": n, "s": s, "s_c": sc,
            "entropy_norm": [float(theory.expected_entropy(n, x)) / math.log(n) for x in s],
            "max_weight": [float(theory.expected_max_weight(n, x)) for x in s],
            "jacobian": [float(theory.expected_jacobian_norm(n, x)) for x in s],
            "at_10_sc": float(theory.expected_jacobian_norm(n, 10 * sc)),
        })
    zs = []
    for n in (64, 512):
        for x in (0.5, 2.0, 4.0, 8.0):
            mc = montecarlo.mc_softmax_stats(n, x, samples=p.mc_samples, seed=1)
            exact = float(theory.expected_entropy(n, x))
            zs.append(abs(mc["entropy"].mean - exact) / max(mc["entropy"].se, 1e-12))
    # measured q/k gradient norms through attention, unscaled vs scaled, d = 64, n = 512
    from attnscale.core.attention import attention

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


def measure_minilm(p: Preset) -> dict[str, Any]:
    """Q2: all-MiniLM-L6-v2 on the default sentences."""
    from attnscale.measure import inspection

    result = inspection.inspect_model("minilm", inspection.default_sentences(p.inspect_sentences))
    result["summary"] = inspection.summary(result)
    return result


# ---------------------------------------------------------------------------------------------
# Evidence from training runs
# ---------------------------------------------------------------------------------------------


def _ci(values) -> dict[str, Any]:
    from attnscale.lab.analysis import mean_ci

    m = mean_ci(values)
    return {"mean": m.mean, "lo": m.low, "hi": m.high, "n": m.n}


def _runs(store, sweep: str) -> list[dict]:
    return [r for r in store.runs(where={"sweep": sweep}, history=True)
            if r["status"] in ("done", "diverged")]


def _best_lr_ci(runs: list[dict], value: str = "final_loss") -> tuple[dict, float]:
    """Mean ± CI over seeds at the LR whose mean clipped loss is lowest (Wortsman's best)."""
    from attnscale.lab import analysis

    _, best_lr = analysis.best_loss(runs)
    at = [r for r in runs if r["config"]["lr"] == best_lr]
    losses0 = [x for x in (analysis.initial_loss(r) for r in runs) if x is not None]
    loss0 = max(losses0) if losses0 else math.inf
    vals = [analysis.clipped_loss(r, loss0) if value == "final_loss" else r[value] for r in at]
    return _ci(vals), best_lr


def evidence_lr(store) -> dict[str, Any]:
    """C4 (training), C6, C11, Q1 from the LR sweeps."""
    from attnscale.lab import analysis

    out: dict[str, Any] = {"best_loss": {}, "by_width": {}, "by_task": {}, "accuracy": {},
                           "runs": []}
    for task, sweep in (("mqar", "lr_mqar"), ("text", "lr_text")):
        runs = _runs(store, sweep)
        out["runs"] += [r["id"] for r in runs]
        widest = max((r["config"]["d_model"] for r in runs), default=None)
        groups = analysis.group_runs([r for r in runs if r["config"]["d_model"] == widest])
        out["best_loss"][task] = {}
        if len({r["config"]["lr"] for r in runs}) > 1:  # LR sensitivity needs an LR grid (Q1)
            out["by_task"][task] = {}
        for (name,), rs in groups.items():
            loss, best_lr = _best_lr_ci(rs)
            out["best_loss"][task][name] = loss
            if task == "mqar":
                out["accuracy"][name] = _ci(r["final_metric"] or 0.0 for r in rs
                                            if r["config"]["lr"] == best_lr)
            if task not in out["by_task"]:
                continue
            out["by_task"][task][name] = {"best_loss": loss, "best_lr": best_lr,
                                          "lr_sensitivity": analysis.lr_sensitivity(rs),
                                          "divergence_rate": analysis.divergence_rate(rs) or 0.0,
                                          "stable_lrs": analysis.stable_lrs(rs)}
        if task == "text":
            out["by_width"] = _by_width(runs + _runs(store, "lr_text_narrow"))
    return out


def _by_width(runs: list[dict]) -> dict[str, dict[str, Any]]:
    """Wortsman's metrics per width and score (C11)."""
    from attnscale.lab import analysis

    out: dict[str, dict[str, Any]] = {}
    for (w, name), rs in analysis.group_runs(runs, by=["d_model"]).items():
        stable = analysis.stable_lrs(rs)
        out.setdefault(str(w), {})[name] = {
            "divergence_rate": analysis.divergence_rate(rs) or 0.0,
            "max_stable_lr": max(stable) if stable else None,
            "lr_sensitivity": analysis.lr_sensitivity(rs),
            "loss_by_lr": {str(k): v for k, v in analysis.loss_by_lr(rs).items()},
            "divergence_by_lr": {str(k): v for k, v in analysis.divergence_by_lr(rs).items()},
            "peak_max_logit": max((v for v in (analysis.peak_max_logit(r) for r in rs)
                                   if v is not None), default=None),
        }
    return out


def evidence_trained_logits(store, n: int) -> dict[str, Any]:
    """C12: scaled_dot's max |logit| at the end of training, at its best LR (per width), and
    its growth from the first logged step."""
    from attnscale.lab import analysis

    runs = [r for r in _runs(store, "lr_text") if r.get("variant") == "scaled_dot"]
    finals, growth, used = [], [], []
    for (_, _), rs in analysis.group_runs(runs, by=["d_model"]).items():
        _, best_lr = analysis.best_loss(rs)
        for r in rs:
            curve = analysis.max_logit_curve(r)
            if r["config"]["lr"] != best_lr or not curve:
                continue
            finals.append(curve[-1][1])
            growth.append(curve[-1][1] / max(curve[0][1], 1e-9))
            used.append(r["id"])
    all_peaks = [v for v in (analysis.peak_max_logit(r) for r in runs) if v is not None]
    return {"trained_max_abs_logit": max(finals) if finals else float("nan"),
            "growth": float(np.median(growth)) if growth else float("nan"), "n": n,
            "max_over_lr_grid": max(all_peaks) if all_peaks else None, "runs": used}


def evidence_salience(store) -> dict[str, Any]:
    runs = _runs(store, "salience")
    acc: dict[str, list[float]] = {}
    for r in runs:
        acc.setdefault(r["variant"], []).append(r["final_metric"] or 0.0)
    from attnscale.lab.tasks import make_task

    return {"accuracy": {k: _ci(v) for k, v in acc.items()},
            "chance": float(make_task("salience").chance_level),
            "runs": [r["id"] for r in runs]}


def evidence_head_dim(store) -> dict[str, Any]:
    from attnscale.lab import analysis

    runs = _runs(store, "head_dim")
    out: dict[str, Any] = {"best_loss": {}, "runs": [r["id"] for r in runs]}
    for (dk, name), rs in analysis.group_runs(runs, by=["d_model"]).items():
        out["best_loss"].setdefault(str(dk), {})[name] = _best_lr_ci(rs)[0]
    return out


def evidence_length(store) -> dict[str, Any]:
    runs = _runs(store, "length")
    acc: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        per = r.get("final_metrics") or {}
        for key, value in per.items():
            if key.startswith("n="):
                metric = value.get("metric") if isinstance(value, dict) else value
                acc.setdefault(r["variant"], {}).setdefault(key, []).append(metric or 0.0)
    from attnscale.lab.tasks import make_task

    return {"accuracy": {v: {k: _ci(x) for k, x in d.items()} for v, d in acc.items()},
            "chance": float(make_task("length").chance_level),
            "runs": [r["id"] for r in runs]}


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclass
class ReportState:
    preset: Preset
    out: Path
    db: Path
    measured: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, list[str]] = field(default_factory=dict)


def measure_all(state: ReportState, say: Callable[[str], None]) -> None:
    """Every non-training measurement, from the cache when already stored."""
    p = state.preset
    cache = MeasurementCache(state.db)
    try:
        jobs = {
            "implementation": ({}, measure_implementation),
            "qk": ({"samples": 20000}, measure_qk),
            "rem": ({"mc": p.mc_samples}, lambda: measure_rem(p)),
            "bench": ({"n": p.bench_n, "repeats": p.bench_repeats}, lambda: measure_bench(p)),
            "minilm": ({"sentences": p.inspect_sentences}, lambda: measure_minilm(p)),
        }
        for kind, (params, fn) in jobs.items():
            say(f"measuring {kind}")
            state.measured[kind] = cache.get_or_compute(
                kind, {**params, "attnscale": versions().get("attnscale")}, fn)
    finally:
        cache.close()


def run_studies(state: ReportState, executor: str, workers: int, address: str | None,
                progress: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Run (or resume) every training study of the preset into the results database."""
    from attnscale.lab.sweep import SweepSpec, run_sweep

    counts = {}
    for name, spec in study_specs(state.preset).items():
        sweep_spec = SweepSpec(**spec)
        counts[name] = run_sweep(
            sweep_spec, state.db, workers=workers, executor=executor, address=address,
            source=f"report:{name}",
            progress=(lambda c, name=name: progress(name, c)) if progress else None,
        )
    return counts


def collect_evidence(state: ReportState) -> None:
    """Per-claim evidence dicts from the stored measurements and runs."""
    from attnscale.measure import theory
    from attnscale.lab.store import Store

    m = state.measured
    with Store(state.db) as store:
        lr = evidence_lr(store)
        sal = evidence_salience(store)
        dk = evidence_head_dim(store)
        length = evidence_length(store)
        trained = evidence_trained_logits(store, n=TEXT["seq_len"])
    bench_rows = m["bench"]["rows"]
    ratio = {}
    for n in sorted({r["n"] for r in bench_rows}):
        t = {r["score"]: r["fwdbwd_ms"] for r in bench_rows if r["n"] == n and not r["causal"]}
        ratio[str(n)] = t["cosine"] / t["scaled_dot"]
    mqar_n = MQAR["seq_len"]  # keys a query sees at most in the MQAR study
    state.evidence = {
        "C1": m["implementation"]["c1"],
        "C2": m["implementation"]["c2"],
        "C3": sal,
        "C4": {"accuracy": {k: v for k, v in lr["accuracy"].items()
                            if k == "scaled_dot" or k.startswith("cosine")},
               "max_weight_bound": float(theory.max_weight_bound(mqar_n, 1.0)), "n": mqar_n,
               "chance": 1 / MQAR["num_kv_pairs"],
               "runs": lr["runs"]},
        "C5": {"ratio_by_n": ratio},
        "C6": {"best_loss": lr["best_loss"], "runs": lr["runs"]},
        "C7": dk,
        "C8": m["qk"],
        "C9": m["rem"],
        "C10": m["rem"],
        "C11": {"by_width": lr["by_width"], "runs": lr["runs"]},
        "C12": {"init_std_scaled": {str(r["d"]): r["std_scaled"] for r in m["qk"]["by_d"]},
                **trained},
        "C13": dk,
        "Q1": {"by_task": lr["by_task"], "runs": lr["runs"]},
        "Q2": {"summary": m["minilm"]["summary"],
               "max_abs_logit": max(h["max_abs_logit"] for layer in m["minilm"]["layers"]
                                    for h in layer["heads"])},
        "Q3": length,
    }


def judge_all(state: ReportState) -> tuple[list[dict], list[dict]]:
    """Verdicts for every claim and question, as report.json entries."""
    def entry(claim: C.Claim) -> dict[str, Any]:
        ev = state.evidence[claim.id]
        try:
            v = claim.judge(ev)
            verdict, rule, because, numbers = v.verdict, v.rule, v.because, v.numbers
        except (KeyError, ValueError, ZeroDivisionError, TypeError) as e:
            # Missing measurements (e.g. every run of a study failed): say so, judge nothing.
            verdict, rule, numbers = C.DEPENDS, claim.rule, {}
            because = f"inconclusive: not enough data to apply the rule ({e!r})"
        return {
            "id": claim.id, "claim": claim.text, "measures": claim.measures,
            "verdict": verdict, "rule": rule, "because": because,
            "thread_wrong": claim.thread_wrong if verdict != C.SUPPORTED else "",
            "evidence": _jsonable({k: v for k, v in ev.items() if k != "runs"}),
            "numbers": _jsonable(numbers),
            "figures": state.figures.get(claim.id, []),
            "runs": list(ev.get("runs", [])),
        }

    return [entry(c) for c in C.CLAIMS], [entry(q) for q in C.QUESTIONS]


def render_html(report: dict[str, Any], explorer_html: str) -> str:
    """The self-contained page: jinja2 with autoescaping, figures as data: URIs."""
    from jinja2 import Environment, PackageLoader, select_autoescape
    from markupsafe import Markup

    env = Environment(loader=PackageLoader("attnscale.audit", "templates"),
                      autoescape=select_autoescape(["html"]))
    def prepare(entry: dict[str, Any]) -> dict[str, Any]:
        figs = [{"name": Path(f).name, "uri": _data_uri(f)} for f in entry["figures"]
                if Path(f).exists()]
        return {**entry, "figure_data": figs,
                "evidence_json": json.dumps(entry["evidence"], indent=1, default=str)[:20000]}

    return env.get_template("report.html").render(
        claims=[prepare(c) for c in report["claims"]],
        questions=[prepare(q) for q in report["questions"]],
        preset=report["preset"], git_rev=report["git_rev"], versions=report["versions"],
        versions_json=json.dumps(report["versions"]), elapsed_s=report["elapsed_s"],
        n_runs=report["n_runs"], bench_rows=report["bench"],
        explorer=Markup(explorer_html),  # built by attnscale.audit.explorer with its own escaping
    )


def _data_uri(path: str) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def _explorer_fragment(db: Path) -> str:
    """The interactive explorer, its theory grids cached like every other measurement."""
    from attnscale.audit import explorer

    cache = MeasurementCache(db)
    try:
        data = cache.get_or_compute("explorer", {"attnscale": versions().get("attnscale")},
                                    explorer.explorer_data)
    finally:
        cache.close()
    return explorer.render_explorer(data)


def build_report(
    preset: str = "standard",
    out: str | Path = "report",
    db: str | Path | None = None,
    executor: str = "local",
    workers: int = 2,
    address: str | None = None,
    say: Callable[[str], None] = lambda msg: None,
    progress: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """Measure, judge and write the report; returns the report.json content."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    started = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = ReportState(PRESETS[preset], out, Path(db) if db else out / "results.db")
    measure_all(state, say)
    say("training studies")
    run_studies(state, executor, workers, address, progress)
    say("judging")
    collect_evidence(state)
    from attnscale.audit import figures

    state.figures = figures.draw_all(state.evidence, state.measured, out / "figures",
                                     state.measured["minilm"])
    claims, questions = judge_all(state)
    from attnscale.lab.store import Store

    with Store(state.db) as store:
        n_runs = sum(store.counts().values())
    report = {
        "schema_version": SCHEMA_VERSION,
        "preset": preset,
        "claims": claims,
        "questions": questions,
        "versions": versions(),
        "git_rev": git_revision(),
        "n_runs": n_runs,
        "bench": state.measured["bench"]["rows"],
        "elapsed_s": time.perf_counter() - started,
    }
    report = _jsonable(report)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "index.html").write_text(render_html(report, _explorer_fragment(state.db)))
    return report
