"""Commands over the training lab: ``train`` one model, run a ``sweep``, export its ``results``.

The lab (torch, pydantic, scipy) is imported by each command when it runs, not here, so that
``attnscale --help`` starts at once; ``train``'s options, made from the config, are added when
``train`` itself is parsed (:class:`attnscale.cli.trainopts.TrainCommand`).
"""

from __future__ import annotations

import importlib.util
import signal
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from attnscale.cli.app import app, console, fmt, print_json
from attnscale.cli.progress import Progress
from attnscale.cli.tables import print_table
from attnscale.cli.trainopts import TrainCommand, with_own_options

if TYPE_CHECKING:
    from attnscale.lab.config import TrainConfig
    from attnscale.lab.sweep import Counts
    from attnscale.lab.train import RunResult

PARQUET_EXTRA = "parquet"  # the pyproject.toml optional-dependency group with pyarrow
# Values the help quotes, whose modules take torch or numpy to import: attnscale.lab.runlog's
# TENSORBOARD_EXTRA, attnscale.lab.leases' LEASE_S and attnscale.lab.sweep's PATIENCE_S
# (tests/cli/test_startup.py checks that these agree with them)
TENSORBOARD_EXTRA = "hf"
LEASE_S = 120.0
PATIENCE_S = 1800.0
DEFAULT_DB = "results.db"  # sweep and results without --db: this file in the working folder


@app.command(cls=TrainCommand)
@with_own_options
def train(
    as_json: Annotated[bool, typer.Option("--json", help="Print the run record as JSON.")] = False,
    tensorboard: Annotated[str | None, typer.Option(
        "--tensorboard", help="Write loss, LR and per-layer attention statistics every "
        f"--log-every steps as TensorBoard event files here (needs the {TENSORBOARD_EXTRA} "
        "extra).")] = None,
    seeds: Annotated[str | None, typer.Option(
        "--seeds", help="Train at several seeds, e.g. 0-7 or 0,3,5: one result per seed, then "
        "the mean and 95% interval of the final loss and metric.")] = None,
    workers: Annotated[int, typer.Option(
        min=1, help="With --seeds: runs in parallel (one thread each).")] = 1,
    **options: object,
) -> None:
    """Train one model: attnscale train --task mqar --score cosine --tau 1 --lr 3e-3 --steps 500.

    Every attnscale.lab.config.TrainConfig field is an option; unset ones take the config default.
    A progress bar (stderr) shows loss and steps/s; a summary table or --json record follows.
    With --seeds, one row per seed and their mean (--json: the records and the summary).
    """
    from attnscale.lab import runlog
    from attnscale.lab import train as T
    from attnscale.lab.seeds import parse_seeds
    from attnscale.util.validate import check_input_file, check_output_folder

    values = {k: v for k, v in options.items() if v is not None}
    if "text" in values:  # a folder reads "is a directory", a missing file "no file at"
        check_input_file("--text", values["text"])
    if seeds is not None:
        several = parse_seeds(seeds)
        if "seed" in values:
            raise ValueError("--seeds and --seed: give one of them")
        if tensorboard is not None:
            raise ValueError("--tensorboard writes one run: give --seed, not --seeds")
        train_several(train_config(values), several, workers, as_json)
        return
    config = train_config(values)
    extra = {}  # run() gets tensorboard= only when asked: callers of run(config, progress) stay
    if tensorboard is not None:
        if not runlog.tensorboard_available():
            raise ValueError("--tensorboard needs the tensorboard package: "
                             f"pip install 'attnscale[{TENSORBOARD_EXTRA}]'")
        extra["tensorboard"] = str(check_output_folder("--tensorboard", tensorboard))
    with Progress("train", "steps", console=console) as shown:
        total, started = config.optim.steps, time.perf_counter()

        def report(done: int, loss: float) -> None:
            rate = done / max(time.perf_counter() - started, 1e-9)
            shown.update("", done, total, f"loss {loss:.4f}, {rate:.1f} steps/s")

        result = T.run(config, progress=report, **extra)
    if as_json:
        print_json(result.to_dict())
    else:
        print_train_summary(result)


