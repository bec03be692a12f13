"""The ``attnscale`` command line.

Bad input prints one line (``error: ...``) on stderr and exits with status 2, without a
traceback, whatever the command and whatever raised. With ``ATTNSCALE_DEBUG=1`` every error
branch also prints the traceback first, and the exit status stays the same.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import traceback

import typer

# Importing a command module registers its commands, in this order in --help.
from attnscale.cli import measure  # bench, theory, inspect

# isort: split
from attnscale.cli import check  # check

# isort: split
from attnscale.cli import lab  # train, sweep, results

# isort: split
from attnscale.cli import audit  # report

# isort: split
from attnscale.cli import kernels  # kernels

# isort: split
from attnscale.cli.app import app

__all__ = ["app", "audit", "check", "kernels", "lab", "main", "measure"]

USAGE_ERROR = 2
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app on ``argv`` (default: the process arguments) and exit."""
    sys.exit(run(argv))


def run(argv: list[str] | None = None) -> int:
    """Run the app; return its exit status, every error turned into one ``error:`` line."""
    try:
        code = app(args=argv, prog_name="attnscale", standalone_mode=False)
    except typer.Exit as e:
        code = e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        debug_traceback()
        print("aborted", file=sys.stderr)
        code = INTERRUPTED
    except (ValueError, TypeError, OSError, sqlite3.Error) as e:
        debug_traceback()
        say(str(e) or type(e).__name__)
        code = USAGE_ERROR
    except Exception as e:
        debug_traceback()
        if is_usage_error(e):  # unknown option, bad value, no command: typer's click says why
            say(e.format_message())
            return e.exit_code
        hint = "" if debugging() else " (ATTNSCALE_DEBUG=1 shows the traceback)"
        say(f"{type(e).__name__}: {e}{hint}")
        code = USAGE_ERROR
    return code if isinstance(code, int) else 0


def debugging() -> bool:
    """Whether ``ATTNSCALE_DEBUG`` is set (to anything but the empty string)."""
    return bool(os.environ.get("ATTNSCALE_DEBUG"))


def debug_traceback() -> None:
    """Print the exception being handled, with its traceback, when debugging."""
    if debugging():
        traceback.print_exc()


def is_usage_error(e: Exception) -> bool:
    """Typer's (click's) usage errors carry their own message and exit status."""
    return hasattr(e, "format_message") and hasattr(e, "exit_code")


def say(message: str) -> None:
    """Print ``error: message`` as one line on stderr (nothing for an empty message)."""
    line = " ".join(message.split())
    if line:  # no arguments at all: the help was shown, nothing more to say
        print(f"error: {line}", file=sys.stderr)
