"""Exact theory against Monte Carlo over the full grid (both REM phases, n = 2 … 8192).

Usage:  PYTHONPATH=src python benchmarks/theory_agreement.py --out results/theory_agreement.json
        [--seed 0] [--scale 1.0] [--quick]

Three parts:

1. REM grid: n ∈ {2, 4, 16, 64, 256, 1024, 8192} × s ∈ {0.1, 0.5, 1} ∪ {0.5, 1, 1.5, 2, 3}·s_c,
   i.i.d. N(0, s²) logits, every quantity of :data:`attnscale.measure.theory.QUANTITIES`.
2. Score grid: q, k ~ N(0, I_d) for dot, scaled_dot, mup, log_length, cosine τ ∈ {1, 10},
   qk_rmsnorm, qk_layernorm over several (d, n), half of them sampling the vectors themselves.
3. The (d_k, n, score) table of :func:`attnscale.measure.montecarlo.theory_table`, timed.

Agreement rule (printed): |z| ≤ z*, where z* is the Bonferroni bound for the whole family at
1% family-wise error, z* = Φ⁻¹(1 − 0.005/K) for K comparisons (≈ 4.4 for K ≈ 800). Quantities
are correlated within a point, which makes Bonferroni conservative, not invalid. Points whose
SE is below 1e-9 relative (pure rounding) are judged by relative error instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from scipy import stats

from attnscale.core.scores import SCORES
from attnscale.measure import montecarlo as mc
from attnscale.measure import theory as th

NS = (2, 4, 16, 64, 256, 1024, 8192)
ABS_SCALES = (0.1, 0.5, 1.0)
REL_SCALES = (0.5, 1.0, 1.5, 2.0, 3.0)  # multiples of s_c = √(2 ln n)

SCORE_POINTS = [  # (d, n, score, tau, method); tau is the cosine temperature
    (1, 64, "dot", 1.0, "rotation"),
    (2, 2, "mup", 1.0, "rotation"),
    (16, 64, "dot", 1.0, "vectors"),
    (64, 512, "dot", 1.0, "vectors"),
    (1024, 4096, "dot", 1.0, "rotation"),
    (16, 4096, "scaled_dot", 1.0, "rotation"),
    (256, 512, "scaled_dot", 1.0, "vectors"),
    (16, 64, "mup", 1.0, "vectors"),
    (256, 512, "mup", 1.0, "rotation"),
    (64, 4096, "log_length", 1.0, "rotation"),
    (2, 64, "cosine", 1.0, "vectors"),
    (3, 512, "cosine", 10.0, "rotation"),
    (64, 512, "cosine", 1.0, "vectors"),
    (64, 512, "cosine", 10.0, "vectors"),
    (1024, 4096, "cosine", 10.0, "rotation"),
    (16, 4096, "cosine", 50.0, "rotation"),
    (64, 128, "qk_rmsnorm", 1.0, "vectors"),
    (16, 64, "qk_layernorm", 1.0, "vectors"),
    (64, 256, "qk_layernorm", 1.0, "vectors"),
]


def rem_theory(n: int, s: float) -> dict[str, float]:
    return {
        "entropy": th.expected_entropy(n, s),
        "max_weight": th.expected_max_weight(n, s),
        "participation": th.expected_participation(n, s),
        "effective_keys": th.expected_effective_keys(n, s),
        "rms_jacobian_norm": th.rms_jacobian_norm(n, s),
        "logit_std": s,
    }


def compare(label: dict, theory: dict[str, float], est: dict[str, mc.Estimate]) -> list[dict]:
    rows = []
    for quantity, value in theory.items():
        e = est[quantity]
        rows.append({**label, "quantity": quantity, "theory": float(value), "mc_mean": e.mean,
                     "mc_se": e.se, "z": float(e.z(value)), "rel_err": float(e.rel(value))})
    return rows


def rem_rows(scale: float, seed: int) -> list[dict]:
    rows = []
    for n in NS:
        s_c = float(th.rem_critical_scale(n))
        samples = int(scale * max(4000, min(40_000, (1 << 25) // n)))
        for i, s in enumerate([*ABS_SCALES, *(f * s_c for f in REL_SCALES)]):
            est = mc.mc_softmax_stats(n, s, samples=samples, seed=seed + 1000 * n + i)
            rows += compare({"part": "rem", "n": n, "s": s, "s_over_sc": s / s_c,
                             "samples": samples}, rem_theory(n, s), est)
    return rows


def score_rows(scale: float, seed: int) -> list[dict]:
    rows = []
    for i, (d, n, score, tau, method) in enumerate(SCORE_POINTS):
        budget = (1 << 26) // (n * (d if method == "vectors" else 4))
        samples = int(scale * max(1000, min(20_000, budget)))
        params = {"tau": tau} if "tau" in SCORES[score].defaults else {}
        est = mc.mc_score_stats(d, n, score, samples=samples, seed=seed + i, method=method,
                                **params)
        exact = th.score_moments(d, n, score, **params)
        theory = {q: exact.get(q) for q in th.QUANTITIES}
        rows += compare({"part": "score", "d": d, "n": n, "score": score, "tau": tau,
                         "method": method, "samples": samples}, theory, est)
    return rows


def summarise(rows: list[dict]) -> dict:
    k = len(rows)
    z_star = float(stats.norm.isf(0.005 / k))
    judged = [r for r in rows if r["mc_se"] > 1e-9 * abs(r["mc_mean"])]
    worst_z = max(judged, key=lambda r: abs(r["z"]))
    tiny = [r for r in rows if r["mc_se"] <= 1e-3 * abs(r["theory"])]
    worst_rel_tiny = max(tiny, key=lambda r: r["rel_err"]) if tiny else None
    fails = [r for r in judged if abs(r["z"]) > z_star]
    fails += [r for r in rows if r not in judged and r["rel_err"] > 1e-9]
    return {
        "comparisons": k,
        "z_star_bonferroni_1pct": z_star,
        "max_abs_z": abs(worst_z["z"]),
        "max_abs_z_at": {key: v for key, v in worst_z.items() if key not in ("mc_mean",)},
        "count_abs_z_gt_3": sum(abs(r["z"]) > 3 for r in judged),
        "expected_count_abs_z_gt_3": k * 2 * float(stats.norm.sf(3)),
        "worst_rel_err_where_se_below_0.1pct": worst_rel_tiny["rel_err"] if tiny else None,
        "worst_rel_err_where_se_below_0.1pct_at": worst_rel_tiny,
        "worst_rel_err_overall": max(r["rel_err"] for r in rows),
        "failures": len(fails),
    }


def print_rem(rows: list[dict]) -> None:
    qs = th.QUANTITIES
    print(f"{'n':>5} {'s':>7} {'s/s_c':>6} " + " ".join(f"{q[:10]:>10}" for q in qs)
          + "   (entries: z = (theory − MC)/SE)")
    for i in range(0, len(rows), len(qs)):
        block = rows[i : i + len(qs)]
        head = block[0]
        print(f"{head['n']:>5} {head['s']:>7.3f} {head['s_over_sc']:>6.2f} "
              + " ".join(f"{r['z']:>10.2f}" for r in block))


def print_scores(rows: list[dict]) -> None:
    qs = th.QUANTITIES
    print(f"{'score':>12} {'tau':>5} {'d':>5} {'n':>5} {'method':>8} "
          + " ".join(f"{q[:10]:>10}" for q in qs))
    for i in range(0, len(rows), len(qs)):
        block = rows[i : i + len(qs)]
        h = block[0]
        print(f"{h['score']:>12} {h['tau']:>5g} {h['d']:>5} {h['n']:>5} {h['method']:>8} "
              + " ".join(f"{r['z']:>10.2f}" for r in block))


def print_table(rows: list[dict]) -> None:
    print(f"{'score':>13} {'d':>5} {'n':>5} {'quantity':>15} {'theory':>12} {'MC':>12} "
          f"{'SE':>9} {'z':>6}")
    for r in rows:
        z = (r["theory"] - r["mc_mean"]) / r["mc_se"] if r["mc_se"] > 0 else 0.0
        print(f"{r['score']:>13} {r['d']:>5} {r['n']:>5} {r['quantity']:>15} "
              f"{r['theory']:>12.6g} {r['mc_mean']:>12.6g} {r['mc_se']:>9.2g} {z:>6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply MC sample counts")
    parser.add_argument("--quick", action="store_true", help="scale 0.1 (smoke run)")
    args = parser.parse_args(argv)
    scale = 0.1 if args.quick else args.scale

    # The table first: in a fresh process the theory's moment caches are cold, so it is timed
    # as a first call is (the REM and score grids would warm them).
    t0 = time.perf_counter()
    table = mc.theory_table(seed=args.seed)
    t1 = time.perf_counter()
    rem = rem_rows(scale, args.seed)
    t2 = time.perf_counter()
    scores = score_rows(scale, args.seed)
    t3 = time.perf_counter()

    print("== REM grid: n i.i.d. N(0, s²) logits ==")
    print_rem(rem)
    print("\n== Scores with q, k ~ N(0, I_d) ==")
    print_scores(scores)
    print(f"\n== theory_table (d_k × n × score × quantity), {t1 - t0:.2f} s ==")
    print_table(table)
    table_cmp = [{**r, "z": (r["theory"] - r["mc_mean"]) / r["mc_se"] if r["mc_se"] else 0.0,
                  "rel_err": abs(r["theory"] - r["mc_mean"]) / abs(r["theory"])} for r in table]
    summary = summarise(rem + scores + table_cmp)
    summary.update({"seconds_rem": t2 - t1, "seconds_scores": t3 - t2,
                    "seconds_table": t1 - t0, "mc_scale": scale, "seed": args.seed})
    print("\n== Summary ==")
    print(f"rule: |z| <= z* = {summary['z_star_bonferroni_1pct']:.2f} (Bonferroni, 1% family-wise "
          f"over {summary['comparisons']} comparisons)")
    for key in ("max_abs_z", "count_abs_z_gt_3", "expected_count_abs_z_gt_3",
                "worst_rel_err_where_se_below_0.1pct", "worst_rel_err_overall", "failures",
                "seconds_rem", "seconds_scores", "seconds_table"):
        value = summary[key]
        print(f"{key:>38}: {value:.4g}" if isinstance(value, float) else f"{key:>38}: {value}")
    print(f"{'max |z| at':>38}: {summary['max_abs_z_at']}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "rem": rem, "scores": scores,
                                    "table": table_cmp}, indent=1, default=float))
    print(f"wrote {args.out}")
    return 0 if summary["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
