"""The ``report`` command: measure every claim, judge it by its rule, write the report.

The audit and the lab it drives (torch, scipy, matplotlib) are imported when it runs.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from attnscale.cli.app import app, console
from attnscale.cli.progress import Progress
from attnscale.cli.tables import print_table

VERDICT_COLORS = {"supported": "green", "refuted": "red", "depends": "yellow",
                  "inconclusive": "bright_black", "error": "bold white on red"}


@app.command()
def report(
    quick: Annotated[bool, typer.Option("--quick", help="About 70 s on 2 cores.")] = False,
    standard: Annotated[bool, typer.Option(
        "--standard", help="The default, 9–12 min on 2 cores.")] = False,
    deep: Annotated[bool, typer.Option("--deep", help=(
        "The standard report plus a 1,500-step text study, a high-LR instability study "
        "without gradient clipping and Q4's QK-Clip study (about 22 min on 2 cores after a "
        "standard report, whose runs it reuses in the same --db)."))] = False,
    full: Annotated[bool, typer.Option("--full", help=(
        "Sized for a Ray cluster: widths to 1024, d_k to 512, thousands of steps; use "
        "--executor ray --address host:port."))] = False,
    out: Annotated[str, typer.Option("--out", help="Output folder.")] = "report",
    db: Annotated[str | None, typer.Option("--db", help="Results database (OUT/results.db).")]
    = None,
    executor: Annotated[str, typer.Option(help="local or ray.")] = "local",
    workers: Annotated[int, typer.Option(min=1, help="Parallel training runs.")] = 2,
    address: Annotated[str | None, typer.Option(help="Ray cluster address.")] = None,
    seed_offset: Annotated[int, typer.Option(
        "--seed-offset", min=0, help="Train on disjoint seeds (s + 100·K): a replication.")] = 0,
) -> None:
    """Measure every claim of the thread, judge it by its rule, write OUT/index.html and JSON."""
    from attnscale.audit import report as R
    from attnscale.lab.executors import EXECUTORS
    from attnscale.util.validate import check_choice, check_output_file, check_output_folder

    chosen = [name for name, flag in (("quick", quick), ("standard", standard), ("deep", deep),
                                      ("full", full)) if flag]
    if len(chosen) > 1:
        raise ValueError(f"choose one preset, got {', '.join('--' + c for c in chosen)}")
    check_choice("--executor", executor, EXECUTORS)
    check_output_folder("--out", out)
    if db is not None:
        check_output_file("--db", db)
    preset = chosen[0] if chosen else "standard"
    with Progress("report", "runs", console=console) as shown:

        def progress(name: str, counts: Any) -> None:
            shown.update(name, counts.finished, getattr(counts, "total", None))

        result = R.build_report(preset, out, db, executor, workers, address, say=shown.log,
                                progress=progress, seed_offset=seed_offset)
    print_verdicts(result, preset, out)
    if result["errors"]:  # the page and report.json are written, with the errors shown
        for e in result["errors"]:
            console.print(f"[bold red]error[/] {e['id']} ({e['where']}): {escape(e['error'])}")
        raise typer.Exit(1)


def print_verdicts(result: dict[str, Any], preset: str, out: str) -> None:
    """One row per claim (its verdict and headline) and per question (its answer); a smoke
    test says that its verdicts are not evidence."""
    smoke = result.get("smoke", False)
    cells = [(c["id"], f"[{VERDICT_COLORS[c['verdict']]}]{c['verdict']}[/]",
              escape(c["headline"][:160])) for c in result["claims"]]
    cells += [(q["id"], "answer", escape(q.get("answer", q["headline"])[:160]))
              for q in result["questions"]]
    print_table(f"attnscale report ({preset}{', smoke test' if smoke else ''}) -> "
                f"{out}/index.html", ("ID", "verdict", "headline"),
                cells, left=("ID", "verdict", "headline"))
    if smoke:
        console.print(f"[bold yellow]smoke test:[/] the {preset} preset checks that the report "
                      "runs end to end; its verdicts are not evidence (run make report)")
    reused = "" if result.get("runs_trained", 1) else ", every training run reused"
    console.print(f"elapsed {result['elapsed_s']:.0f} s{reused}{pace_words(result)}")


def pace_words(result: dict[str, Any]) -> str:
    """'; host reference 0.28 s / 0.29 s (before / after): 3,100 references' (measure.pace)."""
    pace = result.get("host_pace")
    if not pace:
        return ""
    before, after = pace["reference_s"]
    return (f"; host reference {before:.2f} s / {after:.2f} s (before / after): "
            f"{pace['elapsed_in_references']:,.0f} references")
