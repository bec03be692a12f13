"""The Trainer integrations under DDP: a real ``torchrun --nproc_per_node 2`` on gloo. Each
rank trains on its own batches; the health callback pools their statistics, so both ranks log
the same numbers, record the same alarm and stop at the same step; QK-Clip reduces the per-head
maxima first, so both replicas clip alike and end with identical weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

WORKER = Path(__file__).with_name("ddp_trainer_worker.py")


def ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ranks_pool_their_statistics_stop_together_and_clip_alike(tmp_path, torchrun):
    torchrun(WORKER, tmp_path, "2.0", timeout=240)
    a, b = ranks(tmp_path)
    assert a["history"] and a["history"] == b["history"]  # the same pooled numbers
    assert a["health"] == b["health"]  # the same alarm record
    assert a["health"]["alarm_step"] is not None
    assert a["health"]["stopped_at"] == a["health"]["alarm_step"] == a["global_step"]
    assert b["global_step"] == a["global_step"] < 12  # stopped together, before the end
    assert a["clips"] and a["clips"] == b["clips"]  # reduced maxima: the same heads, same γ
    assert a["weights"] == b["weights"]  # the replicas stayed identical
