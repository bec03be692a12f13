"""Sweeps: a TOML grid of training configs, run by a pool of workers into a SQLite store.

A sweep file has four parts, all optional (with no axes and no variants the grid is the one
point ``[base]``)::

    name = "mqar-lr"                 # a label stored with every run
    description = "..."

    [base]                           # any attnscale.lab.train.TrainConfig field
    task = "mqar"
    steps = 200

    [axes]                           # field -> list of values; the grid is their product
    lr = [1e-3, 1e-2]
    seed = [0, 1]

    [[variant]]                      # named sets of overrides, crossed with the axes
    name = "cosine-tau10"
    score = "cosine"
    tau = 10

Every grid point is resolved through ``TrainConfig`` (so defaults are part of it) and gets a
stable id: the first 16 hex digits of the sha256 of its resolved config as sorted-key JSON.
Unknown keys anywhere, an empty axis, an unknown score, a variant that sets an axis field, or
bad TOML raise ValueError with one line that says where.

Runs go through an executor (:class:`LocalExecutor`, a pool of processes with one torch thread
each, or :class:`RayExecutor`) and land in :class:`attnscale.lab.store.Store`. Rerunning a sweep
skips finished runs (done, diverged, and failed unless ``retry_failed``) and redoes runs left
queued or running by a sweep that was killed.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import json
import multiprocessing
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from attnscale.lab.store import FINISHED, Store

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

EXECUTORS = ("local", "ray")
ID_LENGTH = 16


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

    @model_validator(mode="after")
    def _known_fields(self) -> SweepSpec:
        _check_fields(self)
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
        raise ValueError(f"sweep config {str(path)!r} does not exist")
    return parse_spec(path.read_text(encoding="utf-8"), source=str(path))


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
    loc = ".".join(str(part) for part in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"


def train_fields() -> list[str]:
    """The field names of ``attnscale.lab.train.TrainConfig``."""
    from attnscale.lab.train import TrainConfig

    return list(TrainConfig.model_fields)


def _check_fields(spec: SweepSpec) -> None:
    fields = train_fields()
    tables = [("base", spec.base), ("axes", spec.axes)]
    tables += [(f"variant {v.name!r}", v.overrides) for v in spec.variant]
    for where, table in tables:
        for key in table:
            if key not in fields:
                hint = difflib.get_close_matches(key, fields, n=1)
                maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise ValueError(f"[{where}] unknown TrainConfig field {key!r}{maybe}")
    _check_scores(spec)
    _check_variants(spec)


def _check_scores(spec: SweepSpec) -> None:
    from attnscale.core.scores import SCORES

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
    from attnscale.lab.train import TrainConfig

    return TrainConfig(**overrides).model_dump(mode="json")


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


# ------------------------------------------------------------------------------ tasks


@dataclass(frozen=True)
class Task:
    """One run to execute: the grid point's id and resolved config."""

    id: str
    config: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """What came back for a task: the trainer's result dict, or an error text."""

    id: str
    result: dict[str, Any] | None = None
    error: str | None = None


def execute(task: Task) -> Outcome:
    """Train one config in this process; any exception becomes ``Outcome.error``."""
    try:
        from attnscale.lab.train import TrainConfig, run

        result = run(TrainConfig(**task.config)).to_dict()
        return Outcome(task.id, result=result)
    except Exception as e:
        return Outcome(task.id, error=format_error(e))


def format_error(e: BaseException) -> str:
    """``Type: message`` on the first line, then the traceback."""
    head = f"{type(e).__name__}: {e}".strip()
    return head + "\n\n" + "".join(traceback.format_exception(e)).rstrip()


class Executor(Protocol):
    """Runs tasks and yields their outcomes as they finish.

    ``on_start(task_id, worker)`` is called when a task is handed to a worker. A task that
    raises, or whose worker dies, yields an Outcome with ``error`` set; the others go on.
    """

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...

    def run(
        self, tasks: Sequence[Task], on_start: Callable[[str, str | None], None]
    ) -> Iterator[Outcome]: ...


# ------------------------------------------------------------------------------ local


# Imported once in the forkserver, so each worker starts warm; torch.optim imports
# torch._dynamo lazily on the first optimizer (seconds), which would otherwise land in the
# first run of every worker.
PRELOAD = ("torch", "torch._dynamo", "attnscale.lab.train", "attnscale.lab.sweep")


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _worker_main(conn: mpc.Connection) -> None:
    """A pool process: one torch thread; run tasks from ``conn`` until told to stop."""
    _preload()
    import torch

    torch.set_num_threads(1)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        outcome = execute(task)
        try:
            conn.send(outcome)
        except (BrokenPipeError, EOFError, OSError):
            return
        except Exception as e:  # e.g. a result that does not pickle
            conn.send(Outcome(task.id, error=format_error(e)))


