"""Typed run records: a stored row of a real run round-trips into a :class:`Run` whose config is
the TrainConfig it was trained with; a bad config names its field; flat keys read as stored; the
analysis reads records and dicts alike."""

from __future__ import annotations

import dataclasses

import pytest

from attnscale.lab import analysis
from attnscale.lab.config import TrainConfig
from attnscale.lab.records import Run
from attnscale.lab.store import Store
from attnscale.lab.sweep import config_id, is_current
from attnscale.lab.train import run as train

TINY = {"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "d_model": 16, "n_heads": 2,
        "n_layers": 1, "batch_size": 4, "steps": 2, "log_every": 1, "lr": 3e-3, "seed": 7}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """(the config, the stored row with its history) of one 2-step run."""
    config = TrainConfig(**TINY)
    flat = config.flat()
    rid = config_id(flat)
    with Store(tmp_path_factory.mktemp("records") / "r.db") as store:
        store.add_runs([{"id": rid, "config": flat, "variant": "tiny"}], sweep="s")
        store.finish(rid, train(config).to_dict())
        (row,) = store.runs(history=True)
    return config, row


def test_a_stored_row_round_trips(stored):
    config, row = stored
    assert is_current(row)
    r = Run.from_row(row)
    assert r.config == config and r.config.flat() == row["config"] == r.flat_config
    assert (r.id, r.sweep, r.variant, r.status) == (row["id"], "s", "tiny", row["status"])
    assert (r.seed, r.lr) == (7, 3e-3)
    for name in ("final_loss", "final_metric", "initial_loss", "diverged_step", "steps",
                 "elapsed_s"):
        assert getattr(r, name) == row[name], name
    assert r.final_metrics == (row["final_metrics"] or {})
    assert r.history == row["history"] and len(r.history) >= 2
    assert {"step", "loss"} <= set(r.history[0])
    assert all(r.value(k) == v for k, v in row["config"].items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.status = "failed"  # type: ignore[misc]


def test_the_analysis_reads_a_record_as_it_reads_the_row(stored):
    _, row = stored
    r = Run.from_row(row)
    assert analysis.finished([r]) == [r]
    assert analysis.loss_by_lr([r]) == analysis.loss_by_lr([row])
    assert analysis.initial_loss(r) == analysis.initial_loss(row)
    assert analysis.max_logit_curve(r) == analysis.max_logit_curve(row)
    assert analysis.group_key(r) == "tiny"
    bare = dataclasses.replace(r, variant=None)
    assert analysis.group_key(bare) == analysis.group_key({**row, "variant": None})
    assert list(analysis.group_runs([r], by=["d_model"])) == [(16, "tiny")]


@pytest.mark.parametrize(("config", "field"), [
    ({"d_model": "wide"}, "model.d_model"),
    ({"lr": -1.0}, "optim.lr"),
    ({"d_modl": 64}, "d_modl"),
    ({"score": "nope"}, "score"),
])
def test_a_bad_config_names_the_run_and_the_field(config, field):
    with pytest.raises(ValueError, match=r"run r1: config: .*") as err:
        Run.from_row({"id": "r1", "status": "done", "config": config})
    assert field in str(err.value)


def test_a_row_without_a_config_or_with_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="config must be a dict"):
        Run.from_row({"id": "r1", "status": "done", "config": None})
    with pytest.raises(ValueError, match="unknown status 'finished'"):
        Run.from_row({"id": "r1", "status": "finished", "config": {}})


def test_a_partial_row_takes_the_defaults():
    r = Run.from_row({"status": "diverged", "config": {"seed": 3, "lr": 0.1}})
    assert (r.id, r.variant, r.final_loss, r.history, r.final_metrics) == ("", None, None, [], {})
    assert r.config == TrainConfig(seed=3, lr=0.1) and (r.seed, r.lr) == (3, 0.1)


def test_value_reads_flat_keys_as_the_stored_dict():
    r = Run.from_row({"status": "done", "config": {"task": "length", "init": "unit",
                                                    "d_model": 64, "seq_len": 32}})
    assert (r.value("d_model"), r.value("init"), r.value("seq_len")) == (64, "unit", 32)
    assert r.value("task") == r.value("task.name") == "length"
    assert r.value("model.d_model") == 64 and r.value("pos") == "rope"  # the task's default
    assert r.value("qk_clip") is None  # left out of the stored dict while off
    assert r.value("num_kv_pairs") is None  # another task's option
    assert r.value("warmup_steps") == 100  # filled in as the stored dict has it
    with pytest.raises(ValueError, match="did you mean 'd_model'"):
        r.value("d_modle")
