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
    from attnscale.measure import bench as B

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


@app.command()
def sweep(
    config: Annotated[str, typer.Argument(help="Sweep TOML file ([base], [axes], [[variant]]).")],
    db: Annotated[str, typer.Option("--db", help="SQLite results file (created if missing).")],
    workers: Annotated[int, typer.Option(min=1, help="Runs in parallel (1 thread each).")] = 1,
    executor: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join ('auto' finds one); default: a local Ray."),
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Run failed configs again.")
    ] = False,
) -> None:
    """Run every grid point of a sweep into a SQLite store; rerun the same command to resume.

    Finished runs (done, diverged, failed) are skipped; runs a killed sweep left queued or
    running are redone. Exit status 1 if any run failed.
    """
    from attnscale.lab import sweep as S

    spec = S.load_spec(config)
    S.make_executor(executor, workers, address)  # bad --executor / --address: exit 2 here
    with _sweep_progress() as report:
        counts = S.run_sweep(
            spec,
            db,
            workers=workers,
            executor=executor,
            address=address,
            retry_failed=retry_failed,
            source=config,
            progress=report,
        )
    console.print(
        f"{counts.total} runs: {counts.done} done, {counts.diverged} diverged, "
        f"{counts.failed} failed ({counts.skipped} already finished) -> {db}",
        soft_wrap=True,
    )
    if counts.failed:
        raise typer.Exit(1)


def _sweep_progress():
    """A rich progress bar on stderr; yields the callback run_sweep reports counts to."""
    from contextlib import contextmanager

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    @contextmanager
    def bar():
        progress = Progress(
            TextColumn("sweep"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("diverged {task.fields[diverged]}  failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        ids: list = []

        def report(c) -> None:
            fields = {"completed": c.finished, "diverged": c.diverged, "failed": c.failed}
            if not ids:
                ids.append(progress.add_task("sweep", total=c.total, **fields))
            else:
                progress.update(ids[0], **fields)

        with progress:
            yield report

    return bar()


@app.command()
def results(
    db: Annotated[str, typer.Option("--db", help="SQLite results file of a sweep.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print runs as JSON.")] = False,
    csv_path: Annotated[str | None, typer.Option("--csv", help="Write runs to a CSV file.")] = None,
    parquet_path: Annotated[
        str | None, typer.Option("--parquet", help="Write runs to a Parquet file (pyarrow).")
    ] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only runs with this status.")
    ] = None,
) -> None:
    """Export a sweep's runs: JSON on stdout, CSV / Parquet to a file, or a table."""
    from pathlib import Path

    from attnscale.lab import store as St

    if not Path(db).is_file():
        raise ValueError(f"no results database at {db!r}")
    with St.Store(db) as store:
        runs = store.runs(status=status or None)
    if as_json:
        print_json(runs)
    if csv_path:
        console.print(f"wrote {St.write_csv(runs, csv_path)} runs to {csv_path}", soft_wrap=True)
    if parquet_path:
        n = St.write_parquet(runs, parquet_path)
        console.print(f"wrote {n} runs to {parquet_path}", soft_wrap=True)
    if not (as_json or csv_path or parquet_path):
        _print_runs(runs)


def _print_runs(runs: list[dict]) -> None:
    from rich import box

    from attnscale.lab.analysis import group_key

    table = Table(title=f"{len(runs)} runs", box=box.SIMPLE_HEAD)
    for col in ("id", "score", "lr", "seed", "status", "loss", "metric", "diverged"):
        left = col in ("id", "score", "status")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for r in runs:
        cfg = r["config"] or {}
        table.add_row(
            r["id"],
            group_key(r),
            _fmt(cfg.get("lr"), "g"),
            str(cfg.get("seed", "-")),
            r["status"],
            _fmt(r["final_loss"], ".4f"),
            _fmt(r["final_metric"], ".4f"),
            "-" if r["diverged_step"] is None else str(r["diverged_step"]),
        )
    Console(width=None if sys.stdout.isatty() else 120).print(table)  # piped: do not truncate


# Option names for TrainConfig fields whose flag is not the field name with dashes.
_TRAIN_FLAGS = {"n_heads": "--heads", "n_kv_heads": "--kv-heads", "n_layers": "--layers"}


def _with_train_options(
    command: typer.models.CommandFunctionType,
) -> typer.models.CommandFunctionType:
    """Add one option per ``attnscale.lab.train.TrainConfig`` field to ``command``'s signature.

    Every option defaults to None, meaning "the config's default", so the CLI and the config
    never disagree about defaults and a new config field is an option without further edits.
    """
    import inspect
    import typing

    from attnscale.lab.train import TrainConfig

    hints = typing.get_type_hints(command, include_extras=True)
    params = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(command).parameters.values()
        if p.kind != p.VAR_KEYWORD
    ]
    for name, info in TrainConfig.model_fields.items():
        kind, choices = _cli_type(info.annotation)
        flag = _TRAIN_FLAGS.get(name, "--" + name.replace("_", "-"))
        decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
        note = f" One of: {', '.join(choices)}." if choices else ""
        if info.default is not None:
            note += f" [default: {info.default}]"
        option = typer.Option(*decls, help=f"{info.description}{note}")
        annotation = Annotated[kind | None, option]
        kw_only = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(name, kw_only, default=None, annotation=annotation))
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


