"""The ``attnscale`` command line.

Bad input prints one line (``error: ...``) and exits with status 2, without a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Why attention divides by √d_k, and what the alternatives do: theory, benchmarks, runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """attnscale: theory tables, kernel benchmarks, training runs, sweeps, inspection, report."""


def main() -> None:
    """Entry point: run the app, turning bad input into one line and exit status 2."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as e:
        code = e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        code = 130
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        code = 2
    except Exception as e:
        # Typer's usage errors (unknown option, bad value) carry an exit code and a message.
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
            raise
        message = _one_line(e.format_message())
        if message:  # no arguments at all: the help was shown, nothing more to say
            print(f"error: {message}", file=sys.stderr)
        code = e.exit_code
    sys.exit(code if isinstance(code, int) else 0)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def print_json(obj: object) -> None:
    """Machine-readable output goes to stdout, alone."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


@app.command()
def bench(
    quick: Annotated[bool, typer.Option("--quick", help="N = 1024 only.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
    n: Annotated[list[int] | None, typer.Option("--n", help="Sequence lengths.")] = None,
    score: Annotated[
        list[str] | None, typer.Option("--score", help="Scores (default all).")
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed calls per measurement.")] = 3,
    no_naive: Annotated[bool, typer.Option("--no-naive", help="Skip the naive baseline.")] = False,
) -> None:
    """Time every score against PyTorch SDPA and the naive formula (B=8, H=8, D=64, float32)."""
    from attnscale import bench as B

    n_values = n or ([1024] if quick else [256, 1024, 2048])
    if any(v < 1 for v in n_values):
        raise ValueError(f"--n must be positive, got {n_values}")
    with console.status("benchmarking") as status:
        rows, facts = B.run(
            n_values=n_values,
            scores=score,
            repeats=repeats,
            naive=not no_naive,
            progress=lambda msg: status.update(f"benchmarking {msg}"),
        )
    if as_json:
        print_json([r.to_dict() for r in rows])
        return
    table = Table(
        title=f"attention vs SDPA, fwd+bwd, float32, matmul peak "
        f"{facts['matmul_peak_gflops']:.0f} GFLOP/s"
    )
    for col in (
        "score",
        "N",
        "causal",
        "fwd ms",
        "fwd+bwd ms",
        "SDPA ms",
        "× SDPA",
        "naive ms",
        "naive/ours",
        "GFLOP/s",
        "% peak",
        "peak MB",
    ):
        table.add_column(col, justify="left" if col == "score" else "right")
    for r in rows:
        table.add_row(
            r.score,
            str(r.n),
            "yes" if r.causal else "no",
            f"{r.fwd_ms:.1f}",
            f"{r.fwdbwd_ms:.1f}",
            f"{r.sdpa_fwdbwd_ms:.1f}",
            f"{r.ratio_fwdbwd:.2f}",
            _fmt(r.naive_fwdbwd_ms, ".0f"),
            _fmt(r.ratio_naive, ".2f"),
            f"{r.gflops:.1f}",
            f"{100 * r.peak_fraction:.0f}",
            _fmt(r.peak_mem_mb, ".0f"),
        )
    Console().print(table)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
