"""Judging and rendering: each claim's rule applied to its evidence, and the one-page HTML.

The page is self-contained (figures as ``data:`` URIs, no network requests) and built with
jinja2 autoescaping, so no measured string can inject markup. It names no claim: every claim's
section shows its own sentences, figures and tables (:func:`panels`, from ``Claim.panels``).
"""

from __future__ import annotations

import base64
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from attnscale.audit import lr_choice
from attnscale.audit.claim import Claim, Sources, all_claims
from attnscale.audit.evidence import missing_runs
from attnscale.audit.scale import claim_scale
from attnscale.audit.verdicts import (
    ERROR,
    INCONCLUSIVE,
    MissingEvidence,
    failure,
    seeds_sentence,
)
from attnscale.util.jsonio import dumps, jsonable

CLAIMS_DOC = "docs/claims.md"  # where the claims are stated, relative to the source tree


def gather(claim: Claim, src: Sources) -> Any:
    """The claim's typed evidence from ``src``; :class:`MissingEvidence` where a study it
    reads lacks a run its comparisons need (:func:`attnscale.audit.evidence.missing_runs`)."""
    lost = [x for name in claim.studies for x in missing_runs(src.studies[name], src.runs[name])]
    if lost:
        raise MissingEvidence(f"{len(lost)} run(s) with no result, first {lost[0]}")
    return claim.read(claim.gather(src))


def judge(claim: Claim, src: Sources) -> tuple[dict[str, Any], Any]:
    """One report.json entry (the claim, its rule, the verdict and the numbers behind it) and
    the claim's typed evidence (None where it could not be gathered).

    Gathering the evidence or applying the rule that raises gives an ``error`` entry that
    carries the exception (never a verdict); :func:`errors` lists them, and the CLI exits 1."""
    ev, v, error, where, line = None, None, None, "", ""
    try:
        line = claim_scale(claim, src.preset, src.studies)
        ev = gather(claim, src)
        v = lr_choice.decide(claim.judge, claim.read, ev)
    except Exception as e:  # every failure of a rule is reported as that, with its traceback
        error, where = failure(e), "".join(traceback.format_exception(e, limit=-3))
    entry = {"id": claim.id, "claim": claim.text, "measures": claim.measures,
             "evidence": jsonable(ev) if ev is not None else {}, "figures": [], "runs": [],
             "scale": line}
    if v is None:
        return {**entry, "verdict": ERROR, "headline": f"error: {error}",
                "plain": [f"The rule could not be applied ({error}). This is not a verdict: "
                          "fix the cause and rerun the report (finished runs are reused)."],
                "regime": "", "smallest": "", "rule": claim.rule,
                "because": where, "numbers": {}, "error": error}, ev
    plain = list(v.plain)
    if v.verdict == INCONCLUSIVE and not v.by_lr_choice and (
            more := seeds_sentence(jsonable(v.numbers))):
        plain.append(more)
    return {**entry, "verdict": v.verdict, "headline": v.headline, "plain": plain,
            "regime": v.regime, "smallest": v.smallest, "rule": v.rule, "because": v.because,
            "numbers": jsonable(v.numbers)}, ev


def errors(entries: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Every failure in judged entries: ``{"id", "where": "rule" | "figure", "error"}``."""
    out = [{"id": e["id"], "where": "rule", "error": e["error"]} for e in entries
           if e.get("error")]
    out += [{"id": e["id"], "where": "figure", "error": f} for e in entries
            for f in e.get("figure_errors", [])]
    out += [{"id": e["id"], "where": "panel", "error": f} for e in entries
            for f in e.get("panel_errors", [])]
    return out


def judge_all(src: Sources) -> list[tuple[Claim, dict[str, Any], Any]]:
    """(claim, entry, typed evidence) for every registered claim, then every question."""
    return [(c, *judge(c, src)) for c in all_claims()]


def data_uri(path: str | Path) -> str:
    """A PNG file as a ``data:image/png;base64,…`` URI."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def _prepare(entry: dict[str, Any]) -> dict[str, Any]:
    # a figure listed but not on disk is a bug of the build: data_uri raises, loudly
    figs = [{"name": Path(f["path"]).name, "uri": data_uri(f["path"]), "alt": f["alt"]}
            for f in entry["figures"]]
    # strict JSON, as in report.json (written from the same entries before the page), in full
    return {**entry, "figure_data": figs, "evidence_json": dumps(entry["evidence"], indent=1),
            "panels": entry.get("panels", []), "panel_errors": entry.get("panel_errors", [])}


def panels(claim: Claim, entry: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """A judged entry's tables (``claim.panels(entry)``) as plain dicts {"title", "columns",
    "rows", "note"}, and the failure of a builder that raised (an error of the report, like a
    figure that cannot be drawn, never a table left out in silence)."""
    try:
        built = [asdict(p) for p in claim.panels(entry)]
    except Exception as e:  # a table that cannot be built is reported, not dropped
        return [], [failure(e)]
    return [{**p, "columns": [str(h) for h in p["columns"]],
             "rows": [[str(c) for c in r] for r in p["rows"]]} for p in built], []


def render_html(report: dict[str, Any], explorer_html: str) -> str:
    """The self-contained page for a report.json dict and the explorer's HTML fragment."""
    env = Environment(loader=PackageLoader("attnscale.audit", "templates"),
                      autoescape=select_autoescape(["html"]))
    return env.get_template("report.html").render(
        claims=[_prepare(c) for c in report["claims"]],
        questions=[_prepare(q) for q in report["questions"]],
        preset=report["preset"], git_rev=report["git_rev"], versions=report["versions"],
        versions_json=dumps(report["versions"]), elapsed_s=report["elapsed_s"],
        host_pace=report.get("host_pace"),
        n_runs=report["n_runs"], runs_trained=report.get("runs_trained", report["n_runs"]),
        smoke=report.get("smoke", False), takeaways=report.get("takeaways", []),
        errors=report.get("errors", []),
        claims_doc=CLAIMS_DOC,
        explorer=Markup(explorer_html),  # built by attnscale.audit.explorer with its own escaping
    )
