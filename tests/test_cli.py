"""The command line: bad input is one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnscale.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args,words",
    [
        (["bench", "--score", "cosinus"], "score must be one of"),
        (["bench", "--n", "0"], "--n must be positive"),
        (["bench", "--bogus"], "No such option"),
        (["bench", "--repeats", "x"], "--repeats"),
        (["nope"], "No such command"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, words):
    out = run(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]


def test_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0 and "bench" in out.stdout


def test_theory_json_rows():
    import json

    out = run("theory", "--json", "--samples", "50")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert {r["score"] for r in rows} == {"dot", "scaled_dot", "cosine_tau1", "cosine_tau10"}
    assert {r["d"] for r in rows} == {16, 64, 256, 1024}
    assert {r["n"] for r in rows} == {64, 512, 4096}
    assert set(rows[0]) == {"score", "d", "n", "quantity", "theory", "mc_mean", "mc_se"}
    assert len(rows) == 4 * 4 * 3 * 5


def test_theory_bad_samples():
    out = run("theory", "--samples", "1")
    assert out.returncode == 2 and out.stderr.startswith("error: ")
