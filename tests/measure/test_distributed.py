"""Attention statistics under data parallelism: two gloo ranks started by a real ``torchrun``
each measure half a batch; after all_reduce_monitor both read exactly what one process reads
on the whole batch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from ddp_worker import batch, model

from attnscale.measure.distributed import all_reduce_monitor, is_distributed
from attnscale.measure.monitor import Monitor

WORKER = Path(__file__).with_name("ddp_worker.py")


def test_two_ranks_read_the_statistics_of_the_whole_batch(tmp_path, torchrun):
    torchrun(WORKER, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    m = model()
    with torch.no_grad(), Monitor(m, counterfactuals=True) as whole:
        m(batch())
    expected, dot = whole.flat_stats(), whole.flat_stats("dot")
    for r in ranks:
        assert r["pooled"] is True
        assert r["flat"] == pytest.approx(expected, rel=1e-9)
        assert r["dot"] == pytest.approx(dot, rel=1e-9)
    assert ranks[0]["per_head"] == ranks[1]["per_head"]  # every rank reads the same numbers
    # before pooling each rank saw its own half: rank 1's logits are 9× larger
    key = next(k for k in expected if k.endswith("/max_abs_logit"))
    assert ranks[0]["alone"][key] < ranks[1]["alone"][key] == pytest.approx(expected[key])
    rows = next(k for k in expected if k.endswith("/rows"))
    assert ranks[0]["alone"][rows] + ranks[1]["alone"][rows] == expected[rows]


def test_ranks_with_different_heads_both_fail_before_any_data_moves(tmp_path, torchrun):
    torchrun(WORKER, tmp_path, "mismatch")
    for r in (0, 1):
        error = json.loads((tmp_path / f"rank{r}.json").read_text())["error"]
        assert "different layers or heads" in error


def test_a_nan_max_on_either_rank_is_nan_on_both(tmp_path, torchrun):
    """Whether MAX propagates NaN is the backend's choice; the pooled max must not depend on
    it, nor on which rank holds the NaN."""
    torchrun(WORKER, tmp_path, "nan")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    m = model()
    with torch.no_grad(), Monitor(m, counterfactuals=True) as whole:
        m(batch())
    for r in ranks:
        for layer, heads in r["per_head"].items():
            tops = heads["max_abs_logit"]
            assert math.isnan(tops[0]) and math.isnan(tops[1])
            expected = whole.stats()[layer].to_dict()["per_head"]["max_abs_logit"]
            assert tops[2:] == pytest.approx(expected[2:], rel=1e-9)


def test_a_single_process_is_left_alone():
    assert not is_distributed()
    m = model()
    with torch.no_grad(), Monitor(m) as mon:
        m(batch())
    before = mon.flat_stats()
    assert all_reduce_monitor(mon) is False and mon.flat_stats() == before
    with pytest.raises(TypeError, match="monitor"):
        all_reduce_monitor(m)
