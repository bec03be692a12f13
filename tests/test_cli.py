"""The command line: bad input is one line on stderr and exit status 2, never a traceback; a bug
is one ``internal error:`` line and exit status 1 (tests/cli/test_exit_codes.py).

The table holds bad command lines for every command: unknown options and values, a file that
is not SQLite, a SQLite database that another program made, a directory where a file is
expected, a missing file, and an output folder that cannot be written (a path under a regular
file: the tests may run as root, who can write into read-only folders). ``ATTNSCALE_DEBUG=1``
adds the traceback in every error branch and keeps the exit status.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from attnscale.cli import app
from attnscale.cli import run as cli_run
from attnscale.lab.store import Store
from attnscale.lab.tasks import TASKS
from attnscale.measure.montecarlo import table_scores

SWEEP = """
[base]
task = "mqar"
seq_len = 16
num_kv_pairs = 2
d_model = 16
n_heads = 2
n_layers = 1
batch_size = 4
steps = 1
warmup_steps = 0
"""

# (command line with {placeholders}, words the error line must contain)
BAD = [
    ("nope", "No such command"),
    ("bench --score cosinus", "score must be one of"),
    ("bench --n 0", "--n must be positive"),
    ("bench --bogus", "No such option"),
    ("bench --repeats x", "--repeats"),
    ("theory --samples 1", "--samples"),
    ("theory --plot {file}/figs", "--plot"),
    ("theory --plot {file}", "--plot"),
    ("check {missing}", "PATH"),
    ("check {dir}", "PATH"),
    ("check {file}", "not a folder"),
    ("check minilm --text {missing}", "--text"),
    ("inspect --text {dir}", "--text"),
    ("inspect --text {missing}", "--text"),
    ("inspect --text {binary}", "binary"),
    ("inspect --text {file} --sentence hi", "not both"),
    ("inspect --sentence hi --plot {file}/heatmaps", "--plot"),
    ("inspect {missing} --sentence hi", "folder"),
    ("train --task nope", "task"),
    ("train --seeds 3-1", "--seeds"),
    ("train --seeds 0,x", "--seeds"),
    ("train --seeds 0,0", "given twice"),
    ("train --seeds 0-2 --seed 4", "--seeds and --seed"),
    ("train --seeds 0-2 --tensorboard {dir}", "--tensorboard"),
    ("train --seeds 0-2 --workers 0", "--workers"),
    ("train --steps 0", "optim.steps"),
    ("train --task salience --seq-len 1", "task.seq_len: Input should be greater than or equal"),
    ("train --model.d-model 0", "model.d_model"),
    ("train --task text --vocab-size 8", "vocab_size is not an option of task 'text'"),
    ("train --lr -1", "lr"),
    ("train --score cosinus", "score"),
    ("train --steps x", "--steps"),
    ("train --task text --text {dir} --steps 1", "--text: {dir} is a directory"),
    ("train --task text --text {binary} --steps 1", "binary"),
    ("train --task text --text {missing} --steps 1", "text"),
    ("sweep {dir} --db {tmp}/runs.db", "directory"),
    ("sweep {missing} --db {tmp}/runs.db", "no file"),
    ("sweep {file} --db {tmp}/runs.db", "TOML"),
    ("sweep {binary} --db {tmp}/runs.db", "UTF-8"),
    ("sweep {toml} --db {file}", "db"),
    ("sweep {toml} --db {dir}", "db"),
    ("sweep {toml} --db {file}/runs.db", "db"),
    ("sweep {toml} --db {foreign}", "{foreign} is not an attnscale results database"),
    ("sweep {toml} --db {tmp}/runs.db --executor nope", "executor"),
    ("sweep {toml} --db {tmp}/runs.db --workers 0", "--workers"),
    ("results --db {file}", "db"),
    ("results --db {dir}", "directory"),
    ("results --db {missing}", "no file"),
    ("results --db {foreign}", "{foreign} is not an attnscale results database"),
    ("results --db {db} --csv {dir}", "--csv"),
    ("results --db {db} --csv {file}/runs.csv", "--csv"),
    ("results --db {db} --parquet {dir}", "--parquet"),
    ("results --db {db} --parquet {file}/runs.parquet", "--parquet"),
    ("results --db {db} --status bogus", "status"),
    ("results --db {tmp}/none.db", "--db: no file at"),
    ("report --db {file} --out {tmp}/report", "db"),
    ("report --db {dir} --out {tmp}/report", "db"),
    ("report --db {foreign} --out {tmp}/report", "not an attnscale results database"),
    ("report --out {file}/report", "--out"),
    ("report --out {file}", "--out"),
    ("report --quick --full", "one preset"),
    ("report --executor nope --out {tmp}/report", "executor"),
    ("report --seed-offset -1 --out {tmp}/report", "seed-offset"),
]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    """A regular text file, a folder, a missing path, a binary file, a sweep, an empty store,
    and a SQLite database of another program."""
    (tmp_path / "f.txt").write_text("hello, not a database\n")
    with sqlite3.connect(tmp_path / "other.db") as conn:
        conn.execute("CREATE TABLE songs (title TEXT)")
    conn.close()
    (tmp_path / "folder").mkdir()
    (tmp_path / "blob.bin").write_bytes(b"\x00\xff\xfe binary")
    (tmp_path / "sweep.toml").write_text(SWEEP)
    with Store(tmp_path / "empty.db"):
        pass
    return {
        "tmp": str(tmp_path), "file": str(tmp_path / "f.txt"), "dir": str(tmp_path / "folder"),
        "missing": str(tmp_path / "missing.txt"), "binary": str(tmp_path / "blob.bin"),
        "toml": str(tmp_path / "sweep.toml"), "db": str(tmp_path / "empty.db"),
        "foreign": str(tmp_path / "other.db"),
    }


def assert_one_error_line(code: int, stderr: str, words: str) -> None:
    """Exit 2 and stderr exactly one line, ``error: ...`` with ``words``: no blank lines."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, repr(stderr)
    assert lines[0].startswith("error: ") and words in lines[0], lines[0]


