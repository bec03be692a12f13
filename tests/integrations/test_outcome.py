"""attnscale.integrations.outcome: the loss-only divergence label on synthetic losses."""

from __future__ import annotations

import math
import random

import pytest

from attnscale.integrations.outcome import label_run, trailing_mean


def healthy(seed: int, steps: int = 300, noise: float = 0.08) -> list[float]:
    """4.6 decaying to 2.2 with batch noise."""
    rng = random.Random(seed)
    return [2.2 + 2.4 * math.exp(-t / 40) + rng.gauss(0, noise) for t in range(steps)]


def test_trailing_mean():
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("seed", range(5))
def test_healthy_noise_is_not_a_divergence(seed):
    out = label_run(healthy(seed), reference=healthy(seed + 100))
    assert not out.diverged and out.step is None and abs(out.final_gap) < 0.1


def test_a_spike_then_plateau_counts_from_the_spike():
    """The loss falls, jumps at step 150 and stays at 3.2 (stuck) -- a divergence at the
    spike, by the blow-up and the stall criteria both."""
    base = healthy(1)
    run = base[:150] + [3.2 + 0.05 * math.sin(t) for t in range(150)]
    out = label_run(run, reference=healthy(2))
    assert out.diverged and out.step == 150 and out.reasons[0] == "blowup"
    assert "stall" in out.reasons and out.final_gap > 0.8


def test_a_run_stuck_near_the_unigram_loss_counts_without_a_spike():
    """No jump anywhere, but it ends 1 nat above a healthy run on the same batches: the onset
    is the first step it trails by 0.25."""
    ref = healthy(3)
    stuck = [max(3.2, 4.6 - 0.1 * t) for t in range(300)]
    out = label_run(stuck, reference=ref)
    smooth_gap = [a - b for a, b in zip(trailing_mean(stuck, 10), trailing_mean(ref, 10),
                                        strict=True)]
    assert out.diverged and out.reasons == ("stall",)
    assert out.step == next(t for t, g in enumerate(smooth_gap) if g >= 0.25)
    assert label_run(stuck).diverged is False  # without a reference: no stall test


def test_non_finite_and_a_recovered_spike():
    run = healthy(4)
    run[200] = math.nan
    assert label_run(run).step == 200 and label_run(run).reasons[0] == "nonfinite"
    spiky = healthy(5)
    spiky[100:106] = [5.0] * 6  # a sustained spike, then back on track
    out = label_run(spiky, reference=healthy(6))
    assert out.diverged and out.step == 100 and out.reasons == ("blowup",)
    one = healthy(7)
    one[100] = 6.0  # one bad batch is not a blow-up
    assert not label_run(one).diverged


def test_label_run_validates():
    with pytest.raises(ValueError, match="losses"):
        label_run([])
    with pytest.raises(TypeError, match="reference"):
        label_run([1.0], reference="abc")
    with pytest.raises(ValueError, match="window"):
        label_run([1.0], window=0)
    with pytest.raises(ValueError, match="gap"):
        label_run([1.0], gap=-1.0)
