"""Exit statuses that mean something: bad input 2 (``error: ...``), a bug 1 (``internal error:
...``), ``check`` flagged 1, Ctrl-C 130; each error one line on stderr, nothing on stdout, and
with ``ATTNSCALE_DEBUG=1`` the traceback first, the status unchanged.

Each kind is injected into a real command (``results`` reading its store, ``kernels`` asking
its target ISA) by monkeypatching what the command calls.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from attnscale.cli import BUG, INTERRUPTED, USAGE_ERROR, classify
from attnscale.cli import run as cli_run
from attnscale.lab.store import Store

BUGS = [IndexError("index out of range in self"), RuntimeError("boom"), AssertionError(),
        KeyError("layer"), ZeroDivisionError("division by zero"), AttributeError("no x"),
        sqlite3.ProgrammingError("Cannot operate on a closed database."),
        sqlite3.IntegrityError("UNIQUE constraint failed: runs.id"),
        sqlite3.InterfaceError("bad parameter"),
        sqlite3.OperationalError("no such column: foo")]
INPUTS = [ValueError("--db: no file at x.db"), TypeError("lr must be a number, got 'x'"),
          FileNotFoundError(2, "No such file or directory"), IsADirectoryError("a folder"),
          PermissionError("denied"), sqlite3.OperationalError("database is locked"),
          sqlite3.DatabaseError("file is not a database"), UnicodeDecodeError(
              "utf-8", b"\xff", 0, 1, "invalid start byte")]
OUT_OF_MEMORY = [MemoryError(), type("OutOfMemoryError", (RuntimeError,), {})(
    "CUDA out of memory. Tried to allocate 2.00 GiB"), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:127] . DefaultCPUAllocator: can't allocate memory: you "
    "tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)")]


@pytest.fixture
def db(tmp_path) -> str:
    with Store(tmp_path / "runs.db"):
        pass
    return str(tmp_path / "runs.db")


def inject(monkeypatch, error: BaseException) -> None:
    """``results`` raises ``error`` where it opens its store."""
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr("attnscale.lab.store.Store", broken)


def run_injected(monkeypatch, capsys, db: str, error: BaseException, debug: bool
                 ) -> tuple[int, str, str]:
    inject(monkeypatch, error)
    if debug:
        monkeypatch.setenv("ATTNSCALE_DEBUG", "1")
    else:
        monkeypatch.delenv("ATTNSCALE_DEBUG", raising=False)
    code = cli_run(["results", "--db", db])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("error", BUGS, ids=lambda e: f"{type(e).__name__}-{e}"[:40])
def test_a_bug_is_one_internal_error_line_and_exit_1(error, db, monkeypatch, capsys):
    code, out, err = run_injected(monkeypatch, capsys, db, error, debug=False)
    assert code == BUG == 1
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"internal error: {type(error).__name__}"), lines[0]
    assert lines[0].endswith("(a bug in attnscale; ATTNSCALE_DEBUG=1 shows the traceback)")
    assert "Traceback" not in err


@pytest.mark.parametrize("error", BUGS[:3], ids=lambda e: type(e).__name__)
def test_a_bug_with_debug_shows_the_traceback_then_the_line(error, db, monkeypatch, capsys):
    code, out, err = run_injected(monkeypatch, capsys, db, error, debug=True)
    assert code == 1 and out == ""
    assert err.startswith("Traceback (most recent call last):"), err
    assert f"{type(error).__name__}" in err.splitlines()[-2]  # the traceback's own last line
    assert err.splitlines()[-1] == classify(error)[1]
    assert err.splitlines()[-1].endswith("(a bug in attnscale)")


@pytest.mark.parametrize("error", INPUTS, ids=lambda e: type(e).__name__)
def test_bad_input_is_one_error_line_and_exit_2(error, db, monkeypatch, capsys):
    code, out, err = run_injected(monkeypatch, capsys, db, error, debug=False)
    assert code == USAGE_ERROR == 2
    assert out == ""
    assert err.splitlines() == [f"error: {' '.join(str(error).split())}"], err
    code, out, err = run_injected(monkeypatch, capsys, db, error, debug=True)
    assert code == 2 and err.startswith("Traceback") and err.splitlines()[-1].startswith("error:")


@pytest.mark.parametrize("error", OUT_OF_MEMORY, ids=["MemoryError", "torch-OutOfMemoryError",
                                                     "torch-cpu-alloc"])
def test_out_of_memory_is_not_called_a_bug(error, db, monkeypatch, capsys):
    """torch's OutOfMemoryError is a RuntimeError, classified by its name (no torch import)."""
    code, out, err = run_injected(monkeypatch, capsys, db, error, debug=False)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of memory"), lines
    assert lines[0].endswith("(ask for less: smaller sizes, fewer workers)")
    assert "bug" not in lines[0]


def test_a_multiline_bug_message_stays_one_line(db, monkeypatch, capsys):
    code, _, err = run_injected(monkeypatch, capsys, db, RuntimeError("first\n  second"),
                                debug=False)
    assert code == 1 and err.splitlines() == [
        "internal error: RuntimeError: first second (a bug in attnscale; ATTNSCALE_DEBUG=1 "
        "shows the traceback)"]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), EOFError()], ids=["ctrl-c", "eof"])
def test_ctrl_c_is_130(error, db, monkeypatch, capsys):
    """typer turns Ctrl-C into status 130 itself, silently; end of input (typer's Abort)
    reads "aborted"."""
    code, out, err = run_injected(monkeypatch, capsys, db, error, debug=False)
    assert code == INTERRUPTED == 130 and out == ""
    assert err.split() == ([] if isinstance(error, KeyboardInterrupt) else ["aborted"]), err


def test_usage_errors_keep_their_status(capsys):
    assert cli_run(["results", "--bogus"]) == 2
    assert capsys.readouterr().err.startswith("error: No such option")
    assert cli_run(["nope"]) == 2
    assert "No such command" in capsys.readouterr().err


def test_a_bug_in_another_command_reads_the_same(monkeypatch, capsys):
    """``kernels`` asks cppext for the target ISA first: a bug there is exit 1, not 2."""
    def broken() -> str:
        return ["avx512"][3]  # a real IndexError, raised by the interpreter

    monkeypatch.setattr("attnscale.util.cppext.target_isa", broken)
    monkeypatch.delenv("ATTNSCALE_DEBUG", raising=False)
    assert cli_run(["kernels"]) == 1
    assert capsys.readouterr().err.startswith("internal error: IndexError: list index out of")


def test_check_flagged_is_still_1_and_documented():
    from attnscale.cli import check

    assert check.FLAGGED == 1


def test_help_and_the_module_document_the_codes():
    import attnscale.cli as cli

    for code in ("0", "1", "2", "130"):
        assert f"\n{code}\n" in cli.__doc__
    out = subprocess.run([sys.executable, "-m", "attnscale.cli", "--help"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for words in ("Exit status: 0 done", "1 a result to act on", "or a bug in attnscale",
                  "2 bad input", "130 interrupted", "ATTNSCALE_DEBUG=1"):
        assert words in text, (words, text)
