"""``attnscale train --tensorboard DIR`` / ``run(config, tensorboard=DIR)``: loss, LR and the
per-layer attention statistics in TensorBoard event files, read back with tbparse and compared
with the run's own history; a clear error when the tensorboard package is missing."""

from __future__ import annotations

import json
import sys

import pytest

from attnscale.cli import run as cli_run
from attnscale.integrations.health import HEALTH_STATISTICS
from attnscale.lab import train as T

pytest.importorskip("tensorboard")
tbparse = pytest.importorskip("tbparse")

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # tbparse's own use of pandas, not ours
    pytest.mark.filterwarnings("ignore:The inplace keyword:DeprecationWarning"),
]

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 2, "batch_size": 8, "seq_len": 32,
        "eval_size": 64, "steps": 12, "warmup_steps": 2, "lr": 1e-2, "log_every": 5}


def scalars(folder) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar in the event files under ``folder``."""
    frame = tbparse.SummaryReader(str(folder)).scalars
    out: dict[str, dict[int, float]] = {}
    for tag, step, value in zip(frame["tag"], frame["step"], frame["value"], strict=True):
        out.setdefault(tag, {})[int(step)] = float(value)
    return out


def test_every_history_row_is_in_the_event_file(tmp_path):
    result = T.run({**TINY, "eval_every": 10}, tensorboard=tmp_path / "tb")
    assert result.tensorboard == str(tmp_path / "tb")
    assert result.to_dict()["tensorboard"] == str(tmp_path / "tb")
    got = scalars(tmp_path / "tb")
    steps = [row["step"] for row in result.history]
    assert steps == [0, 5, 10, 11]  # every log_every steps, and the last
    for tag, key in (("train/loss", "loss"), ("train/lr", "lr"),
                     ("train/grad_norm", "grad_norm")):
        assert got[tag] == pytest.approx({r["step"]: r[key] for r in result.history}, rel=1e-6)
    evals = {r["step"]: r["eval_loss"] for r in result.history if "eval_loss" in r}
    assert set(evals) == {0, 10} and got["eval/loss"] == pytest.approx(evals, rel=1e-6)
    assert set(got["eval/metric"]) == {0, 10}
    layers = ["blocks.0.attn", "blocks.1.attn"]
    assert {t for t in got if t.startswith("attention/")} == {
        f"attention/{layer}/{stat}" for layer in layers for stat in HEALTH_STATISTICS}
    # the same sequences and weights as the history row's statistics: the same numbers
    for row in result.history:
        for layer, stats in zip(layers, row["layers"], strict=True):
            for stat in ("max_abs_logit", "logit_std", "saturated_fraction"):
                assert got[f"attention/{layer}/{stat}"][row["step"]] == pytest.approx(
                    stats[stat], rel=1e-5, abs=1e-7)


def test_without_stats_only_loss_and_lr(tmp_path):
    T.run({**TINY, "steps": 3, "log_every": 1, "stats": False}, tensorboard=tmp_path)
    got = scalars(tmp_path)
    assert set(got) == {"train/loss", "train/lr", "train/grad_norm"}
    assert sorted(got["train/lr"]) == [0, 1, 2]


def test_the_cli_option_records_the_folder(tmp_path, capsys):
    folder = tmp_path / "runs" / "a"
    args = ["train", "--json", "--tensorboard", str(folder), "--steps", "3", "--log-every", "2",
            "--d-model", "16", "--n-heads", "2", "--batch-size", "4", "--seq-len", "16",
            "--eval-size", "16"]
    assert cli_run(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["tensorboard"] == str(folder)
    assert set(scalars(folder)["train/loss"]) == {0, 2}
    assert cli_run(args[:1] + args[2:]) == 0  # the table says where the events went
    assert f"tensorboard\t{folder}" in capsys.readouterr().out


def test_missing_tensorboard_package_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    assert not T.tensorboard_available()
    folder = tmp_path / "tb"
    assert cli_run(["train", "--steps", "1", "--tensorboard", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith("error: --tensorboard needs the tensorboard package")
    assert "attnscale[hf]" in err and not folder.exists()
    with pytest.raises(ValueError, match=r"tensorboard .*attnscale\[hf\]"):
        T.run({**TINY, "steps": 2}, tensorboard=folder)


def test_a_file_is_not_a_tensorboard_folder(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert cli_run(["train", "--steps", "1", "--tensorboard", str(tmp_path / "f")]) == 2
    assert "--tensorboard" in capsys.readouterr().err
