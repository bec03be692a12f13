"""Evidence: per-claim dicts of numbers, built from the stored runs and measurements.

Pure functions of the results store (and the measurements already read from it). Every
learning-rate number (clipped loss, best LR, LR sensitivity, stable LRs, divergence rate) comes
from :mod:`attnscale.lab.analysis`, which follows Wortsman et al. 2023 (arXiv 2309.14322); a
"mean ± CI" is :meth:`attnscale.lab.analysis.MeanCI.to_dict`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscale.audit.studies import MQAR, TEXT
from attnscale.lab import analysis
from attnscale.lab.store import FINISHED, Store
from attnscale.lab.sweep import is_current
from attnscale.lab.tasks import make_task
from attnscale.measure import theory

Run = dict[str, Any]


def finished_runs(store: Store, sweep: str) -> list[Run]:
    """The finished runs of one study that belong to its current grid, with their histories
    (a results database reused across code versions may hold stale runs: see
    :func:`attnscale.lab.sweep.is_current`)."""
    runs = store.runs(where={"sweep": sweep}, history=True, status=FINISHED)
    return [r for r in runs if is_current(r)]


def score_row(runs: list[Run]) -> dict[str, Any]:
    """One score's numbers over an LR grid: best-LR loss (mean ± CI), best LR, LR sensitivity,
    divergence rate and stable LRs."""
    best, best_lr = analysis.best_loss_ci(runs)
    return {"best_loss": best.to_dict(), "best_lr": best_lr,
            "lr_sensitivity": analysis.lr_sensitivity(runs),
            "divergence_rate": analysis.divergence_rate(runs) or 0.0,
            "stable_lrs": analysis.stable_lrs(runs)}


def evidence_lr(store: Store) -> dict[str, Any]:
    """C4 (training), C6, C11, Q1 from the LR sweeps on MQAR and text, at the widest width."""
    out: dict[str, Any] = {"best_loss": {}, "by_width": {}, "by_task": {}, "accuracy": {},
                           "runs": []}
    for task, sweep in (("mqar", "lr_mqar"), ("text", "lr_text")):
        runs = finished_runs(store, sweep)
        out["runs"] += [r["id"] for r in runs]
        widest = max((r["config"]["d_model"] for r in runs), default=None)
        groups = analysis.group_runs([r for r in runs if r["config"]["d_model"] == widest])
        swept = len({r["config"]["lr"] for r in runs}) > 1  # LR sensitivity needs a grid (Q1)
        out["best_loss"][task] = {}
        if swept:
            out["by_task"][task] = {}
        for (name,), rs in groups.items():
            row = score_row(rs)
            out["best_loss"][task][name] = row["best_loss"]
            if task == "mqar":
                at_best = [r for r in rs if r["config"]["lr"] == row["best_lr"]]
                out["accuracy"][name] = analysis.metric_ci(at_best).to_dict()
            if swept:
                out["by_task"][task][name] = row
        if task == "text":
            out["by_width"] = by_width(runs + finished_runs(store, "lr_text_narrow"))
    return out


def by_width(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Wortsman's metrics per width and score (C11)."""
    out: dict[str, dict[str, Any]] = {}
    for (w, name), rs in analysis.group_runs(runs, by=["d_model"]).items():
        stable = analysis.stable_lrs(rs)
        peaks = [v for v in map(analysis.peak_max_logit, rs) if v is not None]
        out.setdefault(str(w), {})[name] = {
            "divergence_rate": analysis.divergence_rate(rs) or 0.0,
            "max_stable_lr": max(stable) if stable else None,
            "lr_sensitivity": analysis.lr_sensitivity(rs),
            "loss_by_lr": {str(k): v for k, v in analysis.loss_by_lr(rs).items()},
            "divergence_by_lr": {str(k): v for k, v in analysis.divergence_by_lr(rs).items()},
            "peak_max_logit": max(peaks, default=None),
        }
    return out


def evidence_trained_logits(store: Store, n: int) -> dict[str, Any]:
    """C12: scaled_dot's max |logit| at the end of training, at its best LR (per width), and
    its growth from the first logged step."""
    runs = [r for r in finished_runs(store, "lr_text") if r.get("variant") == "scaled_dot"]
    finals, growth, used = [], [], []
    for _, rs in analysis.group_runs(runs, by=["d_model"]).items():
        _, best_lr = analysis.best_loss(rs)
        for r in rs:
            curve = analysis.max_logit_curve(r)
            if r["config"]["lr"] != best_lr or not curve:
                continue
            finals.append(curve[-1][1])
            growth.append(curve[-1][1] / max(curve[0][1], 1e-9))
            used.append(r["id"])
    peaks = [v for v in map(analysis.peak_max_logit, runs) if v is not None]
    return {"trained_max_abs_logit": max(finals) if finals else float("nan"),
            "growth": float(np.median(growth)) if growth else float("nan"), "n": n,
            "max_over_lr_grid": max(peaks, default=None), "runs": used}


