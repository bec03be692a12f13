"""The README works as written, and its figures cannot drift.

* Every shell command in the README's ```bash blocks runs, in README order in one temporary
  folder that holds the checkout's ``configs/`` (as a reader would run them), and exits 0,
  except those it marks slow (a trailing comment that states 20 s or more:
  ``# about 12 min: ...``) and the few in :data:`NOT_RUN`, each with why.
* Every ```python block runs as a script there, and the number the prose quotes from the first
  one's output is the number it prints.
* Every time the README states comes from ``benchmarks/recorded/timings_2core.json`` and its
  results table from ``benchmarks/recorded/report_standard_2core.json``, both through
  ``benchmarks/readme_figures.py``; no table cell is long, no commit hash appears.
* docs/architecture.md lists every module of the package, and no module that is gone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text()


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIGURES = load_script("readme_figures")
DIGEST = load_script("report_digest")

SLOW_S = 20  # a command whose comment states at least this long is not run here
# Commands the test does not run although they state no long time, and why.
NOT_RUN = {
    "pip install": "installs packages into the environment the tests run in",
}
DURATION = re.compile(r"(?:about )?(\d+(?:\.\d+)?)(?:–(\d+(?:\.\d+)?))? (s|min|h)\b")
UNIT_S = {"s": 1, "min": 60, "h": 3600}


def blocks(lang: str, text: str = TEXT) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def shell_lines(text: str = TEXT) -> list[tuple[str, str]]:
    """(command, trailing comment) for every line of every bash block."""
    out = []
    for block in blocks("bash", text):
        for line in block.splitlines():
            if line.strip():
                command, _, comment = line.partition(" #")
                out.append((command.strip(), comment.strip()))
    return out


def stated_seconds(comment: str) -> float | None:
    """The longest time a comment states (``about 12 min``, ``7–8 min``), in seconds."""
    found = [float(hi or lo) * UNIT_S[unit] for lo, hi, unit in DURATION.findall(comment)]
    return max(found) if found else None


def skipped(command: str, comment: str) -> str | None:
    """Why the test does not run ``command``, or None when it does."""
    seconds = stated_seconds(comment)
    if seconds is not None and seconds >= SLOW_S:
        return f"slow: the README states {seconds:g} s"
    return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


RUN = [cmd for cmd, comment in shell_lines() if skipped(cmd, comment) is None]


def test_the_convention_sees_the_readme():
    """The fast commands are found, the slow ones are recognized, and every NOT_RUN entry
    still matches a README command (a stale entry would hide a command forever)."""
    commands = [cmd for cmd, _ in shell_lines()]
    assert {"attnscale --version", "attnscale theory", "attnscale check minilm",
            "attnscale sweep configs/smoke.toml"} <= set(RUN)
    assert "make report" in commands and "make report" not in RUN
    assert "attnscale report --quick" in commands and "attnscale report --quick" not in RUN
    for prefix in NOT_RUN:
        assert any(c.startswith(prefix) for c in commands), f"NOT_RUN entry {prefix!r} is stale"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder like a fresh checkout's root for the commands: configs/ and nothing else."""
    path = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "configs", path / "configs")
    return path