def train_several(config: TrainConfig, seeds: tuple[int, ...], workers: int,
                  as_json: bool) -> None:
    """``config`` at every seed of ``seeds``; a table (or JSON) of the runs and their mean."""
    from attnscale.lab.seeds import summarize, train_seeds

    with Progress("train", "seeds", console=console) as shown:
        statuses: list[str] = []  # of the runs finished so far, as train_seeds reports them

        def report(record: dict) -> None:
            statuses.append(record.get("status", "-"))
            failed = statuses.count("failed")
            shown.update("", len(statuses), len(seeds), f"failed {failed}" if failed else "")

        records = train_seeds(config, seeds, workers, on_done=report)
    summary = summarize(records)
    if as_json:
        print_json({"runs": records, "summary": summary})
        return
    rows = [(str(r.get("seed")), r.get("status", "-"), fmt(r.get("final_loss"), ".4f"),
             fmt(r.get("final_metric"), ".4f"),
             "-" if r.get("diverged_step") is None else str(r["diverged_step"]),
             fmt(r.get("elapsed_s"), ".1f")) for r in records]
    loss, metric = summary["final_loss"], summary["final_metric"]
    rows.append((f"mean of {loss['n']}", "", mean_text(loss), mean_text(metric), "", ""))
    title = f"train {config.task.name} / {config.model.score} at {len(seeds)} seeds"
    print_table(title, ("seed", "status", "final eval loss", "final metric", "diverged at",
                        "elapsed s"), [tuple(escape(c) for c in row) for row in rows],
                left=("status",))
    for r in records:
        if r.get("status") == "failed":
            console.print(f"seed {r['seed']} failed: {r['error'].splitlines()[0]}",
                          soft_wrap=True)
    if summary["failed"]:
        raise typer.Exit(1)


def mean_text(ci: dict) -> str:
    """``2.3456 [2.31, 2.38]``, the mean alone without an interval, or "-"."""
    if not ci["n"]:
        return "-"
    if ci["lo"] is None:
        return fmt(ci["mean"], ".4f")
    return f"{ci['mean']:.4f} [{ci['lo']:.4f}, {ci['hi']:.4f}]"


