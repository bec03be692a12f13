"""Training-step cost of attnscale's GPT against the same model written on plain SDPA, and MFU.

    python benchmarks/train_overhead.py [--blocks 8] [--d-model 128] [--out results/x.json]

Three arms train the same model (the MQAR quick config of ``attnscale.lab.train.TrainConfig``
unless told otherwise) through the same loop, ``attnscale.lab.train.Trainer`` (same batches,
AdamW, clipping, schedule, one history row every ``log_every`` = 25 steps):

* ``attnscale``: :class:`attnscale.lab.models.GPT`, attention statistics logged in every row (one
  extra no-grad forward of 16 sequences with the capture hook, then
  ``attnscale.measure.stats.attention_stats``);
* ``attnscale_nostats``: the same without statistics (the cost of the model code alone);
* ``sdpa``: :class:`PlainGPT` below, a minimal pre-LN GPT on ``F.scaled_dot_product_attention``
  with a fused qkv projection, loaded with the *same weights* (so both compute the same function;
  the script checks the logits agree).

Blocks of 25 steps (each holding exactly one logged row) alternate between the arms, in rotating
order, so that load on a shared machine hits all alike; the ratio is median block time / median
sdpa block time. MFU = model FLOPs per step / step time / this machine's float32 matmul peak
(``attnscale.measure.bench.matmul_peak_gflops``, measured in the same process at the same
thread count).
FLOP convention as in :mod:`attnscale.measure.bench`: forward = 2·tokens·(matmul weights, readout
included) + attention 4·B·T²·d per layer, halved under the causal mask; a training step = 3×.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnscale.lab.models import GPT
from attnscale.lab.tasks.cache import BATCHES
from attnscale.lab.train import TrainConfig, Trainer, num_threads
from attnscale.measure.bench import matmul_peak_gflops
from attnscale.util.provenance import git_revision, machine, versions


class PlainAttention(nn.Module):
    """Causal multi-head self-attention on F.scaled_dot_product_attention (fused qkv)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)  # (B, T, C) each
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class PlainBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, mlp: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, bias=False)
        self.attn = PlainAttention(d_model, n_heads)
        self.mlp = mlp
        if mlp:
            self.ln_2 = nn.LayerNorm(d_model, bias=False)
            self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
            self.out = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        if not self.mlp:
            return x
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class PlainGPT(nn.Module):
    """Learned positions, pre-LN blocks, tied readout: the shape of attnscale's default GPT."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, heads: int, layers: int, mlp: bool):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(PlainBlock(d_model, heads, mlp) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model, bias=False)

    def forward(self, tokens: Tensor, scale: Tensor | None = None) -> Tensor:
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # (B, T, vocab)


def plain_copy(model: GPT) -> PlainGPT:
    """A PlainGPT holding ``model``'s weights (q, k, v projections stacked into qkv)."""
    c = model.config
    plain = PlainGPT(c.vocab_size, c.seq_len, c.d_model, c.n_heads, c.n_layers, c.mlp)
    with torch.no_grad():
        plain.wte.weight.copy_(model.wte.weight)
        plain.wpe.weight.copy_(model.wpe.weight)
        plain.ln_f.weight.copy_(model.ln_f.weight)
        for src, dst in zip(model.blocks, plain.blocks, strict=True):
            a = src.attn
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            dst.attn.qkv.weight.copy_(qkv)
            dst.attn.proj.weight.copy_(a.out_proj.weight)
            dst.ln_1.weight.copy_(src.ln_1.weight)
            if c.mlp:
                dst.ln_2.weight.copy_(src.ln_2.weight)
                dst.fc.weight.copy_(src.mlp.fc.weight)
                dst.out.weight.copy_(src.mlp.proj.weight)
    return plain