def environment() -> dict[str, str]:
    """The test's environment with this interpreter's scripts (``attnscale``) first on PATH,
    one thread per process (``make test`` already runs one worker per core)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def needs_hf(code: str) -> bool:
    return "minilm" in code or "transformers" in code


def run(args: list[str] | str, cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=timeout, shell=isinstance(args, str))


@pytest.mark.parametrize("command", RUN)
def test_a_readme_command_works(command, workdir):
    if needs_hf(command):
        pytest.importorskip("transformers")
    out = run(command, workdir)
    assert out.returncode == 0, f"{command!r} exited {out.returncode}:\n{out.stderr[-3000:]}"


PYTHON = blocks("python")


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_a_readme_python_example_runs(index, workdir):
    code = PYTHON[index]
    if needs_hf(code):
        pytest.importorskip("transformers")
    script = workdir / f"example_{index}.py"
    script.write_text(code)
    out = run([sys.executable, str(script)], workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    if index == 0:  # the prose quotes what this example prints
        printed = re.search(r"^\s*dot: .*entropy/ln n (\d\.\d\d)$", out.stdout, flags=re.M)
        quoted = re.search(r"It prints entropy/ln\s+n\s+(\d\.\d\d)\s+for\s+`dot`", TEXT)
        assert printed and quoted and printed.group(1) == quoted.group(1), out.stdout


def test_the_first_screen_holds_the_pitch_commands_and_example():
    lines = TEXT.splitlines()
    first = "\n".join(lines[:60])
    assert first.startswith("# attnscale\n\n**Why are attention logits divided by √d_k")
    assert "make report" in first and "make test" in first and "pip install" in first
    assert "```python" in first and first.index("```python") < first.rindex("```")
    end = lines.index("```", next(i for i, x in enumerate(lines) if x == "```python"))
    assert end < 60, f"the library example ends at line {end + 1}"


def test_every_stated_time_comes_from_the_timings_record():
    phrases = FIGURES.timing_phrases()
    stated = {cmd: comment for cmd, comment in shell_lines() if DURATION.search(comment)}
    for cmd, comment in stated.items():
        assert cmd in phrases, f"{cmd!r} states a time that timings_2core.json does not hold"
        assert re.match(re.escape(phrases[cmd]) + r"(?![\d.–])", comment), (
            f"{cmd!r}: README says {comment!r}, the record gives {phrases[cmd]!r}")
    everywhere = {m.group(0) for m in DURATION.finditer(TEXT)}
    assert everywhere <= set(phrases.values()), everywhere - set(phrases.values())
    record = FIGURES.load(FIGURES.TIMINGS)
    latest = record["commands"]["make test"]["runs"][-1]["tests"]  # the newest timed run's
    assert f"{latest} tests" in TEXT, f"the README should count the {latest} tests of the record"


def test_the_duration_rounding():
    d = FIGURES.duration
    assert d([430, 456]) == "7–8 min" and d([708, 702]) == "about 12 min" and d([54]) == "54 s"
    assert d([5], approx=True) == "about 5 s" and d([9000], approx=True) == "about 2.5 h"


def test_the_results_table_is_the_digest():
    rows = FIGURES.result_rows()
    lines = TEXT.splitlines()
    start = lines.index(rows[0])
    assert lines[start:start + len(rows)] == rows
    assert not lines[start + len(rows)].startswith("|"), "the README table has extra rows"


def test_the_pitch_quotes_the_digest():
    """The answer's C13 figure is the digest's, rounded."""
    m = re.search(r"\+(\d\.\d+)\s+nats\s+worse\s+at\s+d_k\s+=\s+(\d+)\s+\(claim\s+C13\)", TEXT)
    assert m, "the pitch no longer quotes C13"
    entries = {e["id"]: e for e in FIGURES.load(FIGURES.DIGEST)["entries"]}
    got = re.search(r"\+(\d\.\d+) nats(?: worse)? at d_k ?= ?(\d+)", entries["C13"]["headline"])
    assert got and got.group(2) == m.group(2)
    assert f"{float(got.group(1)):.{len(m.group(1)) - 2}f}" == m.group(1)


def test_the_digest_covers_every_claim_and_reads_a_report(tmp_path):
    digest = FIGURES.load(FIGURES.DIGEST)
    ids = [e["id"] for e in digest["entries"]]
    assert ids == list(DIGEST.titles()), "the digest and docs/claims.md list other claims"
    schema = json.loads((ROOT / "docs" / "report.schema.json").read_text())
    verdicts = schema["$defs"]["entry"]["properties"]["verdict"]["enum"]
    assert all(e["verdict"] in verdicts and e["verdict"] != "error" for e in digest["entries"])
    entry = {"id": "C13", "claim": "Large d_k hurts. More.", "verdict": "supported",
             "headline": "supported: +0.3 nats"}
    report = {"preset": "standard", "smoke": False, "errors": [], "claims": [entry],
              "questions": [{**entry, "id": "Q9", "verdict": "depends"}], "git_rev": "abc",
              "versions": {"torch": "x"}, "elapsed_s": 600.04, "seed_offset": 0}
    out = DIGEST.digest(report)
    assert [e["title"] for e in out["entries"]] == [DIGEST.titles()["C13"], "Large d_k hurts."]
    assert out["revision"] == "abc" and out["report_s"] == 600.0 and not out["hand_filled"]
    for bad in ({"smoke": True}, {"preset": "quick"}, {"errors": [{"id": "C1"}]}):
        with pytest.raises(ValueError):
            DIGEST.digest({**report, **bad})
    source, out_file = tmp_path / "report.json", tmp_path / "digest.json"
    source.write_text(json.dumps(report))
    assert DIGEST.main([str(source), "--out", str(out_file)]) == 0
    assert FIGURES.result_rows(json.loads(out_file.read_text()))[2].startswith("| C13. ")
    source.write_text(json.dumps({**report, "smoke": True}))
    assert DIGEST.main([str(source), "--out", str(tmp_path / "no.json")]) == 2


def test_no_long_cells_and_no_commit_hashes():
    for line in TEXT.splitlines():
        if line.startswith("|"):
            cells = line.strip("|").split("|")
            assert max(len(c.strip()) for c in cells) <= 200, line[:120]
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", TEXT)
    assert not hashes, hashes


# the pages this README rewrite owns (docs/claims.md and the others are checked by their owners)
DOCS = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
        *(ROOT / "docs" / f"{name}.md" for name in (
            "architecture", "check", "kernels", "lab", "library", "performance", "report"))]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{page.name}: {target}"


def test_benchmarks_readme_lists_every_script_and_record():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    files = [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "benchmarks" / "recorded").glob("*")]
    missing = [p.name for p in files if f"`{p.name}`" not in text and f"/{p.name}`" not in text]
    assert not missing, f"benchmarks/README.md does not list {missing}"


def test_the_figure_is_there_and_small():
    assert FIGURES.FIGURE.exists() and FIGURES.FIGURE.stat().st_size < 100_000
    assert str(FIGURES.FIGURE.relative_to(ROOT)) in TEXT


def documented_modules() -> dict[str, set[str]]:
    """{folder: module names} from docs/architecture.md: a heading naming a folder in
    backticks, then the backticked first cells of its table."""
    out: dict[str, set[str]] = {}
    folder = None
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        if m := re.match(r"^#+ `([a-z_/]+)/`", line):
            folder = m.group(1)
            out.setdefault(folder, set())
        elif folder and (m := re.match(r"^\| `([a-z0-9_]+)` \|", line)):
            out[folder].add(m.group(1))
    return out


def test_architecture_lists_every_module():
    pkg = ROOT / "src" / "attnscale"
    actual: dict[str, set[str]] = {}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        if len(rel.parts) > 1 and path.stem not in ("__init__", "__main__"):
            actual.setdefault("/".join(rel.parts[:-1]), set()).add(path.stem)
    assert documented_modules() == actual


def test_a_long_headline_is_cut_at_a_list_separator():
    short = "gap +0.298 nats at d_k=256"
    assert FIGURES.clip(short) == short
    long = ", ".join(f"lr {x} (mean max weight, rows above 0.9)" for x in range(9))
    cut = FIGURES.clip(long)
    assert len(cut) <= FIGURES.CELL_CHARS + 2 and cut.endswith(" …")
    assert long.startswith(cut[:-2]) and cut[:-2].endswith("0.9)")
