"""One config trained at several seeds (``attnscale train --seeds 0-7``): the runs go to a pool
of local processes, one torch thread each (:class:`attnscale.lab.executors.LocalExecutor`), and
come back as one record per seed, with the mean and Student-t 95% interval of the final eval
loss and metric over the seeds that finished (:func:`attnscale.lab.analysis.mean_ci`).

Not batched into one model: on this project's CPUs, training M small models as one was measured
to save at most 1.6× at width 16 and nothing from width 128 (``benchmarks/batched_throughput.py``,
README), so the seeds run side by side, as a sweep's runs do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from attnscale.lab.analysis import mean_ci
from attnscale.lab.config import TrainConfig
from attnscale.lab.executors import Job, LocalExecutor

__all__ = ["MAX_SEEDS", "parse_seeds", "summarize", "train_seeds"]

MAX_SEEDS = 1000
_PART = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_seeds(text: str, name: str = "--seeds") -> tuple[int, ...]:
    """``"0-7"``, ``"0,3,5"`` or ``"2-4,9"`` -> the seeds in the order given; ValueError naming
    ``name`` for anything else (a descending range, a repeated seed, more than
    :data:`MAX_SEEDS`)."""
    seeds: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        match = _PART.match(part)
        if not match:
            raise ValueError(f"{name} must look like 0-7 or 0,3,5 (seeds >= 0), got {text!r}")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last < first:
            raise ValueError(f"{name}: range {part!r} runs backwards")
        if last - first + 1 + len(seeds) > MAX_SEEDS:
            raise ValueError(f"{name}: at most {MAX_SEEDS} seeds")
        seeds.extend(range(first, last + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"{name}: seed {repeated[0]} is given twice")
    return tuple(seeds)


def train_seeds(config: TrainConfig, seeds: Sequence[int], workers: int = 1,
                on_done: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Train ``config`` at every seed of ``seeds``, ``workers`` at a time; one record per seed,
    in the order of ``seeds``: the run's ``RunResult.to_dict()``, or {"seed", "status":
    "failed", "error"} for a run that raised or whose process died. ``on_done(record)`` is
    called as each run finishes."""
    if not seeds:
        raise ValueError("seeds: give at least one seed")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    jobs = [Job(str(seed), config.replace(seed=seed).flat()) for seed in seeds]
    records: dict[str, dict[str, Any]] = {}
    with LocalExecutor(min(workers, len(jobs))) as pool:
        for outcome in pool.run(jobs, lambda job_id, worker: True):
            if outcome.result is not None:
                record = outcome.result
            else:
                record = {"seed": int(outcome.id), "status": "failed", "error": outcome.error}
            records[outcome.id] = record
            if on_done is not None:
                on_done(record)
    return [records[job.id] for job in jobs]


def summarize(records: Sequence[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """Counts per status, and {"mean", "lo", "hi", "n"} of ``final_loss`` and ``final_metric``
    over the runs that finished (done or diverged) with a finite value."""
    statuses = [r.get("status") for r in records]
    finished = [r for r in records if r.get("status") in ("done", "diverged")]
    out: dict[str, Any] = {s: statuses.count(s) for s in ("done", "diverged", "failed")}
    for key in ("final_loss", "final_metric"):
        ci = mean_ci([r.get(key) for r in finished], confidence)
        out[key] = {"mean": ci.mean, "lo": ci.low, "hi": ci.high, "n": ci.n,
                    "confidence": confidence}
    return out
