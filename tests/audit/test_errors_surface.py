"""A bug is never a verdict: a rule that raises, missing evidence and a figure that fails to
draw each surface as an error (in report.json, on the page, and as the CLI's exit status 1),
never as ``inconclusive``; the evidence on the page is never cut short."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from pydantic import Field

from attnscale.audit import render, takeaways
from attnscale.audit import report as R
from attnscale.audit.claim import Claim, Sources, all_claims
from attnscale.audit.evidence import Model
from attnscale.audit.schema import report_schema
from attnscale.audit.studies import PRESETS, Study
from attnscale.audit.verdicts import ERROR, SUPPORTED, MissingEvidence, Verdict
from attnscale.lab.records import Run

SCHEMA = report_schema()


class Ev(Model):
    x: float
    values: list[int] = Field(default_factory=list)


def claim(judge, ev: dict[str, Any] | None = None, cid: str = "C1",
          studies: tuple[str, ...] = ()) -> Claim:
    return Claim(cid, "a claim", "what it measures", "the rule, printed in full as on the page",
                 Ev, lambda src: {"x": 1.0} if ev is None else ev, judge, studies=studies)


def sources(**kw: Any) -> Sources:
    return Sources(PRESETS["tiny"], kw.get("studies", {}), kw.get("runs", {}), {})


def judged(c: Claim, src: Sources | None = None) -> dict[str, Any]:
    return render.judge(c, src or sources())[0]


def fine(ev: Ev) -> Verdict:
    return Verdict(SUPPORTED, "the rule", "because", {"x": ev.x})


def broken_arithmetic(ev: Ev) -> Verdict:
    return Verdict(SUPPORTED, "the rule", f"{ev.x / 0}")


def missing_arm(ev) -> Verdict:
    raise MissingEvidence("arm 'cosine' at d_model=32 has no finished run")


@pytest.mark.parametrize(("judge", "ev", "named"), [
    (broken_arithmetic, None, "a bug: ZeroDivisionError: float division by zero"),
    (missing_arm, None, "missing evidence: arm 'cosine' at d_model=32 has no finished run"),
    (fine, {}, "missing evidence: C1: evidence does not fit Ev (x: Field required)"),
    (fine, {"x": "a lot"}, "a bug: ValueError: C1: evidence does not fit Ev (x: Input should"),
    (lambda ev: Verdict("maybe", "r", "b"), None, "a bug: ValueError: verdict must be one of"),
])
def test_a_rule_that_raises_is_an_error_entry_never_a_verdict(judge, ev, named):
    entry = judged(claim(judge, ev))
    assert entry["verdict"] == ERROR and entry["error"].startswith(named)
    assert entry["headline"].startswith("error: ") and "not a verdict" in entry["plain"][0]
    assert entry["numbers"] == {} and "Traceback" in entry["because"]
    assert render.errors([entry]) == [{"id": "C1", "where": "rule", "error": entry["error"]}]


def test_a_rule_that_works_has_no_error():
    entry = judged(claim(fine, {"x": 2.0}))
    assert entry["verdict"] == SUPPORTED and "error" not in entry
    assert entry["numbers"] == {"x": 2.0} and render.errors([entry]) == []


def page_report(entries: list[dict[str, Any]], errors: list[dict[str, str]]) -> dict[str, Any]:
    return {"claims": entries, "questions": [], "preset": "tiny", "git_rev": "abc",
            "versions": {"attnscale": "0", "torch": "0"}, "elapsed_s": 1.0, "n_runs": 0,
            "bench": {"rows": []}, "errors": errors}


def test_the_page_shows_each_error_with_where_it_failed():
    entry = {**judged(claim(broken_arithmetic)),
             "figure_errors": ["a bug: IndexError: list index out of range"], "scale": ""}
    errors = render.errors([entry])
    assert [e["where"] for e in errors] == ["rule", "figure"]
    html = render.render_html(page_report([entry], errors), "")
    assert 'id="error-banner"' in html and "This report has 2" in html
    assert "Error, not a verdict:" in html and "ZeroDivisionError" in html
    assert "A figure failed to draw:" in html and "IndexError" in html
    assert '<span class="verdict error">error</span>' in html
    clean = render.render_html(page_report([judged(claim(fine))], []), "")
    assert "error-banner" not in clean.split("</style>")[1]


def test_the_evidence_on_the_page_is_never_cut_short():
    big = {"values": list(range(30000))}  # about 200k characters as JSON
    entry = judged(claim(fine, {"x": 1.0, **big}))
    html = render.render_html(page_report([entry], []), "")
    assert "29999" in html and "29998" in html


def test_an_error_entry_validates_against_the_schema():
    entry = {**judged(claim(missing_arm)), "figure_errors": [], "scale": "", "panels": [],
             "panel_errors": []}
    jsonschema.validate(entry, SCHEMA["$defs"]["entry"])
    jsonschema.validate(render.errors([entry]), SCHEMA["properties"]["errors"])


def test_takeaways_and_answers_never_build_on_a_failed_rule():
    entries = [{**judged(claim(missing_arm, cid=cid)), "scale": ""}
               for cid in [c.id for c in all_claims()]]
    for t in takeaways.takeaways(entries):
        assert t["answer"][0].startswith("Not answered here: the rule of"), t
        assert set(t["verdicts"].values()) == {ERROR}
    assert takeaways.answer(entries[-1], {}).startswith("Not answered: missing evidence")


def test_the_cli_writes_the_report_and_exits_1_on_any_error(monkeypatch, tmp_path, capsys):
    from attnscale.cli import run as cli_run

    entry = judged(claim(missing_arm))

    def build_report(*args, **kwargs):
        return {"claims": [entry], "questions": [], "smoke": False, "elapsed_s": 1.0,
                "runs_trained": 0, "errors": render.errors([entry])}

    monkeypatch.setattr(R, "build_report", build_report)
    assert cli_run(["report", "--quick", "--out", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().err
    assert "error C1 (rule): missing evidence: arm 'cosine'" in " ".join(out.split())


STUDY = Study("s", {"steps": 10}, ("dot", "scaled_dot"), (0.1,), (1, 2),
              cells={"d_model": (32,)})


def run(arm: str, seed: int, status: str = "done") -> Run:
    return Run.from_row({"variant": arm, "status": status,
                         "config": {"seed": seed, "d_model": 32}})


def test_evidence_with_missing_runs_is_an_error_before_the_rule_runs():
    runs = [run(a, s) for a in ("dot", "scaled_dot") for s in (1, 2)][:3]
    entry = judged(claim(fine, studies=("s",)), sources(studies={"s": STUDY}, runs={"s": runs}))
    assert entry["verdict"] == ERROR
    assert entry["error"] == ("missing evidence: 1 run(s) with no result, first s: "
                              "d_model=32 scaled_dot seed 2")


def test_missing_runs_names_each_cell_arm_and_seed_without_a_finished_run():
    from attnscale.audit.evidence import missing_runs

    study = STUDY

    complete = [run(a, s) for a in ("dot", "scaled_dot") for s in (1, 2)]
    assert missing_runs(study, complete) == []
    assert missing_runs(study, [*complete[:3], run("scaled_dot", 2, "failed")]) == [
        "s: d_model=32 scaled_dot seed 2"]
    assert missing_runs(study, [*complete[:3], run("scaled_dot", 2, "diverged")]) == []


def test_a_listed_figure_missing_from_disk_fails_the_page(tmp_path):
    entry = {**judged(claim(fine)),
             "figures": [{"path": str(tmp_path / "gone.png"), "alt": "a figure"}]}
    with pytest.raises(FileNotFoundError, match=r"gone\.png"):
        render.render_html(page_report([entry], []), "")