def train_config(values: dict[str, object]) -> TrainConfig:
    """TrainConfig from CLI values; a validation error becomes one readable ValueError."""
    from pydantic import ValidationError

    from attnscale.lab.config import TrainConfig
    from attnscale.lab.sections import error_path

    try:
        return TrainConfig(**values)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            where = error_path(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{where}: {msg}" if where else msg)
        raise ValueError("; ".join(parts)) from None


SUMMARY_CONFIG = (("task", "task"), ("score", "score"), ("width", "d_model"),
                  ("heads", "n_heads"), ("layers", "n_layers"), ("lr", "lr"), ("steps", "steps"),
                  ("seed", "seed"))


def print_train_summary(result: RunResult) -> None:
    """The run's config that matters, then its outcome, metric beside the task's chance level."""
    last = result.history[-1] if result.history else {}
    chance = result.task.get("chance_level")
    beside = "" if chance is None else f" (chance {chance:.4g})"
    rows = [(label, str(result.config.get(key, "-"))) for label, key in SUMMARY_CONFIG]
    rows += [
        ("status", result.status),
        ("steps done", str(result.steps)),
        ("diverged at", "-" if result.diverged_step is None else str(result.diverged_step)),
        ("initial loss", fmt(result.initial_loss, ".4f")),
        ("final eval loss", fmt(result.final_loss, ".4f")),
        (f"final {result.metric_name}", fmt(result.final_metric, ".4f") + beside),
    ]
    if len(result.final_metrics) > 1:
        rows += [(f"  {k}", fmt(v["metric"], ".4f")) for k, v in result.final_metrics.items()]
    rows += [
        ("last max |logit|", fmt(last.get("max_abs_logit"), ".2f")),
        ("parameters", f"{result.num_params:,}"),
        ("elapsed s", f"{result.elapsed_s:.1f}"),
        ("steps/s", f"{result.steps / max(result.elapsed_s, 1e-9):.1f}"),
    ]
    if result.tensorboard is not None:
        rows.append(("tensorboard", result.tensorboard))
    title = f"train {result.config['task']} / {result.config['score']}"
    print_table(title, ("quantity", "value"), [(escape(k), escape(v)) for k, v in rows],
                left=("quantity",))


@app.command()
def sweep(
    config: Annotated[str, typer.Argument(
        help=escape("Sweep TOML file ([base], [axes], [[variant]])."))],
    db: Annotated[str | None, typer.Option("--db", help=escape(
        "SQLite results file (created if missing). [default: results.db in the working "
        "folder]"))] = None,
    workers: Annotated[int, typer.Option(min=1, help="Runs in parallel (1 thread each).")] = 1,
    executor: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join ('auto' finds one); default: a local Ray."),
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Run failed configs again.")
    ] = False,
    lease: Annotated[float, typer.Option(
        min=1.0, help="Seconds a claimed run stays this driver's without renewal: another "
        "driver on the same --db takes a killed driver's runs this long after it died (at once "
        "on the same machine).")
    ] = LEASE_S,
    patience: Annotated[float, typer.Option(
        min=0.0, help="Seconds to wait for runs other drivers hold while none of the grid "
        "finishes; then stop, exit 1 and say how many are still held.")
    ] = PATIENCE_S,
) -> None:
    """Run every grid point of a sweep into a SQLite store; rerun the same command to resume.

    Finished runs (done, diverged, failed) are skipped; runs a killed sweep left queued or
    running are redone. Several drivers may share one --db: each trains the runs it claims,
    none twice, and waits for the runs the others hold. Exit status 1 if any run failed, or
    if it gave up waiting for runs other drivers hold (--patience).
    """
    from attnscale.lab import sweep as S
    from attnscale.util.validate import check_input_file

    check_input_file("config", config)
    spec = S.load_spec(config)
    signal.signal(signal.SIGTERM, exit_on_sigterm)  # so the sweep hands back its claims
    S.make_executor(executor, workers, address)  # bad --executor / --address: exit 2 here
    with Progress("sweep", "runs", console=console) as shown:

        def progress(c: Counts) -> None:
            if db is None and not shown.tasks:  # the store opened: say where it is
                say_default_db("results ->")
            shown.update("", c.finished, c.total, sweep_note(c))

        counts = S.run_sweep(spec, db or DEFAULT_DB, workers=workers, executor=executor,
                             address=address, retry_failed=retry_failed, source=config,
                             progress=progress, lease_s=lease, patience_s=patience)
    print_sweep_summary(counts, db or DEFAULT_DB, patience)


def print_sweep_summary(counts: Counts, db: str, patience: float) -> None:
    """The sweep's final counts on stderr; exit 1 if any run failed or is still held."""
    console.print(
        f"{counts.total} runs: {counts.done} done, {counts.diverged} diverged, "
        f"{counts.failed} failed ({counts.skipped} already finished or run by another "
        f"driver){lost_note(counts.lost)} -> {db}",
        soft_wrap=True,
    )
    if counts.waiting:
        console.print(f"{counts.waiting} runs are still held by other drivers: gave up "
                      f"waiting after {patience:g} s without a run finishing", soft_wrap=True)
    if counts.failed or counts.waiting:
        raise typer.Exit(1)


def say_default_db(arrow: str) -> None:
    """Where results go (``results -> results.db``) or come from, when --db was not given:
    one line on stderr, once the database opened (bad input stays a single error line)."""
    console.print(f"{arrow} {DEFAULT_DB}", soft_wrap=True, markup=False, highlight=False)


def exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM ends a sweep as Ctrl-C would, unwinding so that it hands back its claims."""
    raise SystemExit(128 + signum)


def lost_note(lost: int) -> str:
    """The final line's note on results discarded because another driver took the run."""
    return f"; {lost} trained but taken over by another driver (not stored)" if lost else ""


