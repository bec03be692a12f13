"""Sweeps: TOML parsing and grid ids, and real sweeps run through the CLI in subprocesses.

Nothing is mocked: the sweeps train tiny models in worker processes, the crash test SIGKILLs
the whole sweep (process group) at several moments, and the dead-worker test SIGKILLs one
worker process mid-run. The tests that join a started Ray cluster (a sweep by ``--address``,
and the report's cut-down full studies) share one ``ray start --head`` for the module.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from attnscale.audit.studies import PRESETS, cut_down, studies
from attnscale.cli.lab import results
from attnscale.lab.store import Store
from attnscale.lab.sweep import (
    Job,
    config_id,
    expand,
    load_spec,
    parse_spec,
    plan,
)
from attnscale.lab.train import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.toml"

TINY = """
[base]
task = "mqar"
seq_len = 32
d_model = 16
n_heads = 2
n_layers = 1
batch_size = 4
warmup_steps = 2
log_every = 10
"""


def cli(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnscale.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def start_sweep(config: Path, db: Path, *extra: str) -> subprocess.Popen:
    """The sweep CLI in its own process group (so killpg reaches its workers too).

    Its stderr goes to ``<db>.log`` (appended), which :func:`log_of` reads.
    """
    with open(log_of(db), "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "attnscale.cli", "sweep", str(config), "--db", str(db), *extra],
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            cwd=ROOT,
        )


def log_of(db: Path) -> Path:
    return db.with_suffix(".log")


def write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def n_history_rows(steps: int, log_every: int) -> int:
    """History rows of a finished run: every log_every-th step and the last step."""
    return len({s for s in range(steps) if s % log_every == 0} | {steps - 1})


# ------------------------------------------------------------------------------ parsing


def test_grid_is_variants_times_axes_resolved_with_defaults():
    spec = parse_spec(
        TINY
        + """
[axes]
lr = [1e-3, 1e-2]
seed = [0, 1]

[[variant]]
name = "dot"
score = "dot"

