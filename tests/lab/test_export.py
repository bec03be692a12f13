"""Export of stored runs: flat rows, CSV and Parquet."""

from __future__ import annotations

import csv

import pytest

from attnscale.lab.export import flat_row, write_csv, write_parquet


def test_csv_export(store, tmp_path):
    store.finish("a", {"status": "done", "final_loss": 1.0, "history": []})
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


def test_parquet_needs_pyarrow(store, tmp_path, monkeypatch):
    """Without pyarrow (pandas installed or not) a clear error names the extra."""
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.split(".")[0] == "pyarrow":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ValueError, match=r"--parquet needs pyarrow.*attnscale\[parquet\]"):
        write_parquet(store.runs(), tmp_path / "r.parquet")
    assert not (tmp_path / "r.parquet").exists()


def test_parquet_round_trip(store, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed")
    assert write_parquet(store.runs(), tmp_path / "r.parquet") == 3
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 3
