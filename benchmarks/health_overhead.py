"""AttentionHealthCallback in a real transformers Trainer on a tiny BERT built from a config:
(a) its wall-time overhead, (b) how early its alarm fires before a large learning rate makes the
loss diverge.

    python benchmarks/health_overhead.py [--repeats 12] [--steps 50] [--every 10]
        [--batch 16] [--tokens 32] [--threads 1] [--out FILE.json]

(a) Overhead. Each repeat trains three fresh copies of the same model for ``--steps`` steps
(report_to tensorboard, logging every 10 steps): ``plain`` and ``floor`` without the callback,
``callback`` with ``AttentionHealthCallback(every_n_steps=--every)``, in an order rotated from
repeat to repeat. The time is that of ``trainer.train()``. Per repeat r_i = t_arm / t_plain; the
estimate is their geometric mean with a Student-t 95% interval on ln r_i
(:func:`attnscale.measure.ratio_interval.log_ratio_interval`); ``floor`` is the noise floor
(its interval should straddle 1). ``design_ms`` compares the callback's design (the Monitor
wraps the step's own forward) with the alternative (one extra no-grad forward per sampled step).

(b) Divergence. A copy task (masked tokens whose twin sits 8 positions away), learning rate
warmed up linearly to 1.0 over 200 steps and held (``constant_with_warmup``), 300 steps, loss
logged every step; the callback at every_n_steps 10 and 1. Recorded: the first alarm (step,
layer, statistic, value), the step the loss diverged (:class:`LossDivergence`: a non-finite
loss or gradient norm, or a loss above twice its lowest logged value), the lead time between
them, the first step where max |logit| alone passed 1e4, and the run's trajectory. A healthy
control (learning rate 1e-3) records whether the alarm stays silent.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from attnscale.integrations.hf import AttentionHealthCallback
from attnscale.measure.monitor import Monitor
from attnscale.measure.ratio_interval import log_ratio_interval
from attnscale.util.provenance import git_revision

VOCAB = 100
ARMS = ("plain", "floor", "callback")


class CopyTask(torch.utils.data.Dataset):
    """Sequences a + a (``half`` random tokens, then the same again), two positions masked
    (token 4) and labelled; the other positions are not scored (label −100)."""

    def __init__(self, n: int = 512, tokens: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        half = torch.randint(5, VOCAB, (n, tokens // 2), generator=g)
        self.ids = torch.cat([half, half], 1)
        self.masked = torch.stack([torch.randperm(tokens, generator=g)[:2] for _ in range(n)])

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, labels = self.ids[i].clone(), torch.full_like(self.ids[i], -100)
        labels[self.masked[i]] = ids[self.masked[i]]
        ids[self.masked[i]] = 4
        return {"input_ids": ids, "labels": labels}


def tiny_bert() -> transformers.BertForMaskedLM:
    """2 layers, hidden 32, 2 heads, random weights (seed 0)."""
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg)


def trainer_for(data, out: str, steps: int, batch: int, lr: float, **extra):
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=batch, learning_rate=lr,
        save_strategy="no", disable_tqdm=True, log_level="error", use_cpu=True, seed=0,
        weight_decay=0.0, dataloader_num_workers=0, **extra)
    trainer = transformers.Trainer(model=tiny_bert(), args=args, train_dataset=data)
    trainer.remove_callback(transformers.PrinterCallback)  # stdout carries the JSON
    return trainer


def timed_run(arm: str, data, args: argparse.Namespace) -> tuple[float, int]:
    """Seconds of trainer.train() for one arm; and the number of sampled steps."""
    with tempfile.TemporaryDirectory() as out:
        trainer = trainer_for(data, out, args.steps, args.batch, 1e-3,
                              report_to=["tensorboard"], logging_steps=10)
        health = (AttentionHealthCallback(trainer, every_n_steps=args.every)
                  if arm == "callback" else None)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    return seconds, 0 if health is None else len(health.history)


def overhead(args: argparse.Namespace) -> dict:
    """(a): the callback's and the noise floor's time ratio to the plain run."""
    data = CopyTask(tokens=args.tokens)
    timed_run("plain", data, args)  # warm-up: imports, the native kernel's load, allocations
    timed_run("callback", data, args)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    sampled = 0
    for i in range(args.repeats):
        for arm in ARMS[i % 3:] + ARMS[:i % 3]:
            seconds, n = timed_run(arm, data, args)
            times[arm].append(seconds)
            sampled = max(sampled, n)
    out = {"steps": args.steps, "every_n_steps": args.every, "sampled_steps": sampled,
           "batch": args.batch, "tokens": args.tokens, "repeats": args.repeats,
           "median_s": {arm: statistics.median(t) for arm, t in times.items()}}
    for arm in ("callback", "floor"):
        est = log_ratio_interval(times[arm], times["plain"])
        out[arm] = {"ratio": est["ratio"], "lo": est["lo"], "hi": est["hi"]}
    extra = statistics.median(times["callback"]) - statistics.median(times["plain"])
    out["ms_per_sampled_step"] = 1e3 * extra / max(sampled, 1)
    return out


def design_costs(args: argparse.Namespace, reps: int = 30) -> dict:
    """The two ways to measure a sampled step, in ms, medians of ``reps`` interleaved calls on
    one training batch: ``step`` a plain forward + backward; ``wrapped`` the same inside a
    Monitor (the callback's way: enter, the step, exit, statistics); ``extra_forward`` the
    alternative's addition, one more no-grad forward inside a Monitor."""
    model = tiny_bert().train()
    loader = torch.utils.data.DataLoader(CopyTask(tokens=args.tokens), batch_size=args.batch)
    batch = next(iter(loader))

    def step() -> None:
        model(**batch).loss.backward()

    def wrapped() -> None:
        with Monitor(model) as monitor:
            step()
        monitor.flat_stats()

    def extra_forward() -> None:
        with torch.no_grad(), Monitor(model) as monitor:
            model(**batch)
        monitor.flat_stats()

    calls = {"step": step, "wrapped": wrapped, "extra_forward": extra_forward}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(reps + 2):  # the first two rounds warm up
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            if i >= 2:
                times[name].append(1e3 * (time.perf_counter() - t0))
    out = {name: statistics.median(t) for name, t in times.items()}
    out["wrapped_extra"] = out["wrapped"] - out["step"]
    return out


def divergence_run(lr: float, every: int, steps: int = 300, warmup: int = 200) -> dict:
    """(b): one run of the copy task; the callback's record and the run's trajectory."""
    with tempfile.TemporaryDirectory() as out:
        trainer = trainer_for(CopyTask(), out, steps, 16, lr, report_to="none", logging_steps=1,
                              lr_scheduler_type="constant_with_warmup", warmup_steps=warmup)
        health = AttentionHealthCallback(trainer, every_n_steps=every, warn=False)
        trainer.train()
    record = health.record()
    losses = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    record["first_event"] = record["events"][0] if record["events"] else None
    record.pop("sampled_steps")
    record["lr"] = {"peak": lr, "warmup_steps": warmup, "steps": steps}
    for name in ("alarm_step", "diverged_step"):
        step = record[name]
        record[f"at_{name}"] = None if step is None else {
            "lr": losses[step]["learning_rate"], "loss": losses[step]["loss"]}
    record["best_loss"] = min(h["loss"] for h in losses.values())
    # the logit threshold by itself: the first sampled step past it (the alarm fires once per
    # layer, on whichever check crosses first)
    record["max_logit_crossed_step"] = next(
        (step for step, values in health.history if any(
            v > health.alarm.thresholds.max_logit
            for k, v in values.items() if k.endswith("/max_abs_logit"))), None)
    record["trajectory"] = [
        {"step": step, "loss": losses[step]["loss"],
         "max_abs_logit": max(v for k, v in values.items() if k.endswith("/max_abs_logit")),
         "min_entropy_normalized": min(v for k, v in values.items()
                                       if k.endswith("/entropy_normalized"))}
        for step, values in health.history if step % 10 == 0]
    return record


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-divergence", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return parser.parse_args()


def main() -> None:
    """Measure (a) and (b); print (and write) JSON."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    load_before, started = os.getloadavg(), time.perf_counter()
    record = {
        "command": "python benchmarks/health_overhead.py " + " ".join(_argv(args)),
        "model": "BertForMaskedLM from a config: 2 layers, hidden 32, 2 heads, vocab 100",
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, no GPU",
        "date": datetime.date.today().isoformat(),
        "git_base": git_revision(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "load_before": load_before,
        "overhead": overhead(args),
        "design_ms": design_costs(args),
    }
    record["load_after_overhead"] = os.getloadavg()
    if not args.skip_divergence:
        record["divergence"] = {f"every_{every}": divergence_run(1.0, every) for every in (10, 1)}
        record["healthy_control"] = divergence_run(1e-3, 10, warmup=0)
    record["load_after"] = os.getloadavg()
    record["seconds"] = time.perf_counter() - started
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def _argv(args: argparse.Namespace) -> list[str]:
    out = ["--repeats", str(args.repeats), "--steps", str(args.steps), "--every", str(args.every),
           "--batch", str(args.batch), "--tokens", str(args.tokens),
           "--threads", str(args.threads)]
    return out + (["--skip-divergence"] if args.skip_divergence else [])


if __name__ == "__main__":
    main()