def _exit_with_parent() -> None:
    """Stop an orphaned worker: a killed sweep must not leave training processes behind."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        parent.join()  # returns when the sweep process is gone
        os._exit(1)


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: mpc.Connection
    task: Task | None = None

    @property
    def label(self) -> str:
        return f"pid {self.process.pid}"


def _death_message(process: multiprocessing.process.BaseProcess) -> str:
    process.join(timeout=5)
    code = process.exitcode
    if code is not None and code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code}"
    return f"WorkerDied: the worker process (pid {process.pid}) {how} while running this config"


@dataclass
class LocalExecutor:
    """A pool of ``workers`` processes, one torch thread each.

    The default ``forkserver`` context imports torch and the trainer once (:data:`PRELOAD`)
    and forks every worker from that clean, single-threaded server; ``spawn`` also works.

    Each worker takes one task at a time over its own pipe, so the executor always knows which
    task a worker holds: if the process dies, that task fails with the exit status and a fresh
    worker replaces it.
    """

    workers: int = 1
    context: str = "forkserver"
    _pool: list[_Worker] = field(default_factory=list)

    def __enter__(self) -> LocalExecutor:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        self._ctx = multiprocessing.get_context(self.context)
        if self.context == "forkserver":
            self._ctx.set_forkserver_preload(list(PRELOAD))
        self._pool = [self._spawn() for _ in range(self.workers)]
        return self

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main, args=(child,), daemon=True, name="attnscale-worker"
        )
        process.start()
        child.close()
        return _Worker(process, parent)

    def __exit__(self, *exc: object) -> None:
        for w in self._pool:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        deadline = time.monotonic() + 5
        for w in self._pool:
            if w.task is not None:  # interrupted mid-task: do not wait for it
                w.process.terminate()
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
        self._pool = []

    def run(
        self, tasks: Sequence[Task], on_start: Callable[[str, str | None], None]
    ) -> Iterator[Outcome]:
        """Hand tasks to idle workers; yield outcomes as they come back."""
        queue = deque(tasks)
        while queue or any(w.task for w in self._pool):
            for i, w in enumerate(self._pool):
                if w.task is None and queue:
                    if not w.process.is_alive():  # died between tasks
                        w.conn.close()
                        w = self._pool[i] = self._spawn()
                    w.task = queue.popleft()
                    on_start(w.task.id, w.label)
                    w.conn.send(w.task)
            yield from self._collect()

    def _collect(self) -> Iterator[Outcome]:
        busy = [w for w in self._pool if w.task is not None]
        mpc.wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
        for i, w in enumerate(self._pool):
            if w.task is None:
                continue
            outcome = self._receive(w)
            if outcome is None and w.process.is_alive():
                continue
            if outcome is None:
                outcome = Outcome(w.task.id, error=_death_message(w.process))
                w.conn.close()
                self._pool[i] = self._spawn()
            else:
                w.task = None
            yield outcome

    @staticmethod
    def _receive(w: _Worker) -> Outcome | None:
        try:
            return w.conn.recv() if w.conn.poll() else None
        except (EOFError, OSError):
            return None


# ------------------------------------------------------------------------------ ray


def _ray_task(task: Task) -> Outcome:
    """The Ray remote body: one torch thread, then the same :func:`execute` as local."""
    import torch

    torch.set_num_threads(1)
    return execute(task)


@dataclass
class RayExecutor:
    """Runs tasks as Ray tasks (1 CPU each, no retries), at most ``workers`` at a time.

    With no ``address`` it starts a local Ray instance with ``num_cpus = workers`` and shuts it
    down afterwards; with an address (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``) it
    joins that cluster.
    """

    workers: int = 1
    address: str | None = None

    def __enter__(self) -> RayExecutor:
        self._set_env = _use_ray_token() if self.address is not None else False
        try:
            import ray
        except ImportError:
            raise ValueError("the ray executor needs ray: pip install 'attnscale[ray]'") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self.address is None:  # "local" always starts a new instance
                kwargs["num_cpus"] = self.workers
            ray.init(address=self.address or "local", **kwargs)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._ray.shutdown()
        if self._set_env:  # leave the environment as we found it
            os.environ.pop("RAY_AUTH_MODE", None)

    def run(
        self, tasks: Sequence[Task], on_start: Callable[[str, str | None], None]
    ) -> Iterator[Outcome]:
        """Keep ``workers`` tasks in flight; yield outcomes as they finish."""
        queue = deque(tasks)
        flying: dict[Any, Task] = {}
        while queue or flying:
            while queue and len(flying) < self.workers:
                task = queue.popleft()
                on_start(task.id, "ray")
                flying[self._remote.remote(task)] = task
            ready, _ = self._ray.wait(list(flying), num_returns=1)
            for ref in ready:
                yield self._get(ref, flying.pop(ref))

    def _get(self, ref: Any, task: Task) -> Outcome:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayError as e:
            return Outcome(task.id, error=format_error(e))


def _use_ray_token() -> bool:
    """Let a client present the cluster's auth token.

    Since Ray 2.59, ``ray start --head`` turns token authentication on when a token file exists
    (``~/.ray/auth_token``, or ``RAY_AUTH_TOKEN_PATH``), but ``ray.init(address=...)`` only sends
    the token when ``RAY_AUTH_MODE=token`` is set (ray-project/ray#64755): without it the join
    fails with InvalidAuthToken. Set it (before ray.init reads it) when a token exists and the
    user chose nothing; returns whether it was set.
    """
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if "RAY_AUTH_MODE" in os.environ or not (token.exists() or "RAY_AUTH_TOKEN" in os.environ):
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    return True


def make_executor(kind: str = "local", workers: int = 1, address: str | None = None) -> Executor:
    """``local`` (default) or ``ray``; ``address`` only applies to ray."""
    if kind not in EXECUTORS:
        raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {kind!r}")
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if kind == "ray":
        return RayExecutor(workers, address)
    if address is not None:
        raise ValueError("--address only applies to --executor ray")
    return LocalExecutor(workers)


# ------------------------------------------------------------------------------ runner


@dataclass
class Counts:
    """Progress of one sweep over its own grid points."""

    total: int
    done: int = 0
    diverged: int = 0
    failed: int = 0
    skipped: int = 0
    to_run: int = 0

    @property
    def finished(self) -> int:
        """Grid points with a final status (done, diverged or failed)."""
        return self.done + self.diverged + self.failed

    def add(self, status: str) -> None:
        """Count one more run with this final status."""
        setattr(self, status, getattr(self, status) + 1)


def plan(store: Store, points: Sequence[Point], sweep: str | None, retry_failed: bool):
    """Insert new points as queued; requeue interrupted (and, if asked, failed) runs.

    Returns the tasks to run and the counts of runs already finished.
    """
    store.add_runs(
        [{"id": p.id, "config": p.config, "variant": p.variant} for p in points], sweep=sweep
    )
    status = {r["id"]: r["status"] for r in store.runs()}
    counts = Counts(total=len(points))
    todo = []
    for p in points:
        s = status[p.id]
        if s in FINISHED or (s == "failed" and not retry_failed):
            counts.add(s)
            counts.skipped += 1
        else:
            todo.append(Task(p.id, p.config))
    store.requeue(t.id for t in todo)
    counts.to_run = len(todo)
    return todo, counts


def run_sweep(
    spec: SweepSpec,
    db: str | Path,
    *,
    workers: int = 1,
    executor: str = "local",
    address: str | None = None,
    retry_failed: bool = False,
    source: str = "<sweep>",
    progress: Callable[[Counts], None] | None = None,
) -> Counts:
    """Run every grid point of ``spec`` not yet finished in ``db``; return the counts.

    ``progress(counts)`` is called once before the first run and after every run.
    """
    points = expand(spec, source)
    pool = make_executor(executor, workers, address)
    with Store(db) as store:
        todo, counts = plan(store, points, spec.name, retry_failed)
        if progress:
            progress(counts)
        if not todo:
            return counts
        with pool:
            for outcome in pool.run(todo, store.mark_running):
                record_outcome(store, outcome, counts)
                if progress:
                    progress(counts)
    return counts


def record_outcome(store: Store, outcome: Outcome, counts: Counts) -> None:
    """Store one outcome (result or error) and count its final status."""
    if outcome.result is not None:
        store.finish(outcome.id, outcome.result)
        status = outcome.result.get("status")
        counts.add(status if status in FINISHED else "failed")
    else:
        store.fail(outcome.id, outcome.error or "unknown error")
        counts.add("failed")
