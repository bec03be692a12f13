"""Tests for attnscale.audit.explorer without a browser: theory grids, rendering, escaping, offline.

The browser end of the explorer (sampling, drawing, sliders) is tested in test_browser.py.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time

import numpy as np
import pytest
from scipy.interpolate import CubicSpline

from attnscale.audit import explorer as ex
from attnscale.core.scores import SCORES, Score, dot_logits, get_score, registered
from attnscale.measure import theory as th

IDS = ("explorer-d", "explorer-n", "explorer-score", "explorer-tau", "explorer-cap",
       "explorer-seed", "explorer-entropy", "explorer-maxw", "explorer-effkeys", "explorer-jac",
       "explorer-entropy-norm", "explorer-weights", "explorer-theory", "explorer-data")
EVIL = "</script><script>alert(1)</script><!--"


@pytest.fixture(scope="module")
def small() -> dict:
    """n = 8, 16 and d = 4, 8: cheap, but every array has two entries on each axis."""
    return ex.explorer_data(n_exps=(3, 4), d_exps=(2, 3))


@pytest.fixture(scope="module")
def one_point() -> dict:
    """d = 64, n = 512 only (the page's default), for interpolation checks."""
    return ex.explorer_data(n_exps=(9, 9), d_exps=(6, 6))


def _embedded(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>',
                      html, re.S)
    assert match, "no embedded JSON"
    return json.loads(match.group(1))


# ------------------------------------------------------------------------ theory grids


def test_gauss_grid_equals_theory(small: dict) -> None:
    g = small["gauss"]
    assert g["s"][0] == 0.0 and g["s"][1] == pytest.approx(1 / 16) and g["s"][-1] == 64.0
    for ni, n in enumerate(small["n"]):
        for si in (0, 1, 9, 17, 25, 30):
            s = g["s"][si]
            assert g["entropy"][ni][si] == pytest.approx(th.expected_entropy(n, s), rel=1e-8)
            assert g["max_weight"][ni][si] == pytest.approx(th.expected_max_weight(n, s),
                                                            rel=1e-8)
            assert g["participation"][ni][si] == pytest.approx(
                th.expected_participation(n, s), rel=1e-8)
            assert g["jacobian_sq"][ni][si] == pytest.approx(
                th.rms_jacobian_norm(n, s) ** 2, rel=1e-8)


def test_cosine_grid_equals_theory(small: dict) -> None:
    c = small["cosine"]
    assert c["tau"][0] == 0.25 and c["tau"][-1] == 32.0
    assert c["m"] == [3, 4, 7, 8]  # d − 1 for QK-LayerNorm, d for cosine and QK-RMSNorm
    for d in small["d"]:
        mi = c["m"].index(d)  # τ·cos in d dims is the cosine score
        for ni, n in enumerate(small["n"]):
            for ti in (0, 4, 9, 14):
                tau = c["tau"][ti]
                for q in ("entropy", "max_weight", "participation"):
                    want = th.expected_stat(q, d, n, "cosine", tau=tau)
                    assert c[q][mi][ni][ti] == pytest.approx(want, rel=1e-8), (q, d, n, tau)
                jac = th.expected_stat("rms_jacobian_norm", d, n, "cosine", tau=tau)
                assert c["jacobian_sq"][mi][ni][ti] == pytest.approx(jac**2, rel=1e-8)


def test_chi_rules_are_normalised(small: dict) -> None:
    for d, r, w in zip(small["d"], small["chi"]["r"], small["chi"]["w"], strict=True):
        assert sum(w) == pytest.approx(1.0, rel=1e-8)
        assert float(np.dot(w, np.square(r))) == pytest.approx(d, rel=1e-7)  # E‖q‖² = d


def _gauss_interp(data: dict, ni: int, q: str, s: float) -> float:
    """The page's interpolation: s² blend below s = 1/16, natural spline in log2 s above."""
    grid, row = data["gauss"]["s"], data["gauss"][q][ni]
    if s < grid[1]:
        return row[0] + (row[1] - row[0]) * (s / grid[1]) ** 2
    spline = CubicSpline(np.log2(grid[1:]), row[1:], bc_type="natural")
    return float(spline(math.log2(min(s, grid[-1]))))


def _page_exact(data: dict, score: str, q: str, tau: float = 1.0) -> float:
    """The page's "exact" value at the grid's only (d, n), interpolated as its script does."""
    spec = data["scores"][score]
    if spec["law"] == "cosine":
        t = spec["t"][0] * (tau if spec["slider"] == "tau" else 1.0)
        row = data["cosine"][q][data["cosine"]["m"].index(spec["m"][0])][0]
        return float(CubicSpline(np.log2(data["cosine"]["tau"]), row, bc_type="natural")(
            math.log2(t)))
    r, w = np.array(data["chi"]["r"][0]), np.array(data["chi"]["w"][0])
    return float(np.dot(w, [_gauss_interp(data, 0, q, ri * spec["factor"][0][0]) for ri in r]))


@pytest.mark.parametrize("score", th.stat_scores())
def test_page_exact_matches_expected_stat(one_point: dict, score: str) -> None:
    """What the page shows as "exact" for d = 64, n = 512 is expected_stat to < 5e-3, for every
    score with exact theory (c·q·k through the χ average, t·cos through the cosine grid)."""
    assert one_point["scores"][score]["exact"]
    for q in ("entropy", "max_weight", "participation"):
        want = th.expected_stat(q, 64, 512, score)
        assert _page_exact(one_point, score, q) == pytest.approx(want, rel=5e-3), q


def test_cosine_interpolation_between_grid_points(one_point: dict) -> None:
    for tau in (1.2, 10.0, 20.0):
        for q in ("entropy", "max_weight", "participation"):
            want = th.expected_stat(q, 64, 512, "cosine", tau=tau)
            got = _page_exact(one_point, "cosine", q, tau)
            assert got == pytest.approx(want, rel=5e-3), (q, tau)


def test_every_score_with_a_theory_hook_is_on_the_page(small: dict) -> None:
    hooked = [name for name, sc in SCORES.items() if sc.dot_factor or sc.cosine_law]
    assert ex.page_scores() == tuple(hooked)
    assert set(hooked) >= {"qk_layernorm", "qk_rmsnorm", "log_length", "softcap"}
    assert list(small["scores"]) == hooked


def test_score_data_comes_from_the_registry(small: dict) -> None:
    p = {name: get_score(name).defaults for name in small["scores"]}
    for name, spec in small["scores"].items():
        sc = get_score(name)
        assert spec["label"] == sc.label
        assert spec["exact"] == sc.has_theory
        if spec["law"] == "gauss":
            want = [[sc.dot_factor(d, n, p[name]) for n in small["n"]] for d in small["d"]]
            assert np.allclose(spec["factor"], want, rtol=1e-8), name
        else:
            unit = {**p[name], "tau": 1.0} if spec["slider"] == "tau" else p[name]
            laws = [sc.cosine_law(d, unit) for d in small["d"]]
            assert spec["m"] == [m for m, _ in laws]
            assert np.allclose(spec["t"], [t for _, t in laws])
    assert small["scores"]["cosine"]["slider"] == "tau"
    assert small["scores"]["qk_layernorm"]["slider"] is None
    assert small["scores"]["softcap"]["slider"] == "cap"
    assert small["scores"]["softcap"]["mod"] == "softcap"
    assert small["defaults"]["cap"] == get_score("softcap").defaults["cap"]
    assert small["defaults"]["tau"] == get_score("cosine").defaults["tau"]


def _toy_prepare(q, k, scale, p, ctx):
    return q, k, 0.5 / math.sqrt(ctx.head_dim)


TOY = Score(
    name="toy_half", summary="q·k/(2√d) (a test score)", label="toy: q·k/(2√d)",
    prepare=_toy_prepare, formula=lambda q, k, scale, p, ctx: dot_logits(q, k) * 0.5 / math.sqrt(
        q.shape[-1]), dot_factor=lambda d, n, p: 0.5 / math.sqrt(d),
)
UNKNOWN_MOD = Score(
    name="toy_clip", summary="a mod the page cannot draw (a test score)", defaults={"cap": 2.0},
    prepare=_toy_prepare, formula=lambda q, k, scale, p, ctx: dot_logits(q, k).clamp(-2, 2),
    mod=lambda z, p: z.clamp_(-p["cap"], p["cap"]), mod_grad=lambda f, p: (f.abs() < 2.0) * 1.0,
    dot_factor=lambda d, n, p: 1.0 / math.sqrt(d),
)


def test_a_registered_score_appears_with_no_other_edit() -> None:
    with registered(TOY), registered(UNKNOWN_MOD):
        data = ex.explorer_data(n_exps=(3, 3), d_exps=(2, 2))
        assert "toy_half" in ex.page_scores() and "toy_clip" not in ex.page_scores()
        html = ex.render_explorer(data)
    assert data["scores"]["toy_half"]["factor"] == [[0.25]]
    assert '<option value="toy_half">toy: q·k/(2√d)</option>' in html
    assert "toy_half" not in ex.explorer_data(n_exps=(3, 3), d_exps=(2, 2))["scores"]


def test_data_is_a_fresh_copy(small: dict) -> None:
    small_again = ex.explorer_data(n_exps=(3, 4), d_exps=(2, 3))
    small_again["gauss"]["entropy"][0][0] = -1.0
    assert ex.explorer_data(n_exps=(3, 4), d_exps=(2, 3))["gauss"]["entropy"][0][0] > 0


@pytest.mark.parametrize("bad", [(0, 3), (3, 2), (1, 17), (1, 2, 3)])
def test_bad_grid_is_rejected(bad: tuple) -> None:
    with pytest.raises(ValueError, match="n_exps"):
        ex.explorer_data(n_exps=bad)


def test_non_integer_grid_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"n_exps\[0\] must be an int"):
        ex.explorer_data(n_exps=(1.5, 3))


