"""attnscale.audit.theory_plots: the theory figures are written, and follow the registry."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

from attnscale.audit import theory_plots as tp
from attnscale.core.scores import get_score
from attnscale.measure import theory as th

PNG = b"\x89PNG\r\n\x1a\n"


def dpi_of(path: str) -> float:
    """The dpi a PNG's pHYs chunk records (0 without one)."""
    data = Path(path).read_bytes()
    pos = 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"pHYs":
            x, y, unit = struct.unpack(">IIB", data[pos + 8:pos + 17])
            return min(x, y) * 0.0254 if unit == 1 else 0.0
        pos += 12 + length
    return 0.0


def test_plots_are_print_quality_pngs(tmp_path) -> None:
    a = tp.plot_entropy_vs_scale(str(tmp_path / "entropy.png"), ns=(16, 256), samples=100)
    b = tp.plot_phase_diagram(str(tmp_path / "phase.png"), d_max=256, n_max=4096, grid=6)
    c = tp.plot_score_entropy(str(tmp_path / "scores.png"), d=16, ns=(8, 64))
    for path in (a, b, c):
        with open(path, "rb") as fh:
            assert fh.read(8) == PNG
        assert dpi_of(path) >= 150, path


def test_phase_summary_is_the_exact_theory() -> None:
    """Where unscaled entropy halves, and the scaled floor, agree with expected_entropy."""
    summary = tp.phase_summary(d_max=1024, n_max=4096, ns=(512,))
    d = summary["half_d"][512]
    assert 2 < d < 2 * math.log(512)  # it halves before the REM line d_k = 2 ln n
    assert th.expected_entropy(512, math.sqrt(d)) / math.log(512) == pytest.approx(0.5, abs=1e-6)
    assert summary["scaled_min"] == pytest.approx(th.expected_entropy(2, 1.0) / math.log(2))
    assert summary["unscaled_64_512"] == pytest.approx(th.expected_entropy(512, 8.0)
                                                       / math.log(512))
    assert tp.half_entropy_dk(512, d_max=4) is None  # not crossed below d_k = 4


def test_score_curves_use_registry_labels_and_exact_theory() -> None:
    curves = tp.score_curves(16, (8, 64))
    assert set(curves) == {get_score(name).tex for name in th.stat_scores()}
    scaled = curves[get_score("scaled_dot").tex]
    assert scaled[0] == pytest.approx(th.expected_stat("entropy", 16, 8, "scaled_dot")
                                      / math.log(8))


@pytest.mark.slow
def test_theory_command_draws_every_score(tmp_path) -> None:
    from attnscale import cli

    assert cli.run(["theory", "--plot", str(tmp_path), "--samples", "10", "--json"]) == 0
    for name in ("entropy_vs_scale", "phase_diagram", "score_entropy"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == PNG, name
