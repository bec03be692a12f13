"""A zoo of training runs with known outcomes, for tuning and scoring the attention alarm
(:mod:`attnscale.integrations.alarm`; ``benchmarks/alarm_zoo.py``).

Members: byte-level GPTs of the lab (:class:`attnscale.lab.train.Trainer`) on the default text
corpus (CPython's ``pydoc_data.topics``, task ``text``): width 64, 2 layers of 2 heads, an MLP,
sequences of 64 bytes, batch 16, :data:`STEPS` steps of AdamW (the lab recipe: β = (0.9, 0.95),
clip 1, independent weight decay 1e-4), the learning rate warmed up linearly over ``warmup``
steps and then held constant. The grid: scaled (1/√d, ``scaled_dot``) and unscaled (``dot``)
attention × :data:`LRS` (3e-3 healthy; 1e-1 far past stable for this model) × warmup 0 or 100 ×
seed. Tuning seeds :data:`TUNE_SEEDS`, report seeds :data:`REPORT_SEEDS`.

What a run records: its per-step training loss, and at every ``every``-th step (s = 0, every,
…) the statistics of that step's own training forward (no extra pass), through
:class:`attnscale.measure.monitor.Monitor` as :class:`AttentionHealthCallback` measures them:
``Monitor.flat_stats()`` plus each head's max |logit| and logit std (what the ``frozen`` rule
reads, with the layer's ``entropy_uniform``). The label comes from the loss alone
(:func:`attnscale.integrations.outcome.label_run`), against the run at :data:`REFERENCE_LR` of
the same (score, warmup, seed): same initialisation and batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from attnscale.integrations.health import per_head_scalars
from attnscale.integrations.outcome import label_run
from attnscale.lab.config import TrainConfig
from attnscale.lab.train import Trainer, num_threads
from attnscale.measure.monitor import Monitor
from attnscale.util.validate import check_int

__all__ = ["BASE", "LRS", "REFERENCE_LR", "REPORT_SEEDS", "SCORES", "STEPS", "TUNE_SEEDS",
           "WARMUPS", "Member", "label_zoo", "members", "train_member", "train_zoo"]

STEPS = 300
LRS = (3e-3, 1e-2, 3e-2, 1e-1)
REFERENCE_LR = 3e-3
WARMUPS = (0, 100)
SCORES = ("scaled_dot", "dot")
# Seeds 0-9 were seen while the rules and the search were being set (docs/alarm.md, "History");
# 10-14 were first trained after the rules were fixed.
TUNE_SEEDS = tuple(range(10))
REPORT_SEEDS = tuple(range(10, 15))
BASE: dict[str, Any] = {
    "task": "text", "seq_len": 64, "d_model": 64, "n_heads": 2, "n_layers": 2, "mlp": True,
    "batch_size": 16, "steps": STEPS, "min_lr_ratio": 1.0,  # constant LR after warmup
    "stats": False, "log_every": 10**6,  # the zoo measures the training forward itself
    "divergence_factor": 1e6,  # the lab stops only at a non-finite loss; outcome labels the rest
}  # fmt: skip
KEEP = ("nonfinite_fraction", "max_abs_logit", "entropy_normalized", "logit_std",
        "entropy_uniform")


@dataclass(frozen=True)
class Member:
    """One zoo run: attention ``score``, peak ``lr``, ``warmup`` steps, ``seed``."""

    score: str
    lr: float
    warmup: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.score}-lr{self.lr:g}-w{self.warmup}-s{self.seed}"

    @property
    def group(self) -> tuple[str, int, int]:
        """Runs sharing init, batches and schedule shape (they differ by LR only)."""
        return (self.score, self.warmup, self.seed)

    def config(self, steps: int = STEPS) -> TrainConfig:
        return TrainConfig(**{**BASE, "steps": steps}, score=self.score, lr=self.lr,
                           warmup_steps=min(self.warmup, steps), seed=self.seed)


def members(seeds: tuple[int, ...]) -> list[Member]:
    """The grid (module docstring) for ``seeds``."""
    return [Member(score, lr, warmup, seed) for seed in seeds for score in SCORES
            for warmup in WARMUPS for lr in LRS]


def train_member(member: Member, every: int = 5, steps: int = STEPS) -> dict[str, Any]:
    """Train ``member`` single-threaded; {"member", "losses", "samples": [[step, stats]],
    "every", "elapsed_s"} with stats the :data:`KEEP` statistics of ``Monitor.flat_stats()``
    and per-head max |logit| and logit std (``layer/max_abs_logit_head{h}``,
    ``layer/logit_std_head{h}``) of each sampled step."""
    every = check_int("every", every, minimum=1)
    start = time.perf_counter()
    losses: list[float] = []
    samples: list[list[Any]] = []
    with num_threads(1):
        trainer = Trainer(member.config(steps))
        while not trainer.done:
            step = trainer.next_step
            if step % every:
                losses.append(trainer.step())
                continue
            with Monitor(trainer.model) as monitor:
                losses.append(trainer.step())
            flat = {k: v for k, v in monitor.flat_stats().items() if k.rsplit("/", 1)[1] in KEEP}
            prefixed = per_head_scalars(monitor.stats(), prefix="zoo")  # zoo/<layer>/<stat>_head<h>
            flat.update({k.removeprefix("zoo/"): v for k, v in prefixed.items()})
            samples.append([step, flat])
    return {"member": asdict(member), "name": member.name, "losses": losses,
            "samples": samples, "every": every, "elapsed_s": time.perf_counter() - start}


def _train(args: tuple[Callable[..., dict[str, Any]], Member, int, int]) -> dict[str, Any]:
    train, member, every, steps = args
    return train(member, every, steps)


def train_zoo(zoo: list[Member], every: int = 5, workers: int = 2, steps: int = STEPS,
              train: Callable[..., dict[str, Any]] = train_member) -> list[dict[str, Any]]:
    """``train(member, every, steps)`` (a module-level function: default
    :func:`train_member`) for every member, ``workers`` processes (1: in this one)."""
    workers = check_int("workers", workers, minimum=1)
    jobs = [(train, m, every, steps) for m in zoo]
    if workers == 1:
        return [_train(job) for job in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_train, jobs))


def label_zoo(runs: list[dict[str, Any]], reference_lr: float = REFERENCE_LR,
              step_offset: int = 0, **criteria: float) -> list[dict[str, Any]]:
    """Each run with ``outcome`` (:func:`label_run` against the run of its group at
    ``reference_lr``; the reference itself against nothing: non-finite or blow-up only), its
    onset moved by ``step_offset`` (1 for loops that count steps from 1); ``criteria`` go to
    :func:`label_run` (e.g. ``gap=0.4``)."""
    refs = {Member(**r["member"]).group: r["losses"] for r in runs
            if r["member"]["lr"] == reference_lr}
    out = []
    for r in runs:
        member = Member(**r["member"])
        ref = None if member.lr == reference_lr else refs.get(member.group)
        outcome = label_run(r["losses"], ref, **criteria).to_dict()
        if outcome["step"] is not None:
            outcome["step"] += step_offset
        out.append({**r, "outcome": outcome})
    return out
