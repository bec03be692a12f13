"""Interactive explorer of the attention softmax, for the report page (issue 7, parts 3 and 4).

The explorer is a self-contained HTML fragment (markup, CSS and plain JavaScript, no network
requests) with sliders for d_k and n, a score selector (dot, scaled dot, cosine with τ,
soft-cap with c, µP) and, for that setting:

* the sorted softmax weights of one random draw: q and k_1..k_n with i.i.d. N(0, 1) components
  sampled in the browser with a seeded PRNG (sfc32 + Box–Muller), drawn on a <canvas>;
* entropy (nats and /ln n), max weight, effective keys 1/Σp², softmax Jacobian norm
  √(Σp² − 2Σp³ + (Σp²)²) and RMS logit, for that draw, averaged over a few draws, and exact;
* the exact theory curves (:mod:`attnscale.measure.theory`) against the logit std s, with the REM
  transition s_c = √(2 ln n) (Derrida 1981), or against τ for cosine with the bound
  e^{2τ}/(e^{2τ}+n−1).

The theory is computed here, in Python, on grids small enough to embed (:func:`explorer_data`,
about 10 s once, cached) and the page interpolates it with natural cubic splines:

* ``gauss``: n i.i.d. N(0, s²) logits (the Random Energy Model), s = 0 and 1/16..64 at three
  points per octave, for every n = 2^k on the slider. For dot, scaled dot and µP, the logits
  given q are i.i.d. N(0, (‖q‖·scale)²), so the page averages these curves over ‖q‖ ~ χ_d with
  the same Gauss rule :func:`attnscale.measure.theory.score_moments` uses (``chi``): the "theory"
  column equals :func:`attnscale.measure.theory.expected_stat` up to interpolation (< ~1e-3).
* ``cosine``: exact τ·cos(q, k) statistics for every (d, n) on the sliders, τ = 0.25..32 at two
  points per octave.
* soft-cap has no exact curve here (its logits are not Gaussian); the page shows the bound
  e^{2c}/(e^{2c}+n−1), which holds because every logit lies in (−c, c).

Public API: :func:`explorer_data`, :func:`render_explorer`, :func:`standalone_page` and
:func:`browser_check` (drives the page in headless Chromium; used by ``tests/test_browser.py``
and reusable for the report page).
"""

from __future__ import annotations

import base64
import copy
import json
import math
import os
import shutil
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, FileSystemLoader

from attnscale.measure import theory as th

__all__ = [
    "CHROMIUM_FLAGS",
    "COSINE_TAUS",
    "GAUSS_S",
    "MC_DRAWS",
    "MC_PROBES",
    "SCORES",
    "THEORY_PROBES",
    "browser_check",
    "explorer_data",
    "find_chromium",
    "render_explorer",
    "standalone_page",
]

TEMPLATES = Path(__file__).with_name("templates")
"""Folder of the jinja2 templates (package data: ``templates/*.html``)."""

SCORES = {
    "dot": "dot: q·k (unscaled)",
    "scaled_dot": "scaled dot: q·k/√d",
    "cosine": "cosine: τ·cos(q, k)",
    "softcap": "soft-cap: c·tanh((q·k/√d)/c)",
    "mup": f"µP: {th.MUP_C:g}·q·k/d",
}
"""Score options of the selector: value → label."""

GAUSS_S = (0.0, *(2.0 ** (k / 3.0) / 16.0 for k in range(31)))
"""Logit stds of the Gaussian (REM) grid: 0, then 1/16..64 at three points per octave."""

COSINE_TAUS = tuple(2.0 ** (k / 2.0) for k in range(-4, 11))
"""Cosine temperatures of the cosine grid: 0.25..32 at two points per octave."""

DEFAULTS = {"d": 64, "n": 512, "score": "scaled_dot", "tau": 1.0, "cap": 50.0, "seed": 1}
"""Initial state of the page (τ = 1 as in the thread; c = 50 as in Gemma 2)."""

THEORY_PROBES = (
    ("scaled_dot", 64, 512, 1.0),
    ("dot", 16, 128, 1.0),
    ("dot", 4, 8192, 1.0),
    ("mup", 1024, 32, 1.0),
    ("cosine", 64, 512, 10.0),
    ("cosine", 8, 2048, 3.0),
    ("cosine", 256, 4, 32.0),
)
"""(score, d, n, τ) points where :func:`browser_check` reads the page's interpolated theory."""

MC_PROBES = (
    ("scaled_dot", 64, 512, 1.0),
    ("dot", 16, 128, 1.0),
    ("mup", 1024, 32, 1.0),
    ("cosine", 64, 512, 10.0),
    ("cosine", 4, 8, 3.0),
)
"""(score, d, n, τ) points where :func:`browser_check` runs the page's own sampler (400 draws)."""

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

_SIG = 9  # significant digits kept in the embedded JSON
_QUANTITIES = ("entropy", "max_weight", "participation", "jacobian_sq")


# --------------------------------------------------------------------------------------------
# Theory grids
# --------------------------------------------------------------------------------------------


def _round(x: Any) -> Any:
    """Round floats (nested lists too) to ``_SIG`` significant digits, for a compact JSON."""
    if isinstance(x, list | tuple | np.ndarray):
        return [_round(v) for v in x]
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"non-finite value {v!r} in explorer data")
    return float(f"{v:.{_SIG}g}")


