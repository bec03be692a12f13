"""Run by ``torchrun --nproc_per_node 2`` in tests/integrations/test_fsdp.py: three attention
layers sharded by FSDP2 (``fully_shard``, gloo, CPU) train a few SGD steps, each
rank on its half of the batch, with QK-Clip after every step; each rank writes what it saw to
OUT/rank{r}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.integrations.qkclip import QKClip
from attnscale.measure.distributed import all_reduce_monitor
from attnscale.measure.monitor import Monitor

# SGD, not Adam: a key bias gets an exactly-zero gradient (it shifts a row's logits by a
# constant), and Adam would turn its float32 rounding noise into full-size, order-dependent steps
STEPS, LR = 3, 0.5


class TorchAttention(nn.Module):
    """``nn.MultiheadAttention`` as a layer: its fused in_proj_weight (3E, E) and bias."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


class Parallel(nn.ModuleList):
    """The sum of its layers, each applied to the input (so each sees logits past τ)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(layer(x) for layer in self)


def model() -> Parallel:
    """torch's fused in-projection (q and k are row blocks of one parameter, with a bias);
    separate q/k projections; grouped-query attention with biases (2 key heads for 4: only W_q
    is scaled)."""
    torch.manual_seed(0)
    return Parallel([TorchAttention(16, 4), MultiheadSelfAttention(16, 4, causal=True),
                     MultiheadSelfAttention(16, 4, 2, causal=True, bias=True)])


def batch() -> torch.Tensor:
    """The whole batch, (4, 9, 16); rank r trains on rows 2r, 2r + 1 (rank 1's logits larger)."""
    x = torch.randn(4, 9, 16, generator=torch.Generator().manual_seed(1))
    x[2:] *= 3.0
    return x


def loss_fn(y: torch.Tensor) -> torch.Tensor:
    """Rewards large outputs, so the logits keep growing and QK-Clip acts at every step."""
    return -y.pow(2).mean()


def main(out: Path, tau: float) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    m = model()
    for layer in m:
        fully_shard(layer)
    fully_shard(m)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    clip = QKClip(m, tau)
    mine = batch()[2 * rank:2 * rank + 2]
    clips = []
    for _ in range(STEPS):
        with clip.measure():
            loss_fn(m(mine)).backward()
        opt.step()
        opt.zero_grad()
        clips.append([c.to_dict() for c in clip.apply()])
    with torch.no_grad(), Monitor(m) as mon:  # the last batch again, after the last clip
        m(mine)
    all_reduce_monitor(mon)
    record = {"rank": rank, "clips": clips,
              "after": {k: v.to_dict()["per_head"]["max_abs_logit"]
                        for k, v in mon.stats().items()},
              "weights": {n: p.full_tensor().tolist() for n, p in m.named_parameters()},
              "sharded": [type(p).__name__ for p in m.parameters()]}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