def sweep_note(c: Counts) -> str:
    """What a sweep's progress says beside its count: diverged and failed runs, and the runs
    it waits for that other drivers hold."""
    waiting = f", waiting for {c.waiting} held by other drivers" if c.waiting else ""
    return f"diverged {c.diverged}, failed {c.failed}{waiting}"


@app.command()
def results(
    db: Annotated[str | None, typer.Option("--db", help=escape(
        "SQLite results file of a sweep. [default: results.db in the working folder]"))]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print runs as JSON.")] = False,
    csv_path: Annotated[str | None, typer.Option("--csv", help="Write runs to a CSV file.")] = None,
    parquet_path: Annotated[
        str | None, typer.Option("--parquet", help="Write runs to a Parquet file (needs "
                                 f"pyarrow: the {PARQUET_EXTRA} extra).")
    ] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only runs with this status.")
    ] = None,
    sweep_name: Annotated[
        str | None, typer.Option("--sweep", help="Only runs of the sweep with this name.")
    ] = None,
) -> None:
    """Export a sweep's runs: JSON on stdout, CSV / Parquet to a file, or a table."""
    from attnscale.lab import store as St
    from attnscale.lab.export import write_csv, write_parquet
    from attnscale.util.validate import check_input_file, check_output_file

    check_input_file("--db", db or DEFAULT_DB)
    csv_file = check_output_file("--csv", csv_path) if csv_path else None
    parquet_file = check_output_file("--parquet", parquet_path) if parquet_path else None
    if parquet_file:
        check_parquet_engine()  # before anything is printed or written
    with St.Store(db or DEFAULT_DB) as store:
        where = {"sweep": sweep_name} if sweep_name is not None else None
        runs = store.runs(status=status or None, where=where)
    if db is None:
        say_default_db("results <-")
    if as_json:
        print_json(runs)
    if csv_file:
        console.print(f"wrote {write_csv(runs, csv_file)} runs to {csv_file}", soft_wrap=True)
    if parquet_file:
        n = write_parquet(runs, parquet_file)
        console.print(f"wrote {n} runs to {parquet_file}", soft_wrap=True)
    if not (as_json or csv_path or parquet_path):
        print_runs(runs)


def check_parquet_engine() -> None:
    """ValueError naming ``--parquet`` and the extra to install when pyarrow is missing, before
    any file is written. pandas alone does not count: its ``to_parquet`` calls pyarrow (or
    fastparquet), and :func:`attnscale.lab.export.write_parquet` uses pyarrow directly."""
    if importlib.util.find_spec("pyarrow") is None:
        raise ValueError("--parquet needs pyarrow: install pyarrow with "
                         f"pip install 'attnscale[{PARQUET_EXTRA}]'")


def metric_of(run: dict) -> str:
    """The run's metric name (its task's ``metric_name``, e.g. accuracy or bits per char)."""
    from attnscale.lab.tasks import TASKS

    task = TASKS.get((run["config"] or {}).get("task"))
    return getattr(task, "metric_name", "metric").replace("_", " ")


def print_runs(runs: list[dict]) -> None:
    """The runs on stdout: id, task, group, width, lr, seed, status, loss, one column per metric
    name among them (accuracy and bits per char never share a column), diverged step."""
    from attnscale.lab.analysis import group_key

    metrics = list(dict.fromkeys(metric_of(r) for r in runs)) or ["metric"]
    columns = ("id", "task", "score", "width", "lr", "seed", "status", "loss", *metrics,
               "diverged")
    cells = []
    for r in runs:
        cfg = r["config"] or {}
        mine = metric_of(r)
        cells.append((
            r["id"], str(cfg.get("task", "-")), group_key(r), str(cfg.get("d_model", "-")),
            fmt(cfg.get("lr"), "g"), str(cfg.get("seed", "-")), r["status"],
            fmt(r["final_loss"], ".4f"),
            *(fmt(r["final_metric"], ".4f") if m == mine else "-" for m in metrics),
            "-" if r["diverged_step"] is None else str(r["diverged_step"]),
        ))
    print_table(f"{len(runs)} runs", columns, [[escape(c) for c in row] for row in cells],
                left=("id", "task", "score", "status"))
