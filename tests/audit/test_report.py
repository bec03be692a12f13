"""The report end to end (tiny preset), its JSON schema, HTML escaping and caching."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import matplotlib.pyplot as plt
import pytest

from attnscale.audit import render
from attnscale.audit import report as R
from attnscale.audit.claim import (
    Claim,
    Measurement,
    Panel,
    Says,
    Sources,
    Training,
    all_claims,
    registered,
    training_plan,
)
from attnscale.audit.evidence import Model
from attnscale.audit.measurements import measurement_key
from attnscale.audit.schema import base_schema, report_schema
from attnscale.audit.studies import PRESETS, TEXT, Study, schedule
from attnscale.audit.theory_plots import save
from attnscale.audit.verdicts import REFUTED, SUPPORTED, Verdict
from attnscale.lab.store import Store
from attnscale.util.provenance import versions

SCHEMA = report_schema()
DOCS_SCHEMA = Path(__file__).parents[2] / "docs" / "report.schema.json"
IDS = [f"C{i}" for i in range(1, 14)] + ["Q1", "Q2", "Q3", "Q4", "Q5"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    started = time.perf_counter()
    result = R.build_report("tiny", out=out, workers=2)
    return out, result, time.perf_counter() - started


def test_report_json_validates(tiny):
    out, result, _ = tiny
    on_disk = json.loads((out / "report.json").read_text())
    jsonschema.validate(on_disk, SCHEMA)
    assert [c["id"] for c in on_disk["claims"] + on_disk["questions"]] == IDS
    assert on_disk == json.loads(json.dumps(result))


def test_every_claim_has_a_computed_verdict_and_its_rule(tiny):
    _, result, _ = tiny
    for entry in result["claims"] + result["questions"]:
        assert entry["verdict"] in ("supported", "refuted", "depends", "inconclusive")
        assert entry["rule"] and entry["because"] and entry["headline"]
    by_id = {c["id"]: c for c in result["claims"]}
    assert by_id["C1"]["verdict"] == "supported"  # the implementation is exact
    assert by_id["C8"]["verdict"] == "refuted"  # E[q·k] is 0, not O(d_k)
    # the tiny preset trains 3 steps: no task is learned, so no task claim is decided
    assert all(by_id[c]["verdict"] == "inconclusive" for c in ("C3", "C4"))


def test_tiny_preset_runs_every_study_with_three_seeds(tiny):
    from attnscale.audit.studies import PRESETS, studies
    out, _, _ = tiny
    with Store(out / "results.db") as store:
        runs = store.runs()
    plan = studies(PRESETS["tiny"])
    for name, study in plan.items():
        mine = [r for r in runs if r["sweep"] == name]
        if not study.seeds:  # a deep study, planned with no seeds outside --deep
            assert not mine, name
            continue
        assert {r["variant"] for r in mine} == set(study.arms), name
        reported = {r["config"]["seed"] for r in mine} - set(study.tune_seeds)
        assert reported == set(study.seeds) and len(reported) >= 3, name


def test_page_is_self_contained(tiny):
    out, _, _ = tiny
    html = (out / "index.html").read_text()
    for cid in IDS:
        assert f'id="{cid}"' in html
    assert "src=\"http" not in html and "href=\"http" not in html
    assert html.count("data:image/png;base64,") >= 10
    assert (out / "figures").is_dir() and any((out / "figures").glob("*.png"))


def test_rerun_reuses_everything(tiny):
    out, first, _ = tiny
    again = R.build_report("tiny", out=out, workers=2)
    assert first["runs_trained"] == first["n_runs"] > 0 and again["runs_trained"] == 0
    assert [c["verdict"] for c in again["claims"]] == [c["verdict"] for c in first["claims"]]
    assert again["n_runs"] == first["n_runs"]
    with Store(out / "results.db") as store:  # every measurement is cached in the one store
        kinds = {r[0] for r in store.conn.execute("SELECT kind FROM measurements")}
    declared = {m.kind for c in all_claims() for m in c.measurements}
    assert kinds == declared | {"explorer"}
    assert {"exactness", "qk", "rem", "bench", "jacobian", "minilm", "identity"} <= declared


def test_html_escapes_every_string():
    evil = "<script>alert('x')</script>"
    entry = {"id": "C1", "claim": evil, "measures": evil, "verdict": "supported", "rule": evil,
             "because": evil, "headline": evil, "plain": [evil], "regime": evil,
             "smallest": evil, "evidence": {"config": evil},
             "numbers": {}, "figures": [], "runs": [evil],
             "panels": [{"title": evil, "columns": [evil], "rows": [[evil]], "note": evil}],
             "panel_errors": [evil]}
    report = {"claims": [entry], "questions": [], "preset": evil, "git_rev": evil,
              "versions": {"attnscale": evil, "torch": evil}, "elapsed_s": 1.0, "n_runs": 0}
    html = render.render_html(report, "<p>explorer</p>")
    assert evil not in html
    assert "&lt;script&gt;alert(" in html


def test_the_evidence_on_the_page_is_strict_json():
    entry = {"id": "C1", "claim": "c", "measures": "m", "verdict": "supported", "rule": "r",
             "because": "b", "headline": "h", "plain": [], "regime": "", "smallest": "",
             "evidence": {"x": math.nan, "y": [1.5]}, "numbers": {}, "figures": [], "runs": []}
    report = {"claims": [entry], "questions": [], "preset": "tiny", "git_rev": "abc",
              "versions": {"attnscale": "0"}, "elapsed_s": 1.0, "n_runs": 0}
    html = render.render_html(report, "")
    quoted = '&#34;x&#34;: '  # the page escapes the JSON's quotes
    assert quoted + "null" in html and quoted + "NaN" not in html


def test_bad_preset_workers_and_executor(tmp_path):
    with pytest.raises(ValueError, match="preset must be one of"):
        R.build_report("huge", out=tmp_path)
    with pytest.raises(ValueError, match="workers"):
        R.build_report("tiny", out=tmp_path, workers=0)
    with pytest.raises(ValueError, match="executor must be one of local, ray"):
        R.build_report("tiny", out=tmp_path, executor="slurm")


def test_out_and_db_that_cannot_be_used(tmp_path):
    blocker = tmp_path / "some_file.txt"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"^out: .*some_file.txt is a file, not a folder"):
        R.build_report("tiny", out=blocker)
    with pytest.raises(ValueError, match=r"^out: cannot create the folder"):
        R.build_report("tiny", out=blocker / "report")
    with pytest.raises(ValueError, match=r"^db: .*some_file.txt is not a SQLite database"):
        R.build_report("tiny", out=tmp_path / "report", db=blocker)
    with pytest.raises(ValueError, match=r"^db: .*some_file.txt is a file, not a folder"):
        R.build_report("tiny", out=tmp_path / "report", db=blocker / "results.db")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE songs (title TEXT)")
    conn.close()
    with pytest.raises(ValueError, match=r"^db: .*other.db is not an attnscale results database"):
        R.build_report("tiny", out=tmp_path / "report", db=other)


def test_cli_rejects_two_presets():
    out = subprocess.run([sys.executable, "-m", "attnscale.cli", "report", "--quick", "--full"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("error: choose one preset")


def test_report_page_in_a_real_browser(tiny, tmp_path, browser):
    """Headless Chromium: no console errors, every figure renders, sliders update numbers; the
    tiny preset is a smoke test, so a banner says so before anything else and no verdict is
    shown as evidence."""
    out, _, _ = tiny
    shot = Path(os.environ.get("ATTNSCALE_SCREENSHOT_DIR", tmp_path)) / "report.png"
    result = browser.check(out / "index.html", shot)
    assert result["ok"], result["problems"]
    assert not result["console_errors"]
    assert result["numbers_before"] != result["numbers_after"]
    assert shot.stat().st_size > 10_000
    layout = result["layout"]
    assert layout["smoke_banner"] and layout["banner_top"] < layout["takeaways_top"]
    assert layout["evidence_badges"] == 0 and layout["smoke_badges"] >= 13
    assert layout["takeaway_items"] == 0  # no takeaways drawn from a smoke test
    assert all(len(alt) > 20 and "figure" not in alt.lower()[:8] for alt in layout["alts"])


def test_evidence_page_opens_on_takeaways_and_scales_every_verdict(tiny, tmp_path, browser):
    """The same report as a non-smoke page: takeaways first, within the first screen; no
    banner; every verdict row and every claim carries its scale line."""
    _, result, _ = tiny
    page = tmp_path / "index.html"
    page.write_text(render.render_html({**result, "preset": "standard", "smoke": False}, ""))
    checked = browser.check(page, tmp_path / "evidence.png", require_explorer=False)
    assert checked["ok"], checked["problems"]
    layout = checked["layout"]
    assert layout["h2"][0] == "takeaways", layout["h2"]
    assert layout["takeaways_top"] < layout["viewport"]
    assert not layout["smoke_banner"] and layout["smoke_badges"] == 0
    assert layout["rows_without_scale"] == 0 and layout["claims_without_scale"] == []
    assert layout["takeaway_items"] >= 3


def test_header_says_when_runs_were_reused(tiny):
    _, result, _ = tiny
    fresh = render.render_html({**result, "runs_trained": result["n_runs"]}, "")
    cached = render.render_html({**result, "runs_trained": 0}, "")
    assert "built in" in fresh and "assembled in" not in fresh
    assert "assembled in" in cached and "from stored results" in cached and "built in" not in cached


def test_the_report_states_its_time_in_units_of_the_hosts_pace(tiny):
    _, result, _ = tiny
    pace = result["host_pace"]
    before, after = pace["reference_s"]
    assert before > 0 and after > 0
    assert pace["elapsed_in_references"] == pytest.approx(
        result["elapsed_s"] / ((before + after) / 2))
    assert "fixed reference workload" in render.render_html(result, "")


def test_seed_offset_runs_every_study_on_disjoint_seeds(tiny, tmp_path):
    """--seed-offset K replicates the studies on other seeds; measurements are reused."""
    from attnscale.audit.studies import PRESETS, studies
    from attnscale.lab.store import Store

    out, _, _ = tiny
    db = tmp_path / "results.db"
    db.write_bytes((out / "results.db").read_bytes())
    result = R.build_report("tiny", out=tmp_path / "again", db=db, seed_offset=1)
    assert result["seed_offset"] == 1 and result["seeds"] == [s + 100 for s in
                                                              PRESETS["tiny"].seeds]
    assert result["tune_seeds"] == [s + 100 for s in PRESETS["tiny"].tune_seeds]
    with Store(db) as store:
        runs = store.runs()
    names = {k for k, v in studies(PRESETS["tiny"]).items() if v.seeds}  # not the deep ones
    seeds = {name: set() for name in names}
    for run in runs:
        seeds.setdefault(run["sweep"], set()).add(run["config"]["seed"])
    for name in names:  # every study ran on both seed sets, and they do not meet
        assert {s for s in seeds[name] if s >= 100} and {s for s in seeds[name] if s < 100}
    with pytest.raises(ValueError, match="seed_offset"):
        R.build_report("tiny", out=tmp_path / "bad", seed_offset=-1)


def test_the_page_shows_each_verdicts_headline_and_plain_sentences():
    def page(sentence):
        entry = {"id": "C1", "claim": "c", "measures": "m", "verdict": "inconclusive",
                 "rule": "r", "because": "b", "headline": f"inconclusive: {sentence}",
                 "plain": [sentence], "regime": "unit init", "smallest": "0.02 nats",
                 "evidence": {}, "numbers": {}, "figures": [], "runs": []}
        report = {"claims": [entry], "questions": [], "preset": "tiny", "git_rev": "abc",
                  "versions": {"attnscale": "0"}, "elapsed_s": 1.0, "n_runs": 0}
        return render.render_html(report, "")
    one, other = page("gap +0.35 nats"), page("gap -0.01 nats")
    assert "gap +0.35 nats" in one and "gap +0.35 nats" not in other
    assert "unit init" in one and "0.02 nats" in one and 'class="verdict inconclusive"' in one


def test_the_docs_schema_is_the_registry_independent_part():
    """docs/report.schema.json documents the fixed part of the schema; the registry adds one
    entry per registered claim, in order (so a new claim needs no edit there)."""
    assert json.loads(DOCS_SCHEMA.read_text()) == base_schema()
    ids = [e["allOf"][1]["properties"]["id"]["const"]
           for part in ("claims", "questions") for e in SCHEMA["properties"][part]["prefixItems"]]
    assert ids == IDS


class ToyEvidence(Model):
    total: int
    runs: int


def toy_judge(ev: ToyEvidence) -> Verdict:
    ok = ev.total == 4
    return Verdict(SUPPORTED if ok else REFUTED, "supported if 2 + 2 = 4", f"2 + 2 = {ev.total}",
                   {"total": ev.total}, plain=[f"The toy measured 2 + 2 = {ev.total}."])


def toy_draw(ev, numbers, folder):
    fig, ax = plt.subplots()
    ax.bar(["2 + 2"], [ev["total"]])
    return [save(fig, folder, "c99_toy", f"The toy bar is {numbers['total']} high.")]


def toy_study(p) -> Study:
    """The toy claim's own training study: scaled_dot, one LR, two steps, the preset's seeds."""
    return Study("toy_study", {**TEXT, **schedule(2), "d_model": 16, "n_heads": 1},
                 ("scaled_dot",), (1e-2,), p.seeds)


def toy_gather(src):
    return {**src.measured["toy_total"], "runs": len(src.runs["toy_study"])}


def toy_panels(entry):
    """A table of the toy's own, from its entry: the sum it measured."""
    return [Panel("Toy sums", ("a", "b", "a + b"), (("2", "2", str(entry["evidence"]["total"])),),
                  note="Summed by the toy claim.")]


