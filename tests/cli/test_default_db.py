"""``attnscale sweep configs/smoke.toml`` works as written: without ``--db`` the results go to
``results.db`` in the working folder, said in one line on stderr, and ``attnscale results``
reads them back from there; ``--db`` still chooses another file."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnscale.cli import run as cli_run

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke.toml"


def test_sweep_and_results_default_to_results_db(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_run(["sweep", str(SMOKE)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err.count("results -> results.db") == 1, err
    assert err[-1].endswith("-> results.db"), err  # the summary line names it too
    assert (tmp_path / "results.db").is_file()
    assert cli_run(["results"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == ["results <- results.db"]
    assert out.splitlines()[0] == "# 4 runs"
    assert cli_run(["sweep", str(SMOKE)]) == 0  # a rerun resumes: nothing left to train
    assert "failed (4 already finished" in capsys.readouterr().err


def test_db_still_chooses_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_run(["sweep", str(SMOKE), "--db", "mine.db"]) == 0
    err = capsys.readouterr().err
    assert "results -> results.db" not in err and not (tmp_path / "results.db").exists()
    assert cli_run(["results", "--db", "mine.db", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.count('"status"') == 4


@pytest.mark.parametrize("line", [["results"], ["results", "--json"]])
def test_results_without_a_db_here_is_one_error_line(line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNSCALE_DEBUG", raising=False)
    assert cli_run(line) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == ["error: --db: no file at results.db"]


def test_a_bad_default_db_is_one_error_line(tmp_path, monkeypatch, capsys):
    """results.db here but not a database: the error alone, no "results ->" line first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNSCALE_DEBUG", raising=False)
    (tmp_path / "results.db").write_text("not a database\n")
    assert cli_run(["sweep", str(SMOKE)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "results.db" in err[0], err


def test_help_says_the_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the option's help on one line
    for command in ("sweep", "results"):
        assert cli_run([command, "--help"]) == 0
        assert "[default: results.db in the working folder]" in capsys.readouterr().out