def _gauss_grid(ns: list[int]) -> dict[str, list]:
    """Exact REM statistics for n i.i.d. N(0, s²) logits on ``GAUSS_S``, one row per n."""
    s = np.asarray(GAUSS_S)
    rows: dict[str, list] = {q: [] for q in _QUANTITIES}
    for n in ns:
        rows["entropy"].append(th.expected_entropy(n, s))
        rows["max_weight"].append(th.expected_max_weight(n, s))
        rows["participation"].append(th.expected_participation(n, s))
        rows["jacobian_sq"].append(np.asarray(th.expected_jacobian_norm(n, s)) ** 2)
    return {"s": _round(GAUSS_S), **{q: _round(v) for q, v in rows.items()}}


def _cosine_grid(ds: list[int], ns: list[int]) -> dict[str, list]:
    """Exact τ·cos statistics, indexed [d][n][τ] on ``COSINE_TAUS``."""
    out: dict[str, list] = {q: [] for q in _QUANTITIES}
    for d in ds:
        per_n = [[th.score_moments(d, n, "cosine", tau) for tau in COSINE_TAUS] for n in ns]
        out["entropy"].append([[m.entropy for m in row] for row in per_n])
        out["max_weight"].append([[m.max_weight for m in row] for row in per_n])
        out["participation"].append([[m.participation for m in row] for row in per_n])
        out["jacobian_sq"].append([[m.jacobian_sq for m in row] for row in per_n])
    return {"tau": _round(COSINE_TAUS), **{q: _round(v) for q, v in out.items()}}


def _chi_rules(ds: list[int]) -> dict[str, list]:
    """Gauss rule in r = ‖q‖ ~ χ_d per d: the one :func:`attnscale.measure.theory.score_moments` uses."""
    rules = [th._chi_rule(d, th._default_chi_nodes(d)) for d in ds]
    return {"r": [_round(r) for r, _ in rules], "w": [_round(w) for _, w in rules]}


def _powers(exps: tuple[int, int], name: str) -> list[int]:
    lo, hi = exps
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi <= 16):
        raise ValueError(f"{name} must be integers 1 <= lo <= hi <= 16, got {exps!r}")
    return [2**k for k in range(lo, hi + 1)]


@cache
def _compute(n_exps: tuple[int, int], d_exps: tuple[int, int]) -> dict[str, Any]:
    ns, ds = _powers(n_exps, "n_exps"), _powers(d_exps, "d_exps")
    defaults = dict(DEFAULTS)
    defaults["d"] = min(max(defaults["d"], ds[0]), ds[-1])
    defaults["n"] = min(max(defaults["n"], ns[0]), ns[-1])
    return {
        "schema": 1,
        "mup_c": th.MUP_C,
        "n": ns,
        "d": ds,
        "defaults": defaults,
        "gauss": _gauss_grid(ns),
        "cosine": _cosine_grid(ds, ns),
        "chi": _chi_rules(ds),
    }


def explorer_data(
    *, n_exps: tuple[int, int] = (1, 13), d_exps: tuple[int, int] = (2, 10)
) -> dict[str, Any]:
    """Theory grids embedded in the explorer page (a fresh copy of a cached result).

    ``n`` = 2^k for k in ``n_exps`` (default 2..8192) and ``d`` = 2^k for k in ``d_exps``
    (default 4..1024) are the slider positions. Keys: ``gauss`` (s, and per n: entropy,
    max_weight, participation = E Σp², jacobian_sq = E‖J‖_F², from
    :func:`attnscale.measure.theory.expected_entropy` etc.), ``cosine`` (tau, and per [d][n][τ] the same
    four, from :func:`attnscale.measure.theory.score_moments`), ``chi`` (Gauss rule r, w in ‖q‖ per d),
    ``mup_c``, ``defaults``. All numbers are rounded to 9 significant digits. The default grid
    takes ~10 s on one core the first time; later calls are free.
    """
    return copy.deepcopy(_compute(tuple(n_exps), tuple(d_exps)))


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


@cache
def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                      keep_trailing_newline=True)
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "allow_nan": False,
                                         "separators": (",", ":")}
    return env


def render_explorer(data: dict | None = None) -> str:
    """The explorer as an HTML fragment (one <section id="explorer">, its CSS and script).

    ``data`` defaults to :func:`explorer_data`. It is embedded with jinja2's ``tojson`` filter
    inside <script type="application/json">, which escapes <, >, & and ' as \\u003c etc., so no
    string in it can close the script element. The template is autoescaped.
    """
    data = explorer_data() if data is None else data
    defaults = {**DEFAULTS, **data.get("defaults", {})}
    taus = data["cosine"]["tau"]
    return _environment().get_template("explorer.html").render(
        data=data, scores=SCORES, defaults=defaults,
        n_exp=[round(math.log2(n)) for n in data["n"]],
        d_exp=[round(math.log2(d)) for d in data["d"]],
        n_default_exp=round(math.log2(defaults["n"])),
        d_default_exp=round(math.log2(defaults["d"])),
        tau_min=f"{min(taus):g}", tau_max=f"{max(taus):g}",
    )


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>attnscale: attention softmax explorer</title>
<style>body {{ font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 72rem;
padding: 0 1rem; color: #1b1b1b; background: #fff; }}</style>
</head>
<body>
<main>
{fragment}
</main>
</body>
</html>
"""


def standalone_page(path: str | os.PathLike, data: dict | None = None) -> Path:
    """Write a minimal full HTML page holding only the explorer; return its path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_PAGE.format(fragment=render_explorer(data)), encoding="utf-8")
    return out


# --------------------------------------------------------------------------------------------
# Browser check (headless Chromium through selenium)
# --------------------------------------------------------------------------------------------


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
    """Every score (with τ and the cap moved) renders its figures and an entropy."""
    for score in SCORES:
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
    ``numbers_before``/``numbers_after`` (id → text), ``theory_probes`` (the page's theory at
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
