"""Attention statistics under data parallelism (DDP, FSDP): each rank measures its own batch,
:func:`all_reduce_monitor` pools them.

Every statistic of :class:`attnscale.measure.headstats.AttentionStats` is a ratio of per-head
sums (rows, logits, entropies, ...; :data:`attnscale.measure.rowstats.SUM_FIELDS`) plus a max
|logit|, so pooling is exact: the sums add up across ranks and the max takes the max, and every
rank then reads what one process that had seen every rank's batch would (means weighted by
rows, not a mean of per-rank means).
"""

from __future__ import annotations

import math
import zlib
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
    and heads: a signature of them (count and CRC-32 of the names, variants and head counts) is
    compared first, and a mismatch is a ValueError raised on every rank alike, before any data
    moves (a layer one rank skipped, e.g. under layer drop, is never summed into another). It
    waits on its peers up to the process group's timeout (``init_process_group(timeout=...)``).
    On an NCCL group the buffers go through the current CUDA device. Returns False, and does
    nothing, without torch.distributed or with a single rank.
    """
    import torch.distributed as dist

    if not isinstance(monitor, Monitor):
        raise TypeError(f"monitor must be a Monitor, got {type(monitor).__name__}")
    if not is_distributed(group):
        return False
    accs = monitor.accumulators()
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    layout = ";".join(f"{name}|{label}|{acc.heads}" for (name, label), acc in accs.items())
    sig = float(zlib.crc32(layout.encode()))
    check = torch.tensor([len(accs), -len(accs), sig, -sig], dtype=torch.float64, device=device)
    dist.all_reduce(check, dist.ReduceOp.MAX, group=group)  # the largest and (negated) smallest
    if check[0] != -check[1] or check[2] != -check[3]:
        raise ValueError(f"ranks recorded different layers or heads ({int(-check[1])} to "
                         f"{int(check[0])} accumulators; this rank: {layout or 'none'})")
    if not accs:
        return True
    totals = [acc.totals() for acc in accs.values()]
    top = torch.cat([t[1].detach() for t in totals]).to(device)
    # Whether MAX propagates a NaN differs between backends: count NaN maxima in the SUM
    # (addition always propagates) and put them back after, so a NaN on one rank is on all.
    nan = torch.isnan(top)
    sums = torch.cat([t[0].detach().flatten() for t in totals] + [nan.double().cpu()]).to(device)
    dist.all_reduce(sums, dist.ReduceOp.SUM, group=group)
    dist.all_reduce(top.masked_fill_(nan, -math.inf), dist.ReduceOp.MAX, group=group)
    sums, nans = sums[:-len(top)], sums[-len(top):]
    top = top.masked_fill_(nans > 0, math.nan)
    sizes, heads = [t[0].numel() for t in totals], [acc.heads for acc in accs.values()]
    for acc, part, peak in zip(accs.values(), sums.cpu().split(sizes), top.cpu().split(heads),
                               strict=True):
        acc.set_totals(part.view(acc.heads, -1), peak)
    return True