@pytest.mark.parametrize("line,words", BAD, ids=[line for line, _ in BAD])
def test_bad_command_line_is_one_line_exit_2(line, words, paths, capsys, monkeypatch):
    monkeypatch.delenv("ATTNSCALE_DEBUG", raising=False)
    code = cli_run(line.format(**paths).split())
    assert_one_error_line(code, capsys.readouterr().err, words.format(**paths))


def raise_in_results(monkeypatch, error: BaseException) -> None:
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr("attnscale.lab.store.Store", broken)


@pytest.mark.parametrize(
    "line,error,code,last",
    [
        ("results --db {file}", None, 2, "error: db: "),  # ValueError from the store
        ("bench --bogus", None, 2, "error: No such option"),  # typer's usage error
        ("results --db {db}", sqlite3.OperationalError("disk I/O error"), 2,
         "error: disk I/O error"),
        ("results --db {db}", RuntimeError("boom"), 1,
         "internal error: RuntimeError: boom (a bug in attnscale"),
        ("results --db {db}", EOFError(), 130, "aborted"),  # typer's Abort
    ],
    ids=["value-error", "usage-error", "sqlite-error", "other-error", "abort"],
)
def test_debug_shows_the_traceback_in_every_branch(line, error, code, last, paths, capsys,
                                                   monkeypatch):
    if error is not None:
        raise_in_results(monkeypatch, error)
    monkeypatch.setenv("ATTNSCALE_DEBUG", "1")
    assert cli_run(line.format(**paths).split()) == code
    err = capsys.readouterr().err.lstrip("\n")  # typer ends the line before an Abort
    assert err.startswith("Traceback (most recent call last):"), err
    assert err.splitlines()[-1].startswith(last), err
    monkeypatch.delenv("ATTNSCALE_DEBUG")
    assert cli_run(line.format(**paths).split()) == code
    err = capsys.readouterr().err.lstrip("\n")
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith(last), err


def test_the_table_covers_every_command():
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert names == {"bench", "theory", "inspect", "check", "train", "sweep", "results", "report",
                     "kernels"}
    # kernels takes no input but the environment: tested below
    assert names - {"kernels"} <= {line.split()[0] for line, _ in BAD}
    assert len(BAD) >= 25


def program() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m attnscale.cli``."""
    script = shutil.which("attnscale", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "attnscale.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*program(), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "line,words",
    [
        ("results --db {file}", "db"),
        ("results --db {foreign}", "not an attnscale results database"),
        ("sweep {toml} --db {dir}", "db"),
        ("theory --plot {file}/figs", "--plot"),
        ("bench --bogus", "No such option"),
    ],
)
def test_the_real_entry_point(line, words, paths):
    out = run(*line.format(**paths).split())
    assert_one_error_line(out.returncode, out.stderr, words)


def test_not_sqlite_is_caught_even_when_the_store_lets_it_through(paths, capsys, monkeypatch):
    """main() turns any sqlite3 error into one line, whichever layer raised it."""
    monkeypatch.delenv("ATTNSCALE_DEBUG", raising=False)
    raise_in_results(monkeypatch, sqlite3.DatabaseError("file is not a database"))
    code = cli_run(["results", "--db", paths["file"]])
    assert_one_error_line(code, capsys.readouterr().err, "file is not a database")


def test_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0 and "bench" in out.stdout
    out = run("train", "--help")
    assert out.returncode == 0 and "--task" in out.stdout


def test_theory_json_rows():
    out = run("theory", "--json", "--samples", "50")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    scores = set(table_scores())  # every registered score with exact theory
    assert {r["score"] for r in rows} == scores
    assert {"dot", "scaled_dot", "cosine_tau1", "cosine_tau10"} <= scores
    assert {r["d"] for r in rows} == {16, 64, 256, 1024}
    assert {r["n"] for r in rows} == {64, 512, 4096}
    assert set(rows[0]) == {"score", "d", "n", "quantity", "theory", "mc_mean", "mc_se"}
    assert len(rows) == len(scores) * 4 * 3 * 5


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 40])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_trains_with_its_defaults_and_any_steps(task, steps, capsys):
    """No default (warmup, positions) may conflict with a valid --steps or with the task."""
    small_eval = ["--eval-windows", "8"] if task == "text" else ["--eval-size", "8"]
    code = cli_run(["train", "--task", task, "--steps", str(steps), "--json", "--batch-size",
                    "4", "--eval-batch-size", "8", *small_eval])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["steps"] == steps and result["config"]["task"] == task


def test_kernels_lists_each_kernel_and_rejects_a_bad_isa():
    """In fresh processes: a kernel loaded earlier in this one would keep its state."""
    import os

    env = {**os.environ, "ATTNSCALE_NATIVE_ISA": "bogus"}
    out = subprocess.run([*program(), "kernels"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("error: $ATTNSCALE_NATIVE_ISA must be one of"), out.stderr
    env["ATTNSCALE_NATIVE_ISA"] = "off"
    out = subprocess.run([*program(), "kernels", "--build"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "soft-capping attention (core)\tchunked" in out.stdout
    assert "monitor statistics (measure)\tpython" in out.stdout
