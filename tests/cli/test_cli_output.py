"""What the command line prints: version, help defaults, option names, summaries, tables.

Tables are checked in both layouts: the plain one (CliRunner's stdout is not a terminal) and
the rich one at terminal widths too narrow for one-line headers, where no header word may be
cut ("H without 1/√d" must never read "H with… 1/√d").
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnscale.cli import app, lab, measure, tables
from attnscale.cli.app import console
from attnscale.lab import train as T
from attnscale.lab.build import build_task
from attnscale.lab.config import TrainConfig
from attnscale.lab.sections import FIELDS, field_info
from attnscale.lab.store import Store
from attnscale.measure import inspection as I

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, a package before Python 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "src" / "attnscale" / "cli"
runner = CliRunner()
WIDE = {"COLUMNS": "400", "TERMINAL_WIDTH": "400"}
MAKEFILE_EXTRAS = re.compile(r"INSTALL\) .*-e '\.\[([a-z,]+)\]'")  # the extras `make` installs


def flat(text: str) -> str:
    """Help text with the rich box characters and runs of whitespace collapsed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


# -- 1. --version -------------------------------------------------------------------------------


def test_version_prints_the_package_version_and_exits_0():
    out = runner.invoke(app, ["--version"])
    assert out.exit_code == 0, out.output
    assert out.stdout == f"attnscale {metadata.version('attnscale')}\n"


# -- 2. no source locations in log lines ----------------------------------------------------------


