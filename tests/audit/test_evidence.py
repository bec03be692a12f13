"""Evidence from a hand-made results store: the numbers the claim rules read."""

from __future__ import annotations

import pytest

from attnscale.audit import evidence as E
from attnscale.audit import measurements as M
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
        # at 1e-1 (clipped to its loss0 = 4) and is best at 1e-2 (3.0 and 5.0 -> clipped 4)
        for seed in (0, 1):
            for lr, sd, dot in ((1e-2, 2.0 + 0.2 * seed, 3.0 + 2 * seed), (1e-1, 3.5, None)):
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
    """Sensitivity is each seed's mean clipped loss over the grid minus its minimum; a diverged
    run is unstable, and so is a final loss more than 1 nat above the width's best."""
    from attnscale.audit.studies import Study
    runs = runs_of(store, "lr_text")
    study = Study("lr_text", ("C11",), {"seq_len": 32}, ("scaled_dot", "dot"), (1e-2, 1e-1),
                  (0, 1), cells={"d_model": (32,)})
    ev = E.lr_text_evidence(study, runs)
    dot = ev["sweep"]["d_model=32"]["dot"]
    # seed 0: c = (3.0, 4.0 clipped) -> 0.5; seed 1: (4.0 clipped, 4.0) -> 0
    assert dot["sensitivity"] == pytest.approx({"0": 0.5, "1": 0.0})
    # best over the width is 2.0: 3.0 is fine, 5.0 (> 3.0) and the divergences are unstable
    assert dot["unstable"] == pytest.approx({"0": 0.5, "1": 1.0})
    sd = ev["sweep"]["d_model=32"]["scaled_dot"]
    assert sd["unstable"] == pytest.approx({"0": 0.0, "1": 0.0})
    # the leave-one-seed-out choice: each seed read at the LR the other seed found best
    assert ev["loss"]["d_model=32"]["scaled_dot"]["lrs"] == {"0": 1e-2, "1": 1e-2}


def test_unstable_marks_logits_past_wortsman_limit():
    run = {"status": "done", "final_loss": 2.0, "history": [{"step": 0, "max_abs_logit": 2e4}]}
    assert E.unstable(run, best=2.0)
    run["history"][0]["max_abs_logit"] = 10.0
    assert not E.unstable(run, best=2.0) and E.unstable(run, best=0.5)


def test_layer_stat_reads_init_and_last_rows():
    run = {"history": [{"layers": [{"logit_std": 1.0}]}, {"layers": [{"logit_std": 3.0}]}]}
    assert E.layer_stat(run, "logit_std", 0) == 1.0
    assert E.layer_stat(run, "logit_std", -1) == 3.0
    assert E.layer_stat({"history": []}, "logit_std", 0) is None


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
    mine = Study("lr_text", ("C11",), {"task": "text"}, ("scaled_dot", "dot"), (1e-2,), (0, 1))
    other = Study("lr_text", ("C11",), {"task": "text", "steps": 7}, ("scaled_dot",), (1e-2,),
                  (0, 1))
    assert len(study_runs(store, mine)) == len(study_runs(store, "lr_text")) == 8
    assert study_runs(store, other) == []
