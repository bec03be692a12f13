"""Evidence from a hand-made results store: the numbers the claim rules read."""

from __future__ import annotations

import pytest

from attnscale.audit import evidence as E
from attnscale.audit import measurements as M
from attnscale.lab.records import Run
from attnscale.lab.store import Store
from attnscale.lab.sweep import config_id, resolve


def finish(store, sweep, rid, variant, config, loss, metric=None, loss0=4.0, status="done"):
    """Store one finished run; its id is the real one of its resolved config (evidence skips
    runs whose id does not match their config), ``rid`` only names it in the fixture."""
    config = resolve(config)
    rid = config_id(config)
    store.add_runs([{"id": rid, "config": config, "variant": variant}], sweep=sweep)
    store.finish(rid, {"status": status, "final_loss": loss, "final_metric": metric,
                       "initial_loss": loss0, "steps": 10,
                       "history": [{"step": 0, "loss": loss0, "max_abs_logit": 1.0},
                                   {"step": 10, "loss": loss, "max_abs_logit": 3.0}]})


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "results.db") as s:
        # text LR sweep at width 32: scaled_dot best at 1e-2 (losses 2.0, 2.2), dot diverges
        # at 1e-1 (clipped to its loss0 = 4) and is best at 1e-2 (3.0, and 5.5 -> clipped 4)
        for seed in (0, 1):
            for lr, sd, dot in ((1e-2, 2.0 + 0.2 * seed, 3.0 + 2.5 * seed), (1e-1, 3.5, None)):
                cfg = {"task": "text", "d_model": 32, "lr": lr, "seed": seed}
                finish(s, "lr_text", f"s{lr}{seed}", "scaled_dot", {**cfg, "score": "scaled_dot"},
                       sd)
                finish(s, "lr_text", f"d{lr}{seed}", "dot", {**cfg, "score": "dot"},
                       dot if dot is not None else 9.0,
                       status="done" if dot is not None else "diverged")
        s.add_runs([{"id": "queued", "config": {"lr": 1e-2}}], sweep="lr_text")  # ignored
        yield s


def runs_of(store, sweep):
    from attnscale.audit.running import study_runs
    return study_runs(store, sweep)


def test_lr_sweep_sensitivity_and_instability_per_seed(store):
    """Sensitivity is each seed's mean clipped loss over the grid minus the lowest clipped loss
    any arm reached on that seed (shared by the arms); a diverged run is unstable, and so is
    a loss that climbed more than 1 nat above its own low and stayed there."""
    from attnscale.audit.studies import Study
    runs = runs_of(store, "lr_text")
    study = Study("lr_text", {"seq_len": 32}, ("scaled_dot", "dot"), (1e-2, 1e-1),
                  (0, 1), cells={"d_model": (32,)})
    ev = E.lr_text_evidence(study, runs)
    dot = ev["sweep"]["d_model=32"]["dot"]
    sd = ev["sweep"]["d_model=32"]["scaled_dot"]
    # shared reference: scaled_dot's 2.0 (seed 0) and 2.2 (seed 1)
    # dot: seed 0 c = (3.0, 4.0 clipped) -> 3.5 - 2.0; seed 1 (4.0 clipped, 4.0) -> 4.0 - 2.2
    assert dot["sensitivity"] == pytest.approx({"0": 1.5, "1": 1.8})
    assert sd["sensitivity"] == pytest.approx({"0": 0.75, "1": 0.65})
    # seed 0: the divergence only; seed 1: the divergence and 4.0 -> 5.5 (it blew up)
    assert dot["unstable"] == pytest.approx({"0": 0.5, "1": 1.0})
    assert sd["unstable"] == pytest.approx({"0": 0.0, "1": 0.0})
    assert (dot["n_runs"], dot["n_diverged"], dot["n_past_logit_limit"]) == (4, 2, 0)
    # the leave-one-seed-out choice: each seed read at the LR the other seed found best
    assert ev["loss"]["d_model=32"]["scaled_dot"]["lrs"] == {"0": 1e-2, "1": 1e-2}


def sweep_run(seed, lr, final, losses=(4.0,), status="done"):
    history = [{"step": i, "loss": x, "max_abs_logit": 1.0} for i, x in enumerate(losses)]
    return Run.from_row({"status": status, "final_loss": final, "initial_loss": losses[0],
                         "config": {"seed": seed, "lr": lr}, "history": history})


