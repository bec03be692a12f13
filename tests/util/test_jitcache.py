"""attnscale.util.jitcache's lock: a dead holder is never waited on, a live one is waited on
with one line naming it and given up on after the limit; killed builds' folders are cleared.
Real processes hold the locks; nothing compiles here (test_kernel_builds.py compiles)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from attnscale.util import jitcache

pytestmark = pytest.mark.skipif(jitcache.fcntl is None, reason="no flock on this system")
LOG = logging.getLogger("attnscale.test_jitcache")


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCALE_KERNEL_CACHE", str(tmp_path))
    return tmp_path / "attnscale"


def holder(lock, seconds: float) -> subprocess.Popen:
    """A process that takes the flock on ``lock``, says so, and holds it for ``seconds``."""
    code = ("import fcntl, os, sys, time\n"
            f"f = open({str(lock)!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX)\n"
            "f.truncate(0); f.write(f'process {os.getpid()}'); f.flush()\n"
            f"print('held', flush=True); time.sleep({seconds})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_left_by_a_killed_process_is_not_waited_on(root, caplog):
    """SIGKILL the holder: the OS drops its flock, so the next taker gets it at once, although
    the lock file (naming the dead process) is still there."""
    lock = root / "k.lock"
    lock.parent.mkdir(parents=True)
    proc = holder(lock, 600)
    proc.kill()
    proc.wait(timeout=30)
    assert lock.read_text() == f"process {proc.pid}"
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger=LOG.name), \
            jitcache.turn(lock, "a kernel", LOG, wait=60) as held:
        assert held
    assert time.monotonic() - start < 1
    assert not [r for r in caplog.records if r.name == LOG.name]


def test_a_live_holder_is_waited_on_with_one_line_then_the_lock_is_taken(root, caplog):
    lock = root / "k.lock"
    lock.parent.mkdir(parents=True)
    proc = holder(lock, 1.5)
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger=LOG.name), \
            jitcache.turn(lock, "a kernel", LOG, wait=60) as held:
        assert held and lock.read_text().endswith(str(__import__("os").getpid()))
    waited = time.monotonic() - start
    proc.wait(timeout=30)
    assert 0.5 < waited < 30
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOG.name]
    assert f"waiting for process {proc.pid}, which is building a kernel" in line


def test_a_waiter_gives_up_after_the_limit(root, caplog):
    """Nothing waits for ever: past the limit the block runs without the lock (the build then
    goes on in its own private folder)."""
    lock = root / "k.lock"
    lock.parent.mkdir(parents=True)
    proc = holder(lock, 600)
    try:
        start = time.monotonic()
        with caplog.at_level(logging.INFO, logger=LOG.name), \
                jitcache.turn(lock, "a kernel", LOG, wait=0.5) as held:
            assert not held
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.wait(timeout=30)
    lines = [r.getMessage() for r in caplog.records if r.name == LOG.name]
    assert len(lines) == 2 and "gave up waiting" in lines[1]
    assert lock.read_text() == f"process {proc.pid}"  # the holder's word stays


def test_killed_builds_private_folders_are_cleared(root):
    """Folders of a dead process go; a live process's (this one's) stay; others are ignored."""
    root.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    dead = root / f".attnscale_k_generic_abc.x1y2.{proc.pid}.tmp"
    live = root / f".attnscale_k_generic_abc.z3w4.{__import__('os').getpid()}.tmp"
    other = root / f".attnscale_other_generic_abc.q5.{proc.pid}.tmp"
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "k.o").write_bytes(b"")
    assert jitcache.clear_leftovers("attnscale_k_generic_abc") == [dead]
    assert not dead.exists() and live.exists() and other.exists()


@pytest.mark.parametrize("text,ok", [("", 300.0), ("12.5", 12.5), ("0", 0.0), ("soon", None),
                                     ("-1", None), ("nan", None)])
def test_the_wait_limit_comes_from_the_environment(monkeypatch, text, ok):
    monkeypatch.setenv(jitcache.WAIT_ENV, text)
    if ok is None:
        with pytest.raises(ValueError, match=r"^\$ATTNSCALE_BUILD_WAIT must be"):
            jitcache.wait_limit()
    else:
        assert jitcache.wait_limit() == ok
