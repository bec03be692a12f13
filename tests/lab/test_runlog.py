"""lab.runlog's history rows: non-finite statistics become None, except the fraction of
non-finite logits, which is what a diverged layer has to say."""

from __future__ import annotations

import math

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.lab.runlog import LAYER_STATS, layer_row


def test_a_diverged_layer_keeps_its_nonfinite_fraction():
    module = MultiheadSelfAttention(16, 2)
    means = dict.fromkeys(LAYER_STATS, 0.5) | {"max_abs_logit": math.inf,
                                                "nonfinite_fraction": 1.0}
    healthy = layer_row(module, 1.0, 1.0, means)
    assert healthy["max_abs_logit"] is None and healthy["logit_std"] == 0.5
    assert healthy["nonfinite_fraction"] == 1.0
    broken = layer_row(module, math.nan, 1.0, means)  # q itself is NaN
    assert broken["nonfinite_fraction"] == 1.0
    assert all(broken[k] is None for k in LAYER_STATS if k != "nonfinite_fraction")
