"""QK-Clip and the pooled monitor under FSDP2 (``fully_shard``): a real ``torchrun
--nproc_per_node 2`` on gloo. Each rank trains on half the batch with its parameters sharded;
QK-Clip pools the per-head maxima and scales each rank's shard of W_q and W_k. The result must
be what one process training on the whole batch with QK-Clip gets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from fsdp_worker import LR, STEPS, batch, loss_fn, model

from attnscale.integrations.qkclip import QKClip
from attnscale.measure.monitor import Monitor

WORKER = Path(__file__).with_name("fsdp_worker.py")
TAU = 2.0  # rank 1's half of the batch (x 3) passes it at once; clipped at every step


def torchrun(out: Path, tau: float) -> list[dict]:
    """Both ranks' records; fails with the ranks' output if torchrun fails or takes > 120 s."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([exe, "--standalone", "--nproc_per_node=2", str(WORKER), str(out),
                           str(tau)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def one_process(tau: float) -> tuple[list[list[dict]], dict[str, list], dict[str, list]]:
    """The same steps in one process on the whole batch: the clips, the final weights and each
    head's max |logit| on the batch after training."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=LR)
    clip = QKClip(m, tau)
    clips = []
    for _ in range(STEPS):
        with clip.measure():
            loss_fn(m(batch())).backward()
        opt.step()
        opt.zero_grad()
        clips.append([c.to_dict() for c in clip.apply()])
    with torch.no_grad(), Monitor(m) as mon:
        m(batch())
    after = {k: v.to_dict()["per_head"]["max_abs_logit"] for k, v in mon.stats().items()}
    return clips, {n: p.detach().tolist() for n, p in m.named_parameters()}, after


def test_fsdp_ranks_clip_their_shards_as_one_process_would(tmp_path):
    a, b = torchrun(tmp_path, TAU)
    assert set(a["sharded"]) == {"DTensor"}  # the parameters really were sharded
    assert a["clips"] == b["clips"] and a["after"] == b["after"]  # pooled: the same everywhere
    clips, weights, after = one_process(TAU)
    assert all(step for step in clips)  # the test exercises the clip at every step
    for fsdp_step, ref_step in zip(a["clips"], clips, strict=True):
        assert [(c["layer"], c["head"]) for c in fsdp_step] == [
            (c["layer"], c["head"]) for c in ref_step]
        np.testing.assert_allclose([c["gamma"] for c in fsdp_step],
                                   [c["gamma"] for c in ref_step], rtol=1e-4)
    for name, ref in weights.items():
        np.testing.assert_allclose(a["weights"][name], ref, rtol=1e-4, atol=1e-5, err_msg=name)
    # the pooled per-head maxima after training are those of the whole batch in one process
    for name, ref in after.items():
        np.testing.assert_allclose(a["after"][name], ref, rtol=1e-4, err_msg=name)