def test_data_of_another_schema_is_recomputed(small: dict) -> None:
    embedded = _embedded(ex.render_explorer({**small, "schema": 1}))
    assert embedded["schema"] == ex.SCHEMA and embedded["n"] == ex.explorer_data()["n"]


@pytest.mark.slow
def test_default_data_is_small_and_fast() -> None:
    start = time.perf_counter()
    data = ex.explorer_data()
    seconds = time.perf_counter() - start
    assert seconds < 60, f"explorer_data took {seconds:.1f} s"  # ~10 s on one free core
    assert data["n"] == [2**k for k in range(1, 14)]
    assert data["d"] == [2**k for k in range(2, 11)]
    html = ex.render_explorer(data)
    assert len(html.encode()) < 300_000
    embedded = _embedded(html)
    assert embedded == data
    assert embedded["gauss"]["entropy"][8][0] == pytest.approx(math.log(512))


# ------------------------------------------------------------------------ rendering


def test_fragment_has_controls_and_outputs(small: dict) -> None:
    html = ex.render_explorer(small)
    for element_id in IDS:
        assert f'id="{element_id}"' in html, element_id
    for slider in ("d", "n", "tau", "cap"):
        assert f'<label for="explorer-{slider}">' in html
        assert f'<output id="explorer-{slider}-value" for="explorer-{slider}">' in html
    assert '<label for="explorer-score">' in html and '<label for="explorer-seed">' in html
    for score in small["scores"]:
        assert f'<option value="{score}"' in html
    assert html.count("<canvas") == 2


