"""Several seeds of one config (``attnscale train --seeds``): the seed list, each seed's run
equal to a single run at that seed, and the summary's interval against scipy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import scipy.stats

from attnscale.lab.config import TrainConfig
from attnscale.lab.seeds import MAX_SEEDS, parse_seeds, summarize, train_seeds
from attnscale.lab.train import run

ROOT = Path(__file__).resolve().parents[2]
TINY = {"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "d_model": 16, "n_heads": 2,
        "n_layers": 1, "batch_size": 4, "steps": 12, "log_every": 4}


@pytest.mark.parametrize("text,seeds", [("0-3", (0, 1, 2, 3)), ("5", (5,)),
                                        ("2-4, 9", (2, 3, 4, 9)), ("7,1", (7, 1))])
def test_seed_lists(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text,words", [("3-1", "backwards"), ("a", "look like"),
                                        ("-1", "look like"), ("1,1", "twice"),
                                        ("0-3,2", "twice"), ("", "look like"),
                                        (f"0-{MAX_SEEDS}", "at most")])
def test_bad_seed_lists_name_the_option(text, words):
    with pytest.raises(ValueError, match="--seeds") as err:
        parse_seeds(text)
    assert words in str(err.value)


def test_each_seed_equals_a_single_run_at_that_seed():
    config = TrainConfig(**TINY)
    done = []
    records = train_seeds(config, (3, 1), workers=2, on_done=done.append)
    assert [r["seed"] for r in records] == [3, 1] and len(done) == 2
    for record in records:
        single = run(config.model_copy(update={"seed": record["seed"]})).to_dict()
        assert record["config"] == single["config"]
        assert record["final_loss"] == single["final_loss"]  # same machine, one thread each
        assert [h["loss"] for h in record["history"]] == [h["loss"] for h in single["history"]]
    assert records[0]["final_loss"] != records[1]["final_loss"]


def test_summary_interval_is_students_t():
    records = [{"status": "done", "final_loss": x, "final_metric": 0.5} for x in (1.0, 1.5, 3.0)]
    records += [{"status": "failed", "seed": 9, "error": "boom"},
                {"status": "diverged", "final_loss": None, "final_metric": 0.25}]
    out = summarize(records)
    assert (out["done"], out["diverged"], out["failed"]) == (3, 1, 1)
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=11 / 6,
                                    scale=scipy.stats.sem([1.0, 1.5, 3.0]))
    loss = out["final_loss"]
    assert loss["n"] == 3 and loss["mean"] == pytest.approx(11 / 6)
    assert (loss["lo"], loss["hi"]) == (pytest.approx(lo), pytest.approx(hi))
    assert out["final_metric"]["n"] == 4  # the diverged run's metric counts


def test_cli_prints_one_record_per_seed_and_the_summary():
    args = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    out = subprocess.run([sys.executable, "-m", "attnscale.cli", "train", *args, "--seeds",
                          "0-2", "--workers", "2", "--json"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["seed"] for r in data["runs"]] == [0, 1, 2]
    assert data["summary"]["final_loss"]["n"] == 3 and data["summary"]["done"] == 3
