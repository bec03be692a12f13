"""The results store: one SQLite file (WAL mode) per sweep database.

Tables:

``runs``
    One row per grid point: ``id`` (the config hash), ``sweep`` and ``variant`` labels, the
    resolved ``config`` (JSON), ``status`` (queued, running, done, diverged, failed), ``error``,
    ``worker`` (which process ran it, e.g. ``pid 1234``), timings (``queued_at``,
    ``started_at``, ``finished_at`` as Unix seconds; ``elapsed_s`` as the trainer measured
    it), ``versions`` (JSON), ``git_rev``, and the numbers (``initial_loss``,
    ``final_loss``, ``final_metric``, ``diverged_step``, ``steps``).
``metrics``
    The time series of each run: one row per history entry (``run_id``, ``idx``, ``step``,
    ``loss``, and the whole entry as JSON in ``data``).
``measurements``
    Results that need no training (theory grids, benchmarks, model inspections): ``key`` ->
    JSON ``value``, with the ``kind`` and ``params`` that produced it, ``created`` (Unix
    seconds), ``versions`` (JSON) and ``git_rev``.

A run's results are written in one transaction: its metrics rows and its final status appear
together or not at all, so a sweep killed at any moment leaves either a finished run with its
full history or an unfinished run (queued/running) with no metrics. Every connection sets a
busy timeout, so several processes may write to the same file. ``synchronous = NORMAL``: a
killed process loses nothing that was committed; a power cut may lose the last commits, but
never leaves a half-written run. Non-finite floats are stored as NULL (JSON ``null``).

Opening a path that is a directory, a file that is not a SQLite database, a SQLite database
made by another program (tables, but no ``runs`` table with the columns above), or a path whose
folder cannot be created or written raises ``ValueError`` naming ``db``; such a file is left
untouched. A new or empty file gets the tables.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnscale.util.jsonio import dumps, jsonable
from attnscale.util.provenance import git_revision, versions
from attnscale.util.validate import check_output_folder

STATUSES = ("queued", "running", "done", "diverged", "failed")
FINISHED = ("done", "diverged")
BUSY_TIMEOUT_MS = 60_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    sweep TEXT,
    variant TEXT,
    config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued','running','done','diverged','failed')),
    error TEXT,
    worker TEXT,
    queued_at REAL,
    started_at REAL,
    finished_at REAL,
    elapsed_s REAL,
    versions TEXT,
    git_rev TEXT,
    initial_loss REAL,
    final_loss REAL,
    final_metric REAL,
    diverged_step INTEGER,
    steps INTEGER,
    final_metrics TEXT,
    lease_owner TEXT,
    lease_until REAL
);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    step INTEGER,
    loss REAL,
    data TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS measurements (key TEXT PRIMARY KEY, kind TEXT, params TEXT,
    value TEXT, created REAL, versions TEXT, git_rev TEXT);
"""

_JSON_COLUMNS = ("config", "versions", "final_metrics")
# The runs columns a database of ours has (final_metrics came later and is added when missing).
_RUN_COLUMNS = frozenset({
    "id", "sweep", "variant", "config", "status", "error", "worker", "queued_at", "started_at",
    "finished_at", "elapsed_s", "versions", "git_rev", "initial_loss", "final_loss",
    "final_metric", "diverged_step", "steps",
})
# Columns added later: created when an older database is opened.
_LATER_COLUMNS = {"final_metrics": "TEXT", "lease_owner": "TEXT", "lease_until": "REAL"}
_SMALLEST_PAGE = 512  # bytes: a non-empty SQLite file is at least one page

# SQLite's messages for a path it cannot use -> what to tell the caller.
_OPEN_ERRORS = {
    "file is not a database": "is not a SQLite database",
    "unable to open database file": "cannot be opened or created (folder missing or read-only)",
    "readonly database": "is not writable",
}


