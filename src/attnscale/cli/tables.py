"""Tables on stdout that read well in a terminal and in a pipe, never with a header cut short.

In a terminal, a rich table whose columns are at least as wide as the longest word of their
header, so rich wraps a narrow column (header and cells) at word boundaries instead of cutting
"H without 1/√d" to "H with… 1/√d"; a terminal too narrow even for that gets the plain layout.
Elsewhere (a pipe, a file, a CI log) a compact plain layout:
``# title``, then tab-separated values with the headers as the first line, no markup, no box,
whatever the terminal width.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["interactive", "print_table", "stdout_console"]


def stdout_console() -> Console:
    """A console on the current stdout; its log lines carry no source location."""
    return Console(log_path=False)


def interactive() -> bool:
    """Whether stdout is a terminal (a rich table) rather than a pipe or file (plain TSV)."""
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    left: Sequence[str] = (),
) -> None:
    """Print ``rows`` (rich markup strings, one per column) under ``columns`` on stdout.

    ``left``: columns justified left in a terminal (the others right, as numbers are).
    """
    rows = [list(r) for r in rows]
    if interactive() and print_rich_table(title, columns, rows, left):
        return
    lines = [f"# {plain(title)}", "\t".join(columns)]
    lines += ["\t".join(plain(cell) for cell in row) for row in rows]
    sys.stdout.write("\n".join(lines) + "\n")


def print_rich_table(title: str, columns: Sequence[str], rows: list[list[str]],
                     left: Sequence[str]) -> bool:
    """Print a rich table if the terminal fits every word of it whole; return whether it did.

    A table wider than the terminal gets each column exactly its longest word (header or
    cell), so rich wraps at spaces instead of cropping; rich's own shrinking would cut words.
    """
    out = stdout_console()
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    unbounded = out.options.update_width(10**6)
    if Measurement.get(out, unbounded, table).maximum > out.width:
        words = [max((len(w) for cell in (col, *(plain(r[i]) for r in rows))
                      for w in cell.split()), default=1) for i, col in enumerate(columns)]
        for column, width in zip(table.columns, words, strict=True):
            column.width = width
        if Measurement.get(out, unbounded, table).maximum > out.width:
            return False
    out.print(table)
    return True


def plain(cell: str) -> str:
    """The text of a rich markup string, with tabs and line breaks turned into spaces."""
    return " ".join(Text.from_markup(cell).plain.split())
