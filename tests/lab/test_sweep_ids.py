"""Sweep run ids: stable across spellings of the same point, one run per distinct point, and
stale when the stored config no longer resolves to its id."""

from __future__ import annotations

from test_sweep import TINY

from attnscale.lab.sweep import config_id, expand, is_current, parse_spec, resolve


def test_ids_are_stable_across_spelling():
    a = expand(parse_spec(TINY + "[axes]\nlr = [0.01]\nscore = ['cosine']\ntau = [10]\n"))
    b = expand(parse_spec(TINY + "[axes]\ntau = [10.0]\nscore = ['cosine']\nlr = [1e-2]\n"))
    assert [p.id for p in a] == [p.id for p in b]
    c = expand(parse_spec(TINY + "[axes]\nlr = [0.01]\nscore = ['cosine']\ntau = [10.5]\n"))
    assert c[0].id != a[0].id


def test_duplicate_points_are_run_once():
    spec = parse_spec(TINY + "[axes]\nlr = [0.01, 0.01, 1e-2]\n")
    assert len(expand(spec)) == 1


def test_a_run_stored_under_other_defaults_is_not_current():
    """Analyses skip runs whose stored config no longer resolves to their id."""
    config = resolve({"task": "mqar", "steps": 3})
    run = {"id": config_id(config), "config": config}
    assert is_current(run)
    # as stored by a version whose TrainConfig lacked a field: its id hashed a smaller dict
    older = {k: v for k, v in config.items() if k != "score_params"}
    assert not is_current({"id": config_id(older), "config": older})
    assert not is_current({"id": "0" * 16, "config": config})
    assert not is_current({"id": config_id(config), "config": {"task": "no such task"}})
