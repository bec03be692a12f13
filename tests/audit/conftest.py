"""Headless-Chromium harness for the explorer and report pages (selenium), as a fixture.

``browser`` skips the test when selenium, chromium or chromedriver is missing (or fails it when
$ATTNSCALE_REQUIRE_BROWSER is set, as CI does) and returns a :class:`Harness`, whose
:meth:`Harness.check` opens a page and checks it end to end. Needs
``apt-get install -y chromium chromium-driver`` and ``pip install selenium``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REQUIRE = "ATTNSCALE_REQUIRE_BROWSER"

THEORY_PROBES = (
    ("scaled_dot", 64, 512, 1.0),
    ("dot", 16, 128, 1.0),
    ("dot", 4, 8192, 1.0),
    ("mup", 1024, 32, 1.0),
    ("cosine", 64, 512, 10.0),
    ("cosine", 8, 2048, 3.0),
    ("cosine", 256, 4, 32.0),
)
"""(score, d, n, τ) points where the check reads the page's interpolated theory."""

MC_PROBES = (
    ("scaled_dot", 64, 512, 1.0),
    ("dot", 16, 128, 1.0),
    ("mup", 1024, 32, 1.0),
    ("cosine", 64, 512, 10.0),
    ("cosine", 4, 8, 3.0),
)
"""(score, d, n, τ) points where the check runs the page's own sampler (MC_DRAWS draws)."""

MC_DRAWS = 400

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--force-device-scale-factor=1",
    "--window-size=1280,1000",
)
"""Flags for an offline headless Chromium (no background network traffic)."""


@dataclass(frozen=True)
class Harness:
    """What the ``browser`` fixture gives a test: the probe points and :meth:`check`."""

    theory_probes: tuple = THEORY_PROBES
    mc_probes: tuple = MC_PROBES
    mc_draws: int = MC_DRAWS

    def check(self, html_path: str | os.PathLike, screenshot_path: str | os.PathLike,
              **kwargs: Any) -> dict[str, Any]:
        """:func:`browser_check` of one page."""
        return browser_check(html_path, screenshot_path, **kwargs)


def require_browser() -> None:
    """Skip (or fail, when $ATTNSCALE_REQUIRE_BROWSER is set) if the browser stack is missing."""
    missing = []
    try:
        import selenium  # noqa: F401  (optional dependency: only the browser tests need it)
    except ImportError:
        missing.append("selenium is not installed (pip install selenium)")
    if find_chromium() is None:
        missing.append("chromium/chromedriver not found (apt-get install -y chromium "
                       "chromium-driver)")
    if not missing:
        return
    reason = "; ".join(missing)
    if os.environ.get(REQUIRE, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE} is set but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser() -> Harness:
    """The harness, once the browser stack is known to be there (checked first: a skip is free)."""
    require_browser()
    return Harness()


def find_chromium() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths from PATH or /usr/bin, or None if either is missing."""
    found = []
    for names in (("chromium", "chromium-browser"), ("chromedriver",)):
        hits = [shutil.which(n) or (f"/usr/bin/{n}" if Path(f"/usr/bin/{n}").exists() else None)
                for n in names]
        hits = [h for h in hits if h]
        if not hits:
            return None
        found.append(hits[0])
    return found[0], found[1]


_NUMBER_IDS = ("entropy", "entropy-norm", "maxw", "effkeys", "jac", "logitstd")

_JS_IMAGES = """
return Array.from(document.images).map(function (im) {
  return {src: im.currentSrc || im.src, complete: im.complete, w: im.naturalWidth};
});"""

_JS_FIGURES = """
var root = document.getElementById('explorer');
return Array.from(root.querySelectorAll('canvas, svg')).map(function (f) {
  return {id: f.id, rendered: f.getAttribute('data-rendered')};
});"""

_JS_FIGURES_DONE = """
var figs = document.getElementById('explorer').querySelectorAll('canvas, svg');
return Array.from(figs).every(function (f) { return f.getAttribute('data-rendered') === '1'; });"""

_JS_CONTROLS = """
return arguments[0].map(function (id) {
  var e = document.getElementById(id);
  return [id, e.value, e.min, e.max];
});"""

_JS_SET = """
var el = document.getElementById(arguments[0]);
var old = el.value;
el.value = arguments[1];
el.dispatchEvent(new Event(arguments[2], {bubbles: true}));
return [old, el.value];"""

_JS_RENDERS = "return Number(document.getElementById('explorer').dataset.renders || 0);"

_LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome:", "chrome-untrusted:",
                  "chrome-search:", "devtools:")


def _driver(chromium: str, chromedriver: str, profile: str):
    """A headless Chromium webdriver that never downloads anything (explicit Service path)."""
    # selenium is optional (dev extra): imported only once the browser stack is confirmed
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


def _wait(driver, script: str, timeout: float, *args) -> Any:
    """Poll ``script`` until it returns a truthy value; return it (or the last falsy one)."""
    end = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script, *args)
        if value or time.monotonic() > end:
            return value
        time.sleep(0.05)


def _numbers(driver) -> dict[str, str]:
    """The explorer's displayed numbers (this draw, mean, theory) by element id."""
    ids = [f"explorer-{k}{suffix}" for k in _NUMBER_IDS for suffix in ("", "-mean", "-theory")]
    return driver.execute_script(
        "var o = {}; arguments[0].forEach(function (id) { var e = document.getElementById(id);"
        " o[id] = e ? e.textContent : null; }); return o;", ids)