TOY = Claim("C99", "A toy claim: 2 + 2 = 4.", "one addition", "supported if 2 + 2 = 4",
            ToyEvidence, toy_gather, toy_judge, draw=toy_draw,
            measurements=(Measurement("toy_total", lambda p: {}, lambda p: {"total": 2 + 2}),),
            trains=(Training("toy_study", toy_study),), scale=lambda p: "one addition",
            panels=toy_panels,
            says=(Says("when", lambda e: [f"The toy adds up to {e['numbers']['total']} (C99)."],
                       rank=0),))


def test_a_registered_toy_claim_appears_everywhere(tiny):
    """One Claim registered (its module, in real use) reaches the measurements, its own
    training study, report.json, its schema, the figures, the page and the scale line, with no
    other edit."""
    out, _, _ = tiny
    with registered(TOY):
        result = R.build_report("tiny", out=out, workers=2)
        schema = report_schema()
    toy = [c for c in result["claims"] if c["id"] == "C99"]
    assert len(toy) == 1 and result["claims"][-1]["id"] == "C99"
    toy = toy[0]
    assert toy["verdict"] == SUPPORTED and toy["evidence"] == {"total": 4, "runs": 3}
    assert toy["scale"] == "one addition" and toy["figures"][0]["alt"] == "The toy bar is 4 high."
    jsonschema.validate(json.loads((out / "report.json").read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):  # without the toy, the schema says no
        jsonschema.validate(json.loads((out / "report.json").read_text()), SCHEMA)
    page = (out / "index.html").read_text()
    assert "A toy claim: 2 + 2 = 4." in page and "The toy bar is 4 high." in page
    when = next(t for t in result["takeaways"] if t["id"] == "when")
    assert when["answer"][0] == "The toy adds up to 4 (C99)." and when["sources"][0] == "C99"
    # a smoke page shows no takeaways; the same report as evidence shows the toy's
    assert "The toy adds up to 4 (C99)." not in page
    assert "The toy adds up to 4 (C99)." in render.render_html({**result, "smoke": False}, "")
    assert toy["panels"] == [{"title": "Toy sums", "columns": ["a", "b", "a + b"],
                              "rows": [["2", "2", "4"]], "note": "Summed by the toy claim."}]
    assert '<table class="panel" id="C99-panel-1">' in page and "<td>4</td>" in page
    with Store(out / "results.db") as store:
        assert store.get_measurement(measurement_key(
            "toy_total", {"attnscale": versions().get("attnscale")})) == {"total": 4}
        assert len(store.runs(where={"sweep": "toy_study"})) == 3
    assert "C99" not in [c.id for c in all_claims()]  # the with block unregistered it


def test_a_claims_own_training_study_joins_the_plan_and_a_clash_is_refused():
    p = PRESETS["tiny"]
    with registered(TOY):
        plan = training_plan(p)
        assert plan["toy_study"] == toy_study(p) and "lr_text" in plan
        assert TOY.studies == ("toy_study",)  # it reads what it trains
        clash = Claim("C98", "x", "x", "x", ToyEvidence, toy_gather, toy_judge,
                      trains=(Training("toy_study", lambda q: Study(
                          "toy_study", {**TEXT, "d_model": 32}, ("dot",), (1e-2,), q.seeds)),))
        with registered(clash), pytest.raises(ValueError, match="study 'toy_study' differs"):
            training_plan(p)
        misnamed = Claim("C97", "x", "x", "x", ToyEvidence, toy_gather, toy_judge,
                         trains=(Training("named", toy_study),))
        with registered(misnamed), pytest.raises(ValueError, match="built a study named"):
            training_plan(p)
    assert "toy_study" not in training_plan(p)


def toy_page(claim: Claim) -> tuple[dict, str]:
    """``claim`` registered, judged, its tables built and its page rendered by the report's
    own code (render.judge, render.panels, render.render_html): its entry and the page."""
    src = Sources(PRESETS["tiny"], {"toy_study": toy_study(PRESETS["tiny"])},
                  {"toy_study": []}, {"toy_total": {"total": 4}})
    with registered(claim):
        entry, _ = render.judge(claim, src)
        entry["panels"], entry["panel_errors"] = render.panels(claim, entry)
    report = {"claims": [entry], "questions": [], "preset": "tiny", "git_rev": "abc",
              "versions": {"attnscale": "0"}, "elapsed_s": 1.0, "n_runs": 0,
              "errors": render.errors([entry])}
    return entry, render.render_html(report, "")


def panelled(panels) -> Claim:
    return Claim("C99", "A toy claim: 2 + 2 = 4.", "one addition", "supported if 2 + 2 = 4",
                 ToyEvidence, lambda src: {**src.measured["toy_total"], "runs": 0}, toy_judge,
                 panels=panels)


def test_the_page_shows_a_registered_claims_own_panel():
    """A toy claim's table reaches its section of the page (title, header, cells, note), with
    no report or render code naming it; a builder that raises is an error of the report."""
    entry, page = toy_page(panelled(toy_panels))
    assert entry["panels"][0]["rows"] == [["2", "2", "4"]] and entry["panel_errors"] == []
    section = page[page.index('<div class="claim" id="C99">'):]
    section = section[:section.index("</div>")]
    assert '<table class="panel" id="C99-panel-1">' in section
    assert "<caption>Toy sums</caption>" in section
    assert "<th>a</th><th>b</th><th>a + b</th>" in section
    assert "<tr><td>2</td><td>2</td><td>4</td></tr>" in section
    assert "Summed by the toy claim." in section

    def broken(entry):
        raise KeyError("no such number")
    entry, page = toy_page(panelled(broken))
    assert entry["panels"] == [] and "no such number" in entry["panel_errors"][0]
    assert "A table failed to build" in page and 'id="error-banner"' in page
    assert render.errors([entry]) == [{"id": "C99", "where": "panel",
                                       "error": entry["panel_errors"][0]}]


def test_report_and_page_code_name_no_claim():
    """report.py, render.py and the page template name no claim id and no claim's study: a
    claim's table, sentences and figures come from its own module."""
    root = Path(R.__file__).parent
    for path in (root / "report.py", root / "render.py", root / "templates" / "report.html"):
        named = re.findall(r"\b[CQ][0-9]+\b", path.read_text())
        assert not named, (path.name, named)
        text = path.read_text()
        assert "bench" not in text, path.name
