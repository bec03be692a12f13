"""The Trainer integrations under DDP: a real ``torchrun --nproc_per_node 2`` on gloo. Each
rank trains on its own batches; the health callback pools their statistics, so both ranks log
the same numbers, record the same alarm and stop at the same step; QK-Clip reduces the per-head
maxima first, so both replicas clip alike and end with identical weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

WORKER = Path(__file__).with_name("ddp_trainer_worker.py")


def torchrun(out: Path, tau: float) -> list[dict]:
    """Both ranks' records; fails with the ranks' output if torchrun fails or takes > 240 s."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([exe, "--standalone", "--nproc_per_node=2", str(WORKER), str(out),
                           str(tau)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ranks_pool_their_statistics_stop_together_and_clip_alike(tmp_path):
    ranks = torchrun(tmp_path, tau=2.0)
    a, b = ranks
    assert a["history"] and a["history"] == b["history"]  # the same pooled numbers
    assert a["health"] == b["health"]  # the same alarm record
    assert a["health"]["alarm_step"] is not None
    assert a["health"]["stopped_at"] == a["health"]["alarm_step"] == a["global_step"]
    assert b["global_step"] == a["global_step"] < 12  # stopped together, before the end
    assert a["clips"] and a["clips"] == b["clips"]  # reduced maxima: the same heads, same γ
    assert a["weights"] == b["weights"]  # the replicas stayed identical
