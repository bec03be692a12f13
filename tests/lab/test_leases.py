"""Leases for drivers sharing a sweep database: unit tests on a real SQLite file (the
two-driver runs through the CLI are in ``test_shared_sweeps.py``)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from attnscale.lab import leases
from attnscale.lab.store import Store
from attnscale.lab.sweep import expand, parse_spec, plan

DONE = {"status": "done", "history": [{"step": 0, "loss": 1.0}]}


def test_a_run_is_claimed_once_until_its_lease_lapses(store):
    assert leases.claim(store, "a", "A", "pid 1", lease_s=1.0)
    assert not leases.claim(store, "a", "B", "pid 2", lease_s=1.0)  # A's lease is live
    run = store.get("a")
    assert (run["status"], run["lease_owner"], run["worker"]) == ("running", "A", "pid 1")
    time.sleep(1.05)
    assert leases.claim(store, "a", "B", "pid 2", lease_s=60)  # lapsed: B takes it over
    assert not store.finish("a", DONE, owner="A")  # A's late result does not overwrite
    assert not store.fail("a", "late", owner="A")
    assert store.get("a")["status"] == "running"
    assert store.finish("a", DONE, owner="B")
    run = store.get("a", history=True)
    assert run["status"] == "done" and run["lease_owner"] == "B" and len(run["history"]) == 1
    assert not leases.claim(store, "a", "C")  # finished runs are never claimed


def test_renew_keeps_a_claim_and_release_hands_it_back(store):
    assert leases.claim(store, "a", "A", lease_s=1.0) and leases.claim(store, "b", "A")
    assert leases.claim(store, "c", "B")
    before = store.get("a")["lease_until"]
    assert leases.renew(store, "A", lease_s=60) == 2  # only A's running runs
    assert store.get("a")["lease_until"] > before + 50
    time.sleep(1.05)
    assert not leases.claim(store, "a", "B")  # renewed: still A's
    assert leases.release(store, "A") == 2
    assert {store.get(i)["status"] for i in "ab"} == {"queued"}
    assert store.get("a")["lease_owner"] is None and store.get("c")["status"] == "running"


def test_held_sorts_runs_for_one_driver(store):
    leases.claim(store, "a", "A", lease_s=60)
    leases.claim(store, "b", "B", lease_s=60)
    store.mark_running("c")  # running with no lease: left by a sweep of an earlier version
    state = leases.held(store, "abc", "A")
    # a live lease is not free, even the driver's own (it is still training that run)
    assert state.finished == {} and sorted(state.elsewhere) == ["a", "b"]
    assert state.claimable == ["c"]
    assert 0 < state.wait_s(cap=5.0) <= 5.0
    store.finish("b", DONE)
    assert leases.held(store, "abc", "A").finished == {"b": "done"}
    assert leases.held(store, "c", "A").wait_s(cap=5.0) == 0.0
    with pytest.raises(ValueError, match="ids"):
        leases.held(store, ["a", "zz"], "A")


def test_a_gone_driver_of_this_host_holds_nothing(store):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    gone = f"{socket.gethostname()} pid {dead} 0123abcd"
    away = f"another-host pid {dead} 0123abcd"  # another machine: only its lease tells
    assert leases.claim(store, "a", gone, lease_s=600)
    assert leases.claim(store, "b", away, lease_s=600)
    assert leases.claim(store, "c", leases.new_owner(), lease_s=600)  # this live process
    assert leases.expire_dead(store) == 1
    assert leases.claim(store, "a", "taker")
    assert not leases.claim(store, "b", "taker") and not leases.claim(store, "c", "taker")


def test_plan_leaves_live_claims_of_other_drivers_alone(tmp_path):
    points = expand(parse_spec('[base]\ntask = "mqar"\n[axes]\nlr = [1e-3, 1e-2, 1e-1]\n'))
    ids = [p.id for p in points]
    with Store(tmp_path / "runs.db") as store:
        plan(store, points, "t", retry_failed=False)
        leases.claim(store, ids[0], "other", lease_s=60)
        leases.claim(store, ids[1], "dead", lease_s=0.01)
        time.sleep(0.05)
        todo, counts = plan(store, points, "t", retry_failed=False)
        assert [j.id for j in todo] == ids and counts.skipped == 0
        assert store.get(ids[0])["status"] == "running"  # live: still the other driver's
        assert store.get(ids[1])["status"] == "queued"  # lapsed: requeued
        assert store.get(ids[1])["lease_owner"] is None


def test_claims_race_from_threads_each_run_won_once(tmp_path):
    """Eight threads, each with its own connection, claim the same 40 runs as fast as they
    can: every run is won by exactly one of them."""
    db = tmp_path / "runs.db"
    with Store(db) as store:
        store.add_runs([{"id": f"r{i}", "config": {"i": i}} for i in range(40)])
    won: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def driver(name: str) -> None:
        try:
            with Store(db) as own:
                start.wait()
                won[name] = [f"r{i}" for i in range(40) if leases.claim(own, f"r{i}", name)]
        except BaseException as e:  # a locked database must fail the test, not hide in a thread
            errors.append(e)

    threads = [threading.Thread(target=driver, args=(f"d{k}",)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(won) == 8
    claimed = [r for runs in won.values() for r in runs]
    assert sorted(claimed) == sorted(f"r{i}" for i in range(40))


def test_heartbeat_renews_until_it_stops(tmp_path):
    db = tmp_path / "runs.db"
    with Store(db) as store:
        store.add_runs([{"id": "a", "config": {}}])
        assert leases.claim(store, "a", "A", lease_s=2.0)
        with leases.Heartbeat(db, "A", lease_s=2.0) as heartbeat:
            time.sleep(4.2)  # two lease lengths: alive only if renewed
            heartbeat.check()
            assert not leases.claim(store, "a", "B")
        time.sleep(2.1)
        assert leases.claim(store, "a", "B")  # stopped: it lapses


def test_a_heartbeat_that_cannot_renew_stops_the_driver(tmp_path):
    heartbeat = leases.Heartbeat(tmp_path, "A", lease_s=1.0)  # a folder: no database
    with heartbeat:
        time.sleep(0.8)
        with pytest.raises(RuntimeError, match="not renewed"):
            heartbeat.check()
    assert heartbeat.error is not None


def test_holding_hands_claims_back_on_an_exception(tmp_path):
    db = tmp_path / "runs.db"
    with Store(db) as store:
        store.add_runs([{"id": "a", "config": {}}])
        with pytest.raises(KeyboardInterrupt), leases.holding(db, store, "A", lease_s=60):
            assert leases.claim(store, "a", "A", lease_s=60)
            raise KeyboardInterrupt
        assert store.get("a")["status"] == "queued"


def test_bad_lease_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="lease_s"):
        leases.Heartbeat(tmp_path / "runs.db", "A", lease_s=0)


def test_requeue_spares_live_claims_and_statuses_not_asked_for(store):
    store.finish("a", DONE)
    assert leases.claim(store, "b", "B", lease_s=60)
    assert store.requeue("abc", statuses=("queued", "running")) == 1  # only c
    assert store.get("a")["status"] == "done" and len(store.history("a")) == 1
    assert store.get("b")["status"] == "running" and store.get("b")["lease_owner"] == "B"
    assert store.requeue("a") == 1 and store.get("a")["status"] == "queued"
    assert store.history("a") == []


def test_a_driver_waits_for_a_live_claim_then_gives_up_saying_so(tmp_path, recording_pool):
    from attnscale.lab.sweep import run_sweep

    spec = parse_spec('[base]\ntask = "mqar"\n[axes]\nlr = [1e-3, 1e-2, 1e-1]\n')
    held_id = expand(spec)[1].id
    db = tmp_path / "runs.db"
    with Store(db) as store:
        plan(store, expand(spec), None, retry_failed=False)
        assert leases.claim(store, held_id, "another-host pid 1 abcd", lease_s=600)
    seen = []
    start = time.monotonic()
    counts = run_sweep(spec, db, pool=recording_pool(), patience_s=1.0,
                       progress=lambda c: seen.append(c.waiting))
    assert time.monotonic() - start < 30
    assert (counts.failed, counts.waiting) == (2, 1) and max(seen) == 1
    with Store(db) as store:
        assert store.get(held_id)["lease_owner"] == "another-host pid 1 abcd"
    with pytest.raises(ValueError, match="lease_s"):
        run_sweep(spec, db, pool=recording_pool(), lease_s=0.5)
