"""The SQLite results store: atomic result writes, filters, concurrent writers, export."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from attnscale.lab.store import Store


def result(status="done", n=3, loss=1.0):
    return {
        "status": status,
        "final_loss": loss,
        "final_metric": 0.5,
        "initial_loss": 5.0,
        "diverged_step": 7 if status == "diverged" else None,
        "steps": 10,
        "elapsed_s": 0.1,
        "versions": {"torch": "x"},
        "git_rev": "abc",
        "history": [{"step": i, "loss": 5.0 - i, "max_abs_logit": 0.1 * i} for i in range(n)],
    }




def test_wal_mode_and_schema(store):
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.integrity_check() == "ok"
    assert store.counts()["queued"] == 3


def test_add_runs_is_idempotent(store):
    store.finish("a", result())
    assert store.add_runs([{"id": "a", "config": {"score": "dot"}}]) == 0
    assert store.get("a")["status"] == "done"


def test_finish_writes_status_numbers_and_history(store):
    store.mark_running("a", "pid 1")
    store.finish("a", result(n=4))
    run = store.get("a", history=True)
    assert run["status"] == "done" and run["final_loss"] == 1.0 and run["initial_loss"] == 5.0
    assert run["versions"] == {"torch": "x"} and run["git_rev"] == "abc"
    assert [h["step"] for h in run["history"]] == [0, 1, 2, 3]
    assert run["started_at"] <= run["finished_at"] and run["worker"] == "pid 1"


def test_non_finite_numbers_become_null(store):
    r = result(loss=math.nan)
    r["history"][1]["loss"] = math.inf
    store.finish("a", r)
    run = store.get("a", history=True)
    assert run["final_loss"] is None and run["history"][1]["loss"] is None


def test_a_failed_write_leaves_nothing(store):
    store.mark_running("a")
    bad = result(n=5)
    bad["history"][3]["step"] = {"not": "bindable"}  # sqlite cannot bind a dict: insert fails
    with pytest.raises(sqlite3.Error):
        store.finish("a", bad)
    assert store.get("a")["status"] == "running"
    assert store.history("a") == []
    assert store.metric_counts() == {}


def test_fail_and_requeue(store):
    store.finish("a", result())
    store.fail("b", "ValueError: boom\n\ntraceback")
    assert store.get("b")["error"].startswith("ValueError: boom")
    store.requeue(["a", "b"])
    for rid in ("a", "b"):
        run = store.get(rid)
        assert run["status"] == "queued" and run["error"] is None and run["final_loss"] is None
    assert store.metric_counts() == {}


def test_unknown_trainer_status_is_failed(store):
    store.finish("a", {**result(), "status": "weird"})
    assert store.get("a")["status"] == "failed" and "weird" in store.get("a")["error"]


def test_filters(store):
    store.finish("a", result())
    store.finish("c", result("diverged"))
    assert [r["id"] for r in store.runs(status="done")] == ["a"]
    assert [r["id"] for r in store.runs(status=["done", "diverged"])] == ["a", "c"]
    assert [r["id"] for r in store.runs(where={"score": "dot"})] == ["a", "b"]
    assert [r["id"] for r in store.runs(where={"score": "dot", "lr": 0.01})] == ["b"]
    assert [r["id"] for r in store.runs(where={"variant": "v"})] == ["c"]
    runs = store.runs(history=True)
    assert [len(r["history"]) for r in runs] == [3, 0, 3]
    with pytest.raises(ValueError, match="unknown status"):
        store.runs(status="finished")


def test_measurements_round_trip_with_provenance(store):
    assert store.get_measurement("bench:1") is None
    stored = store.put_measurement("bench:1", {"ratio": math.nan, "n": (1, 2)}, kind="bench",
                                   params={"n": [256]})
    assert stored == {"ratio": None, "n": [1, 2]}
    assert store.get_measurement("bench:1") == stored
    store.put_measurement("bench:1", {"ratio": 1.5})  # a new value replaces the old
    assert store.get_measurement("bench:1") == {"ratio": 1.5}
    row = store.conn.execute("SELECT * FROM measurements").fetchone()
    assert row["kind"] is None and row["versions"] and row["git_rev"] and row["created"] > 0


def test_measurements_persist_across_connections(tmp_path):
    with Store(tmp_path / "m.db") as s:
        s.put_measurement("qk:1", [1.0, 2.0], kind="qk", params={"samples": 10})
    with Store(tmp_path / "m.db") as s:
        assert s.get_measurement("qk:1") == [1.0, 2.0]
        assert s.integrity_check() == "ok"


def test_a_failed_measurement_write_leaves_nothing(store):
    with pytest.raises(RuntimeError), store.transaction() as c:
        c.execute("INSERT INTO measurements (key, value) VALUES ('x', '1')")
        raise RuntimeError("killed mid-transaction")
    assert store.get_measurement("x") is None


def test_a_text_file_is_not_a_database(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a database, just some text that is long enough to have a header\n" * 5)
    with pytest.raises(ValueError, match=r"^db: .*notes.txt is not a SQLite database"):
        Store(text)
    assert text.read_text().startswith("not a database")  # left as it was
    long = tmp_path / "long.txt"  # past the size rule: SQLite's own check refuses it
    long.write_text("not a database, a longer text: refused by SQLite, not by its size\n" * 40)
    before = long.read_bytes()
    with pytest.raises(ValueError, match=r"^db: .*long.txt is not a SQLite database"):
        Store(long)
    assert long.read_bytes() == before
    tiny = tmp_path / "x.txt"
    tiny.write_text("x")  # SQLite itself would overwrite a file this short
    with pytest.raises(ValueError, match="is not a SQLite database"):
        Store(tiny)
    assert tiny.read_text() == "x"
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty file is a new database
    with Store(empty) as s:
        assert s.counts()["queued"] == 0


def test_a_second_store_in_one_process_keeps_the_first_ones_writes_visible(tmp_path):
    """A sweep driver opens a second Store on its database (the lease heartbeat). Were the
    file opened and closed outside SQLite, the first connection's POSIX locks would go, a
    reader in another process would delete the WAL as it closed, and the driver's later
    writes would be seen by no one else."""
    db = tmp_path / "runs.db"
    with Store(db) as first:
        first.add_runs([{"id": "a", "config": {}}])
        Store(db).close()  # the heartbeat's connection, opened beside the live one
        read = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); " \
               "print(c.execute('SELECT status FROM runs').fetchone()[0]); c.close()"
        other = [sys.executable, "-c", read, str(db)]
        subprocess.run(other, check=True, capture_output=True)  # a reader comes and goes
        first.mark_running("a", "pid 1")
        seen = subprocess.run(other, check=True, capture_output=True, text=True).stdout
        assert seen.strip() == "running"
        assert (tmp_path / "runs.db-wal").exists()


def foreign_database(path, schema):
    """A SQLite file made by another program; returns its bytes, to prove it stays untouched."""
    with sqlite3.connect(path) as conn:
        conn.executescript(schema)
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    "schema",
    [
        "CREATE TABLE songs (title TEXT, artist TEXT); INSERT INTO songs VALUES ('a', 'b');",
        "CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT); INSERT INTO runs VALUES ('1', 'x');",
        "CREATE TABLE metrics (run_id TEXT, idx INTEGER);",  # ours in name only, no runs
    ],
    ids=["other-tables", "runs-without-our-columns", "no-runs-table"],
)
def test_a_foreign_sqlite_database_is_refused_and_left_alone(tmp_path, schema):
    path = tmp_path / "other.db"
    before = foreign_database(path, schema)
    with pytest.raises(ValueError, match=r"^db: .*other\.db is not an attnscale results database$"):
        Store(path)
    assert path.read_bytes() == before  # not even switched to WAL mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_an_empty_sqlite_database_gets_the_tables(tmp_path):
    path = tmp_path / "blank.db"
    foreign_database(path, "PRAGMA user_version = 0;")  # a valid SQLite file with no tables
    with Store(path) as s:
        assert s.add_runs([{"id": "a", "config": {}}]) == 1
    with Store(path) as s:  # and it is ours from then on
        assert s.counts()["queued"] == 1


def test_an_older_database_of_ours_gains_the_new_column(tmp_path):
    path = tmp_path / "old.db"
    with Store(path) as s:
        s.add_runs([{"id": "a", "config": {}}])
        s.conn.execute("ALTER TABLE runs DROP COLUMN final_metrics")
    with Store(path) as s:
        columns = {row[1] for row in s.conn.execute("PRAGMA table_info(runs)")}
        assert "final_metrics" in columns and s.get("a")["status"] == "queued"


def test_a_directory_is_not_a_database(tmp_path):
    with pytest.raises(ValueError, match=r"^db: .* is a directory"):
        Store(tmp_path)


def test_a_folder_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "some_file.txt"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"^db: .*some_file.txt is a file, not a folder"):
        Store(blocker / "db.sqlite")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ValueError, match=r"^db: .*ro/runs.db "):
            Store(folder / "runs.db")
    finally:
        folder.chmod(0o700)


def test_concurrent_writers(tmp_path):
    """Four processes finish 50 runs each into one file at the same time."""
    db = tmp_path / "shared.db"
    Store(db).close()
    script = textwrap.dedent(
        f"""
        import sys
        from attnscale.lab.store import Store
        w = int(sys.argv[1])
        with Store({str(db)!r}) as s:
            for i in range(50):
                rid = f"w{{w}}-{{i}}"
                s.add_runs([{{"id": rid, "config": {{"w": w, "i": i}}}}])
                s.mark_running(rid)
                s.finish(rid, {{"status": "done", "final_loss": 1.0, "history":
                          [{{"step": j, "loss": 1.0}} for j in range(20)]}})
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    with Store(db) as s:
        assert s.counts()["done"] == 200
        assert set(s.metric_counts().values()) == {20}
        assert s.integrity_check() == "ok"
