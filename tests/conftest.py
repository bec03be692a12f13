"""Shared fixtures, hypothesis profiles and the ``property`` marker.

Hypothesis profiles (chosen with the ``HYPOTHESIS_PROFILE`` environment variable):

``ci`` (default)
    Derandomized: every run draws the same examples, so ``make test`` passes or fails the same
    way on every machine. No example database, so earlier local failures do not leak in.
``fuzz``
    Many more examples from a random seed (``make fuzz`` passes ``--hypothesis-seed`` and prints
    it, so a failure can be replayed); failing examples are printed as reproducible blobs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, is_hypothesis_test, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=40,
    print_blob=True,
)
settings.register_profile(
    "fuzz",
    deadline=None,
    database=None,
    max_examples=1000,
    print_blob=True,
    # some strategies reject shapes; at this many examples that is expected, not a problem
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "property: a hypothesis property test (make fuzz)")


# The longest modules (seconds on 2 cores, `pytest --durations=0`), run first: `make test` hands
# whole modules to its two workers in collection order, so one started last would run alone at
# the end. A stale list only costs time.
LONGEST_FIRST = (
    "tests/util/test_kernel_builds.py",  # 180: real compiler runs
    "tests/lab/test_sweep.py",  # 125
    "tests/audit/test_report.py",  # 120
    "tests/measure/test_monitor.py",  # 85
    "tests/test_cli.py",  # 75
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every hypothesis test ``property`` so ``-m property`` selects them all, and move the
    longest modules to the front (in order, each module's tests in their own order)."""
    for item in items:
        if is_hypothesis_test(getattr(item, "obj", None)):
            item.add_marker(pytest.mark.property)
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session", autouse=True)
def run_cache(tmp_path_factory) -> Path:
    """$ATTNSCALE_CACHE for this test run: one folder the xdist workers share (so the explorer's
    theory grids are computed once per run, not once per worker), new on every run (so no
    earlier run's values are read)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "attnscale-cache"
    folder.mkdir(exist_ok=True)
    os.environ["ATTNSCALE_CACHE"] = str(folder)
    return folder


@pytest.fixture
def one_thread():
    """Small ops on a busy machine are far faster single-threaded."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports the kernel says are free now (held open together, so no repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A real Ray cluster from ``ray start --head --block`` (2 CPUs) that belongs to the tests
    of one module (a start and stop take ~25 s, so a module's tests share one); yields its
    address ``127.0.0.1:port``. Skips when ray is not installed.

    Every port it listens on is a free one, it binds to loopback and keeps its session files
    in its own folder, and it is stopped by signalling its own process group: ``ray stop``
    would stop every Ray process on the machine, another test's or another checkout's with
    them, and two heads on Ray's default ports take each other's sessions (WrongClusterID)."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'attnscale[ray]')")
    ray_bin = Path(sys.executable).with_name("ray")
    names = ("port", "node-manager-port", "object-manager-port", "ray-client-server-port",
             "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
             "runtime-env-agent-port")
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    # Ray's unix sockets live under the temp dir and must stay under 107 characters
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    log = tmp_path_factory.mktemp("ray-head") / "head.log"
    cmd = [str(ray_bin), "start", "--head", "--block", "--num-cpus", "2",
           "--node-ip-address", "127.0.0.1", "--temp-dir", str(temp),
           "--disable-usage-stats", "--include-dashboard", "false"]
    cmd += [a for name, port in ports.items() for a in (f"--{name}", str(port))]
    with open(log, "w") as out:
        head = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in (said := log.read_text()):
            assert head.poll() is None, f"ray start exited {head.returncode}: {said[-2000:]}"
            assert time.monotonic() < deadline, f"ray start not up in 180 s: {said[-2000:]}"
            time.sleep(0.5)
        yield f"127.0.0.1:{ports['port']}"
    finally:
        _stop_group(head)
        shutil.rmtree(temp, ignore_errors=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (Ray's graceful stop), SIGKILL what is left after 5 s (the
    ``ray start --block`` leader itself can take 30 s to act on SIGTERM)."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; its children may not be yet
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


# gloo can abort a rank while it tears down (a C++ thread still joinable at exit), after the
# rank's work is done: seen twice in about 25 runs of the two-rank tests on a loaded machine
TEARDOWN_ABORT = "terminate called without an active exception"


@pytest.fixture
def torchrun():
    """``run(worker, out, *args, nproc=2, timeout=120)``: ``torchrun --standalone
    --nproc_per_node NPROC worker OUT *args`` with one thread a rank. Fails with the ranks'
    output unless it exits 0, or unless its one failure is gloo's teardown abort after every
    rank wrote OUT/rank{r}.json (the work was done; the test reads what they wrote)."""

    def run(worker: Path, out: Path, *args: str, nproc: int = 2, timeout: int = 120) -> None:
        exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run([exe, "--standalone", f"--nproc_per_node={nproc}", str(worker),
                               str(out), *args], env=env, capture_output=True, text=True,
                              timeout=timeout)
        output = done.stdout[-3000:] + done.stderr[-3000:]
        written = all((out / f"rank{r}.json").is_file() for r in range(nproc))
        assert done.returncode == 0 or (written and TEARDOWN_ABORT in output), output

    return run
