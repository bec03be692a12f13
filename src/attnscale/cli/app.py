"""The typer application the commands register on, and what every command shares.

Paths are checked here before any work starts, so a bad path costs no computation and reads
the same in every command: ``ValueError`` naming the option, which :func:`attnscale.cli.main`
prints as one line with exit status 2.

Importing this module (and every command module) imports typer and rich's console only:
``attnscale --version`` and ``--help`` never import torch, numpy or pydantic; each command
imports what it needs when it runs.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Annotated, Any

import typer
from rich.console import Console

# The exit statuses, for scripts and CI (attnscale.cli explains how an error is classified).
EXIT_CODES = """Exit status: 0 done (check: healthy); 1 a result to act on (check flagged a
head, a sweep or training run failed, the report has errors) or a bug in attnscale (one line
"internal error: ..."); 2 bad input (one line "error: ...": an option, a file, a database);
130 interrupted. ATTNSCALE_DEBUG=1 adds the traceback to every error line."""

app = typer.Typer(
    help="Why attention divides by √d_k, and what the alternatives do: theory, benchmarks, runs.",
    epilog=" ".join(EXIT_CODES.split()),
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
    from attnscale.util.jsonio import dumps  # numpy: only commands that print JSON need it

    sys.stdout.write(dumps(obj, indent=2) + "\n")


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted with ``spec``, or "-" when missing."""
    return "-" if x is None else format(x, spec)


def say_token_budget(budget: dict[str, Any] | None) -> None:
    """One line on stderr when the model takes fewer tokens than ``--max-tokens`` asked
    (``budget``: :func:`attnscale.measure.inspection.token_budget`; None: not known)."""
    if budget is not None and budget["used"] < budget["asked"]:
        console.print(f"--max-tokens {budget['asked']} lowered to {budget['used']}: "
                      f"{budget['limit_from']}", soft_wrap=True, markup=False, highlight=False)
