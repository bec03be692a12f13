"""A small digest of a standard report, which the README's results table is made from.

    make report
    python benchmarks/report_digest.py report/report.json

reads ``report.json`` (schema: docs/report.schema.json) and writes
``benchmarks/recorded/report_standard_2core.json``: for every claim and question
in order, its id, a short title (the heading of its section in docs/claims.md), its verdict and
its one-line headline, with the report's revision, preset, seed offset, seeds, versions and
time. A smoke test (``--quick``) or an errored report is refused: its verdicts are not evidence.
``python benchmarks/readme_figures.py --no-plot`` then prints the README's table from the digest.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLAIMS_DOC = ROOT / "docs" / "claims.md"
HEADING = re.compile(r"^###\s+([CQ]\d+)\.\s+(.+?)\s*$")


def titles(doc: Path = CLAIMS_DOC) -> dict[str, str]:
    """{"C1": "Attention is softmax(QKᵀ/√d_k)V", ...}: the section headings of docs/claims.md."""
    out = {}
    for line in doc.read_text().splitlines():
        if m := HEADING.match(line):
            out[m.group(1)] = m.group(2)
    return out


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.?!])\s", text.strip(), maxsplit=1)[0]


def digest(report: dict[str, Any], names: dict[str, str] | None = None) -> dict[str, Any]:
    """The digest of a report.json dict; raises ValueError for a smoke test or a failed build."""
    if report.get("smoke") or report.get("preset") != "standard":
        raise ValueError(f"not a standard report (preset {report.get('preset')!r}, "
                         f"smoke {report.get('smoke')}): its verdicts are not evidence")
    if report.get("errors"):
        raise ValueError(f"the report has {len(report['errors'])} error(s): fix and rerun first")
    names = titles() if names is None else names
    entries = [{"id": e["id"], "title": names.get(e["id"]) or first_sentence(e["claim"]),
                "verdict": e["verdict"], "headline": e["headline"]}
               for e in [*report["claims"], *report["questions"]]]
    return {
        "description": "Digest of a standard attnscale report (benchmarks/report_digest.py); the "
                       "README's results table is made from it (benchmarks/readme_figures.py).",
        "hand_filled": False,
        "date": datetime.date.today().isoformat(),
        "revision": report["git_rev"],
        "preset": report["preset"],
        "seed_offset": report.get("seed_offset", 0),
        "seeds": report.get("seeds", []),
        "versions": report["versions"],
        "report_s": round(float(report["elapsed_s"]), 1),
        "runs": report.get("n_runs"),
        "entries": entries,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", nargs="?", default="report/report.json")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/recorded/report_standard_2core.json"))
    ap.add_argument("--machine", default="2-core x86-64", help="recorded beside the digest")
    args = ap.parse_args(argv)
    try:
        out = digest(json.loads(Path(args.report).read_text()))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {args.report}: {e}", file=sys.stderr)
        return 2
    out["machine"] = args.machine
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(out['entries'])} verdicts at {out['revision']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
