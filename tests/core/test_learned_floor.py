"""A learned log-length s that training drives through 0 is used as max(s, S_FLOOR): the score
stays a positive scale, the monitor's statistics of it stay defined, and above the floor the
value is the parameter itself (gradient included)."""

from __future__ import annotations

import pytest
import torch

from attnscale.core.learned import S_FLOOR, per_head_value


def test_a_learned_s_below_zero_is_floored_and_above_it_is_itself():
    learned = per_head_value("s", floor=S_FLOOR)
    t = {"s": torch.tensor([0.5, -0.02], requires_grad=True)}
    s = learned.value(t)["s"]
    assert s.tolist() == pytest.approx([0.5, S_FLOOR])
    s.sum().backward()
    assert t["s"].grad.tolist() == [1.0, 0.0]
    plain = per_head_value("s")
    assert plain.value({"s": torch.tensor([-0.02])})["s"].item() == pytest.approx(-0.02)
