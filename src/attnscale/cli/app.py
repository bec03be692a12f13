"""The typer application the commands register on, and what every command shares.

Paths are checked here before any work starts, so a bad path costs no computation and reads
the same in every command: ``ValueError`` naming the option, which :func:`attnscale.cli.main`
prints as one line with exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from attnscale.util.jsonio import dumps

app = typer.Typer(
    help="Why attention divides by √d_k, and what the alternatives do: theory, benchmarks, runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Progress and messages go to stderr; log lines carry no source location (log_path=False).
console = Console(stderr=True, log_path=False)


def version() -> str:
    """The installed package's version (importlib.metadata; "unknown" if not installed)."""
    try:
        return metadata.version("attnscale")
    except metadata.PackageNotFoundError:  # a source tree run without installing it
        return "unknown (not installed)"


def show_version(value: bool) -> None:
    """``--version``: print ``attnscale VERSION`` on stdout and exit 0 before any command."""
    if value:
        sys.stdout.write(f"attnscale {version()}\n")
        raise typer.Exit(0)


@app.callback()
def root(
    _version: Annotated[bool, typer.Option(
        "--version", callback=show_version, is_eager=True, help="Print the version and exit.",
    )] = False,
) -> None:
    """attnscale: theory tables, kernel benchmarks, training runs, sweeps, inspection, report."""


def print_json(obj: object) -> None:
    """Machine-readable output goes to stdout, alone (NaN and inf become null)."""
    sys.stdout.write(dumps(obj, indent=2) + "\n")


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted with ``spec``, or "-" when missing."""
    return "-" if x is None else format(x, spec)


@contextmanager
def shown_from_first_report(progress: Progress) -> Iterator[Progress]:
    """Yield ``progress`` for the command to start at its first report (first task); stop it
    at the end if it was started.

    A command that fails before its first report (bad input found while setting up) then
    leaves stderr to its one error line: no empty bar, no blank line from stopping one.
    """
    try:
        yield progress
    finally:
        if progress.task_ids:
            progress.stop()
