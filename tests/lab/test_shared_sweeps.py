"""Several sweep drivers on one database, through the CLI in subprocesses: started together
they split the grid and train each run once; a driver killed mid-run has its claim taken over
when the lease lapses (:mod:`attnscale.lab.leases`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from attnscale.lab.store import Store
from attnscale.lab.sweep import expand, load_spec

ROOT = Path(__file__).resolve().parents[2]
GRID = """
[base]
task = "mqar"
seq_len = 32
d_model = 16
n_heads = 2
n_layers = 1
batch_size = 4
steps = {steps}
log_every = 50

[axes]
lr = [1e-3, 3e-3, 1e-2, 3e-2]
seed = [{seeds}]
"""
FINAL = re.compile(r"(\d+) runs: (\d+) done, (\d+) diverged, (\d+) failed \((\d+) already")


def driver(config: Path, db: Path, *extra: str) -> subprocess.Popen:
    """``attnscale sweep`` in its own process group (killpg reaches its workers)."""
    return subprocess.Popen(
        [sys.executable, "-m", "attnscale.cli", "sweep", str(config), "--db", str(db), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        cwd=ROOT)


def trained_by(proc: subprocess.Popen) -> int:
    """Runs this driver trained and stored, from its final line (finished minus skipped);
    fails if it lost any result to another driver."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    text = " ".join((out + err).split())
    assert "taken over by another driver" not in text, text
    _total, done, diverged, failed, skipped = map(int, FINAL.search(text).groups())
    return done + diverged + failed - skipped


def rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute(sql).fetchall()


def test_two_drivers_started_together_train_every_run_once(tmp_path):
    config = tmp_path / "grid.toml"
    config.write_text(GRID.format(steps=150, seeds="0, 1, 2"))
    ids = [p.id for p in expand(load_spec(config))]
    db = tmp_path / "runs.db"
    first, second = driver(config, db), driver(config, db)
    assert trained_by(first) + trained_by(second) == len(ids)
    with Store(db) as store:
        assert store.integrity_check() == "ok"
        runs = store.runs()
    assert sorted(r["id"] for r in runs) == sorted(ids)
    assert {r["status"] for r in runs} == {"done"}


def test_a_killed_drivers_claim_is_taken_over(tmp_path):
    config = tmp_path / "grid.toml"
    config.write_text(GRID.format(steps=400, seeds="0"))
    ids = [p.id for p in expand(load_spec(config))]
    db = tmp_path / "runs.db"
    killed = driver(config, db, "--lease", "2")
    deadline = time.monotonic() + 120
    held: list[tuple] = []
    while not held and time.monotonic() < deadline:
        time.sleep(0.05)
        with contextlib.suppress(sqlite3.OperationalError):  # tables not made yet
            held = rows(db, "SELECT id, lease_owner FROM runs WHERE status = 'running' "
                            "AND lease_owner IS NOT NULL") if db.exists() else []
    assert held, "the first driver never claimed a run"
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    start = time.monotonic()
    taker = driver(config, db, "--lease", "2")
    assert trained_by(taker) >= 1
    assert time.monotonic() - start > 1.0  # it waited for the dead driver's lease
    done = dict(rows(db, "SELECT id, lease_owner FROM runs WHERE status = 'done'"))
    assert sorted(done) == sorted(ids)
    for run_id, dead_owner in held:
        assert done[run_id] != dead_owner  # the taker trained it
