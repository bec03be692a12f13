"""Progress a person can see: off a terminal (a file, a pipe, CI), long commands print plain
lines with elapsed time and an estimate of the time left, at most one every 20 s besides each
task's first and last; on a terminal, rich's bars as before.

The pacing and the estimate run on an injected clock; the commands (report, sweep, train,
train --seeds) run with stderr captured, which is not a terminal.
"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from attnscale.cli import run as cli_run
from attnscale.cli.progress import EVERY_S, Pace, Progress, duration, rough

LINE = re.compile(r"^(\w+): (.*), (\d+h)?(\d+m)?\d+s elapsed(, (~\S+ left|estimating|done))?$")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain(clock: Clock, command: str = "report", unit: str = "runs"
          ) -> tuple[Progress, io.StringIO]:
    out = io.StringIO()
    return Progress(command, unit, console=Console(file=out), clock=clock), out


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59.9, "59s"), (192, "3m12s"),
                                          (3600 + 5 * 60 + 9, "1h05m")])
def test_duration(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("seconds,text", [(0.2, "~10s"), (31, "~40s"), (60, "~1m"),
                                          (8 * 60 + 1, "~9m"), (80 * 60, "~1h20m")])
def test_rough_estimates_round_up(seconds, text):
    assert rough(seconds) == text


def test_the_estimate_is_the_rate_since_the_first_report():
    pace = Pace(started=100.0, done_at_start=20)  # 20 runs finished before this sweep began
    assert pace.left(100.0, 20, 120) is None  # no progress yet: no estimate
    assert pace.left(160.0, 30, 120) == pytest.approx(90 * 6.0)  # 10 runs a minute: 6 s each
    assert pace.left(160.0, 120, 120) == 0.0
    assert pace.left(160.0, 30, None) is None  # no total, no estimate
    assert pace.line(160.0, 30, 120) == "1m00s elapsed, ~9m left"
    assert pace.line(100.0, 20, 120) == "0s elapsed, estimating"
    assert pace.line(400.0, 120, 120) == "5m00s elapsed, done"


def test_plain_lines_first_every_20_s_and_last():
    clock = Clock()
    shown, out = plain(clock)
    shown.update("study text_lr", 0, 588)  # first: said
    for done in range(1, 121):  # one run every 2 s: a line every 20 s, not one a run
        clock.now += 2.0
        shown.update("study text_lr", done, 588, "failed 0")
    lines = out.getvalue().splitlines()
    assert lines[0] == "report: study text_lr 0/588 runs, 0s elapsed, estimating"
    assert lines[1] == "report: study text_lr 10/588 runs, failed 0, 20s elapsed, ~20m left"
    assert lines[-1] == "report: study text_lr 120/588 runs, failed 0, 4m00s elapsed, ~16m left"
    assert len(lines) == 1 + 240 / EVERY_S, lines
    assert all(LINE.match(line) for line in lines), lines
    clock.now += 1
    shown.update("study text_lr", 588, 588)  # the last: said at once
    assert out.getvalue().splitlines()[-1] == (
        "report: study text_lr 588/588 runs, 4m01s elapsed, done")
    shown.update("study text_lr", 588, 588)  # and only once
    assert len(out.getvalue().splitlines()) == len(lines) + 1


def test_a_new_task_or_a_restarted_count_starts_afresh():
    clock = Clock()
    shown, out = plain(clock)
    shown.update("study a", 4, 4)  # everything done before: one line
    clock.now += 1
    shown.update("study b (tuning)", 0, 10)
    clock.now += 5
    shown.update("study b (extending)", 0, 3)
    clock.now += 5
    shown.update("study b (extending)", 0, 2)  # a second round under the same name
    lines = out.getvalue().splitlines()
    assert lines == ["report: study a 4/4 runs, 0s elapsed, done",
                     "report: study b (tuning) 0/10 runs, 0s elapsed, estimating",
                     "report: study b (extending) 0/3 runs, 0s elapsed, estimating",
                     "report: study b (extending) 0/2 runs, 0s elapsed, estimating"]


def test_stages_are_always_said_and_notes_are_paced():
    clock = Clock()
    shown, out = plain(clock, "bench", "")
    shown.log("measuring bench")
    clock.now += 65
    shown.note("noise floor n=1024")
    clock.now += 5
    shown.note("cosine n=1024")  # 5 s later: not said
    clock.now += 20
    shown.note("softcap n=1024")
    assert out.getvalue().splitlines() == ["bench: measuring bench, 0s elapsed",
                                           "bench: noise floor n=1024, 1m05s elapsed",
                                           "bench: softcap n=1024, 1m30s elapsed"]


def test_on_a_terminal_rich_draws_bars_and_no_plain_line():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with Progress("report", "runs", console=console) as shown:
        assert not shown.plain
        shown.update("study text_lr", 3, 10)
    text = out.getvalue()
    assert "report study text_lr" in text and "3/10" in text
    assert not any(LINE.match(line) for line in text.splitlines())


def test_nothing_is_shown_before_the_first_report():
    for console in (Console(file=io.StringIO()), Console(file=io.StringIO(), force_terminal=True)):
        with Progress("sweep", "runs", console=console):
            pass
        assert console.file.getvalue() == ""


def plain_lines(err: str, command: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"{command}: ")]


def test_report_prints_stages_and_studies_off_a_terminal(tmp_path, monkeypatch, capsys):
    def build_report(*args, say, progress, **kwargs):
        say("measuring bench")
        say("training studies")
        for done in range(3):
            progress("studies (grids and tuning)", SimpleNamespace(finished=done, total=2))
        say("judging")
        return {"claims": [], "questions": [], "smoke": False, "elapsed_s": 1.0,
                "runs_trained": 2, "errors": []}

    monkeypatch.setattr("attnscale.audit.report.build_report", build_report)
    assert cli_run(["report", "--quick", "--out", str(tmp_path / "r")]) == 0
    lines = plain_lines(capsys.readouterr().err, "report")
    assert lines[:2] == ["report: measuring bench, 0s elapsed",
                         "report: training studies, 0s elapsed"]
    assert lines[2] == "report: studies (grids and tuning) 0/2 runs, 0s elapsed, estimating"
    assert re.fullmatch(r"report: studies \(grids and tuning\) 2/2 runs, \d+s elapsed, done",
                        lines[3]), lines
    assert lines[4] == "report: judging, 0s elapsed" and len(lines) == 5


def fake_result(config):
    from attnscale.lab import train as T

    return T.RunResult(
        status="done", final_loss=0.7, final_metric=0.5, final_metrics={}, metric_name="accuracy",
        diverged_step=None, steps=config.optim.steps, initial_loss=2.0, history=[],
        config=config.flat(), task={}, model={}, seed=config.seed, versions={}, git_rev="",
        elapsed_s=1.0, num_params=10)


def test_train_prints_steps_loss_and_estimate_off_a_terminal(monkeypatch, capsys):
    def run(config, progress=None):
        for step in range(1, config.optim.steps + 1):
            progress(step, 2.0 / step)
        return fake_result(config)

    monkeypatch.setattr("attnscale.lab.train.run", run)
    assert cli_run(["train", "--steps", "7", "--json"]) == 0
    lines = plain_lines(capsys.readouterr().err, "train")
    assert lines[0].startswith("train: 1/7 steps, loss 2.0000, ") and lines[0].endswith(
        "elapsed, estimating"), lines
    assert lines[-1].startswith("train: 7/7 steps, loss 0.2857") and lines[-1].endswith("done")
    assert len(lines) == 2  # 7 quick steps: the first and the last line only


def test_train_seeds_prints_one_line_per_chunk_off_a_terminal(monkeypatch, capsys):
    def train_seeds(config, seeds, workers, on_done=None):
        records = []
        for seed in seeds:
            records.append({"seed": seed, "status": "done", "final_loss": 1.0,
                            "final_metric": 0.5, "diverged_step": None, "elapsed_s": 0.1})
            on_done(records[-1])
        return records

    monkeypatch.setattr("attnscale.lab.seeds.train_seeds", train_seeds)
    assert cli_run(["train", "--seeds", "0-2", "--json"]) == 0
    lines = plain_lines(capsys.readouterr().err, "train")
    assert lines[0].startswith("train: 1/3 seeds, ") and lines[-1].startswith("train: 3/3 seeds")
    assert lines[-1].endswith("done")


def test_sweep_prints_its_progress_off_a_terminal(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    smoke = Path(__file__).resolve().parents[2] / "configs" / "smoke.toml"
    assert cli_run(["sweep", str(smoke), "--db", "runs.db"]) == 0
    lines = plain_lines(capsys.readouterr().err, "sweep")
    assert lines[0] == "sweep: 0/4 runs, diverged 0, failed 0, 0s elapsed, estimating"
    assert re.fullmatch(r"sweep: 4/4 runs, diverged \d, failed 0, \d+s elapsed, done",
                        lines[-1]), lines
