"""``--full`` beyond one machine: the training studies of a cut-down full preset run on a real
``ray start --head`` cluster. One seed: the cluster's work is one task per run, whatever the
seed, and judging and drawing a report are the tiny preset's tests (test_report.py), so more
seeds would only repeat the same tasks (three took 7.5 min of the suite's 2-core time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

from attnscale.audit.studies import PRESETS, cut_down, studies
from attnscale.lab.store import Store

CODE = """
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
    # a fresh process, as `attnscale report` would be: Ray reads its auth settings at import
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    db = tmp_path / "results.db"
    done = subprocess.run([sys.executable, "-c", CODE, str(db), ray_head],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    preset = cut_down(PRESETS["full"])
    plan = studies(replace(preset, seeds=preset.seeds[:1], task_seeds=preset.task_seeds[:1]))
    assert set(counts) == set(plan) and all(counts.values()), counts
    with Store(db) as store:
        runs = store.runs()
    assert {r["sweep"] for r in runs} == set(plan)
    # the full preset's extremes ran: its widest width and its largest head dimension
    assert max(r["config"]["d_model"] for r in runs if r["sweep"] == "lr_text") == 1024
    assert max(r["config"]["d_model"] for r in runs if r["sweep"] == "head_dim") == 512
    bad = [(r["status"], r.get("error")) for r in runs if r["status"] not in ("done", "diverged")]
    assert not bad, bad[:3]