def _cli_type(annotation: object) -> tuple[object, tuple[str, ...]]:
    """The click-parsable type of a config field (Literal -> str with its choices)."""
    import types
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return str, typing.get_args(annotation)
    return annotation, ()


@app.command()
@_with_train_options
def train(
    as_json: Annotated[bool, typer.Option("--json", help="Print the run record as JSON.")] = False,
    **options: object,
) -> None:
    """Train one model: attnscale train --task mqar --score cosine --tau 1 --lr 3e-3 --steps 500.

    Every attnscale.lab.train.TrainConfig field is an option; unset ones take the config default.
    A progress bar (stderr) shows loss and steps/s; a summary table or --json record follows.
    """
    from attnscale.lab import train as T

    config = _train_config({k: v for k, v in options.items() if v is not None})
    with _train_progress(config.steps) as report:
        result = T.run(config, progress=report)
    if as_json:
        print_json(result.to_dict())
    else:
        _print_train_summary(result)


def _train_config(values: dict[str, object]) -> object:
    """TrainConfig from CLI values; a validation error becomes one readable ValueError."""
    from pydantic import ValidationError

    from attnscale.lab.train import TrainConfig

    try:
        return TrainConfig(**values)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{where}: {msg}" if where else msg)
        raise ValueError("; ".join(parts)) from None


def _train_progress(total: int):
    """A rich bar on stderr with loss and steps/s; yields the run() progress callback."""
    import time
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    @contextmanager
    def bar():
        progress = Progress(
            TextColumn("train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[rate]} steps/s"),
            console=console,
        )
        bar_id = progress.add_task("train", total=total, loss="-", rate="-")
        start = time.perf_counter()

        def report(done: int, loss: float) -> None:
            rate = done / max(time.perf_counter() - start, 1e-9)
            progress.update(bar_id, completed=done, loss=f"{loss:.4f}", rate=f"{rate:.1f}")

        with progress:
            yield report

    return bar()


def _print_train_summary(result: object) -> None:
    last = result.history[-1] if result.history else {}
    table = Table(title=f"train {result.config['task']} / {result.config['score']}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("status", result.status),
        ("steps", str(result.steps)),
        ("diverged at", "-" if result.diverged_step is None else str(result.diverged_step)),
        ("initial loss", _fmt(result.initial_loss, ".4f")),
        ("final eval loss", _fmt(result.final_loss, ".4f")),
        (f"final {result.metric_name}", _fmt(result.final_metric, ".4f")),
    ]
    if len(result.final_metrics) > 1:
        rows += [(f"  {k}", _fmt(v["metric"], ".4f")) for k, v in result.final_metrics.items()]
    rows += [
        ("last max |logit|", _fmt(last.get("max_abs_logit"), ".2f")),
        ("parameters", f"{result.num_params:,}"),
        ("elapsed s", f"{result.elapsed_s:.1f}"),
        ("steps/s", f"{result.steps / max(result.elapsed_s, 1e-9):.1f}"),
    ]
    for row in rows:
        table.add_row(*row)
    Console().print(table)


@app.command()
def theory(
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write figures to a folder.")] = None,
    samples: Annotated[int, typer.Option(min=10, help="Monte Carlo queries per cell.")] = 600,
    seed: Annotated[int, typer.Option(help="Monte Carlo seed.")] = 0,
) -> None:
    """Exact theory next to Monte Carlo: logit std, entropy, max weight, effective keys, ‖J‖."""
    from pathlib import Path

    from attnscale.measure import montecarlo

    with console.status("theory and Monte Carlo"):
        rows = montecarlo.theory_table(seed=seed, samples=samples)
    if plot is not None:
        from attnscale.measure import theory as T

        folder = Path(plot)
        folder.mkdir(parents=True, exist_ok=True)
        for path in (T.plot_entropy_vs_scale(str(folder / "entropy_vs_scale.png")),
                     T.plot_phase_diagram(str(folder / "phase_diagram.png"))):
            console.print(f"wrote {path}")
    if as_json:
        print_json({"rows": rows})
        return
    table = Table(title="softmax over n keys at init: theory vs Monte Carlo (z = diff / SE)")
    for col in ("score", "d", "n", "quantity", "theory", "MC mean", "MC SE", "z"):
        table.add_column(col, justify="left" if col in ("score", "quantity") else "right")
    for r in rows:
        se = r["mc_se"]
        z = (r["mc_mean"] - r["theory"]) / se if se else 0.0
        table.add_row(r["score"], str(r["d"]), str(r["n"]), r["quantity"], f"{r['theory']:.4g}",
                      f"{r['mc_mean']:.4g}", f"{se:.2g}", f"{z:+.1f}")
    Console().print(table)


