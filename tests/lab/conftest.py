"""Fixtures shared by the lab's tests."""

from __future__ import annotations

import pytest

from attnscale.lab.store import Store


@pytest.fixture
def store(tmp_path):
    """A results store with three queued runs of sweep "t" (two scores, one variant)."""
    with Store(tmp_path / "runs.db") as s:
        s.add_runs(
            [
                {"id": "a", "config": {"score": "dot", "lr": 0.001, "seed": 0}},
                {"id": "b", "config": {"score": "dot", "lr": 0.01, "seed": 0}},
                {"id": "c", "config": {"score": "cosine", "lr": 0.01, "seed": 1}, "variant": "v"},
            ],
            sweep="t",
        )
        yield s
