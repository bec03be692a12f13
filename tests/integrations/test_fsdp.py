"""QK-Clip and the pooled monitor under FSDP2 (``fully_shard``): a real ``torchrun
--nproc_per_node 2`` on gloo. Each rank trains on half the batch with its parameters sharded;
QK-Clip pools the per-head maxima and scales each rank's shard of W_q and W_k. The result must
be what one process training on the whole batch with QK-Clip gets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2: torch >= 2.6)
except ImportError:
    pytest.skip("FSDP2's fully_shard needs torch >= 2.6", allow_module_level=True)

from fsdp_worker import LR, STEPS, batch, loss_fn, model

from attnscale.integrations.qkclip import QKClip
from attnscale.measure.monitor import Monitor

WORKER = Path(__file__).with_name("fsdp_worker.py")
# FSDP averages the two halves' float32 gradients in another order than one process's backward:
# the results agree to float32 rounding amplified over three steps of LR 0.5 (at most 1.1e-5 of
# a weight measured); a clip missed or applied twice moves them by a factor of 0.03-0.9.
RTOL = ATOL = 1e-4
TAU = 0.5  # every layer passes it at once on rank 1's half (x 3); clipped at every step


def ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def one_process(tau: float) -> tuple[list[list[dict]], dict[str, list], dict[str, list]]:
    """The same steps in one process on the whole batch: the clips, the final weights and each
    head's max |logit| on the batch after training."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
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


def test_fsdp_ranks_clip_their_shards_as_one_process_would(tmp_path, torchrun):
    torchrun(WORKER, tmp_path, str(TAU))
    a, b = ranks(tmp_path)
    assert set(a["sharded"]) == {"DTensor"}  # the parameters really were sharded
    assert a["clips"] == b["clips"] and a["after"] == b["after"]  # pooled: the same everywhere
    clips, weights, after = one_process(TAU)
    assert all(step for step in clips)  # the test exercises the clip at every step
    assert {c["layer"] for step in clips for c in step} == {"0.mha", "1", "2"}  # every kind
    for fsdp_step, ref_step in zip(a["clips"], clips, strict=True):
        assert [(c["layer"], c["head"]) for c in fsdp_step] == [
            (c["layer"], c["head"]) for c in ref_step]
        np.testing.assert_allclose([c["gamma"] for c in fsdp_step],
                                   [c["gamma"] for c in ref_step], rtol=RTOL)
    for name, ref in weights.items():
        np.testing.assert_allclose(a["weights"][name], ref, rtol=RTOL, atol=ATOL, err_msg=name)
    # the pooled per-head maxima after training are those of the whole batch in one process
    for name, ref in after.items():
        # a logit multiplies two weights' errors into the inputs' (up to 1.7e-4 measured)
        np.testing.assert_allclose(a["after"][name], ref, rtol=10 * RTOL, err_msg=name)