def _json(obj: Any) -> str:
    """Strict JSON text for a TEXT column: sorted keys, NaN/inf as null, unknown types as str."""
    return dumps(obj, sort_keys=True, default=str)


def _open_error(path: str, error: sqlite3.DatabaseError) -> ValueError | None:
    for message, meaning in _OPEN_ERRORS.items():
        if message in str(error):
            return ValueError(f"db: {path} {meaning}")
    return None


class Store:
    """A connection to a results database; creates the file and tables on first use.

    >>> store = Store(":memory:")
    >>> store.add_runs([{"id": "a1", "config": {"lr": 0.1}}])
    1
    >>> store.get("a1")["status"]
    'queued'
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            _check_path(Path(self.path))
        self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        try:
            self._set_up()
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise (_open_error(self.path, e) or e) from None
        except ValueError:
            self.conn.close()
            raise

    def _set_up(self) -> None:
        self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._check_ours()  # before any write: WAL mode alone rewrites the file header
        if self.path != ":memory:":
            self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA foreign_keys = ON")
        with self.transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.conn.execute(statement)
            columns = {row[1] for row in self.conn.execute("PRAGMA table_info(runs)")}
            for name, kind in _LATER_COLUMNS.items():  # a database made before they existed
                if name not in columns:
                    self.conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")

    def _check_ours(self) -> None:
        """Raise ValueError if the file holds tables but not attnscale's ``runs`` table."""
        tables = {row[0] for row in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        if not tables:
            return  # a new or empty database: ours to set up
        columns = {row[1] for row in self.conn.execute("PRAGMA table_info(runs)")}
        if _RUN_COLUMNS - columns:  # no runs table, or not ours
            raise ValueError(f"db: {self.path} is not an attnscale results database")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT, rolled back on any exception."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ---------------------------------------------------------------- writing

    def add_runs(self, points: Iterable[Mapping[str, Any]], sweep: str | None = None) -> int:
        """Insert grid points (dicts with ``id``, ``config``, optional ``variant``) as queued.

        Points already in the store are left alone. Returns how many rows were added.
        """
        now = time.time()
        rows = [(p["id"], sweep, p.get("variant"), _json(p["config"]), now) for p in points]
        with self.transaction() as c:
            before = c.total_changes
            c.executemany(
                "INSERT OR IGNORE INTO runs (id, sweep, variant, config, status, queued_at) "
                "VALUES (?, ?, ?, ?, 'queued', ?)",
                rows,
            )
            return c.total_changes - before

    def requeue(self, ids: Iterable[str], statuses: Iterable[str] = STATUSES) -> int:
        """Reset runs to queued, dropping any metrics, error and final numbers they had; only
        runs whose status is one of ``statuses`` as the write happens, and never a run that a
        sweep driver holds under a live lease (:mod:`attnscale.lab.leases`). Returns how many
        were reset."""
        now, wanted = time.time(), list(statuses)
        marks = ",".join("?" * len(wanted))
        reset = 0
        with self.transaction() as c:
            for run_id in ids:
                changed = c.execute(
                    "UPDATE runs SET status = 'queued', error = NULL, worker = NULL, "
                    "queued_at = ?, started_at = NULL, finished_at = NULL, elapsed_s = NULL, "
                    "final_loss = NULL, final_metric = NULL, diverged_step = NULL, steps = NULL, "
                    "initial_loss = NULL, final_metrics = NULL, lease_owner = NULL, "
                    f"lease_until = NULL WHERE id = ? AND status IN ({marks}) AND NOT "
                    "(status = 'running' AND lease_until IS NOT NULL AND lease_until >= ?)",
                    (now, run_id, *wanted, now)).rowcount
                if changed:
                    c.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
                reset += changed
        return reset

    def mark_running(self, run_id: str, worker: str | None = None) -> None:
        """Status running, with the start time and the worker that took it."""
        with self.transaction() as c:
            c.execute(
                "UPDATE runs SET status = 'running', started_at = ?, worker = ? WHERE id = ?",
                (time.time(), worker, run_id),
            )

    def finish(self, run_id: str, result: Mapping[str, Any], owner: str | None = None) -> bool:
        """Write a trainer result (``RunResult.to_dict()``) and its history in one transaction.

        The status is the result's (``done`` or ``diverged``); anything else is stored as
        ``failed``. With ``owner`` (a driver's lease, :mod:`attnscale.lab.leases`) nothing is
        written unless the run is still running under that lease: a driver whose lease lapsed
        and was taken over does not overwrite the taker's result. Returns whether it wrote.
        """
        status = result.get("status")
        if status not in FINISHED:
            return self.fail(run_id, f"trainer returned status {status!r}", owner)
        history = list(result.get("history") or [])
        rows = [
            (run_id, i, h.get("step"), jsonable(h.get("loss")), _json(h))
            for i, h in enumerate(history)
        ]
        with self.transaction() as c:
            if not _owns(c, run_id, owner):
                return False
            c.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
            c.executemany(
                "INSERT INTO metrics (run_id, idx, step, loss, data) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            c.execute(
                "UPDATE runs SET status = ?, error = NULL, finished_at = ?, elapsed_s = ?, "
                "versions = ?, git_rev = ?, initial_loss = ?, final_loss = ?, final_metric = ?, "
                "diverged_step = ?, steps = ?, final_metrics = ?, lease_until = NULL WHERE id = ?",
                (
                    status,
                    time.time(),
                    jsonable(result.get("elapsed_s")),
                    _json(result.get("versions") or {}),
                    result.get("git_rev"),
                    jsonable(result.get("initial_loss")),
                    jsonable(result.get("final_loss")),
                    jsonable(result.get("final_metric")),
                    result.get("diverged_step"),
                    result.get("steps"),
                    _json(result.get("final_metrics") or {}),
                    run_id,
                ),
            )
        return True

    def fail(self, run_id: str, error: str, owner: str | None = None) -> bool:
        """Status failed with the error text; the run keeps no metrics. ``owner`` as in
        :meth:`finish`; returns whether it wrote."""
        with self.transaction() as c:
            if not _owns(c, run_id, owner):
                return False
            c.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
            c.execute(
                "UPDATE runs SET status = 'failed', error = ?, finished_at = ?, "
                "lease_until = NULL WHERE id = ?",
                (error, time.time(), run_id),
            )
        return True

    def put_measurement(
        self, key: str, value: Any, kind: str | None = None, params: Mapping[str, Any] | None = None
    ) -> Any:
        """Store ``value`` (made JSON-ready: NaN/inf -> null) under ``key`` with its provenance,
        replacing any earlier value; returns the stored value as :meth:`get_measurement` will."""
        stored = jsonable(value)
        with self.transaction() as c:
            c.execute(
                "INSERT OR REPLACE INTO measurements "
                "(key, kind, params, value, created, versions, git_rev) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, kind, _json(params or {}), _json(stored), time.time(),
                 _json(versions()), git_revision()),
            )  # fmt: skip
        return stored

    # ---------------------------------------------------------------- reading

    def get_measurement(self, key: str) -> Any | None:
        """The value stored under ``key`` by :meth:`put_measurement`, or None."""
        row = self.conn.execute("SELECT value FROM measurements WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row["value"])

    def get(self, run_id: str, history: bool = False) -> dict[str, Any] | None:
        """One run as a dict (see :meth:`runs`), or None."""
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        run = _run_dict(row)
        if history:
            run["history"] = self.history(run_id)
        return run

    def runs(
        self,
        status: str | Iterable[str] | None = None,
        where: Mapping[str, Any] | None = None,
        history: bool = False,
        ids: Iterable[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Runs as dicts, in the order they were first added.

        Args:
            status: keep runs with this status (or any of these statuses).
            where: keep runs whose resolved config has these values (e.g. ``{"score": "dot"}``);
                ``variant`` and ``sweep`` are matched against the run's labels.
            history: attach each run's time series as ``run["history"]``.
            ids: keep only these run ids.

        Each dict has the ``runs`` columns, with ``config`` and ``versions`` parsed from JSON;
        :meth:`attnscale.lab.records.Run.from_row` makes one a typed record.
        """
        sql, args = "SELECT * FROM runs", []
        clauses = []
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            bad = sorted(set(wanted) - set(STATUSES))
            if bad:
                raise ValueError(f"unknown status {bad}; valid: {list(STATUSES)}")
            clauses.append(f"status IN ({','.join('?' * len(wanted))})")
            args += wanted
        for key, value in (where or {}).items():
            if key in ("variant", "sweep"):
                clauses.append(f"{key} IS ?")
            else:
                clauses.append("json_extract(config, ?) IS ?")
                args.append(f'$."{key}"')
            args.append(value)
        if ids is not None:
            id_list = list(ids)
            clauses.append(f"id IN ({','.join('?' * len(id_list))})")
            args += id_list
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        rows = self.conn.execute(sql + " ORDER BY rowid", args).fetchall()
        out = [_run_dict(r) for r in rows]
        if history:
            series = self._histories()
            for run in out:
                run["history"] = series.get(run["id"], [])
        return out

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """A run's time series: the trainer's history entries, in order."""
        rows = self.conn.execute(
            "SELECT data FROM metrics WHERE run_id = ? ORDER BY idx", (run_id,)
        ).fetchall()
        return [json.loads(r["data"]) for r in rows]

    def _histories(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.conn.execute("SELECT run_id, data FROM metrics ORDER BY run_id, idx"):
            out.setdefault(r["run_id"], []).append(json.loads(r["data"]))
        return out

    def counts(self) -> dict[str, int]:
        """Number of runs per status (every status present, zeros included)."""
        out = dict.fromkeys(STATUSES, 0)
        for r in self.conn.execute("SELECT status, COUNT(*) AS n FROM runs GROUP BY status"):
            out[r["status"]] = r["n"]
        return out

    def metric_counts(self) -> dict[str, int]:
        """Number of metrics rows per run id (runs without metrics are absent)."""
        rows = self.conn.execute("SELECT run_id, COUNT(*) AS n FROM metrics GROUP BY run_id")
        return {r["run_id"]: r["n"] for r in rows}

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` result ("ok" when the file is sound)."""
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]


def _check_path(path: Path) -> None:
    """``path`` can hold a database: not a directory, not a file too short to be one (SQLite
    would take one of under 16 bytes for an empty database and overwrite it; a longer file
    that is not a database it refuses itself), in a folder that exists or can be made.

    The file is never opened here: closing any descriptor of a file drops every POSIX lock
    this process holds on it, so a second Store beside a live one (the lease heartbeat) would
    strip the first of its locks, and another process could then delete the WAL under it."""
    if path.is_dir():
        raise ValueError(f"db: {path} is a directory, not a SQLite database file")
    if path.is_file() and 0 < path.stat().st_size < _SMALLEST_PAGE:  # SQLite writes pages
        raise ValueError(f"db: {path} is not a SQLite database")
    check_output_folder("db", path.parent)


def _owns(conn: sqlite3.Connection, run_id: str, owner: str | None) -> bool:
    """Whether ``owner`` (None: anyone) holds ``run_id``'s lease and it is still running."""
    if owner is None:
        return True
    row = conn.execute("SELECT status, lease_owner FROM runs WHERE id = ?", (run_id,)).fetchone()
    return row is not None and row[0] == "running" and row[1] == owner


def _run_dict(row: sqlite3.Row) -> dict[str, Any]:
    run = dict(row)
    for key in _JSON_COLUMNS:
        run[key] = json.loads(run[key]) if run[key] else ({} if key == "versions" else None)
    return run
