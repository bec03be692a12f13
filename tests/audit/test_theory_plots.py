"""attnscale.audit.theory_plots: the theory figures are written, and follow the registry."""

from __future__ import annotations

import math

import pytest

from attnscale.audit import theory_plots as tp
from attnscale.core.scores import get_score
from attnscale.measure import theory as th

PNG = b"\x89PNG\r\n\x1a\n"


def test_plots_are_pngs(tmp_path) -> None:
    a = tp.plot_entropy_vs_scale(str(tmp_path / "entropy.png"), ns=(16, 256), samples=100)
    b = tp.plot_phase_diagram(str(tmp_path / "phase.png"), d_max=256, n_max=4096, grid=6)
    c = tp.plot_score_entropy(str(tmp_path / "scores.png"), d=16, ns=(8, 64))
    for path in (a, b, c):
        with open(path, "rb") as fh:
            assert fh.read(8) == PNG


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