def test_a_deeper_single_minimum_is_not_read_as_lr_sensitivity():
    """The artefact of each arm's own best: "dot" has the deeper minimum (2.0 against 2.2) but
    is worse elsewhere, "scaled" the reverse. Against its own best dot looks 0.15 nats more
    sensitive; against the shared reference the difference is exactly the difference of the
    two grid means (-0.05), for every seed."""
    scaled = (3.0, 2.5, 2.2, 2.4)
    dot = (2.9, 2.4, 2.0, 2.6)
    lrs = (1e-3, 3e-3, 1e-2, 3e-2)
    arms = {name: [sweep_run(s, lr, x + 0.01 * s)
                   for s in range(3) for lr, x in zip(lrs, xs, strict=True)]
            for name, xs in (("scaled", scaled), ("dot", dot))}
    reference = {s: 2.0 + 0.01 * s for s in range(3)}
    got = {name: E.lr_sweep_arm(runs, reference)["sensitivity"] for name, runs in arms.items()}
    for s in map(str, range(3)):
        assert got["dot"][s] - got["scaled"][s] == pytest.approx(
            sum(dot) / 4 - sum(scaled) / 4, abs=1e-12)
    own = {name: sum(xs) / 4 - min(xs) for name, xs in (("scaled", scaled), ("dot", dot))}
    assert own["dot"] - own["scaled"] == pytest.approx(0.15)  # what the old reading said


def test_unstable_is_a_blow_up_not_under_training_or_a_large_logit():
    slow = sweep_run(0, 3e-4, 3.6, losses=(4.0, 3.9, 3.7))  # far above any good run: fine
    assert not E.unstable(slow)
    spiked = sweep_run(0, 0.3, 3.5, losses=(4.0, 2.1, 3.3))  # fell to 2.1, ended 1.4 above
    assert E.unstable(spiked)
    recovered = sweep_run(0, 0.3, 2.3, losses=(4.0, 2.1, 3.9))  # spiked, came back
    assert not E.unstable(recovered)
    assert E.unstable(sweep_run(0, 1.0, 9.0, status="diverged"))
    assert E.unstable(sweep_run(0, 1.0, float("nan")))
    big = sweep_run(0, 0.1, 2.0, losses=(4.0, 2.0))
    big.history[-1]["max_abs_logit"] = 2e4  # the marker alone
    assert not E.unstable(big)


def test_layer_stat_reads_init_and_last_rows():
    run = Run.from_row({"config": {}, "history": [{"layers": [{"logit_std": 1.0}]},
                                                  {"layers": [{"logit_std": 3.0}]}]})
    assert E.layer_stat(run, "logit_std", 0) == 1.0
    assert E.layer_stat(run, "logit_std", -1) == 3.0
    assert E.layer_stat(Run.from_row({"config": {}}), "logit_std", 0) is None


def test_measurements_are_cached_in_the_store(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"x": float("nan"), "y": (1, 2)}

    with Store(tmp_path / "r.db") as s:
        first = M.cached(s, "demo", {"n": (1, 2)}, compute)
        again = M.cached(s, "demo", {"n": [1, 2]}, compute)  # same key: tuples are lists
        other = M.cached(s, "demo", {"n": [2]}, compute)
    assert first == again == other == {"x": None, "y": [1, 2]}
    assert len(calls) == 2
    key = M.measurement_key
    assert key("demo", {"b": 1, "a": 2}) == key("demo", {"a": 2, "b": 1}) != key("qk", {})


def test_study_runs_keep_only_the_studys_own_settings(store):
    """Two presets in one database share study names and seeds; a study reads only the runs
    made with its own base settings."""
    from attnscale.audit.running import study_runs
    from attnscale.audit.studies import Study
    mine = Study("lr_text", {"task": "text"}, ("scaled_dot", "dot"), (1e-2,), (0, 1))
    other = Study("lr_text", {"task": "text", "steps": 7}, ("scaled_dot",), (1e-2,),
                  (0, 1))
    assert len(study_runs(store, mine)) == len(study_runs(store, "lr_text")) == 8
    assert study_runs(store, other) == []