def _set_and_wait(driver, element_id: str, value: str, event: str, timeout: float) -> bool:
    """Set a control and dispatch ``event``; if its value changed, wait for the next render."""
    renders = driver.execute_script(_JS_RENDERS)
    old, new = driver.execute_script(_JS_SET, element_id, value, event)
    if old == new:
        return False
    return bool(_wait(driver, _JS_RENDERS[:-1] + " > arguments[0];", timeout, renders))


def _check_images(driver, timeout: float, problems: list[str]) -> int:
    """Wait for every <img> to finish loading; each must have naturalWidth > 0."""
    ready = "return Array.from(document.images).every(function (i) { return i.complete; });"
    _wait(driver, ready, timeout)
    images = driver.execute_script(_JS_IMAGES)
    problems.extend(f"image did not render: {im['src'][:200]}" for im in images
                    if not im["complete"] or im["w"] <= 0)
    return len(images)


def _check_figures(driver, timeout: float, problems: list[str], when: str) -> int:
    """Every canvas/svg in #explorer must get data-rendered="1" within ``timeout``."""
    _wait(driver, _JS_FIGURES_DONE, timeout)
    figs = driver.execute_script(_JS_FIGURES)
    if not figs:
        problems.append("no canvas/svg figure in #explorer")
    problems.extend(f"{when}: figure #{f['id'] or '?'} has no data-rendered=1" for f in figs
                    if f["rendered"] != "1")
    return len(figs)


def _check_sliders(driver, timeout: float, problems: list[str]) -> dict[str, Any]:
    """Move #explorer-n, then #explorer-d, to the other end; the numbers must change."""
    before = _numbers(driver)
    controls = driver.execute_script(_JS_CONTROLS, ["explorer-n", "explorer-d"])
    for element_id, value, low, high in controls:
        target = high if value == low else low
        if not _set_and_wait(driver, element_id, target, "input", timeout):
            problems.append(f"setting #{element_id} = {target} did not re-render")
    after = _numbers(driver)
    if all(before[k] == after[k] for k in before):
        problems.append("moving the n and d sliders did not change the displayed numbers")
    return {"numbers_before": before, "numbers_after": after}


def _check_scores(driver, timeout: float, problems: list[str]) -> None:
    """Every score of the selector (with τ and the cap moved) renders its figures and an entropy."""
    scores = driver.execute_script(
        "return Array.from(document.getElementById('explorer-score').options)"
        ".map(function (o) { return o.value; });")
    for score in scores:
        _set_and_wait(driver, "explorer-score", score, "change", timeout)
        for element_id, value in (("explorer-tau", "8"), ("explorer-cap", "2")):
            _set_and_wait(driver, element_id, value, "input", timeout)
        _check_figures(driver, timeout, problems, f"score {score}")
        if _numbers(driver).get("explorer-entropy") in (None, "", "—"):
            problems.append(f"score {score}: no entropy shown")


def _check_explorer(driver, timeout: float, problems: list[str]) -> dict[str, Any]:
    """Figures render; sliders change the numbers; every score renders; then back to start."""
    out: dict[str, Any] = {"figures": _check_figures(driver, timeout, problems, "on load")}
    ids = ["explorer-score", "explorer-n", "explorer-d", "explorer-tau", "explorer-cap"]
    start = driver.execute_script(_JS_CONTROLS, ids)
    out.update(_check_sliders(driver, timeout, problems))
    _check_scores(driver, timeout, problems)
    for element_id, value, _, _ in start:
        event = "change" if element_id == "explorer-score" else "input"
        _set_and_wait(driver, element_id, value, event, timeout)
    out["theory_probes"] = driver.execute_script(
        "var api = window.attnscaleExplorer; if (!api || !api.theory) return null;"
        " return arguments[0].map(function (p) { return api.theory(p[0], p[1], p[2], p[3]); });",
        [list(p) for p in THEORY_PROBES])
    out["mc_probes"] = driver.execute_script(
        "var api = window.attnscaleExplorer, draws = arguments[1];"
        " if (!api || !api.monteCarlo) return null;"
        " return arguments[0].map(function (p) {"
        " return api.monteCarlo(p[0], p[1], p[2], p[3], 50, 7, draws); });",
        [list(p) for p in MC_PROBES], MC_DRAWS)
    return out


