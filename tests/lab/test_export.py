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
