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


class RecordingPool:
    """A pool that trains nothing: it records the configs of the jobs it may claim (the ones
    ``on_start`` does not refuse), in order, and reports each as failed (so the store has an
    outcome for it)."""

    def __init__(self) -> None:
        self.order: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def run(self, jobs, on_start):
        from attnscale.lab.executors import Outcome

        for job in jobs:
            if on_start(job.id, "rec") is not False:
                self.order.append(job.config)
                yield Outcome(job.id, None, "recorded, not run")


@pytest.fixture
def recording_pool() -> type[RecordingPool]:
    """The :class:`RecordingPool` class (a fake executor for run_sweep)."""
    return RecordingPool
