"""Export of stored runs: flat rows (summary columns, then ``config.<field>``) as CSV or Parquet.

The rows come from :meth:`attnscale.lab.store.Store.runs`; nested config values (lists, dicts)
become JSON text so that every cell is a scalar.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SUMMARY_COLUMNS = (
    "id", "sweep", "variant", "status", "initial_loss", "final_loss", "final_metric",
    "diverged_step", "steps", "elapsed_s", "git_rev", "error",
)  # fmt: skip


def flat_row(run: Mapping[str, Any]) -> dict[str, Any]:
    """One run as a flat dict: the summary columns, then ``config.<field>`` for each field.

    ``error`` keeps only its first line (the exception type and message).
    """
    row = {key: run.get(key) for key in SUMMARY_COLUMNS}
    if row["error"]:
        row["error"] = str(row["error"]).splitlines()[0]
    for key, value in (run.get("config") or {}).items():
        is_nested = isinstance(value, (dict, list))
        row[f"config.{key}"] = json.dumps(value) if is_nested else value
    return row


def write_csv(runs: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write runs as CSV (see :func:`flat_row`); returns the number of rows."""
    rows = [flat_row(r) for r in runs]
    columns = _columns(rows)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def write_parquet(runs: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write runs as Parquet with pyarrow; returns the number of rows. Raises ValueError naming
    ``--parquet`` and the extra that installs pyarrow when it is missing (pandas alone cannot
    write Parquet: it calls pyarrow or fastparquet itself)."""
    rows = [flat_row(r) for r in runs]
    columns = _columns(rows)
    table = {c: [r.get(c) for r in rows] for c in columns}
    try:  # an optional dependency, imported only when Parquet is asked for
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("--parquet needs pyarrow: pip install 'attnscale[parquet]' "
                         "(or pip install pyarrow)") from None
    pq.write_table(pa.table(table), str(path))
    return len(rows)


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    columns = list(SUMMARY_COLUMNS)
    for row in rows:
        columns += [k for k in row if k not in columns]
    return columns
