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

Times are each driver's own clock (``time.time()``): drivers on one machine, or machines
whose clocks agree to well under ``lease_s``. A run held by a driver on this machine whose
process is gone counts as lapsed at once (:func:`expire_dead`), so a sweep killed and started
again does not wait out its own old leases.
"""

from __future__ import annotations

import os
import socket
import sqlite3
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
    "expire_dead",
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


def _dead_here(owner: str) -> bool:
    """Whether ``owner`` (:func:`new_owner`'s form) is a process of this host that is gone."""
    host, _, rest = owner.partition(" pid ")
    pid = rest.split(" ")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's live process
        return False
    return False


def expire_dead(store: Store) -> int:
    """Lapse the leases of drivers on this host whose process is gone; how many runs."""
    owners = {r[0] for r in store.conn.execute(
        "SELECT DISTINCT lease_owner FROM runs WHERE status = 'running' AND lease_until "
        "IS NOT NULL AND lease_owner IS NOT NULL")}
    dead = [o for o in owners if _dead_here(o)]
    if not dead:
        return 0
    with store.transaction() as c:
        return sum(c.execute("UPDATE runs SET lease_until = NULL WHERE lease_owner = ? AND "
                             "status = 'running'", (o,)).rowcount for o in dead)


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
        self.elsewhere = elsewhere  # run id -> when its live lease ends (any driver's)
        self.claimable = claimable  # queued, or running under a lapsed lease or none

    def wait_s(self, cap: float) -> float:
        """Seconds until the first lease held elsewhere may lapse, at most ``cap``."""
        if not self.elsewhere:
            return 0.0
        return max(0.05, min(cap, min(self.elsewhere.values()) - time.time()))


def held(store: Store, ids: Iterable[str], owner: str) -> Held:
    """Sort ``ids`` into finished, held under a live lease (another driver's, or ``owner``'s
    own: a run this driver still trains is not free either), and claimable; a driver of this
    host that is gone holds nothing (:func:`expire_dead`). Raises ValueError for an id that
    is not in the store."""
    expire_dead(store)
    ids, now = list(ids), time.time()
    finished: dict[str, str] = {}
    elsewhere: dict[str, float] = {}
    claimable: list[str] = []
    runs = store.runs(ids=ids)
    missing = sorted(set(ids) - {r["id"] for r in runs})
    if missing:
        raise ValueError(f"ids: runs {missing[:3]} are not in {store.path}")
    for run in runs:
        status, until = run["status"], run["lease_until"]
        if status in (*FINISHED, "failed"):
            finished[run["id"]] = status
        elif status == "running" and until is not None and until >= now:
            elsewhere[run["id"]] = until
        else:
            claimable.append(run["id"])
    return Held(finished, elsewhere, claimable)


class Heartbeat:
    """A thread renewing ``owner``'s claims in ``db`` every ``lease_s / 4`` seconds, on its
    own connection (a SQLite connection belongs to one thread); a context manager. A renewal
    that fails (a database locked past its busy timeout) is retried at the next beat; when no
    renewal has succeeded for ``lease_s / 2``, :meth:`check` raises, so the driver stops
    before its leases can lapse under it."""

    def __init__(self, db: str | Path, owner: str, lease_s: float = LEASE_S) -> None:
        self.db, self.owner = db, owner
        self.lease_s = check_float("lease_s", lease_s, low=0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="attnscale-lease", daemon=True)
        self.error: BaseException | None = None
        # a database no other process can open: nothing to renew, nothing to lapse
        self.renewed = float("inf") if str(db) == ":memory:" else time.monotonic()

    def _beat(self) -> None:
        if str(self.db) == ":memory:":
            return
        try:
            with Store(self.db) as store:
                while not self._stop.wait(self.lease_s / 4):
                    try:
                        renew(store, self.owner, self.lease_s)
                        self.renewed = time.monotonic()
                    except sqlite3.OperationalError as e:  # locked: the next beat retries
                        self.error = e
        except Exception as e:  # reported by check(): the leases are no longer renewed
            self.error = e
            self.renewed = -float("inf")

    def check(self) -> None:
        """Raise RuntimeError if the leases went unrenewed for half a lease."""
        if time.monotonic() - self.renewed > self.lease_s / 2:
            raise RuntimeError(f"sweep driver {self.owner}: its leases in {self.db} were not "
                               f"renewed for {self.lease_s / 2:g} s ({self.error}); stopping "
                               f"before other drivers take its runs over")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def holding(db: str | Path, store: Store, owner: str, lease_s: float = LEASE_S
            ) -> Iterator[Heartbeat]:
    """Renew ``owner``'s leases while the block runs (the block gets the
    :class:`Heartbeat`, to :meth:`~Heartbeat.check`); hand back what it still holds when the
    block stops early (an exception, Ctrl-C or, in the CLI, SIGTERM)."""
    finished = False
    try:
        with Heartbeat(db, owner, lease_s) as heartbeat:
            yield heartbeat
        finished = True
    finally:
        if not finished:  # stopped early: the exception goes on once the claims are back
            release(store, owner)
