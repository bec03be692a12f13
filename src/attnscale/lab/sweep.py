"""Sweeps: a TOML grid of training configs, run by a pool of workers into a SQLite store.

A sweep file has four parts, all optional (with no axes and no variants the grid is the one
point ``[base]``)::

    name = "mqar-lr"                 # a label stored with every run
    description = "..."

    [base]                           # any attnscale.lab.config.TrainConfig field
    task = "mqar"
    optim.steps = 200                # by section path, or flat: steps = 200

    [axes]                           # field -> list of values; the grid is their product
    lr = [1e-3, 1e-2]
    seed = [0, 1]

    [[variant]]                      # named sets of overrides, crossed with the axes
    name = "cosine-tau10"
    score = "cosine"
    tau = 10

A field is named by its flat name (``steps``) or its section path (``optim.steps``, a TOML
dotted key; quoted as an axis: ``"optim.steps" = [...]``); both are read as the flat name, so
the spelling never changes a run. Every grid point is resolved through ``TrainConfig`` (so
defaults are part of it) and gets a stable id: the first 16 hex digits of the sha256 of its
resolved config as sorted-key JSON.
Unknown keys anywhere, an empty axis, an unknown score, a variant that sets an axis field, or
bad TOML raise ValueError with one line that says where.

Jobs go through an executor (:mod:`attnscale.lab.executors`: a pool of local processes with
one torch thread each, or Ray) and land in :class:`attnscale.lab.store.Store`. Rerunning a sweep
skips finished runs (done, diverged, and failed unless ``retry_failed``) and redoes runs left
queued or running by a sweep that was killed. Several drivers may run one sweep on one
database at once: each claims a run before training it, under a lease
(:mod:`attnscale.lab.leases`), so no run is trained twice and a killed driver's runs are taken
over when its leases lapse.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from attnscale.core.scores import SCORES
from attnscale.lab import leases
from attnscale.lab.executors import EXECUTORS, Executor, Job, Outcome, make_executor
from attnscale.lab.sections import error_path, flatten
from attnscale.lab.store import FINISHED, Store
from attnscale.lab.train import TrainConfig
from attnscale.util.validate import check_float

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

__all__ = [
    "EXECUTORS",
    "Counts",
    "Job",
    "Point",
    "SweepSpec",
    "Variant",
    "config_id",
    "expand",
    "load_spec",
    "make_executor",
    "parse_spec",
    "plan",
    "record_outcome",
    "resolve",
    "run_sweep",
]

ID_LENGTH = 16
PATIENCE_S = 1800.0  # waiting for other drivers' runs, with no run finishing, gives up after


# ------------------------------------------------------------------------------ config


class Variant(BaseModel):
    """A named set of TrainConfig overrides (``[[variant]]`` in TOML)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)

    @property
    def overrides(self) -> dict[str, Any]:
        """The TrainConfig fields this variant sets."""
        return dict(self.model_extra or {})


class SweepSpec(BaseModel):
    """A parsed sweep file. Use :func:`load_spec` / :func:`parse_spec` to get one."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    variant: list[Variant] = Field(default_factory=list)

    @field_validator("axes")
    @classmethod
    def _axes_not_empty(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in axes.items():
            if not values:
                raise ValueError(f"axis {key!r} is empty; give at least one value")
        return axes

    @model_validator(mode="before")
    @classmethod
    def _flat_names(cls, data: Any) -> Any:
        """Every table's section paths as flat names; unknown fields are errors."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in ("base", "axes"):
            if isinstance(data.get(key), dict):
                data[key] = flatten(data[key], f"[{key}] ")
        if isinstance(data.get("variant"), list):
            data["variant"] = [
                {**{k: x for k, x in v.items() if k == "name"},
                 **flatten({k: x for k, x in v.items() if k != "name"},
                           f"[variant {v.get('name')!r}] ")}
                if isinstance(v, dict) else v for v in data["variant"]]
        return data

    @model_validator(mode="after")
    def _known_values(self) -> SweepSpec:
        _check_scores(self)
        _check_variants(self)
        return self


