"""Interactive explorer of the attention softmax, for the report page.

The explorer is a self-contained HTML fragment (markup, CSS and plain JavaScript, no network
requests) with sliders for d_k and n, a score selector (every registered score the page can
draw, :func:`page_scores`), a temperature τ and a soft-cap c slider and, for that setting:

* the sorted softmax weights of one random draw: q and k_1..k_n with i.i.d. N(0, 1) components
  sampled in the browser with a seeded PRNG (sfc32 + Box–Muller), drawn on a <canvas>;
* entropy (nats and /ln n), max weight, effective keys 1/Σp², softmax Jacobian norm
  √(Σp² − 2Σp³ + (Σp²)²) and RMS logit, for that draw, averaged over a few draws, and exact;
* the exact theory curves (:mod:`attnscale.measure.theory`) against the logit std s, with the REM
  transition s_c = √(2 ln n) (Derrida 1981), or against the temperature t of a t·cos score with
  the bound e^{2t}/(e^{2t}+n−1).

Everything the page knows about a score comes from its registry entry
(:class:`attnscale.core.scores.Score`), sent as data (``scores`` in :func:`explorer_data`):

* a ``dot_factor`` c (logit c·q·k): c on the page's (d, n) grid. Given q the logits are i.i.d.
  N(0, (c·‖q‖)²), so the page averages the ``gauss`` curves over ‖q‖ ~ χ_d with the Gauss rule
  :func:`attnscale.measure.theory.score_moments` uses (``chi``): the "exact" column equals
  :func:`attnscale.measure.theory.expected_stat` up to interpolation (< ~1e-3);
* a ``cosine_law`` (m, t) (logit t·cos in m dims): m and t per grid d, and t per unit τ where
  the law is linear in the score's ``tau`` (the τ slider then sets it). The page draws q and k
  in m dims and reads the ``cosine`` grid, exact for t·cos in m dims;
* an elementwise ``mod`` after c·q·k: the page knows one, soft-capping c·tanh(z/c) (checked
  numerically against the score's own function), with c from the cap slider. Its logits are not
  Gaussian given q, so it has no exact curve; the page shows the bound e^{2c}/(e^{2c}+n−1).

The theory grids (``gauss``: n i.i.d. N(0, s²) logits, s = 0 and 1/16..64 at three points per
octave, per n = 2^k on the slider; ``cosine``: t·cos in m dims for every m the scores need,
t = 0.25..32 at two points per octave) are computed here once per machine (25-35 s on 2 cores;
kept by :mod:`attnscale.util.diskcache`, keyed by the code that computes them) and the page
interpolates them with natural cubic splines. Public API: :func:`explorer_data`,
:func:`render_explorer`, :func:`standalone_page` and :func:`page_scores`; the headless-browser
check of the page lives with the tests.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jinja2 import Environment, FileSystemLoader

from attnscale.core.scores import SCORES, Score
from attnscale.measure import cosine_theory, quadrature
from attnscale.measure import theory as th
from attnscale.util import diskcache
from attnscale.util.validate import check_int

__all__ = [
    "COSINE_TAUS",
    "GAUSS_S",
    "SCHEMA",
    "SLIDERS",
    "explorer_data",
    "page_scores",
    "render_explorer",
    "standalone_page",
]

TEMPLATES = Path(__file__).with_name("templates")
"""Folder of the jinja2 templates (package data: ``templates/*.html``)."""

SCHEMA = 2
"""Version of the data layout :func:`explorer_data` returns and the page reads."""

SLIDERS = ("tau", "cap")
"""Score parameters the page's sliders set: a temperature τ and a soft-cap c."""

GAUSS_S = (0.0, *(2.0 ** (k / 3.0) / 16.0 for k in range(31)))
"""Logit stds of the Gaussian (REM) grid: 0, then 1/16..64 at three points per octave."""

COSINE_TAUS = tuple(2.0 ** (k / 2.0) for k in range(-4, 11))
"""Temperatures of the cosine grid: 0.25..32 at two points per octave."""

DEFAULTS = {"d": 64, "n": 512, "score": "scaled_dot", "seed": 1}
"""Initial state of the page; the sliders start at the registry's defaults for τ and c."""

_SIG = 9  # significant digits kept in the embedded JSON
_QUANTITIES = ("entropy", "max_weight", "participation", "jacobian_sq")
log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# What the page knows about each score, from the registry
# --------------------------------------------------------------------------------------------


def _soft_caps(sc: Score) -> bool:
    """Whether the score's ``mod`` is soft-capping c·tanh(z/c) in its parameter ``cap``."""
    if sc.mod is None or "cap" not in sc.scalar_params():
        return False
    z = torch.linspace(-20.0, 20.0, 81, dtype=torch.float64)
    for cap in (0.5, 7.0):
        got = sc.apply_mod(z.clone(), {**sc.defaults, "cap": cap})
        if not torch.allclose(got, cap * torch.tanh(z / cap), rtol=1e-9, atol=1e-9):
            return False
    return True


def _linear_in_tau(sc: Score, ds: list[int]) -> bool:
    """Whether the score's cosine law is (m, τ·t₁) in its parameter ``tau``, m not moving."""
    if "tau" not in sc.scalar_params():
        return False
    for d in ds:
        m1, t1 = sc.cosine_law(d, {**sc.defaults, "tau": 1.0})
        for tau in (0.5, 3.0):
            m, t = sc.cosine_law(d, {**sc.defaults, "tau": tau})
            if m != m1 or not math.isclose(t, tau * t1, rel_tol=1e-12):
                return False
    return True


def _drawable(sc: Score) -> bool:
    """A theory hook the page can sample: a cosine law, or c·q·k with no or a soft-cap mod."""
    if sc.cosine_law is not None:
        return True
    return sc.dot_factor is not None and (sc.fused or _soft_caps(sc))


def page_scores() -> tuple[str, ...]:
    """The registered scores the page shows, in registry order: every one with a theory hook
    (``dot_factor`` or ``cosine_law``) whose logits the page can draw (:func:`_drawable`)."""
    return tuple(name for name, sc in SCORES.items() if _drawable(sc))


def _score_spec(sc: Score, ds: list[int], ns: list[int]) -> dict[str, Any]:
    """What the page's script needs to draw and compute one score on the (d, n) grid."""
    p = dict(sc.defaults)
    if sc.cosine_law is not None:
        slider = "tau" if _linear_in_tau(sc, ds) else None
        laws = [sc.cosine_law(d, {**p, "tau": 1.0} if slider else p) for d in ds]
        return {"label": sc.label, "law": "cosine", "slider": slider, "exact": True,
                "mod": None, "m": [int(m) for m, _ in laws], "t": _round([t for _, t in laws])}
    soft_cap = sc.mod is not None
    return {"label": sc.label, "law": "gauss", "slider": "cap" if soft_cap else None,
            "exact": sc.fused, "mod": "softcap" if soft_cap else None,
            "factor": _round([[sc.dot_factor(d, n, p) for n in ns] for d in ds])}


def _slider_defaults() -> dict[str, float]:
    """Each slider starts at the default of the first page score that has its parameter."""
    out = {}
    for name in SLIDERS:
        values = [SCORES[s].defaults[name] for s in page_scores() if name in SCORES[s].defaults]
        out[name] = float(values[0]) if values else 1.0
    return out


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


def _grid_key(**args: Any) -> dict[str, Any]:
    """What a theory grid depends on: its arguments and the code that computes it."""
    code = [th.__file__, quadrature.__file__, cosine_theory.__file__, __file__]
    return {**args, "schema": SCHEMA, "code": diskcache.source_digest(*code),
            "numpy": np.__version__}


@cache
def _gauss_grid(ns: tuple[int, ...]) -> dict[str, list]:
    """:func:`_compute_gauss_grid`, computed once per machine (:mod:`attnscale.util.diskcache`)."""
    return diskcache.cached_json("explorer-gauss", _grid_key(ns=ns),
                                 lambda: _compute_gauss_grid(ns), log)


@cache
def _cosine_grid(ms: tuple[int, ...], ns: tuple[int, ...]) -> dict[str, list]:
    """:func:`_compute_cosine_grid`, computed once per machine."""
    return diskcache.cached_json("explorer-cosine", _grid_key(ms=ms, ns=ns),
                                 lambda: _compute_cosine_grid(ms, ns), log)


def _compute_gauss_grid(ns: tuple[int, ...]) -> dict[str, list]:
    """Exact REM statistics for n i.i.d. N(0, s²) logits on ``GAUSS_S``, one row per n."""
    s = np.asarray(GAUSS_S)
    rows: dict[str, list] = {q: [] for q in _QUANTITIES}
    for n in ns:
        rows["entropy"].append(th.expected_entropy(n, s))
        rows["max_weight"].append(th.expected_max_weight(n, s))
        rows["participation"].append(th.expected_participation(n, s))
        rows["jacobian_sq"].append(np.asarray(th.rms_jacobian_norm(n, s)) ** 2)
    return {"s": _round(GAUSS_S), **{q: _round(v) for q, v in rows.items()}}


def _compute_cosine_grid(ms: tuple[int, ...], ns: tuple[int, ...]) -> dict[str, list]:
    """Exact t·cos statistics in m dims, indexed [m][n][t] on ``COSINE_TAUS``."""
    out: dict[str, list] = {q: [] for q in _QUANTITIES}
    for m in ms:
        per_n = [[th.softmax_moments(th.cosine_logits(m, t, n), n) for t in COSINE_TAUS]
                 for n in ns]
        for q in _QUANTITIES:
            out[q].append([[getattr(mom, q) for mom in row] for row in per_n])
    return {"tau": _round(COSINE_TAUS), "m": list(ms), **{q: _round(v) for q, v in out.items()}}


def _chi_rules(ds: list[int]) -> dict[str, list]:
    """Gauss rule in r = ‖q‖ ~ χ_d per d, the one :func:`attnscale.measure.theory.score_moments`
    uses."""
    rules = [th.chi_rule(d, th.default_chi_nodes(d)) for d in ds]
    return {"r": [_round(r) for r, _ in rules], "w": [_round(w) for _, w in rules]}


def _powers(exps: tuple[int, int], name: str) -> list[int]:
    if not (isinstance(exps, tuple) and len(exps) == 2):
        raise ValueError(f"{name} must be a pair (lo, hi), got {exps!r}")
    lo = check_int(f"{name}[0]", exps[0], minimum=1, maximum=16)
    hi = check_int(f"{name}[1]", exps[1], minimum=lo, maximum=16)
    return [2**k for k in range(lo, hi + 1)]


def explorer_data(
    *, n_exps: tuple[int, int] = (1, 13), d_exps: tuple[int, int] = (2, 10)
) -> dict[str, Any]:
    """Theory grids and score descriptions embedded in the explorer page (a fresh copy).

    ``n`` = 2^k for k in ``n_exps`` (default 2..8192) and ``d`` = 2^k for k in ``d_exps``
    (default 4..1024) are the slider positions. Keys: ``scores`` (per :func:`page_scores` name:
    label, law "gauss" with ``factor`` [d][n] or "cosine" with ``m`` and ``t`` per d, the
    ``slider`` it follows, ``mod``, whether an ``exact`` curve exists), ``gauss`` (s, and per
    n: entropy, max_weight, participation = E Σp², jacobian_sq = E‖J‖_F², from
    :func:`attnscale.measure.theory.expected_entropy` etc.), ``cosine`` (tau, m, and per
    [m][n][t] the same four), ``chi`` (Gauss rule r, w in ‖q‖ per d), ``defaults``, ``schema``.
    All numbers are rounded to 9 significant digits. The grids take 25-35 s the first time on
    a machine; later calls and processes reuse them (:mod:`attnscale.util.diskcache`).
    """
    ns, ds = _powers(tuple(n_exps), "n_exps"), _powers(tuple(d_exps), "d_exps")
    scores = {name: _score_spec(SCORES[name], ds, ns) for name in page_scores()}
    ms = sorted({m for spec in scores.values() if spec["law"] == "cosine" for m in spec["m"]})
    defaults = {**DEFAULTS, **_slider_defaults()}
    defaults["d"] = min(max(defaults["d"], ds[0]), ds[-1])
    defaults["n"] = min(max(defaults["n"], ns[0]), ns[-1])
    return {
        "schema": SCHEMA,
        "n": ns,
        "d": ds,
        "defaults": defaults,
        "scores": scores,
        "gauss": copy.deepcopy(_gauss_grid(tuple(ns))),
        "cosine": copy.deepcopy(_cosine_grid(tuple(ms), tuple(ns))),
        "chi": _chi_rules(ds),
    }


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

    ``data`` defaults to :func:`explorer_data`; data of another ``schema`` (stored by an older
    version) is recomputed on the default grid. It is embedded with jinja2's ``tojson`` filter
    inside <script type="application/json">, which escapes <, >, & and ' as \\u003c etc., so no
    string in it can close the script element. The template is autoescaped.
    """
    if data is None or data.get("schema") != SCHEMA:
        data = explorer_data()
    defaults = data["defaults"]
    taus = data["cosine"]["tau"]
    return _environment().get_template("explorer.html").render(
        data=data, defaults=defaults,
        scores={name: spec["label"] for name, spec in data["scores"].items()},
        n_exp=[round(math.log2(n)) for n in data["n"]],
        d_exp=[round(math.log2(d)) for d in data["d"]],
        n_default_exp=round(math.log2(defaults["n"])),
        d_default_exp=round(math.log2(defaults["d"])),
        tau_min=f"{min(taus):g}", tau_max=f"{max(taus):g}",
        cap_max=f"{max(50.0, defaults['cap']):g}",
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