[[variant]]
name = "cosine-tau10"
score = "cosine"
tau = 10
"""
    )
    points = expand(spec)
    assert len(points) == 8
    assert [p.variant for p in points] == ["dot"] * 4 + ["cosine-tau10"] * 4
    p = points[-1]
    assert p.config == TrainConfig(**p.config).flat()
    assert p.config["tau"] == 10.0 and p.config["lr"] == 1e-2 and p.config["seed"] == 1
    assert "z_loss" in p.config  # defaults are part of the resolved config (and of the id)
    assert p.id == config_id(p.config) and len(p.id) == 16
    assert len({q.id for q in points}) == 8


def test_smoke_config_parses():
    assert len(expand(load_spec(SMOKE))) == 4


@pytest.mark.parametrize(
    "text,words",
    [
        ("lr = [", "bad TOML"),
        ("[bass]\nlr = 1", "bass: unknown key"),
        ("[base]\nlrr = 0.1", "[base] unknown TrainConfig field 'lrr' (did you mean 'lr'?)"),
        ("[axes]\nsteeps = [1]", "[axes] unknown TrainConfig field 'steeps'"),
        ("[base]\nmodel.d_modle = 8",
         "[base] unknown TrainConfig field 'model.d_modle' (did you mean 'model.d_model'?)"),
        ("[base]\noptim.d_model = 8", "[base] unknown TrainConfig field 'optim.d_model'"),
        ("[base]\nd_model = 8\nmodel.d_model = 16", "[base] model.d_model is given twice"),
        ("[base]\nmodel = 3", "[base] model must be a table of its fields"),
        ("[[variant]]\nname = 'x'\nfoo = 1", "[variant 'x'] unknown TrainConfig field 'foo'"),
        ("[axes]\nlr = []", "axis 'lr' is empty"),
        ("[axes]\nlr = 0.1", "axes.lr: Input should be a valid list"),
        ("[axes]\nscore = ['cosinus']", "unknown score 'cosinus'"),
        ("[base]\nscore = 'cosinus'", "[base] unknown score 'cosinus'"),
        ("[[variant]]\nscore = 'dot'", "variant.0.name: Field required"),
        ("[axes]\nlr = [1]\n[[variant]]\nname = 'x'\nlr = 2", "also axes"),
        ("[[variant]]\nname = 'x'\n[[variant]]\nname = 'x'", "repeated: ['x']"),
        ("[base]\nsteps = 5\nwarmup_steps = 10", "warmup_steps (10) must be <= steps (5)"),
    ],
)
def test_bad_specs_raise_one_line_value_errors(text, words):
    with pytest.raises(ValueError) as info:
        expand(parse_spec(text, source="x.toml"), source="x.toml")
    message = str(info.value)
    assert words in message and message.startswith("x.toml: ") and "\n" not in message


@pytest.mark.parametrize(
    "text,words",
    [
        ("lr = [", "bad TOML"),
        ("[base]\nlrr = 0.1", "unknown TrainConfig field 'lrr'"),
        ("[axes]\nlr = []", "axis 'lr' is empty"),
        ("[axes]\nscore = ['cosinus']", "unknown score 'cosinus'"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, text, words):
    db = tmp_path / "runs.db"
    out = cli("sweep", str(write(tmp_path, text)), "--db", str(db))
    assert_one_error_line(out, words)
    assert not db.exists()


def assert_one_error_line(out: subprocess.CompletedProcess, words: str) -> None:
    """Exit 2, and stderr is exactly one line: no leading blank line, no traceback."""
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, repr(out.stderr)
    assert lines[0].startswith("error: ") and words in lines[0], lines[0]


@pytest.mark.parametrize("kind", ["text", "foreign"])
def test_cli_bad_db_is_one_line_exit_2(tmp_path, kind):
    """The store refuses the file after the spec is read: the progress bar has not started,
    so nothing but the error line reaches stderr."""
    db = tmp_path / "other.db"
    if kind == "text":
        db.write_text("notes, not a database\n")
        words = "is not a SQLite database"
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE songs (title TEXT)")
        conn.close()
        words = "is not an attnscale results database"
    before = db.read_bytes()
    out = cli("sweep", str(write(tmp_path, TINY + "steps = 2\n")), "--db", str(db))
    assert_one_error_line(out, words)
    assert db.read_bytes() == before


def test_plan_skips_finished_and_redoes_interrupted(tmp_path):
    points = expand(parse_spec(TINY + "[axes]\nlr = [1e-3, 1e-2, 1e-1, 1.0, 10.0]\n"))
    ids = [p.id for p in points]
    with Store(tmp_path / "runs.db") as store:
        todo, counts = plan(store, points, "t", retry_failed=False)
        assert [t.id for t in todo] == ids and counts.skipped == 0
        assert all(isinstance(t, Job) for t in todo)
        assert [t.config for t in todo] == [p.config for p in points]
        store.finish(ids[0], {"status": "done", "history": [{"step": 0, "loss": 1.0}]})
        store.finish(ids[1], {"status": "diverged", "history": []})
        store.fail(ids[2], "ValueError: boom")
        store.mark_running(ids[3])  # left running by a killed sweep
        todo, counts = plan(store, points, "t", retry_failed=False)
        assert [t.id for t in todo] == ids[3:]
        assert (counts.done, counts.diverged, counts.failed, counts.skipped) == (1, 1, 1, 3)
        assert store.get(ids[3])["status"] == "queued"
        todo, counts = plan(store, points, "t", retry_failed=True)
        assert [t.id for t in todo] == ids[2:] and counts.skipped == 2
        assert store.get(ids[2])["status"] == "queued" and store.get(ids[2])["error"] is None


# ------------------------------------------------------------------------------ real sweeps


@pytest.fixture(scope="module")
def smoke_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("smoke") / "runs.db"
    out = cli("sweep", str(SMOKE), "--db", str(db), "--workers", "2")
    assert out.returncode == 0, out.stderr
    return db


def test_smoke_sweep_stores_complete_runs(smoke_db):
    points = expand(load_spec(SMOKE))
    with Store(smoke_db) as store:
        runs = store.runs(history=True)
        assert [r["id"] for r in runs] == [p.id for p in points]
        for r in runs:
            assert r["status"] == "done" and r["sweep"] == "smoke" and r["error"] is None
            assert len(r["history"]) == n_history_rows(10, 5)
            assert r["versions"]["torch"] and r["git_rev"] and r["initial_loss"] > 0
            assert r["started_at"] <= r["finished_at"] and r["worker"].startswith("pid ")
        assert store.integrity_check() == "ok"


def test_rerun_skips_finished_runs(smoke_db):
    with Store(smoke_db) as store:
        before = {r["id"]: r["finished_at"] for r in store.runs()}
    out = cli("sweep", str(SMOKE), "--db", str(smoke_db), "--workers", "2")
    text = " ".join(out.stderr.split())
    assert out.returncode == 0 and "(4 already finished or run by another driver)" in text
    with Store(smoke_db) as store:
        assert {r["id"]: r["finished_at"] for r in store.runs()} == before


def test_results_json_and_csv(smoke_db, tmp_path):
    csv_path = tmp_path / "runs.csv"
    out = cli("results", "--db", str(smoke_db), "--json", "--csv", str(csv_path))
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)
    assert len(runs) == 4
    keys = {"id", "status", "config", "final_loss", "final_metric", "diverged_step"}
    assert all(keys <= set(r) for r in runs)
    assert runs[0]["config"]["d_model"] == 16
    assert len(csv_path.read_text().strip().splitlines()) == 5


def test_results_bad_input(tmp_path, smoke_db):
    missing = tmp_path / "missing.db"
    with pytest.raises(ValueError, match="--db: no file"):  # the CLI exits 2 on these
        results(db=str(missing), as_json=True, csv_path=None, parquet_path=None, status=None)
    assert not missing.exists()
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        out = cli("results", "--db", str(smoke_db), "--parquet", str(tmp_path / "r.parquet"))
        assert_one_error_line(out, "install pyarrow")


def test_ray_executor_matches_local(smoke_db, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'attnscale[ray]')")
    db = tmp_path / "ray.db"
    out = cli("sweep", str(SMOKE), "--db", str(db), "--workers", "2", "--executor", "ray")
    assert out.returncode == 0, out.stderr
    with Store(smoke_db) as local, Store(db) as ray:
        want = {r["id"]: (r["final_loss"], r["final_metric"]) for r in local.runs()}
        got = {r["id"]: (r["final_loss"], r["final_metric"]) for r in ray.runs()}
        failed = [(r["id"], r["error"]) for r in ray.runs() if r["status"] == "failed"]
        assert not failed, failed  # the worker's error, should Ray ever fail a run here
        assert got == want
        assert [len(r["history"]) for r in ray.runs(history=True)] == [3] * 4


def test_ray_executor_joins_a_started_cluster_by_address(smoke_db, tmp_path, ray_head):
    """`ray start --head`, then --address host:port (token auth on when ~/.ray/auth_token
    exists, Ray >= 2.59), then the same final metrics as the local executor."""
    db = tmp_path / "cluster.db"
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    out = cli("sweep", str(SMOKE), "--db", str(db), "--workers", "2", "--executor", "ray",
              "--address", ray_head, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    with Store(smoke_db) as local, Store(db) as ray:
        want = {r["id"]: (r["final_loss"], r["final_metric"]) for r in local.runs()}
        assert {r["id"]: (r["final_loss"], r["final_metric"]) for r in ray.runs()} == want


REPORT_ON_RAY = """
import json, sys
from dataclasses import replace
from pathlib import Path
from attnscale.audit.report import run_studies
from attnscale.audit.studies import PRESETS, cut_down, studies
p = cut_down(PRESETS['full'])
p = replace(p, seeds=p.seeds[:1], task_seeds=p.task_seeds[:1])
runs = run_studies(studies(p), Path(sys.argv[1]), 'ray', 2, sys.argv[2])
print(json.dumps({name: len(r) for name, r in runs.items()}))
"""


def test_cut_down_full_studies_on_a_started_ray_cluster(tmp_path, ray_head):
    """``--full`` beyond one machine: the training studies of a cut-down full preset run on a
    real cluster. One seed: the cluster's work is one task per run, whatever the seed, and
    judging and drawing a report are the tiny preset's tests (tests/audit/test_report.py)."""
    # a fresh process, as `attnscale report` would be: Ray reads its auth settings at import
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    db = tmp_path / "results.db"
    done = subprocess.run([sys.executable, "-c", REPORT_ON_RAY, str(db), ray_head],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    preset = cut_down(PRESETS["full"])
    plan = studies(replace(preset, seeds=preset.seeds[:1], task_seeds=preset.task_seeds[:1]))
    assert set(counts) == set(plan), counts
    assert {k for k, n in counts.items() if not n} == {k for k, v in plan.items() if not v.seeds}
    plan = {k: v for k, v in plan.items() if v.seeds}  # the deep studies run only with --deep
    with Store(db) as store:
        runs = store.runs()
    assert {r["sweep"] for r in runs} == set(plan)
    # the full preset's extremes ran: its widest width and its largest head dimension
    assert max(r["config"]["d_model"] for r in runs if r["sweep"] == "lr_text") == 1024
    assert max(r["config"]["d_model"] for r in runs if r["sweep"] == "head_dim") == 512
    bad = [(r["status"], r.get("error")) for r in runs if r["status"] not in ("done", "diverged")]
    assert not bad, bad[:3]


def test_divergence_failure_and_dead_worker(tmp_path):
    """One sweep: a run killed by SIGKILL, a normal run, a diverging run, a raising run."""
    short = write(tmp_path, "too short for seq_len", "short.txt")
    config = write(
        tmp_path,
        TINY
        + f"""
[[variant]]
name = "slow"
steps = 20000
[[variant]]
name = "ok"
steps = 10
[[variant]]
name = "diverge"
lr = 100.0
steps = 20
[[variant]]
name = "raise"
task = "text"
text = "{short}"
steps = 10
""",
    )
    db = tmp_path / "runs.db"
    proc = start_sweep(config, db, "--workers", "2")
    try:
        pid = wait_for(lambda: worker_of(db, "slow"), timeout=120, log=log_of(db))
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=180) == 1, log_of(db).read_text()  # 1: some runs failed
    finally:
        kill_group(proc)
    with Store(db) as store:
        runs = {r["variant"]: r for r in store.runs(history=True)}
    assert runs["slow"]["status"] == "failed" and "SIGKILL" in runs["slow"]["error"]
    assert runs["ok"]["status"] == "done"
    assert runs["diverge"]["status"] == "diverged" and runs["diverge"]["diverged_step"] >= 0
    assert runs["diverge"]["history"][-1]["step"] == runs["diverge"]["diverged_step"]
    error = runs["raise"]["error"]
    assert runs["raise"]["status"] == "failed"
    assert error.startswith("ValueError:") and "too short" in error
    assert runs["slow"]["history"] == [] and runs["raise"]["history"] == []


