"""The benchmark runs and reports what it promises: ratio cells with 95% intervals from
interleaved repeats, a noise-floor row per block, a JSON record with config and provenance, and
a table whose headers survive any width. Speed itself is never asserted here."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from attnscale.cli import measure, tables
from attnscale.measure import bench
from attnscale.measure.overhead import RatioEstimate

CELL_KEYS = {"ratio", "lo", "hi", "repeats", "ms", "sdpa_ms", "half_width", "se_log",
             "converged", "target", "calls_per_block", "seconds"}
ROW_KEYS = {"score", "noise_floor", "n", "causal", "fwd", "fwdbwd", "naive", "gflops",
            "peak_fraction", "peak_mem_mb", "naive_peak_mem_mb"}
CONFIG_KEYS = {"batch", "heads", "head_dim", "n_values", "causal_values", "scores", "dtype",
               "threads", "repeats", "naive_repeats", "target", "budget_s", "block_s", "level"}
NUMBER = r"(\d+\.\d\d|\d\.\d\de\+\d\d|\d{3})"  # .2f below 100, else .3g
INTERVAL = re.compile(rf"^{NUMBER} \[{NUMBER}, {NUMBER}\]$")  # "1.03 [0.99, 1.07]"
TINY = {"n_values": [32], "batch": 1, "heads": 2, "head_dim": 8, "threads": 1}


@pytest.fixture(scope="module")
def tiny_run():
    return bench.run(scores=["scaled_dot", "softcap"], repeats=3, naive_repeats=2, **TINY)


def cells(row: bench.BenchRow) -> list[dict]:
    return [c for c in (row.fwd, row.fwdbwd, row.naive) if c is not None]


def test_rows_come_in_blocks_that_start_with_the_noise_floor(tiny_run):
    rows, _ = tiny_run
    assert [(r.score, r.noise_floor, r.causal) for r in rows] == [
        ("sdpa", True, False), ("scaled_dot", False, False), ("softcap", False, False),
        ("sdpa", True, True), ("scaled_dot", False, True), ("softcap", False, True)]
    for r in rows:
        assert set(r.to_dict()) == ROW_KEYS
        assert (r.naive is None) == r.noise_floor  # the floor has no naive formula


def test_every_cell_has_an_interval_around_its_ratio(tiny_run):
    rows, _ = tiny_run
    for r in rows:
        for c in cells(r):
            assert set(c) == CELL_KEYS
            assert 0 < c["lo"] <= c["ratio"] <= c["hi"], (r.score, c)
            assert c["ms"] > 0 and c["sdpa_ms"] > 0 and c["calls_per_block"] >= 1
            assert c["half_width"] == pytest.approx(max(c["hi"] / c["ratio"] - 1,
                                                        1 - c["lo"] / c["ratio"]), rel=1e-9)
        assert r.fwd["repeats"] == r.fwdbwd["repeats"] == 3
        assert r.naive is None or r.naive["repeats"] == 2
        assert r.gflops > 0 and r.peak_fraction > 0


def test_the_record_is_json_with_config_and_provenance(tiny_run):
    rows, facts = tiny_run
    record = json.loads(json.dumps(bench.to_record(rows, facts)))
    assert set(record) == {"rows", "config", "matmul_peak_gflops", "versions", "git_rev",
                           "machine", "seconds"}
    cfg = record["config"]
    assert set(cfg) >= CONFIG_KEYS
    assert (cfg["batch"], cfg["heads"], cfg["head_dim"], cfg["n_values"]) == (1, 2, 8, [32])
    assert cfg["dtype"] == "float32" and cfg["threads"] == 1
    assert (cfg["repeats"], cfg["naive_repeats"]) == (3, 2)
    assert "torch" in record["versions"] and record["git_rev"]
    assert len(record["rows"]) == 6 and record["rows"][0]["fwd"]["repeats"] == 3


def fake_measure(log: list):
    """A stand-in for measure_ratio that records its options and returns a fixed estimate."""
    def measure(fn, baseline, **opts):
        log.append((fn, baseline, opts))
        return RatioEstimate(ratio=1.0, lo=0.9, hi=1.1, n=opts["min_repeats"], converged=False,
                             seconds=0.0, ms=1.0, baseline_ms=1.0, number=1, half_width=0.1,
                             se_log=0.05, target=opts["target"])
    return measure


def kernel_of(call) -> str:
    """Which bench kernel factory made the kernel a timed closure calls ("_sdpa", ...)."""
    inner = [c.cell_contents for c in call.__closure__ if callable(c.cell_contents)]
    return inner[0].__qualname__.split(".")[0]


def test_cells_get_their_repeat_counts_and_the_floor_times_sdpa_twice(monkeypatch):
    log: list = []
    monkeypatch.setattr(bench, "measure_ratio", fake_measure(log))
    rows, _ = bench.run(scores=["cosine"], causal_values=[False], repeats=4, naive_repeats=2,
                        **TINY)
    # floor: fwd, fwdbwd; cosine: fwd, fwdbwd, naive
    assert [o["min_repeats"] for _, _, o in log] == [4, 4, 4, 4, 2]
    assert all(o["min_repeats"] == o["max_repeats"] for _, _, o in log)  # a fixed count
    fns = [(fn, base) for fn, base, _ in log]
    assert all(fn is not base for fn, base in fns)  # separate closures, even for the floor
    kinds = [(kernel_of(fn), kernel_of(base)) for fn, base in fns]
    assert kinds == [("_sdpa", "_sdpa")] * 2 + [("_ours", "_sdpa")] * 2 + [("_naive", "_sdpa")]
    assert fns[4][1] is fns[3][1]  # the naive cell is against the same SDPA fwd+bwd
    assert rows[0].naive is None and rows[1].naive["repeats"] == 2


def test_one_repeat_is_raised_to_two_and_bad_arguments_are_named(monkeypatch):
    log: list = []
    monkeypatch.setattr(bench, "measure_ratio", fake_measure(log))
    rows, facts = bench.run(scores=["dot"], causal_values=[True], repeats=1, naive=False, **TINY)
    assert facts["config"]["repeats"] == 2 and rows[1].fwd["repeats"] == 2
    assert facts["config"]["naive_repeats"] is None and rows[1].naive is None
    with pytest.raises(ValueError, match="batch"):
        bench.run(scores=["dot"], batch=0)
    with pytest.raises(ValueError, match="score"):
        bench.run(scores=["cosinus"])
    with pytest.raises(ValueError, match="target"):
        bench.run(scores=["dot"], target=-1.0)


@pytest.mark.parametrize(("ratio", "lo", "hi", "text"), [
    (1.0312, 0.9876, 1.07, "1.03 [0.99, 1.07]"),
    (5.2, 0.004, 47538.8, "5.20 [0.00, 4.75e+04]"),
    (123.4, 99.99, 150.0, "123 [99.99, 150]"),
])
def test_interval_cells_read_ratio_then_interval(ratio, lo, hi, text):
    assert measure.interval_cell({"ratio": ratio, "lo": lo, "hi": hi}) == text
    assert INTERVAL.match(text)
    assert measure.interval_cell(None) == "-"


def test_bench_params_come_from_the_registry():
    assert bench.bench_params("cosine") == {"tau": 10.0}  # practice's τ, not the default 1
    assert bench.bench_params("scaled_dot") == {}


def test_flop_count():
    assert bench.attention_flops(1, 1, 10, 4, causal=False, backward=False) == 4 * 100 * 4
    assert bench.attention_flops(1, 1, 10, 4, causal=True, backward=True) == 3 * 2 * 100 * 4


# -- the command line ---------------------------------------------------------------------------


def test_piped_table_at_80_columns_has_whole_headers_and_interval_cells(tiny_run, monkeypatch,
                                                                         capsys):
    rows, facts = tiny_run
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(tables, "interactive", lambda: False)
    measure.print_bench_table(rows, facts)
    text = capsys.readouterr().out
    assert "…" not in text
    lines = text.splitlines()
    assert lines[0].startswith("# ") and "3 interleaved repeats per cell (2 for naive)" in lines[0]
    assert lines[1].split("\t") == list(measure.BENCH_COLUMNS)
    assert "fwd+bwd ×SDPA [95% CI]" in measure.BENCH_COLUMNS
    body = [line.split("\t") for line in lines[2:]]
    assert len(body) == len(rows)
    floor = [cols for cols in body if cols[0] == "SDPA (noise floor)"]
    assert len(floor) == 2 and all(cols[5] == "-" for cols in floor)  # no naive for SDPA
    for cols in body:
        assert all(INTERVAL.match(c) for c in cols[3:5]), cols
        assert cols[0].startswith("SDPA") or INTERVAL.match(cols[5]), cols


def test_without_naive_cells_the_naive_column_is_left_out(tiny_run, monkeypatch, capsys):
    rows, facts = tiny_run
    monkeypatch.setattr(tables, "interactive", lambda: False)
    without = [dataclasses.replace(r, naive=None) for r in rows]
    measure.print_bench_table(without, facts)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split("\t") == [c for c in measure.BENCH_COLUMNS if not c.startswith("naive")]
    assert "for naive" not in lines[0]
    assert all(len(line.split("\t")) == len(measure.BENCH_COLUMNS) - 1 for line in lines[1:])


@pytest.mark.parametrize("width", [60, 80, 120, 250])
def test_a_terminal_table_never_cuts_a_header_word(width, tiny_run, monkeypatch, capsys):
    rows, facts = tiny_run
    monkeypatch.setattr(tables, "interactive", lambda: True)
    monkeypatch.setenv("COLUMNS", str(width))
    measure.print_bench_table(rows, facts)
    text = capsys.readouterr().out
    assert "…" not in text
    words = set(text.split())
    for header in measure.BENCH_COLUMNS:
        assert set(header.split()) <= words, (header, text)
    if "\t" not in text:  # the rich table fits the terminal
        assert max(len(line) for line in text.splitlines()) <= width


def test_cli_bench_json():
    out = subprocess.run(
        [sys.executable, "-m", "attnscale.cli", "bench", "--json", "--n", "16", "--score",
         "cosine", "--repeats", "2", "--threads", "1", "--no-naive"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert [(r["score"], r["causal"]) for r in record["rows"]] == [
        ("sdpa", False), ("cosine", False), ("sdpa", True), ("cosine", True)]
    assert record["config"]["threads"] == 1 and record["config"]["repeats"] == 2
    assert record["config"]["batch"] == bench.STANDARD["batch"]
    for r in record["rows"]:
        assert r["fwdbwd"]["lo"] <= r["fwdbwd"]["ratio"] <= r["fwdbwd"]["hi"]
