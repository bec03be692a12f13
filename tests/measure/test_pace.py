"""attnscale.measure.pace: the reference workload's median time and report.json's host_pace."""

from __future__ import annotations

import itertools

import pytest

from attnscale.measure.pace import REFERENCE_STEPS, pace_record, reference_seconds


def test_reference_time_is_the_median_of_the_repeats():
    # a fake clock: the repeats take 3, 1 and 2 s (start/end pairs)
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])
    assert reference_seconds(repeats=3, steps=1, timer=lambda: next(ticks)) == 2.0


def test_reference_time_is_real_and_restores_the_thread_count():
    import torch

    before = torch.get_num_threads()
    seconds = reference_seconds(repeats=1, steps=5)
    assert 0 < seconds < 30
    assert torch.get_num_threads() == before


def test_pace_record_states_the_elapsed_time_in_reference_units():
    rec = pace_record(0.2, 0.3, 500.0)
    assert rec == {"reference_s": [0.2, 0.3], "steps": REFERENCE_STEPS,
                   "elapsed_in_references": pytest.approx(2000.0)}


@pytest.mark.parametrize("kwargs,word", [({"repeats": 0}, "repeats"), ({"steps": 0}, "steps")])
def test_bad_arguments_name_themselves(kwargs, word):
    with pytest.raises(ValueError, match=word):
        reference_seconds(**kwargs)


def test_a_zero_reference_is_an_error():
    with pytest.raises(ValueError, match="reference times"):
        pace_record(0.0, 0.0, 1.0)


def test_clock_is_read_twice_per_repeat():
    calls = itertools.count()
    reference_seconds(repeats=2, steps=1, timer=lambda: float(next(calls)))
    assert next(calls) == 4


def test_the_callers_random_state_is_left_alone():
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    reference_seconds(repeats=1, steps=1)
    assert torch.equal(torch.rand(3), expected)
