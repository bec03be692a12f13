"""``--full`` beyond one machine: a cut-down full preset runs on a real ``ray start --head``."""

from __future__ import annotations

import os
import subprocess
import sys

from attnscale.audit.studies import PRESETS, cut_down, studies
from attnscale.lab.store import Store


def test_cut_down_full_report_on_a_started_ray_cluster(tmp_path, ray_head):
    # a fresh process, as `attnscale report` would be: Ray reads its auth settings at import
    code = ("import json, sys; from attnscale.audit import report as R; "
            "from attnscale.audit.studies import PRESETS, cut_down; "
            "r = R.build_report(cut_down(PRESETS['full']), out=sys.argv[1], executor='ray', "
            "workers=2, address=sys.argv[2]); print(json.dumps(r['preset']))")
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "full"), ray_head],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == '"full-cut"'
    preset = cut_down(PRESETS["full"])
    with Store(tmp_path / "full" / "results.db") as store:
        runs = store.runs()
    plan = studies(preset)
    assert {r["sweep"] for r in runs} == set(plan)
    # the full preset's extremes ran: its widest width and its largest head dimension
    assert max(r["config"]["d_model"] for r in runs if r["sweep"] == "lr_text") == 1024
    assert max(r["config"]["d_model"] for r in runs if r["sweep"] == "head_dim") == 512
    bad = [(r["status"], r.get("error")) for r in runs if r["status"] not in ("done", "diverged")]
    assert not bad, bad[:3]
