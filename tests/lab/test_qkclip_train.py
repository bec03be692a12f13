"""``attnscale train --qk-clip TAU``: the config field (off by default, left out of the dump
while off so earlier runs keep their ids), the CLI option, and a run whose max attention logit
explodes past 1e3 at a high LR without the clip and stays near τ with it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from attnscale.cli import app
from attnscale.lab.config import TrainConfig
from attnscale.lab.sweep import config_id, is_current, resolve
from attnscale.lab.train import run

# Small and fast (about 3 s a run): MQAR, width 32, 2 heads, no MLP; at lr 0.1 the max |logit|
# of the unclipped run passes 1e3 by step 100 (3.8e3 at the end), and its eval loss ends higher.
EXPLODING = {"task": "mqar", "d_model": 32, "n_heads": 2, "steps": 200, "lr": 0.1,
             "warmup_steps": 10, "batch_size": 32, "log_every": 25, "stats_batch": 8}
TAU = 30.0


def test_off_by_default_and_left_out_of_the_dump():
    config = TrainConfig()
    assert config.optim.qk_clip is None
    assert "qk_clip" not in config.flat() and "qk_clip" not in resolve({})
    assert TrainConfig(**config.flat()) == config
    clipped = TrainConfig(qk_clip=50)
    assert clipped.flat()["qk_clip"] == 50.0
    assert TrainConfig(**clipped.flat()) == clipped


def test_runs_stored_before_the_field_keep_their_ids():
    stored = resolve({"task": "mqar", "steps": 3})  # what a run stored before qk_clip holds
    assert is_current({"id": config_id(stored), "config": stored})
    clipped = resolve({"task": "mqar", "steps": 3, "qk_clip": 100})
    assert config_id(clipped) != config_id(stored)
    assert is_current({"id": config_id(clipped), "config": clipped})


@pytest.mark.parametrize("bad, match", [
    ({"qk_clip": 0}, "qk_clip"),
    ({"qk_clip": -1.0}, "qk_clip"),
    ({"qk_clip": 10, "score": "cosine"}, "qk_clip: QK-Clip needs a score whose logit is bilinear"),
])
def test_bad_values_name_qk_clip(bad, match):
    with pytest.raises(ValidationError, match=match):
        TrainConfig(**bad)


def test_cli_option():
    runner = CliRunner()
    out = runner.invoke(app, ["train", "--json", "--d-model", "32", "--steps", "3",
                              "--log-every", "1", "--qk-clip", "0.001"])
    assert out.exit_code == 0, out.output
    record = json.loads(out.stdout)
    assert record["config"]["qk_clip"] == 0.001
    # every head is over τ = 0.001 after the first update: clipped at every step after it
    assert [row["qk_clipped"] for row in record["history"]] == [0, 2, 2]


def test_clip_keeps_an_exploding_max_logit_bounded():
    plain = run(EXPLODING)
    clipped = run({**EXPLODING, "qk_clip": TAU})
    assert plain.status == clipped.status == "done"
    assert max(row["max_abs_logit"] for row in plain.history) > 1e3
    assert "qk_clipped" not in plain.history[-1]
    rows = clipped.history[1:]  # after the first clip
    # the maxima that set each clip are those before the step's update, so the next step's
    # logits can pass τ by what one update adds: a few tens of percent here, not 100×
    assert all(row["max_abs_logit"] <= 1.5 * TAU for row in rows), rows
    assert sum(row["qk_clipped"] for row in rows) > 0
    assert clipped.final_loss < plain.final_loss
