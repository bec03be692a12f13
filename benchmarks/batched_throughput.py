"""Can training many small models at once make the lab faster on this CPU?

    python benchmarks/batched_throughput.py [--members 8] [--widths 16 32 64 128 256]
        [--budget 8] [--out benchmarks/recorded/batched_throughput_2core.json]

The lab's text studies train byte-level GPTs (``attnscale.audit.studies.TEXT``: 2 layers of
attention only, 2 heads, sequences of 32, batch 16) one run per process, one thread each. The
idea of batching: give the parameters of M runs a leading member dimension and train them as
one model, so that each step's Python, optimizer and kernel-launch overhead is paid once for M
runs. How much that can buy is bounded by two ratios, each measured in one process, one
thread, interleaved (:func:`attnscale.measure.overhead.measure_ratio`: A B / B A repeats,
geometric mean, Student-t 95% interval), with a noise-floor row (the same arm against itself):

* ``overhead``: one run's whole training step (``Trainer.step``: batch, forward, backward,
  clipping, AdamW, schedule) over its forward and backward alone. Batching can at most remove
  the difference, so this ratio bounds its gain if forward and backward cost the same batched.
* ``stacking``: M single forward-and-backward passes over one pass of the M members stacked
  (the real :class:`attnscale.lab.models.GPT` through ``torch.func.stack_module_state``,
  ``functional_call`` and ``vmap(grad(...))``, each member on its own batch). Above 1, stacking
  makes the passes themselves cheaper.

Member-steps per second batched, over one run at a time, are then at most
``overhead × stacking`` (every cost outside the passes gone). The figures also give one run's
rate in GFLOP/s and its fraction of this core's float32 matmul peak
(``attnscale.measure.bench.matmul_peak_gflops``; FLOPs as in ``train_overhead.step_flops``),
and the rate of the step's own matrix products (``shape_gflops``: the tokens of a batch times
the q/k/v projection, and times the byte readout), which says whether the products of a small
model leave the core idle.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, stack_module_state, vmap
from train_overhead import step_flops

from attnscale.audit.studies import TEXT
from attnscale.lab.tasks import IGNORE_INDEX
from attnscale.lab.tasks.cache import BATCHES
from attnscale.lab.train import TrainConfig, Trainer, labelled_logits, losses, num_threads
from attnscale.measure.bench import matmul_peak_gflops
from attnscale.measure.overhead import measure_ratio
from attnscale.util.jsonio import jsonable
from attnscale.util.provenance import git_revision, machine, versions


def config(width: int, seed: int = 0) -> TrainConfig:
    """A text-study run at ``width`` (2 heads), long enough never to end while timed."""
    return TrainConfig(**TEXT, n_heads=2, d_model=width, steps=10**6, lr=3e-3, seed=seed,
                       stats=False, log_every=10**6)


def arms(width: int, members: int) -> dict:
    """The timed callables at ``width``: a whole step, one pass, M passes, M stacked."""
    trainers = [Trainer(config(width, seed)) for seed in range(members)]
    one = trainers[0]
    batches = [t.task.train_batch(0, t.config.optim.batch_size) for t in trainers]

    def step() -> None:
        one.step()

    def passes(trainer: Trainer, batch) -> None:
        trainer.model.zero_grad(set_to_none=True)
        losses(*labelled_logits(trainer.model, batch))[0].backward()

    params, buffers = stack_module_state([t.model for t in trainers])
    skeleton = copy.deepcopy(one.model).to("meta")
    vocab = one.task.vocab_size

    def member_loss(p, b, tokens, targets):  # (B, T) each: one member's batch
        logits = functional_call(skeleton, (p, b), (tokens,))  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1),
                               ignore_index=IGNORE_INDEX)

    stacked_grad = vmap(grad(member_loss))
    tokens = torch.stack([b.tokens for b in batches])  # (M, B, T)
    targets = torch.stack([b.targets for b in batches])
    return {
        "step": step,
        "pass": lambda: passes(one, batches[0]),
        "passes": lambda: [passes(t, b) for t, b in zip(trainers, batches, strict=True)],
        "stacked": lambda: stacked_grad(params, buffers, tokens, targets),
        "flops": step_flops(one.config, vocab, one.task.seq_len),
    }


def shape_gflops(width: int, rows: int = TEXT["batch_size"] * TEXT["seq_len"]) -> dict:
    """GFLOP/s of (rows × width) @ (width × n) for the projection (n = 3·width) and the
    byte readout (n = 256), best of 5 blocks of 50."""
    out = {}
    for name, n in (("qkv", 3 * width), ("readout", 256)):
        a, b = torch.randn(rows, width), torch.randn(width, n)
        best = min(_block(lambda a=a, b=b: a @ b, 50) for _ in range(5))
        out[name] = 2 * rows * width * n / best / 1e9
    return out


def _block(fn, number: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def measure(width: int, members: int, budget: float, peak: float) -> dict:
    """The three ratios at ``width`` (module docstring) and the single run's rate."""
    a = arms(width, members)
    kw = {"budget_s": budget, "min_repeats": 10, "target": 0.02}
    overhead = measure_ratio(a["step"], a["pass"], **kw)
    stacking = measure_ratio(a["passes"], a["stacked"], **kw)
    floor = measure_ratio(a["pass"], arms(width, 1)["pass"], **kw)
    gflops = a["flops"] / (overhead.ms / 1e3) / 1e9
    return {"width": width, "members": members, "overhead": overhead.to_dict(),
            "stacking": stacking.to_dict(), "floor": floor.to_dict(),
            "bound": overhead.ratio * stacking.ratio, "step_ms": overhead.ms,
            "pass_ms": overhead.baseline_ms, "step_gflops": gflops, "mfu": gflops / peak,
            "shape_gflops": shape_gflops(width)}


def show(row: dict) -> None:
    def r(est: dict) -> str:
        return f"{est['ratio']:.2f} [{est['lo']:.2f}, {est['hi']:.2f}]"
    print(f"width {row['width']:>4}: step {row['step_ms']:.2f} ms ({row['step_gflops']:.1f} "
          f"GFLOP/s, {100 * row['mfu']:.0f}% of peak) | step/pass {r(row['overhead'])} | "
          f"{row['members']} passes / stacked {r(row['stacking'])} | floor {r(row['floor'])} | "
          f"batched at most {row['bound']:.2f}x | products {row['shape_gflops']['qkv']:.0f}/"
          f"{row['shape_gflops']['readout']:.0f} GFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--budget", type=float, default=8.0, help="seconds per ratio")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    with num_threads(1), BATCHES.disabled():  # every arm draws its own batches
        peak = matmul_peak_gflops()
        rows = []
        for width in args.widths:
            rows.append(measure(width, args.members, args.budget, peak))
            show(rows[-1])
    print(f"float32 matmul peak, one thread: {peak:.0f} GFLOP/s")
    if args.out:
        record = {"rows": rows, "matmul_peak_gflops": peak, "text_base": TEXT, "threads": 1,
                  "wall_s": time.perf_counter() - start, "versions": versions(),
                  "git_rev": git_revision(), "machine": machine()}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(jsonable(record), indent=1))


if __name__ == "__main__":
    main()
