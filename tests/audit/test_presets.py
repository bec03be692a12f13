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


def test_the_text_sweep_decides_at_unit_init_with_gpt2_context_at_the_widest_width():
    plan = studies(PRESETS["standard"])
    assert plan["lr_text"].cells == {"init": ("unit",), "d_model": (32, 128)}
    assert plan["lr_text_gpt2"].cells == {"init": ("gpt2",), "d_model": (128,)}
    assert set(plan["lr_text_gpt2"].arms) <= set(plan["lr_text"].arms)
    assert plan["lr_text_gpt2"].seeds == plan["lr_text"].seeds
    # the context runs the tuned LRs: under GPT-2's init no arm's best is near 0.1
    assert plan["lr_text_gpt2"].lrs == (1e-3, 3e-3, 1e-2, 3e-2) != plan["lr_text"].lrs
    assert plan["tau_n64"].seeds == tuple(range(6)) and plan["tau_n64"].cells == {
        "seq_len": (64,)}


def test_c4s_studies_tune_on_two_seeds_the_others_on_one():
    for p in (PRESETS["standard"], PRESETS["full"]):
        tuned = {n: s for n, s in studies(p).items() if s.lr_choice == "tuned" and s.seeds}
        assert {n for n, s in tuned.items() if s.tune_seeds == p.tune_seeds[:2]} == {
            "tau", "tau_n64"}
        assert all(s.tune_seeds == p.tune_seeds[:1] for n, s in tuned.items()
                   if n not in ("tau", "tau_n64"))


def test_head_dims_gpt2_cells_are_context():
    hd = studies(PRESETS["standard"])["head_dim"]
    assert hd.is_context((("init", "gpt2"), ("d_model", 256)))
    assert not hd.is_context((("init", "unit"), ("d_model", 256)))


def test_the_deep_studies_run_only_in_the_deep_preset():
    standard, deep = studies(PRESETS["standard"]), studies(PRESETS["deep"])
    for name in ("long_text", "unstable"):
        assert standard[name].seeds == ()  # planned, never run
        assert deep[name].seeds
    assert deep["long_text"].base["steps"] == 1500 and deep["unstable"].base["steps"] == 1000
    assert {"scaled_dot_noclip", "dot_noclip"} <= set(deep["unstable"].arms)
    # every other study is the standard one, so a deep report reuses a standard report's runs
    assert {k: v for k, v in deep.items() if k not in ("long_text", "unstable")} == \
        {k: v for k, v in standard.items() if k not in ("long_text", "unstable")}


def test_no_two_studies_share_a_run():
    """A run's id is its config's hash and is stored under the first study that trains it, so
    two studies sharing a config would leave the second one missing runs."""
    from attnscale.audit.claim import training_plan
    from attnscale.audit.running import grid_spec
    from attnscale.lab.sweep import expand

    plan = training_plan(PRESETS["deep"])
    owner: dict[str, str] = {}
    for name, study in plan.items():
        spec = grid_spec(study, study.tune_seeds + study.seeds, study.lrs)
        for point in expand(spec):
            assert owner.setdefault(point.id, name) == name, (name, owner[point.id])