@dataclass(frozen=True)
class Point:
    """One grid point: its id, its resolved TrainConfig as a dict, and its variant name."""

    id: str
    config: dict[str, Any]
    variant: str | None = None


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep TOML file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ValueError(f"sweep config {str(path)!r} {what}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"sweep config {str(path)!r} is not UTF-8 text") from None
    return parse_spec(text, source=str(path))


def parse_spec(text: str, source: str = "<sweep>") -> SweepSpec:
    """Validate a sweep given as TOML text; every problem is one ValueError line."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source}: bad TOML: {e}") from None
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise ValueError(f"{source}: {_first_error(e)}") from None


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = error_path(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"


def _check_scores(spec: SweepSpec) -> None:
    values = [("base", spec.base.get("score"))]
    values += [("axes", s) for s in spec.axes.get("score", [])]
    values += [(f"variant {v.name!r}", v.overrides.get("score")) for v in spec.variant]
    for where, score in values:
        if score is not None and score not in SCORES:
            raise ValueError(f"[{where}] unknown score {score!r}; valid: {sorted(SCORES)}")


def _check_variants(spec: SweepSpec) -> None:
    names = [v.name for v in spec.variant]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"variant names must be unique; repeated: {dup}")
    for v in spec.variant:
        both = sorted(set(v.overrides) & set(spec.axes))
        if both:
            raise ValueError(
                f"variant {v.name!r} sets {both}, which are also axes; set them in one place"
            )


def config_id(config: dict[str, Any]) -> str:
    """The stable id of a resolved config: sha256 of its sorted-key JSON, first 16 hex digits."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:ID_LENGTH]


def resolve(overrides: dict[str, Any]) -> dict[str, Any]:
    """A full TrainConfig dict (defaults included) from a set of field values."""
    return TrainConfig(**overrides).flat()


def is_current(run: dict[str, Any]) -> bool:
    """Whether a stored run is what its config means under this code: resolving the stored
    config again gives the run's id. A run stored before a change to TrainConfig's fields or
    defaults fails this, so analyses never mix it with runs of the current grid."""
    try:
        return config_id(resolve(run["config"])) == run["id"]
    except (ValueError, TypeError, KeyError):
        return False


def expand(spec: SweepSpec, source: str = "<sweep>") -> list[Point]:
    """The grid: variants × product of the axes, resolved, deduplicated by id, in order."""
    variants: list[Variant | None] = list(spec.variant) or [None]
    keys = list(spec.axes)
    points: dict[str, Point] = {}
    for variant in variants:
        for values in itertools.product(*(spec.axes[k] for k in keys)):
            overrides = dict(spec.base)
            if variant is not None:
                overrides.update(variant.overrides)
            overrides.update(zip(keys, values, strict=True))
            point = _make_point(overrides, variant, source)
            points.setdefault(point.id, point)
    return list(points.values())


def _make_point(overrides: dict[str, Any], variant: Variant | None, source: str) -> Point:
    try:
        config = resolve(overrides)
    except ValidationError as e:
        where = f"variant {variant.name!r}, " if variant else ""
        raise ValueError(f"{source}: {where}grid point {overrides}: {_first_error(e)}") from None
    except (ValueError, TypeError) as e:
        raise ValueError(f"{source}: grid point {overrides}: {e}") from None
    return Point(config_id(config), config, variant.name if variant else None)


# ------------------------------------------------------------------------------ runner


@dataclass
class Counts:
    """Progress of one sweep over its own grid points: final statuses (``skipped`` of them
    finished before this sweep started or by another driver), ``to_run`` when it started,
    ``waiting``: runs another live driver holds, which this one waits for (still held when it
    gave up waiting), and ``lost``: runs this driver trained but whose lease another driver
    had taken over (result not stored: a driver stalled for longer than its lease)."""

    total: int
    done: int = 0
    diverged: int = 0
    failed: int = 0
    skipped: int = 0
    to_run: int = 0
    waiting: int = 0
    lost: int = 0

    @property
    def finished(self) -> int:
        """Grid points with a final status (done, diverged or failed)."""
        return self.done + self.diverged + self.failed

    def add(self, status: str) -> None:
        """Count one more run with this final status."""
        setattr(self, status, getattr(self, status) + 1)


def plan(store: Store, points: Sequence[Point], sweep: str | Mapping[str, str] | None,
         retry_failed: bool):
    """Insert new points as queued under ``sweep`` (a name, or run id -> name); requeue
    interrupted (and, if asked, failed) runs, except one another driver holds under a live lease
    (still a job: the driver waits for it, and takes it over if the lease lapses). Returns the
    jobs to run and the counts of runs already finished."""
    names = sweep if isinstance(sweep, Mapping) else dict.fromkeys((p.id for p in points), sweep)
    for name in set(names.values()):
        store.add_runs([{"id": p.id, "config": p.config, "variant": p.variant}
                        for p in points if names[p.id] == name], sweep=name)
    leases.expire_dead(store)  # a killed driver of this machine holds nothing
    status = {r["id"]: r["status"] for r in store.runs()}
    counts = Counts(total=len(points))
    todo = []
    for p in points:
        s = status[p.id]
        if s in FINISHED or (s == "failed" and not retry_failed):
            counts.add(s)
            counts.skipped += 1
        else:
            todo.append(Job(p.id, p.config))
    # as the write happens: a run another driver finished or holds meanwhile is left alone
    redo = ("queued", "running", "failed") if retry_failed else ("queued", "running")
    store.requeue((job.id for job in todo), statuses=redo)
    counts.to_run = len(todo)
    return todo, counts


def run_sweep(
    spec: SweepSpec | Sequence[SweepSpec],
    db: str | Path,
    *,
    workers: int = 1,
    executor: str = "local",
    address: str | None = None,
    retry_failed: bool = False,
    source: str = "<sweep>",
    progress: Callable[[Counts], None] | None = None,
    pool: Executor | None = None,
    lease_s: float = leases.LEASE_S,
    patience_s: float = PATIENCE_S,
) -> Counts:
    """Run every grid point of ``spec`` not yet finished in ``db``; return the counts.

    ``spec`` may be several grids (say, each arm at its own chosen LR, or every study's tuning
    grid): their points run as one batch, so no worker waits at the end of one grid for the next
    to start. Each run is stored under its grid's sweep name, the first grid's where two grids
    hold the same config.
    Jobs start longest first (:func:`cost_hint`), so the batch's tail is short runs.
    ``progress(counts)`` is called once before the first run, after every run and after
    every round of claims (:func:`_drive`). ``pool``, an
    executor shared by several sweeps (:class:`attnscale.lab.executors.Kept`), replaces the one
    ``executor``, ``workers`` and ``address`` would make. ``lease_s`` (≥ 1): how long a claim
    lasts unrenewed (:mod:`attnscale.lab.leases`): another driver takes over a killed one's
    runs that long after it died (at once if it ran on this machine). Runs that other live
    drivers hold are waited for, ``progress`` being called at least every 5 s meanwhile, until
    ``patience_s`` pass with no run of the grid finishing; the counts then say how many are
    still ``waiting``.
    """
    lease_s = check_float("lease_s", lease_s, low=1.0, low_inclusive=True)
    patience_s = check_float("patience_s", patience_s, low=0.0)
    specs = [spec] if isinstance(spec, SweepSpec) else list(spec)
    if not specs:
        raise ValueError("spec: give at least one sweep")
    points: dict[str, Point] = {}
    names = {}  # run id -> the sweep name it is stored under: its first grid's
    for name, p in ((s.name, p) for s in specs for p in expand(s, source)):
        names.setdefault(p.id, name), points.setdefault(p.id, p)
    pool = pool if pool is not None else make_executor(executor, workers, address)
    with Store(db) as store:
        todo, counts = plan(store, list(points.values()), names, retry_failed)
        if progress:
            progress(counts)
        if not todo:
            return counts
        todo.sort(key=lambda job: -cost_hint(job.config))  # stable: grid order among equals
        owner = leases.new_owner()
        # pool innermost: on Ctrl-C its workers stop before the claims are handed back
        with leases.holding(db, store, owner, lease_s) as heartbeat, pool:
            _drive(store, pool, todo, counts, heartbeat, patience_s, progress)
    return counts


def _drive(store: Store, pool: Executor, todo: list[Job], counts: Counts,
           heartbeat: leases.Heartbeat, patience_s: float,
           progress: Callable[[Counts], None] | None) -> None:
    """Rounds until every job is finished: claim and run what is free, then count what other
    drivers finished and wait (saying so through ``progress`` and ``counts.waiting``) for what
    they hold, giving up after ``patience_s`` without any run of the grid finishing."""
    owner, lease_s = heartbeat.owner, heartbeat.lease_s
    claimed: list[str] = []

    def claim(run_id: str, worker: str | None) -> bool:
        heartbeat.check()  # leases no longer renewed: stop before they lapse under us
        won = leases.claim(store, run_id, owner, worker, lease_s)
        if won:
            claimed.append(run_id)
        return won

    pending, mine, lost = list(todo), set(), set()
    last_progress = time.monotonic()
    while pending:
        claimed.clear()
        for outcome in pool.run(pending, claim):
            if record_outcome(store, outcome, counts, owner):
                mine.add(outcome.id)
            else:
                lost.add(outcome.id)
            counts.lost = len(lost - mine)
            if progress:
                progress(counts)
        state = leases.held(store, [job.id for job in pending], owner)
        for run_id, status in state.finished.items():
            if run_id not in mine:  # finished by another driver
                counts.add(status)
                counts.skipped += 1
        if state.finished or claimed:
            last_progress = time.monotonic()
        pending = [job for job in pending if job.id not in state.finished]
        counts.waiting = len(state.elsewhere)
        if progress:
            progress(counts)
        if pending and not claimed:  # nothing was free this round: wait, but not forever
            if time.monotonic() - last_progress > patience_s:
                return
            heartbeat.check()
            time.sleep(max(0.2, state.wait_s(cap=min(5.0, lease_s / 4))))


def cost_hint(config: dict[str, Any]) -> float:
    """A run's relative cost for longest-first scheduling: steps · batch · tokens · layers ·
    (d_model² + seq_len · d_model), the matmul and attention work of a step up to constants.
    Only the order of jobs uses it (Graham 1969's LPT rule), never a result."""
    def get(key: str, default: float) -> float:
        value = config.get(key)
        return float(value) if isinstance(value, int | float) else default
    d, n = get("d_model", 1.0), get("seq_len", 1.0)
    return (get("steps", 1.0) * get("batch_size", 1.0) * n * get("n_layers", 1.0)
            * (d * d + n * d))


def record_outcome(store: Store, outcome: Outcome, counts: Counts,
                   owner: str | None = None) -> bool:
    """Store one outcome (result or error) and count its final status; with ``owner``, only
    while that driver still holds the run's lease. Returns whether it was stored."""
    if outcome.result is not None:
        if not store.finish(outcome.id, outcome.result, owner):
            return False
        status = outcome.result.get("status")
        counts.add(status if status in FINISHED else "failed")
    else:
        if not store.fail(outcome.id, outcome.error or "unknown error", owner):
            return False
        counts.add("failed")
    return True
