"""The presets' seeds: task studies report as many of the task seeds as their claims need,
never fewer than three, and a seed offset keeps every study's seeds disjoint from another
offset's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnscale.audit.studies import PRESETS, SEED_STRIDE, studies, with_seed_offset


def test_standard_gives_the_task_studies_their_own_seed_counts():
    p = PRESETS["standard"]
    plan = studies(p)
    assert plan["salience"].seeds == tuple(range(5))
    assert plan["length"].seeds == plan["tau"].seeds == p.task_seeds == tuple(range(10))
    assert plan["lr_text"].seeds == plan["head_dim"].seeds == p.seeds


def test_seed_counts_follow_a_seed_offset():
    shifted = studies(with_seed_offset(PRESETS["standard"], 2))
    assert shifted["salience"].seeds == tuple(2 * SEED_STRIDE + s for s in range(5))
    assert not set(shifted["tau"].seeds) & set(studies(PRESETS["standard"])["tau"].seeds)


def test_seed_counts_out_of_range_or_unknown_are_refused_by_name():
    with pytest.raises(ValueError, match="seed_counts must be 3 to 10"):
        replace(PRESETS["standard"], seed_counts={"tau": 2})
    with pytest.raises(ValueError, match="seed_counts must be 3 to 10"):
        replace(PRESETS["standard"], seed_counts={"tau": 11})
    with pytest.raises(ValueError, match=r"seed_counts names \['taus'\]"):
        replace(PRESETS["standard"], seed_counts={"taus": 5})