@app.command("inspect")
def inspect_command(
    model: Annotated[str, typer.Argument(help="'minilm' or a local HF model folder.")] = "minilm",
    text: Annotated[str | None, typer.Option("--text", help="UTF-8 file, an input a line.")] = None,
    sentence: Annotated[list[str] | None, typer.Option("--sentence", help="An input.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write heatmaps here.")] = None,
    max_tokens: Annotated[int, typer.Option(min=2, help="Truncate inputs to this.")] = 128,
) -> None:
    """Per-layer, per-head attention statistics of a real trained model, offline."""
    from attnscale.measure import inspection as I

    if text is not None and sentence:
        raise ValueError("give --text or --sentence, not both")
    sentences = I.sentences_from_file(text) if text is not None else (sentence or None)
    with console.status(f"inspecting {model}"):
        result = I.inspect_model(model, sentences, max_tokens=max_tokens)
    if plot is not None:
        for path in I.plot_heatmaps(result, plot):
            console.print(f"wrote {path}")
    if as_json:
        print_json(result)
        return
    table = Table(title=f"{result['model']}: {result['n_tokens']} tokens "
                        f"({result['n_sentences']} inputs), pre-softmax scores per head")
    for col in ("layer", "head", "logit std", "max |logit|", "entropy", "ln n", "max w",
                "eff. keys", "H without 1/√d", "H cosine τ=1"):
        table.add_column(col, justify="right")
    for layer in result["layers"]:
        for h in layer["heads"]:
            table.add_row(str(layer["layer"]), str(h["head"]), f"{h['logit_std']:.2f}",
                          f"{h['max_abs_logit']:.1f}", f"{h['entropy']:.2f}",
                          f"{h['entropy_uniform']:.2f}", f"{h['max_weight']:.2f}",
                          f"{h['effective_keys']:.1f}", f"{h['entropy_unscaled']:.2f}",
                          f"{h['entropy_cosine_tau1']:.2f}")
    Console().print(table)


@app.command()
def report(
    quick: Annotated[bool, typer.Option("--quick", help="About 2 minutes.")] = False,
    standard: Annotated[bool, typer.Option("--standard", help="The default (≤ 15 min).")] = False,
    full: Annotated[bool, typer.Option("--full", help="Everything, hours on a laptop.")] = False,
    out: Annotated[str, typer.Option("--out", help="Output folder.")] = "report",
    db: Annotated[str | None, typer.Option("--db", help="Results database (OUT/results.db).")]
    = None,
    executor: Annotated[str, typer.Option(help="local or ray.")] = "local",
    workers: Annotated[int, typer.Option(min=1, help="Parallel training runs.")] = 2,
    address: Annotated[str | None, typer.Option(help="Ray cluster address.")] = None,
) -> None:
    """Measure every claim of the thread, judge it by its rule, write OUT/index.html and JSON."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnscale.audit import report as R

    chosen = [name for name, flag in (("quick", quick), ("standard", standard), ("full", full))
              if flag]
    if len(chosen) > 1:
        raise ValueError(f"choose one preset, got {', '.join('--' + c for c in chosen)}")
    if executor not in ("local", "ray"):
        raise ValueError(f"--executor must be 'local' or 'ray', got {executor!r}")
    preset = chosen[0] if chosen else "standard"
    bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)
    tasks: dict[str, int] = {}

    def progress(name: str, counts) -> None:
        total = counts.total if hasattr(counts, "total") else None
        if name not in tasks:
            tasks[name] = bars.add_task(f"study {name}", total=total)
        bars.update(tasks[name], completed=counts.finished, total=total)

    with bars:
        result = R.build_report(preset, out, db, executor, workers, address,
                                say=lambda msg: bars.console.log(msg), progress=progress)
    table = Table(title=f"attnscale report ({preset}) -> {out}/index.html")
    for col in ("ID", "verdict", "because"):
        table.add_column(col)
    colors = {"supported": "green", "refuted": "red", "depends": "yellow"}
    for c in result["claims"] + result["questions"]:
        table.add_row(c["id"], f"[{colors[c['verdict']]}]{c['verdict']}[/]", c["because"][:160])
    Console().print(table)
    console.print(f"elapsed {result['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
