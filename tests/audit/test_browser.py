"""End-to-end browser test of the generated page in headless Debian Chromium (selenium).

Needs ``apt-get install -y chromium chromium-driver`` and ``pip install selenium``. Without
them every test here is skipped, unless ATTNSCALE_REQUIRE_BROWSER is set (to anything but "" or
"0"), as CI does: then they fail. The page under test comes from the ``page`` fixture; to test
the report instead of the standalone explorer, return the report's index.html there. The
screenshot goes to $ATTNSCALE_SCREENSHOT_DIR if set, else to a pytest temporary folder.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from attnscale.audit import explorer as ex
from attnscale.measure import theory as th

REQUIRE = "ATTNSCALE_REQUIRE_BROWSER"


def require_browser() -> None:
    """Skip (or fail, when $ATTNSCALE_REQUIRE_BROWSER is set) if the browser stack is missing."""
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium is not installed (pip install selenium)")
    if ex.find_chromium() is None:
        missing.append("chromium/chromedriver not found (apt-get install -y chromium "
                       "chromium-driver)")
    if not missing:
        return
    reason = "; ".join(missing)
    if os.environ.get(REQUIRE, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE} is set but {reason}")
    pytest.skip(reason)


def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("ATTNSCALE_SCREENSHOT_DIR")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser() -> None:
    """Checked before the page is built, so that a skip costs nothing."""
    require_browser()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page under test (switch to the report's index.html once it is built)."""
    return ex.standalone_page(tmp_path_factory.mktemp("page") / "explorer.html")


@pytest.fixture(scope="module")
def result(browser: None, page: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return ex.browser_check(page, screenshot_dir(tmp_path_factory) / "explorer.png")


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


def test_page_theory_equals_python_theory(result: dict) -> None:
    """The page's interpolated "exact" numbers match attnscale.measure.theory within 0.5%."""
    assert result["theory_probes"] is not None
    for (score, d, n, tau), shown in zip(ex.THEORY_PROBES, result["theory_probes"],
                                         strict=True):
        for q in ("entropy", "max_weight", "effective_keys", "jacobian_norm"):
            want = th.expected_stat(q, d, n, score, tau)
            assert shown[q] == pytest.approx(want, rel=5e-3), (score, d, n, tau, q)


def test_page_sampler_agrees_with_theory(result: dict) -> None:
    """The page's own q, k sampler and softmax statistics: seeded Monte Carlo within 4 SE."""
    assert result["mc_probes"] is not None
    names = {"entropy": "entropy", "max_weight": "max_weight",
             "participation": "participation", "jacobian_sq": "jacobian_norm"}
    for (score, d, n, tau), mc in zip(ex.MC_PROBES, result["mc_probes"], strict=True):
        assert mc["draws"] == ex.MC_DRAWS
        for key, q in names.items():
            want = th.expected_stat(q, d, n, score, tau) ** (2 if key == "jacobian_sq" else 1)
            z = (mc["mean"][key] - want) / mc["se"][key]
            assert abs(z) < 4, (score, d, n, tau, key, mc["mean"][key], want, z)


def test_check_catches_a_broken_page(tmp_path: Path) -> None:
    """The checker itself fails on a script error, a missing image and a network request."""
    require_browser()
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html><head><link rel="icon" href="data:,"></head><body>'
                   '<img src="missing.png" alt="x"><img src="http://127.0.0.1:9/x.png" alt="y">'
                   "<script>notDefined();</script></body></html>")
    out = ex.browser_check(bad, tmp_path / "bad.png", timeout=5)
    text = "\n".join(out["problems"])
    assert not out["ok"]
    assert "page has no #explorer" in text
    assert "notDefined" in text
    assert "missing.png" in text
    assert "network request: http://127.0.0.1:9/x.png" in text
