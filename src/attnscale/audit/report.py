"""``attnscale report``: measure every claim, judge it by its printed rule, write one page.

The pipeline:

1. **Measure** what each claim declares without training (:mod:`attnscale.audit.measurements`:
   exactness checks, theory and Monte Carlo, the timing study, the MiniLM inspection),
   cached in the results database's ``measurements`` table, and run the training studies
   (:mod:`attnscale.audit.studies`; tuning seeds first, :mod:`attnscale.audit.running`) through
   the sweep runner into the same database, so a rerun resumes and skips finished runs.
2. **Gather evidence** per registered claim (:mod:`attnscale.audit.claim`; one module per
   claim in :mod:`attnscale.audit.claims`) from the stored runs and measurements, into its
   typed evidence model.
3. **Judge** each claim (docs/claims.md) with its rule, draw its figures, build its tables
   (``Claim.panels``) and render the page (:mod:`attnscale.audit.render`).
4. **Write** ``OUT/index.html`` (self-contained: figures embedded, no network requests),
   ``OUT/report.json`` (schema: docs/report.schema.json) and ``OUT/figures/*.png``.

The report's elapsed time is also stated in units of a fixed reference workload timed before
and after (:mod:`attnscale.measure.pace`), since the wall time of the same work moves with the
host's speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnscale.audit import explorer, figures, scale
from attnscale.audit.claim import Claim, Sources, training_plan
from attnscale.audit.measurements import cached, measure_all
from attnscale.audit.render import errors, judge_all, panels, render_html
from attnscale.audit.running import StudyRunner, study_runs
from attnscale.audit.studies import PRESETS, Preset, Study, with_seed_offset
from attnscale.audit.takeaways import answer, takeaways
from attnscale.audit.verdicts import ERROR
from attnscale.lab.executors import EXECUTORS
from attnscale.lab.records import Run
from attnscale.lab.store import Store
from attnscale.measure.pace import pace_record, reference_seconds
from attnscale.util.jsonio import dumps, jsonable
from attnscale.util.provenance import git_revision, versions
from attnscale.util.validate import check_choice, check_int, check_output_folder

# 2: four verdicts, headline and plain sentences, the timing study
# 3: takeaways, per-entry scale and (questions) answer, smoke, runs_trained, figures with alt text
# 4: "error" entries (verdict "error", with "error"), per-entry figure_errors, top-level errors
# 5: one module per claim: the formula claim's evidence is its cases, the cosine-range claim its
#    own measurement, the MiniLM question the inspection
# 6: per-entry panels (a claim's own tables) and panel_errors; the timing study is no longer a
#    top-level key (its table is its claim's panel, its numbers that claim's evidence)
SCHEMA_VERSION = 6


def run_studies(plan: dict[str, Study], db: Path, executor: str, workers: int,
                address: str | None, progress: Callable[[str, Any], None] | None = None,
                ) -> dict[str, list[Run]]:
    """Run (or resume) every study into the results database; returns each study's runs (typed
    records)."""
    with StudyRunner(db, executor, workers, address, progress) as runner:
        runner.run_all(plan.values())
    with Store(db) as store:
        return {name: study_runs(store, study) for name, study in plan.items()}


def explorer_fragment(store: Store) -> str:
    """The interactive explorer, its theory grids cached like every other measurement."""
    key = {"attnscale": versions().get("attnscale"), "schema": explorer.SCHEMA,
           "scores": list(explorer.page_scores())}
    data = cached(store, "explorer", key, explorer.explorer_data)
    return explorer.render_explorer(data)


def complete(claim: Claim, e: dict[str, Any], ev: Any, folder: Path) -> None:
    """Add to a judged entry ``e`` its figures (drawn into ``folder``) and its tables (the
    claim's ``panels``), each with the failures of those that could not be made (none for an
    entry whose rule failed), and a question's answer."""
    if ev is not None and e["verdict"] != ERROR:
        e["figures"], e["figure_errors"] = figures.draw(claim, ev, e["numbers"], folder)
        e["panels"], e["panel_errors"] = panels(claim, e)
    else:
        e["figures"], e["figure_errors"], e["panels"], e["panel_errors"] = [], [], [], []
    if claim.question:
        e["answer"] = answer(e, claim.answers)


def build_report(
    preset: str | Preset = "standard",
    out: str | Path = "report",
    db: str | Path | None = None,
    executor: str = "local",
    workers: int = 2,
    address: str | None = None,
    say: Callable[[str], None] = lambda msg: None,
    progress: Callable[[str, Any], None] | None = None,
    seed_offset: int = 0,
) -> dict[str, Any]:
    """Measure, judge and write the report into folder ``out``; returns the report.json
    content. A rule that raised, evidence that is missing, a figure that failed to draw and a
    table that failed to build are listed in its ``"errors"`` (and shown on the page), never
    turned into a verdict; the CLI exits 1 when there are any. ``db`` is the results database
    (default ``out/results.db``); ``seed_offset`` K trains every study on disjoint seeds
    (:func:`attnscale.audit.studies.with_seed_offset`)."""
    p = preset if isinstance(preset, Preset) else PRESETS[check_choice("preset", preset, PRESETS)]
    p = with_seed_offset(p, check_int("seed_offset", seed_offset, minimum=0))
    check_int("workers", workers, minimum=1)
    check_choice("executor", executor, EXECUTORS)
    out = check_output_folder("out", out)
    pace_start = reference_seconds()  # the host's pace now (measure.pace), outside elapsed_s
    started = time.perf_counter()
    db = Path(db) if db else out / "results.db"
    with Store(db) as store:
        measured = measure_all(p, store, say)
        n_before = sum(store.counts().values())
    say("training studies")
    plan = training_plan(p)
    runs = run_studies(plan, db, executor, workers, address, progress)
    say("judging")
    with Store(db) as store:
        n_runs = sum(store.counts().values())
    judged = judge_all(Sources(p, plan, runs, measured))
    for claim, e, ev in judged:
        complete(claim, e, ev, out / "figures")
    claims = [e for c, e, _ in judged if not c.question]
    questions = [e for c, e, _ in judged if c.question]
    elapsed = time.perf_counter() - started
    pace_end = reference_seconds()
    report = jsonable({
        "schema_version": SCHEMA_VERSION, "preset": p.name, "seed_offset": seed_offset,
        "smoke": scale.is_smoke(p.name), "takeaways": takeaways(claims + questions),
        "seeds": list(p.seeds), "task_seeds": list(p.task_seeds),
        "tune_seeds": list(p.tune_seeds),
        "study_seeds": {name: list(study.seeds) for name, study in plan.items()},
        "claims": claims,
        "questions": questions, "versions": versions(), "git_rev": git_revision(),
        "n_runs": n_runs, "runs_trained": n_runs - n_before,
        "errors": errors(claims + questions), "elapsed_s": elapsed,
        "host_pace": pace_record(pace_start, pace_end, elapsed),
    })
    (out / "report.json").write_text(dumps(report, indent=1))
    with Store(db) as store:
        explorer_html = explorer_fragment(store)
    (out / "index.html").write_text(render_html(report, explorer_html))
    return report
