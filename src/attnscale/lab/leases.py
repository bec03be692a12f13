"""Leases: several sweep drivers sharing one results database.

A driver claims a run before it trains it: one ``UPDATE`` that succeeds only if the run is
queued, or running under a lease that has lapsed (its driver died, or was stopped for longer
than the lease). SQLite serialises writers, so two drivers never both succeed on one run. A
claim lasts ``lease_s`` seconds; a :class:`Heartbeat` thread renews every claim of its driver
every ``lease_s / 4``, so a live driver keeps its runs however long they train, and a driver
killed at any moment loses them at most ``lease_s`` later, when any other driver may take
them. A driver whose lease lapsed does not overwrite the new holder's result
(:meth:`attnscale.lab.store.Store.finish` with ``owner``). A driver stopping on an exception
or Ctrl-C hands its claims back at once (:func:`release`).

Time is the database's clock as each driver reads it (``time.time()``): drivers on one
machine, or machines whose clocks agree to well under ``lease_s``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from attnscale.lab.store import FINISHED, Store
from attnscale.util.validate import check_float

__all__ = [
    "LEASE_S",
    "Heartbeat",
    "Held",
    "claim",
    "held",
    "holding",
    "new_owner",
    "release",
    "renew",
]

LEASE_S = 120.0


def new_owner() -> str:
    """A name no other driver has: host, pid and a random suffix."""
    return f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"


def claim(store: Store, run_id: str, owner: str, worker: str | None = None,
          lease_s: float = LEASE_S) -> bool:
    """Take ``run_id`` for ``owner`` if it is queued or its lease lapsed; whether it did.
    A run left running with no lease (by a sweep of an earlier version) counts as lapsed."""
    now = time.time()
    with store.transaction() as c:
        cursor = c.execute(
            "UPDATE runs SET status = 'running', started_at = ?, worker = ?, lease_owner = ?, "
            "lease_until = ?, error = NULL WHERE id = ? AND (status = 'queued' OR "
            "(status = 'running' AND (lease_until IS NULL OR lease_until < ?)))",
            (now, worker, owner, now + lease_s, run_id, now))
        return cursor.rowcount == 1


def renew(store: Store, owner: str, lease_s: float = LEASE_S) -> int:
    """Extend every running claim of ``owner`` to ``lease_s`` from now; how many."""
    with store.transaction() as c:
        return c.execute("UPDATE runs SET lease_until = ? WHERE lease_owner = ? AND "
                         "status = 'running'", (time.time() + lease_s, owner)).rowcount


def release(store: Store, owner: str) -> int:
    """Hand ``owner``'s running claims back (queued), for other drivers to take now; how
    many."""
    with store.transaction() as c:
        return c.execute(
            "UPDATE runs SET status = 'queued', worker = NULL, started_at = NULL, "
            "lease_owner = NULL, lease_until = NULL WHERE lease_owner = ? AND "
            "status = 'running'", (owner,)).rowcount


class Held:
    """Where the runs of a set stand for one driver (:func:`held`)."""

    def __init__(self, finished: dict[str, str], elsewhere: dict[str, float],
                 claimable: list[str]) -> None:
        self.finished = finished    # run id -> final status (done, diverged, failed)
        self.elsewhere = elsewhere  # run id -> when another driver's live lease ends
        self.claimable = claimable  # queued, or running under a lapsed lease

    def wait_s(self, cap: float) -> float:
        """Seconds until the first lease held elsewhere may lapse, at most ``cap``."""
        if not self.elsewhere:
            return 0.0
        return max(0.05, min(cap, min(self.elsewhere.values()) - time.time()))


def held(store: Store, ids: Iterable[str], owner: str) -> Held:
    """Sort ``ids`` into finished, held by another driver's live lease, and claimable."""
    now = time.time()
    finished: dict[str, str] = {}
    elsewhere: dict[str, float] = {}
    claimable: list[str] = []
    for run in store.runs(ids=list(ids)):
        status, until = run["status"], run["lease_until"]
        if status in (*FINISHED, "failed"):
            finished[run["id"]] = status
        elif status == "running" and until is not None and until >= now \
                and run["lease_owner"] != owner:
            elsewhere[run["id"]] = until
        else:
            claimable.append(run["id"])
    return Held(finished, elsewhere, claimable)


class Heartbeat:
    """A thread renewing ``owner``'s claims in ``db`` every ``lease_s / 4`` seconds, on its
    own connection (a SQLite connection belongs to one thread); a context manager."""

    def __init__(self, db: str | Path, owner: str, lease_s: float = LEASE_S) -> None:
        self.db, self.owner = db, owner
        self.lease_s = check_float("lease_s", lease_s, low=0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="attnscale-lease", daemon=True)
        self.error: BaseException | None = None

    def _beat(self) -> None:
        if str(self.db) == ":memory:":  # a database no other driver can open
            return
        try:
            with Store(self.db) as store:
                while not self._stop.wait(self.lease_s / 4):
                    renew(store, self.owner, self.lease_s)
        except Exception as e:  # surfaced by __exit__: a lease that is not renewed lapses
            self.error = e

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None and not any(exc):
            raise RuntimeError(f"renewing the sweep's leases in {self.db} failed: "
                               f"{self.error}") from self.error


@contextmanager
def holding(db: str | Path, store: Store, owner: str, lease_s: float = LEASE_S
            ) -> Iterator[None]:
    """Renew ``owner``'s leases while the block runs; hand back what it still holds when the
    block stops early (an exception or Ctrl-C)."""
    try:
        with Heartbeat(db, owner, lease_s):
            yield
    except BaseException:
        release(store, owner)
        raise
