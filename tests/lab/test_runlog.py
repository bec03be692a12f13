"""lab.runlog's history rows: non-finite statistics become None, except the fraction of
non-finite logits, which is what a diverged layer has to say; the row logit spread against
numpy and its known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.core.reference import attention_logits
from attnscale.lab.build import build_model, build_task
from attnscale.lab.config import TrainConfig
from attnscale.lab.runlog import LAYER_STATS, attention_rows, layer_row, row_spread


def test_a_diverged_layer_keeps_its_nonfinite_fraction():
    module = MultiheadSelfAttention(16, 2)
    means = dict.fromkeys(LAYER_STATS, 0.5) | {"max_abs_logit": math.inf,
                                                "nonfinite_fraction": 1.0}
    healthy = layer_row(module, 1.0, 1.0, (2.0, 0.5), means)
    assert healthy["max_abs_logit"] is None and healthy["logit_std"] == 0.5
    assert healthy["nonfinite_fraction"] == 1.0 and healthy["row_logit_std"] == 2.0
    assert healthy["row_freeze_ratio"] == 0.5
    broken = layer_row(module, math.nan, 1.0, (math.nan, math.nan), means)  # q itself is NaN
    assert broken["nonfinite_fraction"] == 1.0
    assert all(broken[k] is None for k in LAYER_STATS if k != "nonfinite_fraction")
    assert broken["row_logit_std"] is None and broken["row_freeze_ratio"] is None


def test_row_spread_known_answers():
    inf, t = math.inf, torch.tensor
    keep = t([[True, True, True], [True, True, False]])
    # a row shift the softmax ignores counts for nothing; two keys a, b: σ = |a − b|/√2
    std, ratio = row_spread(t([[5.0, 5.0, 5.0], [1.0, 3.0, -inf]]), keep)
    assert std == pytest.approx(math.sqrt(2) / 2)
    assert ratio == pytest.approx(math.sqrt(2) / math.sqrt(2 * math.log(2)) / 2)
    one_key = t([[True, False], [False, True]])
    assert all(map(math.isnan, row_spread(t([[1.0, -inf], [-inf, 2.0]]), one_key)))
    # a visible logit that overflowed to −inf, or NaN, is a blow-up, not a hidden key
    assert all(map(math.isnan, row_spread(t([[1.0, -inf, 0.0]]), t([[True] * 3]))))
    assert all(map(math.isnan, row_spread(t([[1.0, math.nan, 0.0]]), t([[True] * 3]))))


def test_row_spread_of_causal_logits_matches_numpy():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 9, 4, generator=gen), torch.randn(2, 3, 9, 4, generator=gen)
    z, keep = attention_logits(q, k, is_causal=True, with_keep=True)  # (2, 3, 9, 9)
    assert keep.shape == z.shape and not bool(keep[0, 0, 0, 1])
    full = (q @ k.transpose(-1, -2) / 2).numpy()
    rows = [full[b, h, i, : i + 1] for b in range(2) for h in range(3) for i in range(1, 9)]
    std, ratio = row_spread(z, keep)
    assert std == pytest.approx(np.mean([r.std(ddof=1) for r in rows]), rel=1e-5)
    assert ratio == pytest.approx(np.mean([r.std(ddof=1) / math.sqrt(2 * math.log(r.size))
                                           for r in rows]), rel=1e-5)


def test_attention_rows_log_the_row_spread_of_each_layer():
    config = TrainConfig(task="text", d_model=16, n_heads=2, n_layers=2, seq_len=8, mlp=False)
    task = build_task(config)
    model = build_model(config, task)
    batch = task.train_batch(0, 4)
    seen: list[tuple[float, float]] = []
    def spread(module, q, k, call):
        seen.append(row_spread(*attention_logits(q, k, is_causal=True, with_keep=True)))
    for m in model.modules():
        if isinstance(m, MultiheadSelfAttention):
            m.capture = spread
    with torch.no_grad():
        model.eval()(batch.tokens, batch.scale)
    rows = attention_rows(model, batch)
    got = [x for r in rows for x in (r["row_logit_std"], r["row_freeze_ratio"])]
    assert got == pytest.approx([x for pair in seen for x in pair])
    assert len(seen) == 2 and all(0 < x < math.inf for pair in seen for x in pair)