def worker_of(db: Path, variant: str) -> int | None:
    """The pid of the worker running ``variant``, once it is running."""
    row = query(db, "SELECT worker FROM runs WHERE variant = ? AND status = 'running'", variant)
    return int(row[0][0].split()[-1]) if row and row[0][0] else None


def query(db: Path, sql: str, *args) -> list[tuple]:
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db, timeout=30) as conn:
            return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # tables not created yet
        return []


def wait_for(predicate, timeout: float, every: float = 0.05, log: Path | None = None):
    """``predicate()`` once it is truthy; on a timeout, the sweep's log (``log``) says why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    said = log.read_text()[-2000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout} s"
                         + (f"; the sweep's log:\n{said}" if said else ""))


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# ------------------------------------------------------------------------------ crash safety

RESUME_STEPS, RESUME_LOG = 150, 10


def check_store(db: Path, ids: list[str]) -> dict[str, str]:
    """Integrity ok, each point at most once, no partial metrics; returns id -> status."""
    with Store(db) as store:
        assert store.integrity_check() == "ok"
        runs = store.runs()
        counts = store.metric_counts()
    assert len(runs) == len({r["id"] for r in runs}) and {r["id"] for r in runs} <= set(ids)
    for r in runs:
        if r["status"] == "done":
            assert counts.get(r["id"]) == n_history_rows(RESUME_STEPS, RESUME_LOG), r
        else:
            assert r["id"] not in counts, r
    return {r["id"]: r["status"] for r in runs}


def finished_count(db: Path) -> int:
    rows = query(db, "SELECT COUNT(*) FROM runs WHERE status IN ('done', 'diverged')")
    return rows[0][0] if rows else 0


def test_sigkill_at_any_moment_then_resume(tmp_path):
    config = write(
        tmp_path,
        TINY + f"steps = {RESUME_STEPS}\n[axes]\nlr = [1e-3, 3e-3, 1e-2, 3e-2]\nseed = [0, 1]\n",
    )
    config.write_text(config.read_text().replace("log_every = 10", f"log_every = {RESUME_LOG}"))
    ids = [p.id for p in expand(load_spec(config))]
    db = tmp_path / "runs.db"
    start = wall_start = 0.0

    def after_half_a_second(prior: int) -> bool:
        return time.monotonic() - start > 0.5

    def once_queued(prior: int) -> bool:  # this sweep has planned; its pool is starting
        sql = "SELECT COUNT(*) FROM runs WHERE status = 'queued' AND queued_at >= ?"
        rows = query(db, sql, wall_start)
        return bool(rows) and rows[0][0] == len(ids) - prior

    def after_first_finished(prior: int) -> bool:
        return finished_count(db) >= prior + 1

    def mid_way(prior: int) -> bool:
        return finished_count(db) >= max(prior + 1, len(ids) // 2)

    for moment in (after_half_a_second, once_queued, after_first_finished, mid_way):
        prior = finished_count(db)
        start, wall_start = time.monotonic(), time.time()
        proc = start_sweep(config, db, "--workers", "2")
        try:
            wait_for(lambda m=moment, p=prior, q=proc: m(p) or q.poll() is not None,
                     timeout=120, log=log_of(db))
        finally:
            kill_group(proc)
        check_store(db, ids)

    statuses = check_store(db, ids)
    assert 0 < sum(s == "done" for s in statuses.values()) < len(ids)  # killed mid-sweep
    with Store(db) as store:
        kept = {r["id"]: r["finished_at"] for r in store.runs(status="done")}
    proc = start_sweep(config, db, "--workers", "2")
    assert proc.wait(timeout=240) == 0, log_of(db).read_text()
    statuses = check_store(db, ids)
    assert sorted(statuses) == sorted(ids) and set(statuses.values()) == {"done"}
    with Store(db) as store:
        again = {r["id"]: r["finished_at"] for r in store.runs(status="done")}
    assert {k: again[k] for k in kept} == kept  # finished runs were not redone


def test_a_kept_pool_serves_several_sweeps_and_opens_only_when_there_is_work(tmp_path):
    """run_sweep with a :class:`Kept` pool: the first sweep with runs opens it, later sweeps
    reuse its workers (same processes), a sweep with nothing left to run opens nothing, and
    close() stops the workers."""
    from attnscale.lab.executors import Kept, LocalExecutor
    from attnscale.lab.sweep import run_sweep

    opened: list[int] = []

    class Counting(LocalExecutor):
        def __enter__(self) -> Counting:
            opened.append(1)
            return super().__enter__()

    spec = load_spec(SMOKE)
    db = tmp_path / "kept.db"
    kept = Kept(Counting(1))
    assert run_sweep(spec, db, pool=kept).to_run == 4 and opened == [1]
    again = parse_spec(SMOKE.read_text().replace("1e-3, 1e-2", "3e-3"))
    assert run_sweep(again, db, pool=kept).to_run == 2 and opened == [1]
    kept.close()
    assert not kept.is_open
    assert run_sweep(spec, db, pool=kept).to_run == 0 and opened == [1]  # nothing to run
    with Store(db) as store:
        runs = store.runs()
    assert sum(r["status"] == "done" for r in runs) == 6
    assert len({r["worker"] for r in runs}) == 1, runs  # one worker process ran all six


def test_a_freed_worker_gets_its_next_job_before_its_outcome_is_stored():
    """The local pool hands a worker its next job before yielding the outcome it just
    returned, so the worker trains while the caller stores the result."""
    from attnscale.lab.executors import Job, LocalExecutor

    config = {"task": "text", "seq_len": 16, "batch_size": 4, "n_layers": 1, "steps": 2,
              "d_model": 16, "n_heads": 2}
    events: list[tuple[str, str]] = []
    jobs = [Job(name, {**config, "seed": seed}) for seed, name in enumerate("abc")]
    with LocalExecutor(workers=1) as pool:
        for outcome in pool.run(jobs, lambda job_id, worker: events.append(("start", job_id))):
            assert outcome.error is None, outcome.error
            events.append(("stored", outcome.id))
    assert events == [("start", "a"), ("start", "b"), ("stored", "a"), ("start", "c"),
                      ("stored", "b"), ("stored", "c")]


def test_a_claim_that_fails_still_hands_over_the_finished_run():
    """If handing out the next job raises (a lost lease), the outcome already received is
    yielded first, so the caller stores it, and then the error propagates."""
    from attnscale.lab.executors import Job, LocalExecutor

    config = {"task": "text", "seq_len": 16, "batch_size": 4, "n_layers": 1, "steps": 2,
              "d_model": 16, "n_heads": 2}

    def claim(job_id: str, worker: str | None) -> bool:
        if job_id == "b":
            raise RuntimeError("lease lost")
        return True

    stored: list[str] = []
    with LocalExecutor(workers=1) as pool, pytest.raises(RuntimeError, match="lease lost"):
        for outcome in pool.run([Job("a", config), Job("b", {**config, "seed": 1})], claim):
            stored.append(outcome.id)
    assert stored == ["a"]


def test_grids_of_one_sweep_run_as_one_batch_largest_first(tmp_path, recording_pool):
    """Several grids of one sweep name (each arm at its own LR, as the report's reported seeds
    are) go to the pool as one batch, deduplicated, the widest model first; grids of two names
    (every study's tuning grid, as the report's first phase) also run as one batch, each run
    stored under its own grid's name (the first grid's for a config two grids share)."""
    from attnscale.lab.sweep import SweepSpec, cost_hint, run_sweep

    base = {"task": "text", "seq_len": 16, "batch_size": 4, "n_layers": 1, "steps": 2}
    grids = [SweepSpec(name="s", base={**base, "d_model": d}, axes={"seed": [0, 1]})
             for d in (16, 64, 32)]
    pool = recording_pool()
    counts = run_sweep([*grids, grids[0]], tmp_path / "b.db", pool=pool)
    assert counts.to_run == 6 and len(pool.order) == 6
    assert [c["d_model"] for c in pool.order] == [64, 64, 32, 32, 16, 16]
    assert [c["seed"] for c in pool.order] == [0, 1, 0, 1, 0, 1]  # grid order among equals
    assert cost_hint({"d_model": 64, "seq_len": 16}) > cost_hint({"d_model": 32, "seq_len": 16})
    other = SweepSpec(name="t", base={**base, "d_model": 16}, axes={"seed": [0, 5]})
    pool = recording_pool()
    counts = run_sweep([grids[0], other], tmp_path / "c.db", pool=pool)
    assert counts.to_run == 3 and len(pool.order) == 3  # seed 0 of d_model 16 is in both
    from attnscale.lab.store import Store

    with Store(tmp_path / "c.db") as store:
        names = {r["config"]["seed"]: r["sweep"] for r in store.runs()}
    assert names == {0: "s", 1: "s", 5: "t"}
    with pytest.raises(ValueError, match="spec: give at least one sweep"):
        run_sweep([], tmp_path / "d.db", pool=recording_pool())
