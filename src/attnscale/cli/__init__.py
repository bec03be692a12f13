"""The ``attnscale`` command line.

Exit status, whatever the command (also in ``attnscale --help``):

0
    done (``check``: every head healthy).
1
    a result to act on: ``check`` flagged a head, a sweep or training run failed, the report
    has errors; or a bug in attnscale: one line ``internal error: TYPE: message (a bug in
    attnscale; ATTNSCALE_DEBUG=1 shows the traceback)`` on stderr.
2
    bad input: one line ``error: message`` on stderr, no traceback.
130
    interrupted (Ctrl-C).

What counts as bad input (:func:`classify`): typer's usage errors (an unknown option, a value
of the wrong form, no command); ``ValueError`` and ``TypeError``, which the project raises for
every argument it rejects (:mod:`attnscale.util.validate`, and the file checks before any work
starts); ``OSError`` (a file the user named is missing, a folder, unwritable; the disk is
full: not a bug, and the user can act on it); a SQLite error opening or reading the database
the user named (not a database, locked, I/O error); and running out of memory
(``MemoryError``, torch's ``OutOfMemoryError``: the sizes asked for do not fit). Every other
exception (``IndexError``, ``KeyError``, ``RuntimeError``, ``AssertionError``, ...) is a bug,
and so are the SQLite errors that only wrong code raises (``ProgrammingError``,
``InterfaceError``, ``IntegrityError``, ``InternalError``, and an ``OperationalError`` that is
not about the file: "no such column", "syntax error"); torch's CPU allocator failing (a
``RuntimeError`` saying it can't allocate memory) is out of memory, not a bug. The split is
by type: a ``ValueError`` raised deep in torch by a bug still reads as bad input;
``ATTNSCALE_DEBUG=1`` shows where any error came from (the traceback first, the exit status
unchanged).

Importing this package registers every command but imports no torch: each command imports
what it needs when it runs, so ``attnscale --version`` and ``--help`` start at once.
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

__all__ = ["BUG", "INTERRUPTED", "USAGE_ERROR", "app", "audit", "check", "classify", "kernels",
           "lab", "main", "measure", "run"]

BUG = 1
USAGE_ERROR = 2
INTERRUPTED = 130
# SQLite errors only wrong code raises (a closed connection, bad SQL or bindings, a violated
# constraint); the others (not a database, locked, disk I/O) come from the file the user named
SQLITE_BUGS = (sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.IntegrityError,
               sqlite3.InternalError)
# An OperationalError is the file's fault only with these messages; "no such column", "syntax
# error" and the like come from attnscale's own SQL
SQLITE_FILE_ERRORS = ("locked", "busy", "disk i/o", "not a database", "unable to open",
                      "readonly", "read-only", "disk is full", "malformed")
# torch's CPU allocator raises a plain RuntimeError: "[enforce fail at alloc_cpu.cpp:...]
# DefaultCPUAllocator: can't allocate memory"
CPU_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "out of memory")
BUG_HINT = "a bug in attnscale"


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app on ``argv`` (default: the process arguments) and exit."""
    sys.exit(run(argv))


def run(argv: list[str] | None = None) -> int:
    """Run the app; return its exit status, every error turned into one line on stderr:
    ``error: ...`` for bad input (2), ``internal error: ...`` for a bug (1)."""
    try:
        code = app(args=argv, prog_name="attnscale", standalone_mode=False)
    except typer.Exit as e:
        code = e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        debug_traceback()
        print("aborted", file=sys.stderr)
        code = INTERRUPTED
    except Exception as e:
        debug_traceback()
        code, line = classify(e)
        say(line)
    return code if isinstance(code, int) else 0


def classify(e: Exception) -> tuple[int, str]:
    """(exit status, the line to print) for an exception a command raised: bad input (2,
    ``error: ...``) or a bug (1, ``internal error: ...``); see the module docstring."""
    if is_usage_error(e):  # unknown option, bad value, no command: typer's click says why
        return e.exit_code, error_line(e.format_message())
    if isinstance(e, (ValueError, TypeError, OSError)) or (
            isinstance(e, sqlite3.Error) and not is_sqlite_bug(e)):
        return USAGE_ERROR, error_line(str(e) or type(e).__name__)
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or (  # torch's
            isinstance(e, RuntimeError) and any(m in str(e) for m in CPU_OUT_OF_MEMORY)):
        said = f": {e}" if str(e) else ""
        return USAGE_ERROR, error_line(f"out of memory{said} (ask for less: smaller sizes, "
                                       "fewer workers)")
    hint = BUG_HINT if debugging() else f"{BUG_HINT}; ATTNSCALE_DEBUG=1 shows the traceback"
    message = " ".join(str(e).split())
    what = f"{type(e).__name__}: {message}" if message else type(e).__name__
    return BUG, f"internal error: {what} ({hint})"


def is_sqlite_bug(e: sqlite3.Error) -> bool:
    """Whether a SQLite error comes from attnscale's code rather than the database file."""
    if isinstance(e, SQLITE_BUGS):
        return True
    message = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and not any(
        m in message for m in SQLITE_FILE_ERRORS)


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


def error_line(message: str) -> str:
    """``error: message`` on one line; "" for an empty message (no arguments at all: the help
    was shown, there is nothing more to say)."""
    line = " ".join(message.split())
    return f"error: {line}" if line else ""


def say(line: str) -> None:
    """Print ``line`` on stderr, unless it is empty."""
    if line:
        print(line, file=sys.stderr)