def test_every_console_in_the_cli_logs_without_source_locations():
    calls = [node for path in CLI.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Console"]
    assert calls, "no Console found: the check would pass vacuously"
    for call in calls:
        kw = {k.arg: k.value for k in call.keywords}
        assert "log_path" in kw and kw["log_path"].value is False, ast.unparse(call)


@pytest.mark.parametrize("make", [lambda: console, tables.stdout_console], ids=["stderr", "stdout"])
def test_log_lines_carry_no_file_and_line(make):
    con = make()
    with con.capture() as cap:
        con.log("step 3 done")
    text = cap.get()
    assert "step 3 done" in text and not re.search(r"\w+\.py:\d+", text), text


# -- 3. help shows every default, and the right ones -------------------------------------------


def test_train_help_shows_the_defaults_runs_use():
    out = runner.invoke(app, ["train", "--help"], env=WIDE)
    assert out.exit_code == 0, out.output
    text = flat(out.stdout)
    config = TrainConfig().flat()
    for what, field in [("Peak learning rate.", "lr"), ("Optimizer steps.", "steps"),
                        ("Model width.", "d_model"), ("Query heads.", "n_heads"),
                        ("Transformer blocks.", "n_layers"), ("Adam β2.", "beta2")]:
        assert f"{what} [default: {config[field]}]" in text, (what, text)
    pairs = build_task(TrainConfig()).num_kv_pairs  # TASK_DEFAULTS applied: what a run uses
    assert f"mqar key-value pairs. [default: {pairs} for mqar]" in text
    assert "mqar key-value pairs (8)" not in text
    for field in FIELDS:  # every fixed default is shown
        info = field_info(field)
        if info.default is not None and info.default_factory is None:
            assert f"[default: {config[field]}" in text, field


def test_sweep_help_keeps_its_brackets():
    out = runner.invoke(app, ["sweep", "--help"], env=WIDE)
    assert out.exit_code == 0, out.output
    assert "Sweep TOML file ([base], [axes], [[variant]])." in flat(out.stdout)


# -- 4. option names match the config keys; the old spellings still work --------------------


def fake_run(seen: list[TrainConfig], **task: object):
    def run(config: TrainConfig, progress=None) -> T.RunResult:
        seen.append(config)
        return T.RunResult(
            status="done", final_loss=0.7, final_metric=0.5,
            final_metrics={"n": {"loss": 0.7, "metric": 0.5}}, metric_name="accuracy",
            diverged_step=None, steps=config.optim.steps, initial_loss=2.0, history=[],
            config=config.flat(), task=dict(task), model={}, seed=config.seed,
            versions={}, git_rev="", elapsed_s=1.0, num_params=10)
    return run


@pytest.mark.parametrize("flags", [
    ["--n-heads", "4", "--n-layers", "3", "--n-kv-heads", "2"],
    ["--heads", "4", "--layers", "3", "--kv-heads", "2"],
    ["--model.n-heads", "4", "--model.n-layers", "3", "--model.n-kv-heads", "2"],
], ids=["config-names", "old-names", "section-paths"])
def test_model_options_have_config_names_and_old_aliases(flags, monkeypatch):
    seen: list[TrainConfig] = []
    monkeypatch.setattr(T, "run", fake_run(seen, chance_level=0.25))
    out = runner.invoke(app, ["train", "--json", "--d-model", "32", *flags])
    assert out.exit_code == 0, out.output
    model = seen[0].model
    assert (model.n_heads, model.n_layers, model.n_kv_heads, model.d_model) == (4, 3, 2, 32)


def test_help_lists_the_config_name_first():
    text = flat(runner.invoke(app, ["train", "--help"], env=WIDE).stdout)
    for new, old in [("--n-heads", "--heads"), ("--n-layers", "--layers")]:
        assert f"{new},--model.{new[2:]},{old}" in text.replace(", ", ","), text


# -- 5. run summary: the config that matters, the chance level beside the metric --------------


@pytest.mark.parametrize("chance", [0.25, 0.125])
def test_train_summary_shows_config_and_chance(chance, monkeypatch):
    monkeypatch.setattr(T, "run", fake_run([], chance_level=chance))
    out = runner.invoke(app, ["train", "--d-model", "48", "--n-heads", "3", "--lr", "0.003",
                              "--steps", "7", "--seed", "5", "--score", "cosine"])
    assert out.exit_code == 0, out.output
    rows = dict(line.split("\t") for line in out.stdout.splitlines()[2:])
    assert {k: rows[k] for k in ("task", "score", "width", "heads", "layers", "lr", "steps",
                                 "seed")} == {"task": "mqar", "score": "cosine", "width": "48",
                                              "heads": "3", "layers": "2", "lr": "0.003",
                                              "steps": "7", "seed": "5"}
    assert rows["final accuracy"] == f"0.5000 (chance {chance:.4g})"


def test_a_real_run_reports_its_tasks_chance_level():
    out = runner.invoke(app, ["train", "--steps", "1", "--num-kv-pairs", "2", "--d-model", "8",
                              "--n-layers", "1", "--batch-size", "2", "--eval-size", "4",
                              "--seq-len", "16", "--no-stats"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.stdout.splitlines() if x.startswith("final accuracy"))
    assert line.endswith("(chance 0.5)"), line  # 1 / num_kv_pairs


# -- 6. results: --sweep, task, width and one column per metric name -----------------------------


def finished(store: Store, run_id: str, sweep: str, task: str, metric: float) -> None:
    store.add_runs([{"id": run_id, "config": {"task": task, "d_model": 64, "lr": 0.01,
                                              "seed": 1, "score": "dot"}}], sweep=sweep)
    store.finish(run_id, {"status": "done", "final_loss": 1.0, "final_metric": metric,
                          "initial_loss": 5.0, "diverged_step": None, "steps": 3,
                          "elapsed_s": 0.1, "versions": {}, "git_rev": "", "history": []})


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "runs.db"
    with Store(path) as store:
        finished(store, "r-acc", "recall", "mqar", 0.75)
        finished(store, "r-bpc", "chars", "text", 2.5)
    return str(path)


def table(stdout: str) -> list[dict[str, str]]:
    lines = stdout.splitlines()
    assert lines[0].startswith("# ")
    header = lines[1].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[2:]]


def test_results_name_the_metric_and_never_mix_two(db):
    out = runner.invoke(app, ["results", "--db", db])
    assert out.exit_code == 0, out.output
    rows = {r["id"]: r for r in table(out.stdout)}
    assert "metric" not in rows["r-acc"]
    assert rows["r-acc"]["accuracy"] == "0.7500" and rows["r-acc"]["bits per char"] == "-"
    assert rows["r-bpc"]["bits per char"] == "2.5000" and rows["r-bpc"]["accuracy"] == "-"
    assert (rows["r-acc"]["task"], rows["r-acc"]["width"]) == ("mqar", "64")
    assert rows["r-bpc"]["task"] == "text"


@pytest.mark.parametrize("sweep,ids", [("recall", ["r-acc"]), ("chars", ["r-bpc"]), ("x", [])])
def test_results_filter_by_sweep(sweep, ids, db):
    out = runner.invoke(app, ["results", "--db", db, "--sweep", sweep])
    assert out.exit_code == 0, out.output
    assert [r["id"] for r in table(out.stdout)] == ids


# -- 7. headers are never cut ------------------------------------------------------------------


def inspect_result() -> dict:
    head = dict(head=0, logit_std=1.0, max_abs_logit=2.0, entropy=1.0, entropy_uniform=1.1,
                max_weight=0.5, effective_keys=2.0, entropy_unscaled=0.3, entropy_cosine_tau1=1.0)
    return {"model": "m", "n_tokens": 3, "n_sentences": 1,
            "layers": [{"layer": 0, "heads": [head]}]}


def test_not_a_tty_prints_every_header_whole(monkeypatch):
    monkeypatch.setattr(I, "inspect_model", lambda *a, **k: inspect_result())
    out = runner.invoke(app, ["inspect", "--sentence", "hi"], env={"COLUMNS": "40"})
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[1].split("\t") == list(measure.INSPECT_COLUMNS)
    assert "…" not in out.stdout


@pytest.mark.parametrize("width", [40, 70, 84, 100, 200])
def test_a_narrow_terminal_wraps_headers_at_words_never_cuts(width, monkeypatch, capsys):
    monkeypatch.setattr(tables, "interactive", lambda: True)
    monkeypatch.setenv("COLUMNS", str(width))
    measure.print_inspect_table(inspect_result())
    text = capsys.readouterr().out
    assert "…" not in text
    words = set(text.split())
    for header in measure.INSPECT_COLUMNS:
        assert set(header.split()) <= words, (header, text)
    if "\t" not in text:  # the rich table: it fits the terminal (the plain layout need not)
        assert max(len(line) for line in text.splitlines()) <= width
    assert ("\t" in text) == (width < 84), text  # 84: the narrowest width that fits every word


# -- 8. --parquet names the extra that installs pyarrow -------------------------------------


def test_the_parquet_extra_holds_pyarrow_and_the_error_names_it(db, tmp_path, monkeypatch):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(dep.startswith("pyarrow") for dep in extras[lab.PARQUET_EXTRA])
    assert "parquet" in MAKEFILE_EXTRAS.search((ROOT / "Makefile").read_text())[1].split(",")
    monkeypatch.setattr(lab.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"--parquet .*attnscale\[parquet\]"):
        lab.check_parquet_engine()


def hide_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow is not installed, as far as the CLI can tell; every other module (pandas
    included, a stub if it is not installed) is found."""
    real = lab.importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name.split(".")[0] == "pyarrow":
            return None
        return real(name, *args, **kwargs) or object()

    monkeypatch.setattr(lab.importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # and importing it fails


@pytest.mark.parametrize("also", [[], ["--json"], ["--csv", "{dir}/r.csv"]])
def test_parquet_without_pyarrow_is_one_line_exit_2_even_with_pandas(db, tmp_path, monkeypatch,
                                                                      capsys, also):
    from attnscale.cli import run as cli_run

    hide_pyarrow(monkeypatch)
    assert lab.importlib.util.find_spec("pandas") is not None
    target = tmp_path / "r.parquet"
    args = [a.replace("{dir}", str(tmp_path)) for a in also]
    assert cli_run(["results", "--db", db, "--parquet", str(target), *args]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "error: --parquet needs pyarrow: install pyarrow with pip install 'attnscale[parquet]'"]
    assert out == ""  # nothing printed and nothing written before the error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]


def test_parquet_with_pyarrow_writes_every_run(db, tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed (make test "
                             "installs it: the parquet extra)")
    from attnscale.cli import run as cli_run

    target = tmp_path / "r.parquet"
    assert cli_run(["results", "--db", db, "--parquet", str(target)]) == 0
    assert capsys.readouterr().err.split() == ["wrote", "2", "runs", "to", str(target)]
    assert sorted(pq.read_table(target).column("id").to_pylist()) == ["r-acc", "r-bpc"]


# -- 9. the report's verdict table: questions answered, a smoke test said so ------------------


def report_result(smoke: bool) -> dict:
    claim = {"id": "C1", "verdict": "supported", "headline": "supported: max error 4.5e-07"}
    question = {"id": "Q3", "verdict": "refuted", "headline": "refuted: at n=128 +0.01",
                "answer": "No measurable accuracy gain (at n=128 +0.01)"}
    return {"claims": [claim], "questions": [question], "smoke": smoke, "elapsed_s": 3.0,
            "runs_trained": 0}


@pytest.mark.parametrize("smoke", [True, False])
def test_report_table_piped_at_80_columns(smoke, monkeypatch, capsys):
    from attnscale.cli import audit

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(tables, "interactive", lambda: False)
    audit.print_verdicts(report_result(smoke), "quick" if smoke else "standard", "report")
    captured = capsys.readouterr()
    text = captured.out
    assert "…" not in text
    assert "ID\tverdict\theadline" in text
    assert "Q3\tanswer\tNo measurable accuracy gain" in text
    assert ("smoke test" in text) == smoke
    assert ("not evidence" in captured.err) == smoke  # the note goes to stderr, with the logs
    assert "every training run reused" in captured.err
