"""Attention statistics under data parallelism (DDP, FSDP): each rank measures its own batch,
:func:`all_reduce_monitor` pools them.

Every statistic of :class:`attnscale.measure.headstats.AttentionStats` is a ratio of per-head
sums (rows, logits, entropies, ...; :data:`attnscale.measure.rowstats.SUM_FIELDS`) plus a max
|logit|, so pooling is exact: the sums add up across ranks and the max takes the max, and every
rank then reads what one process that had seen every rank's batch would (means weighted by
rows, not a mean of per-rank means).
"""

from __future__ import annotations

from typing import Any

import torch

from attnscale.measure.monitor import Monitor

__all__ = ["all_reduce_monitor", "is_distributed"]


def is_distributed(group: Any = None) -> bool:
    """Whether torch.distributed is initialized with more than one rank in ``group``."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def all_reduce_monitor(monitor: Monitor, group: Any = None) -> bool:
    """Pool what every rank of ``group`` recorded in ``monitor``, in place (module docstring).

    A collective: every rank must call it at the same point, having recorded the same layers
    (ValueError naming the counts otherwise, raised on every rank alike); it waits on its peers
    up to the process group's timeout (``init_process_group(timeout=...)``). Returns False, and
    does nothing, without torch.distributed or with a single rank.
    """
    import torch.distributed as dist

    if not isinstance(monitor, Monitor):
        raise TypeError(f"monitor must be a Monitor, got {type(monitor).__name__}")
    if not is_distributed(group):
        return False
    accs = monitor.accumulators()
    counts = torch.tensor([len(accs), -len(accs)], dtype=torch.float64)
    dist.all_reduce(counts, dist.ReduceOp.MAX, group=group)  # the most and (negated) fewest
    if counts[0] != -counts[1]:
        raise ValueError(f"ranks recorded different layers: {int(-counts[1])} to "
                         f"{int(counts[0])} accumulators (this rank {len(accs)})")
    if not accs:
        return True
    totals = [acc.totals() for acc in accs]
    sums = torch.cat([t[0].detach().cpu().flatten() for t in totals])
    top = torch.cat([t[1].detach().cpu() for t in totals])
    dist.all_reduce(sums, dist.ReduceOp.SUM, group=group)
    dist.all_reduce(top, dist.ReduceOp.MAX, group=group)
    sizes, heads = [t[0].numel() for t in totals], [acc.heads for acc in accs]
    for acc, part, peak in zip(accs, sums.split(sizes), top.split(heads), strict=True):
        acc.set_totals(part.view(acc.heads, -1), peak)
    return True
