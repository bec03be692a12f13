"""Several sweep drivers on one database, through the CLI in subprocesses: started together
they split the grid and train each run once; a driver joining a running one shares its grid; a
driver killed mid-run has its claim taken over (:mod:`attnscale.lab.leases`; the lapse of a
lease held by another machine's driver is tested in ``test_leases.py``)."""

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
SMOKE = ROOT / "configs" / "smoke.toml"  # 2 scores x 2 LRs of a width-16 model


def grid(tmp_path: Path, steps: int, seeds: str) -> Path:
    """The smoke sweep at ``steps`` steps, crossed with ``seeds`` ("0, 1")."""
    text = SMOKE.read_text().replace("steps = 10\n", f"steps = {steps}\n")
    path = tmp_path / "grid.toml"
    path.write_text(text + f"seed = [{seeds}]\n")  # the file ends in its [axes] table
    return path


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
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    text = " ".join((out + err).split())
    assert "taken over by another driver" not in text, text
    _total, done, diverged, failed, skipped = map(int, FINAL.search(text).groups())
    return done + diverged + failed - skipped


def rows(db: Path, sql: str) -> list[tuple]:
    """Rows of a read-only query (closed at once: an open connection would pin a snapshot)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as c:
        return c.execute(sql).fetchall()


def test_two_drivers_started_together_train_every_run_once(tmp_path):
    config = grid(tmp_path, 150, "0, 1, 2")
    ids = [p.id for p in expand(load_spec(config))]
    db = tmp_path / "runs.db"
    first, second = driver(config, db), driver(config, db)
    assert trained_by(first) + trained_by(second) == len(ids)
    with Store(db) as store:
        assert store.integrity_check() == "ok"
        runs = store.runs()
    assert sorted(r["id"] for r in runs) == sorted(ids)
    assert {r["status"] for r in runs} == {"done"}


def test_a_second_driver_joins_a_running_one_and_they_share_the_grid(tmp_path):
    config = grid(tmp_path, 300, "0, 1, 2")
    ids = [p.id for p in expand(load_spec(config))]
    db = tmp_path / "runs.db"
    first = driver(config, db)
    wait_for_claim(db)
    second = driver(config, db)
    mine, theirs = trained_by(first), trained_by(second)
    assert mine >= 1 and theirs >= 1 and mine + theirs == len(ids)
    owners = {o for (o,) in rows(db, "SELECT lease_owner FROM runs WHERE status = 'done'")}
    assert len(owners) == 2


def wait_for_claim(db: Path) -> list[tuple]:
    """(id, lease_owner) of the runs held once some driver holds one."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with contextlib.suppress(sqlite3.OperationalError):  # tables not made yet
            held = rows(db, "SELECT id, lease_owner FROM runs WHERE status = 'running' "
                            "AND lease_owner IS NOT NULL") if db.exists() else []
            if held:
                return held
    raise AssertionError("no driver claimed a run within 120 s")


def test_a_killed_drivers_claim_is_taken_over_at_once_on_its_machine(tmp_path):
    """The dead driver's lease (10 min) would hold its run far past this test's time out: the
    taker sees that the driver's process is gone and takes the run at once."""
    config = grid(tmp_path, 400, "0")
    ids = [p.id for p in expand(load_spec(config))]
    db = tmp_path / "runs.db"
    killed = driver(config, db, "--lease", "600")
    try:
        wait_for_claim(db)
    except AssertionError:  # show what the driver said
        os.killpg(killed.pid, signal.SIGKILL)
        raise AssertionError(killed.communicate()[1][-3000:]) from None
    os.killpg(killed.pid, signal.SIGSTOP)  # frozen: what it holds now is what it held at death
    held = rows(db, "SELECT id, lease_owner FROM runs WHERE status = 'running'")
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert held
    taker = driver(config, db, "--lease", "600")
    assert trained_by(taker) >= len(held)
    done = dict(rows(db, "SELECT id, lease_owner FROM runs WHERE status = 'done'"))
    assert sorted(done) == sorted(ids)
    for run_id, dead_owner in held:
        assert done[run_id] != dead_owner  # the taker trained it
