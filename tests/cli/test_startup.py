"""A command line that starts at once: ``import attnscale``, ``import attnscale.cli``,
``attnscale --version`` and ``attnscale --help`` import no torch (nor numpy, scipy, pydantic,
transformers, matplotlib); the commands import what they need when they run, and ``train``
builds its config options when it is parsed.

Each check looks at what a fresh interpreter imported (``sys.modules``, or ``-X importtime``
for the real console script), and a control shows that the same check sees torch when it is
imported, so none can pass by accident. The help values copied into the command modules (so
that registering them needs no torch) are checked against their sources.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

import attnscale
from attnscale.cli import check, lab, measure

HEAVY = ("torch", "numpy", "scipy", "pydantic", "transformers", "matplotlib")
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$")


def imported_by(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    probe = (f"{code}\nimport sys, json\n"
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def script_imports(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run the installed ``attnscale`` console script (else ``-m attnscale.cli``) under
    ``python -X importtime``; (the process, the top-level modules it imported)."""
    script = shutil.which("attnscale", path=str(Path(sys.executable).parent))
    cmd = [script] if script else ["-m", "attnscale.cli"]
    out = subprocess.run([sys.executable, "-X", "importtime", *cmd, *args], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "120"})
    names = {m[1].split(".")[0] for line in out.stderr.splitlines()
             if (m := IMPORTED.match(line))}
    return out, names


def test_the_check_sees_torch_when_it_is_imported():
    """The control: the probes below would see torch."""
    assert "torch" in imported_by("import attnscale; attnscale.attention")
    out, names = script_imports("kernels")
    assert out.returncode == 0, out.stderr
    assert "torch" in names and "typer" in names


@pytest.mark.parametrize("code", ["import attnscale", "import attnscale.cli",
                                  "from attnscale.cli import app, run, main",
                                  "import attnscale.cli.progress, attnscale.cli.trainopts"])
def test_importing_the_package_and_the_cli_imports_no_torch(code):
    assert imported_by(code) == []


@pytest.mark.parametrize("args,shows", [(["--version"], f"attnscale {attnscale.__version__}"),
                                        (["--help"], "Exit status")])
def test_version_and_help_import_no_torch(args, shows):
    out, names = script_imports(*args)
    assert out.returncode == 0, out.stderr
    assert shows in out.stdout
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


@pytest.mark.parametrize("args,shows", [(["sweep", "--help"], "--patience"),
                                        (["check", "--help"], "--max-tokens"),
                                        (["report", "--help"], "--seed-offset")])
def test_a_command_help_imports_no_torch(args, shows):
    """Parsing any command's options imports pydantic: typer's own value checks use it."""
    out, names = script_imports(*args)
    assert out.returncode == 0, out.stderr
    assert shows in out.stdout
    assert not names & (set(HEAVY) - {"pydantic"}), sorted(names & set(HEAVY))


def test_train_help_builds_the_config_options_when_asked():
    out, names = script_imports("train", "--help")
    assert out.returncode == 0, out.stderr
    assert "--d-model" in out.stdout and "--seeds" in out.stdout  # config's and its own
    assert "pydantic" in names  # the options come from the config (which imports torch too)


def test_the_lazy_package_lists_and_gives_every_public_name():
    names = set(dir(attnscale))
    assert set(attnscale.__all__) <= names
    from attnscale import SCORES, Monitor, attention, get_score, reference_attention

    assert callable(attention) and callable(reference_attention) and callable(get_score)
    assert "scaled_dot" in SCORES and Monitor.__name__ == "Monitor"
    for name in attnscale.__all__:
        assert getattr(attnscale, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnscale.nope  # noqa: B018


def test_the_copied_help_values_agree_with_their_sources():
    from attnscale.integrations import checkup
    from attnscale.lab import leases, runlog, sweep
    from attnscale.measure import bench

    for copy, source in ((measure.Q, bench.QUICK), (measure.S, bench.STANDARD)):
        assert copy == {k: source[k] for k in copy}
    thresholds = {k: v for k, v in asdict(check.DEFAULTS).items()
                  if k not in ("growth", "plot_name")}
    assert thresholds == asdict(checkup.Thresholds())
    assert (check.DEFAULTS.growth, check.DEFAULTS.plot_name) == (checkup.GROWTH,
                                                                 checkup.PLOT_NAME)
    assert lab.TENSORBOARD_EXTRA == runlog.TENSORBOARD_EXTRA
    assert (lab.LEASE_S, lab.PATIENCE_S) == (leases.LEASE_S, sweep.PATIENCE_S)


def load_benchmark():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cli_startup.py"
    spec = importlib.util.spec_from_file_location("cli_startup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("n,ranks", [(6, (0, 5)), (10, (1, 8)), (20, (5, 14)), (50, (17, 32))])
def test_the_benchmarks_median_interval_covers_95_percent(n, ranks):
    """The narrowest symmetric order-statistic pair covering the median with >= 95%."""
    from math import comb

    bench = load_benchmark()
    assert bench.median_interval(n) == ranks
    j, k = ranks
    cover = sum(comb(n, i) for i in range(j + 1, k + 1)) / 2**n
    narrower = sum(comb(n, i) for i in range(j + 2, k)) / 2**n
    assert cover >= 0.95 > narrower


def test_the_benchmark_runs_and_records_its_provenance(tmp_path):
    out = tmp_path / "startup.json"
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cli_startup.py"
    done = subprocess.run([sys.executable, str(path), "--repeats", "6", "--no-train-help",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert set(record["results"]) == {"python -c pass", "attnscale --version", "attnscale --help"}
    for r in record["results"].values():
        assert r["ci95_lo_s"] <= r["median_s"] <= r["ci95_hi_s"] and len(r["samples_s"]) == 6
    assert record["git_rev"] and record["versions"]["attnscale"] and record["config"]["repeats"]
