"""The typer application the commands register on, and what every command shares.

Paths are checked here before any work starts, so a bad path costs no computation and reads
the same in every command: ``ValueError`` naming the option, which :func:`attnscale.cli.main`
prints as one line with exit status 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from attnscale.util.jsonio import dumps

app = typer.Typer(
    help="Why attention divides by √d_k, and what the alternatives do: theory, benchmarks, runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Progress and messages go to stderr; log lines carry no source location (log_path=False).
console = Console(stderr=True, log_path=False)


@app.callback()
def root() -> None:
    """attnscale: theory tables, kernel benchmarks, training runs, sweeps, inspection, report."""


def print_json(obj: object) -> None:
    """Machine-readable output goes to stdout, alone (NaN and inf become null)."""
    sys.stdout.write(dumps(obj, indent=2) + "\n")


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted with ``spec``, or "-" when missing."""
    return "-" if x is None else format(x, spec)


def input_file(path: str, option: str) -> Path:
    """``path`` if it is an existing regular file, else ValueError naming ``option``."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{option}: {path} is a directory, not a file")
    if not p.is_file():
        raise ValueError(f"{option}: no file at {path}")
    return p


def output_file(path: str, option: str) -> Path:
    """``path`` if a file can be written there (its folder is created), else ValueError."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{option}: {path} is a directory, not a file")
    output_folder(str(p.parent), option)
    return p


def output_folder(path: str, option: str) -> Path:
    """``path`` created if needed and writable, else ValueError naming ``option``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{option}: {path} is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{option}: cannot create the folder {path} ({e.strerror})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: the folder {path} is not writable")
    return p
