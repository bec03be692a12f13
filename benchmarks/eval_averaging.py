"""Does averaging the eval loss over the end of training make paired comparisons less noisy?

    python benchmarks/eval_averaging.py [--seeds 10] [--workers 2] [--out results/x.json]

The report's text claims (C6, C11, Q1) read each run's eval loss at its last step, and compare
arms by paired per-seed differences d_s = loss(arm, s) − loss(scaled_dot, s). This script trains
the text LR study's setup (``attnscale.audit.studies.TEXT``, 150 steps, widths 32 and 128) for
scaled_dot, dot and qk_layernorm at one LR (1e-2, the middle of the grid) on ``--seeds`` seeds,
with an eval every 10 steps, and reads each run two ways:

* ``final``: the run's final eval loss, after its last step (what the report reads);
* ``tail``: the mean of the evals over the last fifth of training (steps 120, 130, 140) and
  the final one.

For each width and arm it prints the standard deviation over seeds of d_s under each reading,
their ratio tail/final with a 95% interval (bootstrap over seeds, ``scipy.stats.bootstrap``),
and the mean difference under each reading (averaging must not move the effect itself much: the
tail mean includes slightly less-trained weights). A ratio well below 1 would mean fewer seeds
for the same interval width: (tail/final)² of them.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from attnscale.audit.studies import TEXT, VARIANTS, schedule
from attnscale.lab.config import TrainConfig
from attnscale.lab.train import run
from attnscale.util.provenance import git_revision, versions

ARMS = ("scaled_dot", "dot", "qk_layernorm")
WIDTHS = (32, 128)
LR, STEPS, EVAL_EVERY, TAIL_FROM = 1e-2, 150, 10, 120


def one(job: tuple[int, str, int]) -> dict[str, Any]:
    """Train one (width, arm, seed) and return its final and tail-mean eval loss."""
    width, arm, seed = job
    cfg = TrainConfig(**{**TEXT, **schedule(STEPS), "n_heads": 2, "d_model": width,
                         **VARIANTS[arm], "lr": LR, "seed": seed, "eval_every": EVAL_EVERY})
    result = run(cfg).to_dict()
    evals = [r["eval_loss"] for r in result["history"]
             if r.get("eval_loss") is not None and TAIL_FROM <= r["step"] < STEPS - 1]
    tail = [*evals, result["final_loss"]]
    return {"width": width, "arm": arm, "seed": seed, "final": result["final_loss"],
            "tail": float(np.mean(tail)), "evals": len(tail)}


def sd_ratio(final: np.ndarray, tail: np.ndarray) -> tuple[float, float, float]:
    """SD(tail)/SD(final) over seeds with a 95% BCa bootstrap interval (paired resampling)."""
    def ratio(f: np.ndarray, t: np.ndarray) -> float:
        return float(np.std(t, ddof=1) / np.std(f, ddof=1))
    ci = stats.bootstrap((final, tail), ratio, paired=True, vectorized=False,
                         random_state=0, n_resamples=2000).confidence_interval
    return ratio(final, tail), float(ci.low), float(ci.high)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    jobs = [(w, a, s) for w in WIDTHS for a in ARMS for s in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one, jobs))
    by = {(r["width"], r["arm"], r["seed"]): r for r in rows}
    table = []
    print(f"{'width':>5} {'arm':>13} {'SD final':>9} {'SD tail':>8} {'tail/final [95% CI]':>24} "
          f"{'mean d final':>12} {'mean d tail':>11}")
    for w in WIDTHS:
        for arm in ARMS[1:]:
            d = {k: np.array([by[(w, arm, s)][k] - by[(w, "scaled_dot", s)][k]
                              for s in range(args.seeds)]) for k in ("final", "tail")}
            r, lo, hi = sd_ratio(d["final"], d["tail"])
            sd_f, sd_t = np.std(d["final"], ddof=1), np.std(d["tail"], ddof=1)
            table.append({"width": w, "arm": arm, "sd_final": sd_f, "sd_tail": sd_t,
                          "ratio": r, "lo": lo, "hi": hi, "mean_final": d["final"].mean(),
                          "mean_tail": d["tail"].mean()})
            print(f"{w:>5} {arm:>13} {sd_f:>9.4f} {sd_t:>8.4f} {r:>8.2f} [{lo:.2f}, {hi:.2f}]"
                  f"{'':>6} {d['final'].mean():>+12.4f} {d['tail'].mean():>+11.4f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": {"lr": LR, "steps": STEPS, "seeds": args.seeds,
                                                   "eval_every": EVAL_EVERY,
                                                   "tail_from": TAIL_FROM},
                                        "table": table, "runs": rows, "versions": versions(),
                                        "git_rev": git_revision()}, indent=1, default=float))


if __name__ == "__main__":
    main()
