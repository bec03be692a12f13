"""Progress of a long command, on stderr, that a person can see wherever stderr goes.

On a terminal: rich progress bars, one per task (a study of the report, a sweep, a training
run), with elapsed time and rich's estimate of the time left. Anywhere else (a file, a pipe, a
CI log), where rich draws nothing until the end: plain lines, at most one every ``every_s``
seconds (20) besides each task's first and last, e.g.::

    report: study text_lr 120/588 runs, 3m12s elapsed, ~9m left

The estimate (:class:`Pace`) is the time left at the task's own rate since its first report:
work counted done at the first report (runs an earlier, interrupted sweep finished) is not
taken for this run's speed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rich.console import Console

__all__ = ["EVERY_S", "Pace", "Progress", "duration"]

EVERY_S = 20.0  # plain lines: at most one this often (besides each task's first and last)


def duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``1h05m``: elapsed time, to the second below an hour."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def rough(seconds: float) -> str:
    """An estimate rounded up to what it can claim: ``~40s``, ``~9m``, ``~1h20m``."""
    if seconds < 60:
        return f"~{max(1, math.ceil(seconds / 10) * 10)}s"
    if seconds < 3600:
        return f"~{math.ceil(seconds / 60)}m"
    minutes = math.ceil(seconds / 60)
    return f"~{minutes // 60}h{minutes % 60:02d}m"


@dataclass
class Pace:
    """One task's pace: when it started and how much was done then (its first report)."""

    started: float
    done_at_start: int

    def left(self, now: float, done: int, total: int | None) -> float | None:
        """Seconds left at the rate since the start; None before any progress (or without a
        total), 0 when done."""
        if total is None:
            return None
        if done >= total:
            return 0.0
        gained, spent = done - self.done_at_start, now - self.started
        if gained <= 0 or spent <= 0:
            return None
        return (total - done) * spent / gained

    def line(self, now: float, done: int, total: int | None) -> str:
        """``3m12s elapsed, ~9m left`` (``estimating`` before any progress, ``done`` at the
        end)."""
        elapsed = f"{duration(now - self.started)} elapsed"
        if total is not None and done >= total:
            return f"{elapsed}, done"
        left = self.left(now, done, total)
        return f"{elapsed}, " + ("estimating" if left is None else f"{rough(left)} left")


@dataclass
class Task:
    """What a plain line needs of one task: its pace and what it last said."""

    pace: Pace
    done: int
    total: int | None


class Progress:
    """Progress of ``command`` in ``unit`` (runs, steps, seeds): :meth:`update` one task's
    count, :meth:`log` a stage; rich bars on a terminal, plain lines elsewhere (``plain`` None:
    whether ``console`` writes to a terminal). Nothing shows before the first report, so a
    command that fails while setting up leaves stderr to its one error line. Use it as a
    context manager: the bars stop on exit. Safe to report to from several threads."""

    def __init__(self, command: str, unit: str = "", *, console: Console | None = None,
                 plain: bool | None = None, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.command, self.unit, self.every_s, self.clock = command, unit, every_s, clock
        self.console = console if console is not None else Console(stderr=True, log_path=False)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.started = clock()
        self.last_line = -math.inf
        self.tasks: dict[str, Task] = {}
        self.bars: Any = None  # rich.progress.Progress, made at the first report
        self.ids: dict[str, Any] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def update(self, name: str, done: int, total: int | None = None, note: str = "") -> None:
        """Task ``name`` has ``done`` of ``total`` (``note``: e.g. "loss 2.31" or "failed 1").
        A count that went back or a new total starts the task's pace afresh (a new sweep
        under the same name)."""
        with self.lock:
            now = self.clock()
            task = self.tasks.get(name)
            first = task is None or done < task.done or total != task.total
            if first:
                task = self.tasks[name] = Task(Pace(now, done), done, total)
            finished = total is not None and done >= total and (first or task.done < total)
            task.done = done
            if self.plain:
                if first or finished or now - self.last_line >= self.every_s:
                    self.write(self.status_line(name, task, now, note), now)
            else:
                self.draw(name, done, total, note)

    def status_line(self, name: str, task: Task, now: float, note: str) -> str:
        """``report: study text_lr 120/588 runs, failed 1, 3m12s elapsed, ~9m left``."""
        count = f"{task.done}/{task.total}" if task.total is not None else str(task.done)
        parts = [" ".join(p for p in (name, count, self.unit) if p), note,
                 task.pace.line(now, task.done, task.total)]
        return f"{self.command}: " + ", ".join(p for p in parts if p)

    def log(self, message: str) -> None:
        """A stage of the command (``training studies``): always one line."""
        with self.lock:
            now = self.clock()
            if self.plain:
                self.write(f"{self.command}: {message}, {duration(now - self.started)} elapsed",
                           now)
            else:
                self.console.log(message)

    def note(self, message: str) -> None:
        """What the command is at (``noise floor n=1024``), as a plain line at most every
        ``every_s`` seconds; nothing on a terminal (the command shows it there itself)."""
        with self.lock:
            now = self.clock()
            if self.plain and now - self.last_line >= self.every_s:
                self.write(f"{self.command}: {message}, {duration(now - self.started)} elapsed",
                           now)

    def write(self, line: str, now: float) -> None:
        self.last_line = now
        self.console.file.write(line + "\n")
        self.console.file.flush()

    def draw(self, name: str, done: int, total: int | None, note: str) -> None:
        """The rich bar of task ``name``, the bars started at the first report."""
        if self.bars is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bars

            self.bars = Bars(TextColumn("{task.description}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                             TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
            self.bars.start()
        description = " ".join(p for p in (self.command, name) if p)
        if name not in self.ids:
            self.ids[name] = self.bars.add_task(description, total=total, note=note)
        self.bars.update(self.ids[name], completed=done, total=total, note=note)

    def stop(self) -> None:
        """Stop the bars if they were started (plain lines need no ending)."""
        if self.bars is not None:
            self.bars.stop()
            self.bars = None
