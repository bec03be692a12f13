"""The SQLite results store: atomic result writes, filters, concurrent writers, export."""

from __future__ import annotations

import csv
import math
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from attnscale.lab import store as store_module
from attnscale.lab.store import Store, flat_row, write_csv, write_parquet

STORE_PY = store_module.__file__


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


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "runs.db") as s:
        s.add_runs(
            [
                {"id": "a", "config": {"score": "dot", "lr": 0.001, "seed": 0}},
                {"id": "b", "config": {"score": "dot", "lr": 0.01, "seed": 0}},
                {"id": "c", "config": {"score": "cosine", "lr": 0.01, "seed": 1}, "variant": "v"},
            ],
            sweep="t",
        )
        yield s


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


def test_concurrent_writers(tmp_path):
    """Four processes finish 50 runs each into one file at the same time."""
    db = tmp_path / "shared.db"
    Store(db).close()
    # Load store.py on its own (it imports nothing from attnscale), so the writers start fast.
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("store", {str(STORE_PY)!r})
        store = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(store)
        Store = store.Store
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


def test_csv_export(store, tmp_path):
    store.finish("a", result())
    store.fail("b", "ValueError: boom\n\ntraceback")
    path = tmp_path / "runs.csv"
    assert write_csv(store.runs(), path) == 3
    rows = list(csv.DictReader(path.open()))
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["config.score"] == "dot" and float(rows[0]["final_loss"]) == 1.0
    assert rows[1]["error"] == "ValueError: boom"


def test_flat_row_nested_config():
    row = flat_row({"id": "x", "config": {"eval_multipliers": [1, 2]}})
    assert row["config.eval_multipliers"] == "[1, 2]"


def test_parquet_needs_pyarrow(store, tmp_path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        try:
            import pandas  # noqa: F401
        except ImportError:
            with pytest.raises(ValueError, match="install pyarrow"):
                write_parquet(store.runs(), tmp_path / "r.parquet")
            return
    assert write_parquet(store.runs(), tmp_path / "r.parquet") == 3