def test_slider_ranges_follow_data(small: dict) -> None:
    html = ex.render_explorer(small)
    assert re.search(r'id="explorer-n" min="3" max="4" step="1"\s+value="4"', html)
    assert re.search(r'id="explorer-d" min="2" max="3" step="1"\s+value="3"', html)
    assert re.search(r'id="explorer-tau" min="0.25" max="32"', html)


def test_embedded_json_round_trips(small: dict) -> None:
    assert _embedded(ex.render_explorer(small)) == small


def test_script_breakout_is_inert(small: dict) -> None:
    data = {**small, "note": EVIL, "defaults": {**small["defaults"], "score": EVIL}}
    html = ex.render_explorer(data)
    assert "<script>alert(1)" not in html
    assert html.count("</script>") == 2  # the data block and the program
    assert html.count("<script") == 2
    assert "<!--" not in html
    assert _embedded(html)["note"] == EVIL  # still the same string once parsed


def test_markup_is_autoescaped(small: dict) -> None:
    data = copy.deepcopy(small)
    data["scores"]["dot"]["label"] = "<b onmouseover=alert(1)>dot</b>"
    html = ex.render_explorer(data)
    assert "<b onmouseover" not in html and "&lt;b onmouseover=alert(1)&gt;" in html


def test_no_network_requests(small: dict, tmp_path) -> None:
    page = ex.standalone_page(tmp_path / "x" / "explorer.html", small).read_text()
    assert page.startswith("<!doctype html>") and '<section id="explorer"' in page
    assert not re.search(r"https?://", page)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(//|[a-z]+:(?!,))""", page)
    assert not re.search(r"@import|url\(|<link(?![^>]*data:,)|<img|<iframe|fetch\(|XMLHttp",
                         page)


def test_nonfinite_data_is_refused() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        ex._round([1.0, float("nan")])


def test_theory_grids_are_cached_on_disk_under_their_code(tmp_path, monkeypatch) -> None:
    """A grid another process computed is read from the disk cache and equals a fresh
    computation; a change to the code that computes it gives it a new key."""
    monkeypatch.setenv("ATTNSCALE_CACHE", str(tmp_path))
    ns, ms = (8, 16), (4,)
    fresh_gauss, fresh_cosine = ex._compute_gauss_grid(ns), ex._compute_cosine_grid(ms, ns)
    ex._gauss_grid.__wrapped__(ns)
    ex._cosine_grid.__wrapped__(ms, ns)
    files = sorted(p.name for p in tmp_path.glob("explorer-*.json"))
    assert len(files) == 2
    monkeypatch.setattr(ex, "_compute_gauss_grid", lambda ns: pytest.fail("recomputed"))
    monkeypatch.setattr(ex, "_compute_cosine_grid", lambda ms, ns: pytest.fail("recomputed"))
    assert ex._gauss_grid.__wrapped__(ns) == fresh_gauss
    assert ex._cosine_grid.__wrapped__(ms, ns) == fresh_cosine
    key = ex._grid_key(ns=ns)
    monkeypatch.setattr(ex.diskcache, "source_digest", lambda *paths: "edited")
    assert ex._grid_key(ns=ns) != key
