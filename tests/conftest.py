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
import subprocess
import sys
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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every hypothesis test ``property`` so ``-m property`` selects them all, and give
    each test without an ``xdist_group`` its module's: under ``pytest -n N --dist loadgroup``
    (make test) a module's tests share one worker and its module-scoped fixtures are built
    once, while tests that share a machine-wide resource (one Ray cluster) name one group."""
    for item in items:
        if is_hypothesis_test(getattr(item, "obj", None)):
            item.add_marker(pytest.mark.property)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture
def one_thread():
    """Small ops on a busy machine are far faster single-threaded."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def ray_head():
    """A real local Ray cluster from `ray start --head` (2 CPUs), stopped afterwards; yields its
    address ``127.0.0.1:port``. Skips when ray is not installed. Its tests are in the
    ``xdist_group("ray")``: one cluster on the machine at a time (``ray stop`` stops them all)."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'attnscale[ray]')")
    ray_bin = Path(sys.executable).with_name("ray")
    port = "6391"
    start = [str(ray_bin), "start", "--head", "--port", port, "--num-cpus", "2",
             "--disable-usage-stats", "--include-dashboard", "false"]
    started = subprocess.run(start, capture_output=True, text=True, timeout=180)
    if started.returncode != 0 and "already running" in started.stderr:
        # the cluster of the test before is still stopping: stop it for good, then start again
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, timeout=120)
        started = subprocess.run(start, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, timeout=120)
