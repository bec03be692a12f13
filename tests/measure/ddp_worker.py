"""Run by ``torchrun --nproc_per_node 2`` in tests/measure/test_distributed.py: each rank
measures its share of one batch under a Monitor, pools with all_reduce_monitor, and writes what
it reads to OUT/rank{r}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.measure.distributed import all_reduce_monitor
from attnscale.measure.monitor import Monitor


def batch() -> torch.Tensor:
    """The whole batch, (4, 9, 16); rank r measures rows 2r, 2r + 1 (rank 1's logits larger)."""
    x = torch.randn(4, 9, 16, generator=torch.Generator().manual_seed(1))
    x[2:] *= 3.0
    return x


def model() -> MultiheadSelfAttention:
    torch.manual_seed(0)
    return MultiheadSelfAttention(16, 4, causal=True)


def finish() -> None:
    """Wait for the peer, then leave: a rank that tears gloo down while its peer is still in a
    collective can abort the peer ("terminate called without an active exception", SIGABRT),
    as it did once in a fresh-clone CI run."""
    dist.barrier()
    dist.destroy_process_group()


def main(out: Path, mismatch: bool = False, nan: bool = False) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # mismatch: rank 1's layer has the same name and 2 heads instead of 4
    m = MultiheadSelfAttention(16, 2, causal=True) if mismatch and rank == 1 else model()
    with torch.no_grad(), Monitor(m, counterfactuals=True) as mon:
        m(batch()[2 * rank:2 * rank + 2])
    if mismatch:
        try:
            all_reduce_monitor(mon)
        except ValueError as e:
            (out / f"rank{rank}.json").write_text(json.dumps({"error": str(e)}))
        finish()
        return
    if nan:  # rank r's head r saw a NaN logit
        for acc in mon.accumulators().values():
            sums, top = acc.totals()
            acc.set_totals(sums, top.clone().index_fill_(0, torch.tensor([rank]), float("nan")))
    alone = mon.flat_stats()
    pooled = all_reduce_monitor(mon)
    record = {"pooled": pooled, "alone": alone, "flat": mon.flat_stats(),
              "dot": mon.flat_stats("dot"),
              "per_head": {k: v.to_dict()["per_head"] for k, v in mon.stats().items()}}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    finish()


if __name__ == "__main__":
    main(Path(sys.argv[1]), mismatch=sys.argv[2:] == ["mismatch"], nan=sys.argv[2:] == ["nan"])
