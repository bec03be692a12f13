"""The README's figure and figures: remade from their sources, so the front page cannot drift.

    python benchmarks/readme_figures.py            # rewrite the figure, print timings and table
    python benchmarks/readme_figures.py --no-plot  # only print what the README should say

* the figure (``FIGURE``): the exact-theory phase diagram of ``attnscale theory --plot``
  (:func:`attnscale.audit.theory_plots.plot_phase_diagram`), saved small;
* every duration the README states, from ``benchmarks/recorded/timings_2core.json``
  (:func:`duration`, :func:`timing_phrases`);
* the results table, from ``benchmarks/recorded/report_standard_2core.json``, the digest of a
  standard report that ``benchmarks/report_digest.py`` writes (:func:`result_rows`).

``tests/test_readme.py`` checks the README against the same functions, so editing a number in one
place without the other fails.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "benchmarks" / "figures" / "phase_diagram.png"
TIMINGS = ROOT / "benchmarks" / "recorded" / "timings_2core.json"
DIGEST = ROOT / "benchmarks" / "recorded" / "report_standard_2core.json"
FIGURE_DPI = 96  # about 960 px wide: readable on a README page, a fifth of the report's file


def write_figure(path: Path = FIGURE) -> Path:
    """The phase diagram (exact theory, no sampling, so the same on every machine), saved at
    :data:`FIGURE_DPI` and reduced to a 256-colour palette."""
    from PIL import Image

    from attnscale.audit import theory_plots

    path.parent.mkdir(parents=True, exist_ok=True)
    old, theory_plots.DPI = theory_plots.DPI, FIGURE_DPI
    try:
        theory_plots.plot_phase_diagram(str(path))
    finally:
        theory_plots.DPI = old
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
    return path


def duration(seconds: list[float], approx: bool = False) -> str:
    """How the README states a time measured as ``seconds`` (one value or several runs).

    Under 100 s in seconds, under 100 min in minutes, else in half hours; runs that round to
    the same value read "about N", runs that do not read as a range rounded outwards;
    ``approx`` (a time noted once, not a recorded run) always reads "about N"."""
    lo, hi = min(seconds), max(seconds)
    if hi < 100:
        unit, scale, step = "s", 1.0, 1.0
    elif hi < 100 * 60:
        unit, scale, step = "min", 60.0, 1.0
    else:
        unit, scale, step = "h", 3600.0, 0.5
    a, b = lo / scale / step, hi / scale / step
    if round(a) == round(b):
        value = f"{round(a) * step:g}"
        return f"about {value} {unit}" if approx or lo != hi else f"{value} {unit}"
    return f"{math.floor(a) * step:g}–{math.ceil(b) * step:g} {unit}"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def command_seconds(entry: dict[str, Any]) -> list[float]:
    """The times of one command of the timings record: its runs' ``wall_s``, else ``approx_s``."""
    runs = entry.get("runs", [])
    return [r["wall_s"] for r in runs] if runs else [entry["approx_s"]]


def timing_phrases(record: dict[str, Any] | None = None) -> dict[str, str]:
    """{command: how the README states its time} for every command of the timings record."""
    record = record or load(TIMINGS)
    return {cmd: duration(command_seconds(e), approx=not e.get("runs"))
            for cmd, e in record["commands"].items()}


def verdict_detail(headline: str, verdict: str) -> str:
    """A report headline without its leading verdict ("supported: +0.33 nats" -> "+0.33 nats")."""
    rest = headline[len(verdict):] if headline.startswith(verdict) else headline
    return rest.lstrip(" ,:;—-").strip() or "—"


CELL_CHARS = 160  # a README cell longer than this is cut at a list separator (the page has all)


def clip(text: str, limit: int = CELL_CHARS) -> str:
    """``text``, or its longest prefix ending before a ", " or "; " within ``limit`` characters
    followed by " …" (the report page holds the whole headline)."""
    if len(text) <= limit:
        return text
    cut = max(text.rfind(", ", 0, limit), text.rfind("; ", 0, limit))
    return (text[:cut] if cut > 0 else text[:limit]) + " …"


def result_rows(digest: dict[str, Any] | None = None) -> list[str]:
    """The README's results table (Markdown lines): claim, verdict, its number."""
    digest = digest or load(DIGEST)
    rows = ["| claim | verdict | in numbers |", "|---|---|---|"]
    for e in digest["entries"]:
        rows.append(f"| {e['id']}. {e['title']} | {e['verdict']} | "
                    f"{clip(verdict_detail(e['headline'], e['verdict']))} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-plot", action="store_true", help="do not rewrite the figure")
    args = ap.parse_args()
    if not args.no_plot:
        path = write_figure()
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
    print("\ntimes the README states:")
    for cmd, phrase in timing_phrases().items():
        print(f"  {cmd:50s} {phrase}")
    print("\nresults table:")
    print("\n".join(result_rows()))


if __name__ == "__main__":
    main()
