"""The benchmark runs and reports what it promises; speed itself is not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys

from attnscale.measure import bench

KEYS = {
    "score",
    "n",
    "causal",
    "fwd_ms",
    "fwdbwd_ms",
    "sdpa_fwd_ms",
    "sdpa_fwdbwd_ms",
    "naive_fwdbwd_ms",
    "ratio_fwdbwd",
    "gflops",
    "peak_fraction",
}


def test_bench_runs_small():
    rows, facts = bench.run(
        n_values=[32], scores=["scaled_dot", "softcap"], batch=1, heads=2, head_dim=8, repeats=1
    )
    assert [(r.score, r.causal) for r in rows] == [
        ("scaled_dot", False),
        ("softcap", False),
        ("scaled_dot", True),
        ("softcap", True),
    ]
    for r in rows:
        d = r.to_dict()
        assert set(d) >= KEYS
        assert d["fwdbwd_ms"] > 0 and d["sdpa_fwdbwd_ms"] > 0 and d["naive_fwdbwd_ms"] > 0
        assert abs(d["ratio_fwdbwd"] - d["fwdbwd_ms"] / d["sdpa_fwdbwd_ms"]) < 1e-9
        assert d["peak_fraction"] > 0
    assert facts["matmul_peak_gflops"] > 0


def test_bench_params_come_from_the_registry():
    assert bench.bench_params("cosine") == {"tau": 10.0}  # practice's τ, not the default 1
    assert bench.bench_params("scaled_dot") == {}


def test_flop_count():
    assert bench.attention_flops(1, 1, 10, 4, causal=False, backward=False) == 4 * 100 * 4
    assert bench.attention_flops(1, 1, 10, 4, causal=True, backward=True) == 3 * 2 * 100 * 4


def test_cli_bench_json():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnscale.cli",
            "bench",
            "--json",
            "--n",
            "16",
            "--score",
            "cosine",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 2 and set(rows[0]) >= KEYS
