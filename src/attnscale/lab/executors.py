"""Executors: run queued sweep jobs in a pool of local processes or on Ray, one torch thread each.

A :class:`Job` is one grid point to train (its id and resolved
:class:`attnscale.lab.train.TrainConfig` as a dict); an executor yields one :class:`Outcome` per
job as it finishes, with the trainer's result or the error text. A job that raises, or whose
worker process dies, fails alone: the other jobs go on.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from attnscale.integrations.alarm import AttentionHealthWarning
from attnscale.lab.train import TrainConfig, run

EXECUTORS = ("local", "ray")


# ------------------------------------------------------------------------------ jobs


@dataclass(frozen=True)
class Job:
    """One queued run: the grid point's id and its resolved TrainConfig as a dict."""

    id: str
    config: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """What came back for a job: the trainer's result dict, or an error text."""

    id: str
    result: dict[str, Any] | None = None
    error: str | None = None


def execute(job: Job) -> Outcome:
    """Train one config in this process; any exception becomes ``Outcome.error``. A sweep's
    runs keep their alarm in the record (``alarm``) without warning: a sweep over learning
    rates is meant to reach the ones that break, and a warning per run buried the progress."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AttentionHealthWarning)
            result = run(TrainConfig(**job.config)).to_dict()
        return Outcome(job.id, result=result)
    except Exception as e:
        return Outcome(job.id, error=format_error(e))


def format_error(e: BaseException) -> str:
    """``Type: message`` on the first line, then the traceback."""
    head = f"{type(e).__name__}: {e}".strip()
    return head + "\n\n" + "".join(traceback.format_exception(e)).rstrip()


class Executor(Protocol):
    """Runs jobs and yields their outcomes as they finish.

    ``on_start(job_id, worker)`` is called before a job is handed to a worker; when it returns
    False (another sweep driver holds the run: :func:`attnscale.lab.leases.claim`) the job is
    skipped and yields nothing. A job that raises, or whose worker dies, yields an Outcome with
    ``error`` set; the others go on.
    """

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...

    def run(
        self, jobs: Sequence[Job], on_start: Callable[[str, str | None], bool | None]
    ) -> Iterator[Outcome]: ...


# ------------------------------------------------------------------------------ local


# Imported once in the forkserver, so each worker starts warm; torch.optim imports
# torch._dynamo lazily on the first optimizer (seconds), which would otherwise land in the
# first run of every worker.
PRELOAD = ("torch", "torch._dynamo", "attnscale.lab.train", "attnscale.lab.executors")


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _worker_main(conn: mpc.Connection) -> None:
    """A pool process: one torch thread; run jobs from ``conn`` until told to stop."""
    _preload()
    torch.set_num_threads(1)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        outcome = execute(job)
        try:
            conn.send(outcome)
        except (BrokenPipeError, EOFError, OSError):
            return
        except Exception as e:  # e.g. a result that does not pickle
            conn.send(Outcome(job.id, error=format_error(e)))


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
    job: Job | None = None

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

    Each worker takes one job at a time over its own pipe, so the executor always knows which
    job a worker holds: if the process dies, that job fails with the exit status and a fresh
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
            if w.job is not None:  # interrupted mid-job: do not wait for it
                w.process.terminate()
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
        self._pool = []

    def run(
        self, jobs: Sequence[Job], on_start: Callable[[str, str | None], bool | None]
    ) -> Iterator[Outcome]:
        """Hand jobs to idle workers; yield outcomes as they come back. A freed worker gets
        its next job before its outcome is yielded, so it need not wait while the caller
        stores the result (no gain was measurable in a standard report: CHANGELOG)."""
        queue = deque(jobs)
        self._dispatch(queue, on_start)
        while any(w.job for w in self._pool):
            for outcome in self._collect():
                try:
                    self._dispatch(queue, on_start)
                except BaseException:  # a claim that failed must not lose a finished run
                    yield outcome
                    raise
                yield outcome

    def _dispatch(self, queue: deque[Job],
                  on_start: Callable[[str, str | None], bool | None]) -> None:
        """Give every idle worker a job from ``queue`` (replacing a worker that died)."""
        for i, w in enumerate(self._pool):
            while w.job is None and queue:
                if not w.process.is_alive():  # died between jobs
                    w.conn.close()
                    w = self._pool[i] = self._spawn()
                job = queue.popleft()
                if on_start(job.id, w.label) is not False:  # False: held elsewhere
                    w.job = job
                    w.conn.send(job)

    def _collect(self) -> Iterator[Outcome]:
        busy = [w for w in self._pool if w.job is not None]
        mpc.wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
        for i, w in enumerate(self._pool):
            if w.job is None:
                continue
            outcome = self._receive(w)
            if outcome is None and w.process.is_alive():
                continue
            if outcome is None:
                outcome = Outcome(w.job.id, error=_death_message(w.process))
                w.conn.close()
                self._pool[i] = self._spawn()
            else:
                w.job = None
            yield outcome

    @staticmethod
    def _receive(w: _Worker) -> Outcome | None:
        try:
            return w.conn.recv() if w.conn.poll() else None
        except (EOFError, OSError):
            return None


# ------------------------------------------------------------------------------ ray


def _ray_job(job: Job) -> Outcome:
    """The Ray remote body: one torch thread, then the same :func:`execute` as local."""
    torch.set_num_threads(1)
    return execute(job)


@dataclass
class RayExecutor:
    """Runs jobs as Ray tasks (1 CPU each, no retries), at most ``workers`` at a time.

    With no ``address`` it starts a local Ray instance with ``num_cpus = workers`` and shuts it
    down afterwards; with an address (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``) it
    joins that cluster.
    """

    workers: int = 1
    address: str | None = None

    def __enter__(self) -> RayExecutor:
        self._set_env = _use_ray_token() if self.address is not None else False
        try:
            import ray  # optional and heavy (seconds to import): only when asked for
        except ImportError:
            raise ValueError("the ray executor needs ray: pip install 'attnscale[ray]'") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self.address is None:  # "local" always starts a new instance
                kwargs["num_cpus"] = self.workers
            ray.init(address=self.address or "local", **kwargs)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_ray_job)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._ray.shutdown()
        if self._set_env:  # leave the environment as we found it
            os.environ.pop("RAY_AUTH_MODE", None)

    def run(
        self, jobs: Sequence[Job], on_start: Callable[[str, str | None], bool | None]
    ) -> Iterator[Outcome]:
        """Keep ``workers`` jobs in flight; yield outcomes as they finish."""
        queue = deque(jobs)
        flying: dict[Any, Job] = {}
        while queue or flying:
            while queue and len(flying) < self.workers:
                job = queue.popleft()
                if on_start(job.id, "ray") is not False:  # False: held elsewhere
                    flying[self._remote.remote(job)] = job
            if not flying:
                break
            ready, _ = self._ray.wait(list(flying), num_returns=1)
            for ref in ready:
                yield self._get(ref, flying.pop(ref))

    def _get(self, ref: Any, job: Job) -> Outcome:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayError as e:
            return Outcome(job.id, error=format_error(e))


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


class Kept:
    """An executor opened on first use and kept open across sweeps until :meth:`close`.

    A report runs dozens of sweeps; opening a pool for each one forks (local) or starts (Ray)
    its workers again, and each worker imports torch and the trainer again (seconds per sweep).
    ``with kept:`` opens the inner executor the first time only, and leaves it open.
    """

    def __init__(self, inner: Executor) -> None:
        self.inner, self.is_open = inner, False

    def __enter__(self) -> Kept:
        if not self.is_open:
            self.inner.__enter__()
            self.is_open = True
        return self

    def __exit__(self, *exc: object) -> None:
        if any(exc):  # an interrupted sweep leaves jobs in flight: do not reuse its workers
            self.close()

    def run(
        self, jobs: Sequence[Job], on_start: Callable[[str, str | None], bool | None]
    ) -> Iterator[Outcome]:
        return self.inner.run(jobs, on_start)

    def close(self) -> None:
        """Close the inner executor if it was opened."""
        if self.is_open:
            self.is_open = False
            self.inner.__exit__(None, None, None)


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