def step_flops(cfg: TrainConfig, vocab_size: int, seq_len: int) -> float:
    """Model FLOPs of one training step (module docstring)."""
    m, d, b, t = cfg.model, cfg.model.d_model, cfg.optim.batch_size, seq_len
    weights = m.n_layers * (4 * d * d + (8 * d * d if m.mlp else 0)) + d * vocab_size
    attn = m.n_layers * 4 * b * t * t * d * 0.5
    return 3 * (2 * b * t * weights + attn)


def time_block(trainer: Trainer, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    return time.perf_counter() - start


def measure(cfg: TrainConfig, blocks: int) -> dict:
    """Interleaved block timings of the three arms, their ratios and MFU."""
    every = cfg.run.log_every
    cfg = cfg.replace(steps=(blocks + 2) * every)  # the last row never falls in
    arms = {
        "attnscale": Trainer(cfg),
        "attnscale_nostats": Trainer(cfg.replace(stats=False)),
    }
    arms["sdpa"] = Trainer(cfg, model=plain_copy(arms["attnscale"].model))
    batch = arms["sdpa"].task.train_batch(0, 4)
    with torch.no_grad():
        diff = (arms["attnscale"].model(batch.tokens) - arms["sdpa"].model(batch.tokens)).abs()
    if diff.max() > 1e-4:
        raise RuntimeError(f"the plain model is not the same function (max |Δ| {diff.max():.2e})")
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for i in range(blocks + 1):  # block 0 warms up and is dropped
        for name in names[i % 3 :] + names[: i % 3]:
            elapsed = time_block(arms[name], every)
            if i > 0:
                times[name].append(elapsed)
    peak = matmul_peak_gflops()
    task = arms["sdpa"].task
    flops = step_flops(cfg, task.vocab_size, task.seq_len)
    median = {name: statistics.median(ts) / every for name, ts in times.items()}
    return {
        "config": cfg.flat(),
        "blocks": blocks,
        "steps_per_block": every,
        "max_abs_logit_difference_at_init": diff.max().item(),
        "step_s": median,
        "ratio_vs_sdpa": {name: median[name] / median["sdpa"] for name in arms},
        "paired_ratio_median": statistics.median(
            a / b for a, b in zip(times["attnscale"], times["sdpa"], strict=True)
        ),
        "block_s": times,
        "step_gflop": flops / 1e9,
        "matmul_peak_gflops": peak,
        "achieved_gflops": {name: flops / s / 1e9 for name, s in median.items()},
        "mfu": {name: flops / s / 1e9 / peak for name, s in median.items()},
        "threads": torch.get_num_threads(),
    }


def report(record: dict) -> None:
    for name, ratio in record["ratio_vs_sdpa"].items():
        ms = 1e3 * record["step_s"][name]
        rate, mfu = record["achieved_gflops"][name], 100 * record["mfu"][name]
        print(f"{name:18s} {ms:7.1f} ms/step {ratio:5.3f}x sdpa {rate:6.1f} GFLOP/s MFU {mfu:.1f}%")
    print(f"paired attnscale/sdpa ratio (median of blocks): {record['paired_ratio_median']:.3f}")
    print(
        f"matmul peak {record['matmul_peak_gflops']:.1f} GFLOP/s at {record['threads']} thread(s); "
        f"step {record['step_gflop']:.2f} GFLOP; logits agree to "
        f"{record['max_abs_logit_difference_at_init']:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8, help="Timed blocks of 25 steps per arm.")
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mlp", action=argparse.BooleanOptionalAction, default=None,
                        help="MLP blocks (default: the config's, off for MQAR).")
    parser.add_argument("--out", type=Path, default=None, help="Write the record as JSON.")
    args = parser.parse_args()
    sizes = {"d_model": args.d_model, "n_heads": args.heads, "n_layers": args.layers,
             "batch_size": args.batch_size, "threads": args.threads, "mlp": args.mlp}
    cfg = TrainConfig(**{k: v for k, v in sizes.items() if v is not None})
    with num_threads(cfg.run.threads), BATCHES.disabled():  # every arm draws its own batches
        record = measure(cfg, args.blocks)
    record.update(versions=versions(), git_rev=git_revision(), machine=machine())
    report(record)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
