"""Host pace: the time of a fixed reference workload, so that a wall time can be read on a
machine whose speed moves.

On a shared virtual machine the same work can take twice as long at one hour as at another with
nothing else running (this project's 2-core VM on 2026-12-07: one 150-step training run took
0.45 s in the morning, 0.58 s after lunch and 0.85 s mid-afternoon, with no steal time in
/proc/stat). A wall time alone then says little about the code; beside the time of a fixed
workload taken on the same machine at the same time, it does.

:func:`reference_seconds` times a fixed training loop in plain torch (none of attnscale's code,
so a faster attnscale shows as fewer reference units, not as a faster reference): an MLP
64 → 256 → 64 with GELU, mean-squared error on fixed random data (batch 256), ``steps`` steps of
AdamW, on one thread; the median over ``repeats`` timings. ``attnscale report`` takes it before
and after its work and states its elapsed time in these units (report.json ``host_pace``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from attnscale.util.validate import check_int

__all__ = ["REFERENCE_STEPS", "pace_record", "reference_seconds"]

REFERENCE_STEPS = 200  # 0.26-0.32 s on the 2-core VM (2026-12-07 afternoon)


def _reference_loop(steps: int) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=gen)  # (B, D)
    y = torch.randn(256, 64, generator=gen)
    with torch.random.fork_rng():  # the caller's global RNG is left as it was
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def reference_seconds(repeats: int = 3, steps: int = REFERENCE_STEPS,
                      timer: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of ``repeats`` runs of the reference loop (module docstring), one torch
    thread; ``timer`` is injectable for tests."""
    check_int("repeats", repeats, minimum=1)
    check_int("steps", steps, minimum=1)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(repeats):
            start = timer()
            _reference_loop(steps)
            times.append(timer() - start)
    finally:
        torch.set_num_threads(old)
    return statistics.median(times)


def pace_record(start_s: float, end_s: float, elapsed_s: float) -> dict[str, Any]:
    """report.json's ``host_pace``: the reference time before and after, and the elapsed time
    in reference units (elapsed / mean of the two)."""
    mean = (start_s + end_s) / 2
    if not mean > 0:
        raise ValueError(f"reference times must be > 0, got {start_s} and {end_s}")
    return {"reference_s": [start_s, end_s], "steps": REFERENCE_STEPS,
            "elapsed_in_references": elapsed_s / mean}
