"""Running a study's sweeps into the results database, tuning phase first.

A ``grid`` study is one sweep. A ``tuned`` study is (1) the tuning seeds over the LR grid,
(2) for every cell and arm whose best LR sits at an edge, one more LR beyond that edge
(× or ÷ the study's ``lr_step``), repeated up to ``extend`` times, and (3) the reported seeds at
each cell and arm's chosen LR and at its runner-up unless the tuning separates the two
(:func:`attnscale.audit.selection.reported_lrs`). Every run has a stable id
(its config's hash), so a killed report resumes where it stopped and a rerun runs nothing.
The report runs each phase of every study as one batch (:meth:`StudyRunner.run_all`): with a
phase per study in turn, workers idled at each of some 25 phase ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnscale.audit.selection import Cell, cells, in_cell, reported_lrs, tuned_choice
from attnscale.audit.studies import Study
from attnscale.lab.executors import Kept, make_executor
from attnscale.lab.records import Run
from attnscale.lab.store import FINISHED, Store
from attnscale.lab.sweep import SweepSpec, is_current, run_sweep

Progress = Callable[[str, Any], None]


def study_runs(store: Store, study: Study | str) -> list[Run]:
    """The finished runs of a study that belong to the current code's grid, with their
    histories (see :func:`attnscale.lab.sweep.is_current`), as typed records. Given a
    :class:`Study`, only the runs made with its base settings: a database shared by two presets
    (say ``--quick`` then the standard report) holds both, under the same study names and
    seeds."""
    name = study if isinstance(study, str) else study.name
    runs = [Run.from_row(r) for r in store.runs(where={"sweep": name}, history=True,
                                                 status=FINISHED) if is_current(r)]
    if isinstance(study, Study):
        runs = [r for r in runs if all(r.value(k) == v for k, v in study.base.items())]
    return runs


def grid_spec(study: Study, seeds: tuple[int, ...], lrs: tuple[float, ...],
              cell: Cell = (), arms: tuple[str, ...] | None = None) -> SweepSpec:
    """The sweep of ``arms`` (default: all) at ``cell`` (default: every cell) × ``lrs`` ×
    ``seeds``."""
    axes: dict[str, list[Any]] = {} if cell else {k: list(v) for k, v in study.cells.items()}
    axes.update(lr=list(lrs), seed=list(seeds))
    return SweepSpec(name=study.name, base={**study.base, **dict(cell)}, axes=axes,
                     variant=[study.variant(a) for a in (arms or study.arms)])


class StudyRunner:
    """Runs studies into ``db`` through one executor setting; ``progress(name, counts)``.

    Used as a context manager, its sweeps share one pool of workers, opened by the first sweep
    with something to run (a rerun with nothing to do starts no worker) and closed on exit."""

    def __init__(self, db: Path, executor: str, workers: int, address: str | None,
                 progress: Progress | None = None) -> None:
        self.db, self.executor, self.workers, self.address = db, executor, workers, address
        self.progress = progress
        self.pool: Kept | None = None

    def __enter__(self) -> StudyRunner:
        self.pool = Kept(make_executor(self.executor, self.workers, self.address))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def sweep(self, spec: SweepSpec | list[SweepSpec], label: str) -> Any:
        """Run (or resume) one sweep, or several grids (of one study or several) as one
        batch."""
        report = (lambda c: self.progress(label, c)) if self.progress else None
        return run_sweep(spec, self.db, workers=self.workers, executor=self.executor,
                         address=self.address, source=f"report:{label}", progress=report,
                         pool=self.pool)

    def run(self, study: Study) -> None:
        """Every run of ``study``: the grid, or tuning, extension and the reported seeds (a
        study planned with no seeds, as the deep studies are outside ``--deep``: nothing)."""
        self.run_all([study], f"study {study.name}")

    def run_all(self, studies: Iterable[Study], label: str = "studies") -> None:
        """Every run of ``studies`` in three phases, each one batch across the studies, so no
        worker waits at the end of one study's phase for the next study: (1) the grids of
        ``grid`` studies and the tuning grids of ``tuned`` ones, (2) rounds of extensions beyond
        an edge, (3) the reported seeds at each chosen LR and runner-up. A study planned with no
        seeds (the deep studies outside ``--deep``) runs nothing."""
        plan = [s for s in studies if s.seeds]
        tuned = [s for s in plan if s.lr_choice == "tuned"]
        first = [grid_spec(s, s.seeds if s.lr_choice == "grid" else s.tune_seeds, s.lrs)
                 for s in plan]
        if first:
            self.sweep(first, f"{label} (grids and tuning)" if tuned else label)
        for _ in range(max((s.extend for s in tuned if len(s.lrs) > 1), default=0)):
            # each study's extensions count what it already ran, so a study at its limit
            # adds nothing while another extends again
            extra = [grid_spec(s, s.tune_seeds, (lr,), cell, (arm,)) for s in tuned
                     if len(s.lrs) > 1
                     for (cell, arm), lr in self.extensions(s, self.tuning(s)).items()]
            if not extra:
                break
            self.sweep(extra, f"{label} (extending)")
        reported = [spec for s in tuned for spec in self.reported(s)]
        if reported:
            self.sweep(reported, f"{label} (reported seeds)")

    def reported(self, study: Study) -> list[SweepSpec]:
        """The reported seeds' grids of a tuned ``study``: each cell and arm at the LRs
        :func:`attnscale.audit.selection.reported_lrs` reads from its tuning runs."""
        with Store(self.db) as store:
            runs = study_runs(store, study)
        return [grid_spec(study, study.seeds, (lr,), cell, (arm,))
                for cell in cells(study) for arm in study.arms
                for lr in reported_lrs(study, runs, cell, arm)]

    def tuning(self, study: Study) -> dict[tuple[Cell, str], tuple[float, bool, dict]]:
        """(cell, arm) -> :func:`attnscale.audit.selection.tuned_choice` on the tuning runs."""
        with Store(self.db) as store:
            runs = [r for r in study_runs(store, study) if r.seed in study.tune_seeds]
        out = {}
        for cell in cells(study):
            for arm in study.arms:
                mine = [r for r in runs if in_cell(r, cell, arm)]
                try:
                    out[cell, arm] = tuned_choice(mine)
                except ValueError:  # nothing measured (no runs, or none with a finite loss)
                    continue
        return out

    def extensions(self, study: Study, tuning: dict[tuple[Cell, str], tuple[float, bool, dict]]
                   ) -> dict[tuple[Cell, str], float]:
        """(cell, arm) -> the LR one step beyond its edge, for each arm whose best LR is at an
        edge of what it has run and has fewer than ``study.extend`` LRs past the study's grid
        on that side (``tuning``: :meth:`tuning` of the study). Counting what is already there
        keeps a rerun from extending again: the database, not the loop, says how far a grid
        went."""
        out = {}
        for key, (lr, edge, curve) in tuning.items():
            if not edge:
                continue
            low = lr == min(curve)
            beyond = [x for x in curve if (x < min(study.lrs) if low else x > max(study.lrs))]
            if len(beyond) < study.extend:
                out[key] = lr / study.lr_step if low else lr * study.lr_step
        return out