def evidence_salience(store: Store) -> dict[str, Any]:
    """C3: final accuracy per variant on the salience task, mean ± CI over seeds."""
    runs = finished_runs(store, "salience")
    groups = analysis.group_runs(runs)  # by variant: every study run has one
    return {"accuracy": {k: analysis.metric_ci(rs).to_dict() for (k,), rs in groups.items()},
            "chance": float(make_task("salience").chance_level),
            "runs": [r["id"] for r in runs]}


def evidence_head_dim(store: Store) -> dict[str, Any]:
    """C7, C13: best-LR loss (mean ± CI) of scaled and unscaled attention per head dim."""
    runs = finished_runs(store, "head_dim")
    out: dict[str, Any] = {"best_loss": {}, "runs": [r["id"] for r in runs]}
    for (dk, name), rs in analysis.group_runs(runs, by=["d_model"]).items():
        out["best_loss"].setdefault(str(dk), {})[name] = analysis.best_loss_ci(rs)[0].to_dict()
    return out


def evidence_length(store: Store) -> dict[str, Any]:
    """Q3: accuracy per variant at each evaluation length ``n=...``, mean ± CI over seeds."""
    runs = finished_runs(store, "length")
    acc: dict[str, dict[str, list[float]]] = {}
    for (variant,), rs in analysis.group_runs(runs).items():  # by variant, as in every study
        for r in rs:
            for key, value in (r.get("final_metrics") or {}).items():
                if key.startswith("n="):
                    metric = value.get("metric") if isinstance(value, dict) else value
                    acc.setdefault(variant, {}).setdefault(key, []).append(metric or 0.0)
    return {"accuracy": {v: {k: analysis.mean_ci(x).to_dict() for k, x in d.items()}
                         for v, d in acc.items()},
            "chance": float(make_task("length").chance_level),
            "runs": [r["id"] for r in runs]}


def bench_ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """C5: cosine / scaled_dot forward+backward time at each N (non-causal)."""
    ratio = {}
    for n in sorted({r["n"] for r in rows}):
        t = {r["score"]: r["fwdbwd_ms"] for r in rows if r["n"] == n and not r["causal"]}
        ratio[str(n)] = t["cosine"] / t["scaled_dot"]
    return ratio


def collect_evidence(store: Store, m: dict[str, Any]) -> dict[str, Any]:
    """Every claim's evidence dict, from the stored runs and the measurements ``m``."""
    lr = evidence_lr(store)
    dk = evidence_head_dim(store)
    mqar_n = MQAR["seq_len"]  # keys a query sees at most in the MQAR study
    return {
        "C1": m["implementation"]["c1"],
        "C2": m["implementation"]["c2"],
        "C3": evidence_salience(store),
        "C4": {"accuracy": {k: v for k, v in lr["accuracy"].items()
                            if k == "scaled_dot" or k.startswith("cosine")},
               "max_weight_bound": float(theory.max_weight_bound(mqar_n, 1.0)), "n": mqar_n,
               "chance": 1 / MQAR["num_kv_pairs"], "runs": lr["runs"]},
        "C5": {"ratio_by_n": bench_ratios(m["bench"]["rows"])},
        "C6": {"best_loss": lr["best_loss"], "runs": lr["runs"]},
        "C7": dk,
        "C8": m["qk"],
        "C9": m["rem"],
        "C10": m["rem"],
        "C11": {"task": TEXT["task"], "by_width": lr["by_width"], "runs": lr["runs"]},
        "C12": {"init_std_scaled": {str(r["d"]): r["std_scaled"] for r in m["qk"]["by_d"]},
                **evidence_trained_logits(store, n=TEXT["seq_len"])},
        "C13": dk,
        "Q1": {"by_task": lr["by_task"], "runs": lr["runs"]},
        "Q2": {"summary": m["minilm"]["summary"],
               "max_abs_logit": max(h["max_abs_logit"] for layer in m["minilm"]["layers"]
                                    for h in layer["heads"])},
        "Q3": evidence_length(store),
    }
