"""The frozen limit of ``attnscale check`` against a Monte Carlo of its own premise: for n i.i.d.
N(0, s²) logits at s = 23·s_c, more than half of the rows are one-hot in float32 (their top
weight rounds to exactly 1), at every n the default inputs give; well short of it, fewer."""

from __future__ import annotations

import math

import pytest
import torch

from attnscale.integrations import checkup as C


def one_hot_share(n: int, factor: float, rows: int = 20_000) -> float:
    """Share of ``rows`` softmax rows of n Gaussian logits of std factor·s_c whose largest
    weight is 1.0 in float32."""
    z = torch.randn(rows, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    weights = torch.softmax((factor * C.critical_std(math.log(n)) * z).float(), dim=-1)
    return float((weights.max(dim=-1).values == 1.0).double().mean())


@pytest.mark.parametrize("n", [10, 32, 128])
def test_past_the_frozen_limit_the_median_row_is_one_hot(n):
    # measured: 0.54-0.57 at 23·s_c; the median row is one-hot from 19-21·s_c
    assert 0.5 < one_hot_share(n, C.ONE_HOT_FACTOR) < 0.65
    # a sharp healthy head (MiniLM's sharpest sits at 4.7·s_c) is far from it
    assert one_hot_share(n, 15.0) < 0.45
    assert one_hot_share(n, 5.0) < 0.2
