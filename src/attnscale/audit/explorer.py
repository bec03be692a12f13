"""Interactive explorer of the attention softmax, for the report page.

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

The selector's labels are the scores' registry labels
(:attr:`attnscale.core.scores.Score.label`); the µP constant and the soft-cap default are the
registry's. Public API: :func:`explorer_data`,
:func:`render_explorer` and :func:`standalone_page`; the headless-browser check of the page
lives with the tests.
"""

from __future__ import annotations

import copy
import math
import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, FileSystemLoader

from attnscale.core.scores import get_score
from attnscale.measure import theory as th

__all__ = [
    "COSINE_TAUS",
    "GAUSS_S",
    "PAGE_SCORES",
    "SCORES",
    "explorer_data",
    "render_explorer",
    "standalone_page",
]

TEMPLATES = Path(__file__).with_name("templates")
"""Folder of the jinja2 templates (package data: ``templates/*.html``)."""

PAGE_SCORES = ("dot", "scaled_dot", "cosine", "softcap", "mup")
"""The scores the page's script samples and draws."""

SCORES = {name: get_score(name).label for name in PAGE_SCORES}
"""Score options of the selector: value → registry label."""

GAUSS_S = (0.0, *(2.0 ** (k / 3.0) / 16.0 for k in range(31)))
"""Logit stds of the Gaussian (REM) grid: 0, then 1/16..64 at three points per octave."""

COSINE_TAUS = tuple(2.0 ** (k / 2.0) for k in range(-4, 11))
"""Cosine temperatures of the cosine grid: 0.25..32 at two points per octave."""

DEFAULTS = {"d": 64, "n": 512, "score": "scaled_dot", "tau": 1.0,
            "cap": get_score("softcap").defaults["cap"], "seed": 1}
"""Initial state of the page (τ = 1 as in the thread; the registry's soft-cap, Gemma 2's)."""

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
        rows["jacobian_sq"].append(np.asarray(th.rms_jacobian_norm(n, s)) ** 2)
    return {"s": _round(GAUSS_S), **{q: _round(v) for q, v in rows.items()}}


def _cosine_grid(ds: list[int], ns: list[int]) -> dict[str, list]:
    """Exact τ·cos statistics, indexed [d][n][τ] on ``COSINE_TAUS``."""
    out: dict[str, list] = {q: [] for q in _QUANTITIES}
    for d in ds:
        per_n = [[th.score_moments(d, n, "cosine", tau=tau) for tau in COSINE_TAUS] for n in ns]
        out["entropy"].append([[m.entropy for m in row] for row in per_n])
        out["max_weight"].append([[m.max_weight for m in row] for row in per_n])
        out["participation"].append([[m.participation for m in row] for row in per_n])
        out["jacobian_sq"].append([[m.jacobian_sq for m in row] for row in per_n])
    return {"tau": _round(COSINE_TAUS), **{q: _round(v) for q, v in out.items()}}


def _chi_rules(ds: list[int]) -> dict[str, list]:
    """Gauss rule in r = ‖q‖ ~ χ_d per d, the one :func:`attnscale.measure.theory.score_moments`
    uses."""
    rules = [th.chi_rule(d, th.default_chi_nodes(d)) for d in ds]
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
        "mup_c": get_score("mup").defaults["c"],
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
    :func:`attnscale.measure.theory.expected_entropy` etc.), ``cosine`` (tau, and per [d][n][τ]
    the same four, from :func:`attnscale.measure.theory.score_moments`), ``chi`` (Gauss rule r,
    w in ‖q‖ per d), ``mup_c``, ``defaults``. All numbers are rounded to 9 significant digits.
    The default grid takes ~10 s on one core the first time; later calls are free.
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
