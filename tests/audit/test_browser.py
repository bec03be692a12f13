"""End-to-end browser test of the generated page in headless Debian Chromium (selenium).

The harness is the ``browser`` fixture (tests/audit/conftest.py). Needs
``apt-get install -y chromium chromium-driver`` and ``pip install selenium``. Without them every
test here is skipped, unless ATTNSCALE_REQUIRE_BROWSER is set (to anything but "" or "0"), as CI
does: then they fail. The page under test comes from the ``page`` fixture; to test the report
instead of the standalone explorer, return the report's index.html there. The screenshot goes
to $ATTNSCALE_SCREENSHOT_DIR if set, else to a pytest temporary folder.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from attnscale.audit import explorer as ex
from attnscale.core.scores import SCORES
from attnscale.measure import theory as th


def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("ATTNSCALE_SCREENSHOT_DIR")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page under test (switch to the report's index.html once it is built)."""
    return ex.standalone_page(tmp_path_factory.mktemp("page") / "explorer.html")


@pytest.fixture(scope="module")
def result(browser, page: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return browser.check(page, screenshot_dir(tmp_path_factory) / "explorer.png")


def test_page_passes_all_checks(result: dict) -> None:
    assert result["ok"], "\n".join(result["problems"])


def test_no_console_errors_and_no_network(result: dict) -> None:
    assert result["console_errors"] == []
    assert result["requests"] == []


def test_every_figure_renders(result: dict) -> None:
    assert result["figures"] >= 2
    assert not [p for p in result["problems"] if "render" in p or "image" in p]


def test_sliders_change_the_numbers(result: dict) -> None:
    before, after = result["numbers_before"], result["numbers_after"]
    for key in ("explorer-entropy", "explorer-maxw", "explorer-effkeys", "explorer-jac"):
        assert before[key] not in (None, "", "—") and after[key] not in (None, "", "—")
        assert before[key] != after[key], key


def test_screenshot_is_a_png(result: dict) -> None:
    data = Path(result["screenshot"]).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 600
    assert len(data) > 20_000  # not a blank page


def _params(score: str, tau: float) -> dict:
    """The page's τ is a parameter of cosine only."""
    return {"tau": tau} if "tau" in SCORES[score].defaults else {}


# The page's name for a theory quantity -> attnscale.measure.theory's
THEORY_NAMES = {"entropy": "entropy", "max_weight": "max_weight",
                "effective_keys": "effective_keys", "jacobian_norm": "rms_jacobian_norm"}


def test_page_theory_equals_python_theory(browser, result: dict) -> None:
    """The page's interpolated "exact" numbers match attnscale.measure.theory within 0.5%."""
    assert result["theory_probes"] is not None
    for (score, d, n, tau), shown in zip(browser.theory_probes, result["theory_probes"],
                                         strict=True):
        for page_name, q in THEORY_NAMES.items():
            want = th.expected_stat(q, d, n, score, **_params(score, tau))
            assert shown[page_name] == pytest.approx(want, rel=5e-3), (score, d, n, tau, q)


def test_page_sampler_agrees_with_theory(browser, result: dict) -> None:
    """The page's own q, k sampler and softmax statistics: seeded Monte Carlo within 4 SE."""
    assert result["mc_probes"] is not None
    names = {"entropy": "entropy", "max_weight": "max_weight",
             "participation": "participation", "jacobian_sq": "rms_jacobian_norm"}
    for (score, d, n, tau), mc in zip(browser.mc_probes, result["mc_probes"], strict=True):
        assert mc["draws"] == browser.mc_draws
        for key, q in names.items():
            want = th.expected_stat(q, d, n, score, **_params(score, tau)) ** (
                2 if key == "jacobian_sq" else 1)
            z = (mc["mean"][key] - want) / mc["se"][key]
            assert abs(z) < 4, (score, d, n, tau, key, mc["mean"][key], want, z)


def test_check_catches_a_broken_page(browser, tmp_path: Path) -> None:
    """The checker itself fails on a script error, a missing image and a network request."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html><head><link rel="icon" href="data:,"></head><body>'
                   '<img src="missing.png" alt="x"><img src="http://127.0.0.1:9/x.png" alt="y">'
                   "<script>notDefined();</script></body></html>")
    out = browser.check(bad, tmp_path / "bad.png", timeout=5)
    text = "\n".join(out["problems"])
    assert not out["ok"]
    assert "page has no #explorer" in text
    assert "notDefined" in text
    assert "missing.png" in text
    assert "network request: http://127.0.0.1:9/x.png" in text