def _log_problems(driver, problems: list[str]) -> dict[str, list]:
    """Console errors (level SEVERE) and every request that leaves the machine (http:, ws:...)."""
    console = driver.get_log("browser")
    errors = [e for e in console if e.get("level") == "SEVERE"]
    problems.extend(f"console error: {e.get('message', '')[:300]}" for e in errors)
    requests = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            url = msg["params"]["request"]["url"]
            if not url.startswith(_LOCAL_SCHEMES):
                requests.append(url)
    problems.extend(f"network request: {u[:200]}" for u in requests)
    return {"console": console, "console_errors": errors, "requests": requests}


LAYOUT_JS = """
const top = el => el ? el.getBoundingClientRect().top + window.scrollY : null;
const banner = document.getElementById('smoke-banner');
const cells = sel => [...document.querySelectorAll(sel)];
return {
  h2: cells('h2').map(h => h.id || (h.closest('section') || {}).id || h.textContent.trim()),
  takeaways_top: top(document.getElementById('takeaways')),
  viewport: window.innerHeight,
  smoke_banner: !!banner && banner.offsetParent !== null,
  banner_top: top(banner),
  rows_without_scale: cells('#verdicts tr, #questions tr').slice(0).filter(
      r => r.querySelector('td') && !(r.querySelector('td.scale') || {}).textContent),
  claims_without_scale: cells('div.claim').filter(
      d => !(d.querySelector('.scale') || {textContent: ''}).textContent.replace('Scale:', '')
             .trim()).map(d => d.id),
  takeaway_items: cells('#takeaways li').length,
  smoke_badges: cells('.verdict.smoke').length,
  evidence_badges: cells('.verdict:not(.smoke)').length,
  alts: cells('img').map(i => i.alt),
};
"""


def page_layout(driver) -> dict[str, Any]:
    """Where the page puts things: the order of its sections, the takeaways' and smoke
    banner's positions, verdict rows or claims without a scale line, badges and image alts."""
    out = driver.execute_script(LAYOUT_JS)
    out["rows_without_scale"] = len(out["rows_without_scale"])
    return out


def _screenshot(driver, path: Path) -> Path:
    """Full-page PNG through the DevTools protocol (height capped at 16000 CSS px)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 16000),
            "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True, "clip": clip})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def browser_check(
    html_path: str | os.PathLike,
    screenshot_path: str | os.PathLike,
    *,
    timeout: float = 20.0,
    require_explorer: bool = True,
) -> dict[str, Any]:
    """Open ``html_path`` in headless Chromium and check it end to end.

    Checks: every <img> loaded (naturalWidth > 0); if the page has the explorer (required unless
    ``require_explorer=False``), every canvas/svg in it has ``data-rendered="1"``, setting
    #explorer-n and #explorer-d to other values (input events) changes the displayed numbers,
    and every score renders; no console message of level SEVERE; no request that leaves the
    machine (anything but file:, data:, blob:, about: and Chromium's own chrome: pages).
    Saves a full-page screenshot PNG to ``screenshot_path``.

    Returns a dict: ``ok``, ``problems`` (list of str, empty when ok), ``images``, ``figures``,
    ``layout`` (:func:`page_layout`), ``numbers_before``/``numbers_after`` (id → text),
    ``theory_probes`` (the page's theory at
    :data:`THEORY_PROBES`), ``mc_probes`` (mean and standard error of the page's sampler over
    :data:`MC_DRAWS` draws at :data:`MC_PROBES`), ``console_errors``, ``requests``,
    ``screenshot``, ``seconds``.
    Raises RuntimeError if Chromium or chromedriver is missing, ImportError without selenium.
    """
    paths = find_chromium()
    if paths is None:
        raise RuntimeError("chromium/chromedriver not found (apt-get install chromium "
                           "chromium-driver)")
    start = time.monotonic()
    problems: list[str] = []
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="attnscale-chromium-") as profile:
        driver = _driver(*paths, profile)
        try:
            driver.get(Path(html_path).resolve().as_uri())
            _wait(driver, "return document.readyState === 'complete';", timeout)
            result["images"] = _check_images(driver, timeout, problems)
            result["layout"] = page_layout(driver)
            has_explorer = driver.execute_script("return !!document.getElementById('explorer');")
            if has_explorer:
                result.update(_check_explorer(driver, timeout, problems))
            elif require_explorer:
                problems.append("page has no #explorer")
            result["screenshot"] = str(_screenshot(driver, Path(screenshot_path)))
            result.update(_log_problems(driver, problems))
        finally:
            driver.quit()
    result.update(ok=not problems, problems=problems, seconds=time.monotonic() - start)
    return result
