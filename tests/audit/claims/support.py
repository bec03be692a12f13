"""What the claims' tests share: synthetic paired evidence (every arm of a draw shares a
per-seed level, as runs with the same init and data order do, so only the paired difference
removes it), scipy's versions of the numbers the rules compute, the check that no sentence reads
as another verdict, and the checks of a figure's PNG and layout.

The test directories are not packages: a test file beside this one imports it by plain name
(``from support import Draw``); tests/audit/test_figures.py imports it as ``claims.support``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from attnscale.audit import theory_plots
from attnscale.audit import verdicts as V
from attnscale.audit.readings import cell
from attnscale.audit.verdicts import LOSS_DELTA, Verdict

SEEDS = 5  # the standard preset's reported seeds (every study the claims read)
DKS = (16, 64, 128, 256)  # head dimensions of the synthetic head-dimension study
WIDTHS = ("d_model=32", "d_model=128")  # the text LR study's widths
NULL_DRAWS = range(20)  # rng seeds of the no-effect tests: every one must read inconclusive
READINGS = ("greater", "less", "equal")  # the decided readings of a paired comparison

CLAIMS_MD = (Path(__file__).parents[3] / "docs" / "claims.md").read_text()
GENERIC = re.compile(r"^\s*(C\d+|Q\d+)?\s*(figure|fig\.?|plot|image)?\s*\d*\s*$", re.I)
"""An alt text that names the figure instead of stating its finding ("C3 figure 2")."""


# ------------------------------------------------------------------------ synthetic draws


class Draw:
    """One synthetic study: every arm shares a per-seed level (same init and data order), so
    only the paired difference removes it. ``spread`` is the levels' standard deviation (the
    class's :attr:`spread` unless given); ``n`` the seeds."""

    spread = 0.2  # a clipped eval loss in nats (head_dim study, C6)

    def __init__(self, rng_seed: int, n: int = SEEDS, spread: float | None = None):
        self.rng = np.random.default_rng(rng_seed)
        self.level = self.rng.normal(0.0, self.spread if spread is None else spread, n)

    def values(self, mean: float, noise: float) -> dict[str, float]:
        """Per-seed values: ``mean`` plus the seed's level plus noise of sd ``noise``."""
        x = mean + self.level + noise * self.rng.standard_normal(self.level.size)
        return {str(s): float(v) for s, v in enumerate(x)}

    def arm(self, mean: float, noise: float, censored: bool = False) -> dict[str, Any]:
        """One arm as :mod:`attnscale.audit.selection` writes it, around :meth:`values`."""
        v = self.values(mean, noise)
        return {"values": v, "lrs": dict.fromkeys(v, 0.01), "censored": censored, "curve": {}}

    def unstable(self, p: float) -> dict[str, float]:
        """Per seed, the unstable fraction of a six-LR grid (each LR unstable w.p. ``p``)."""
        return {str(s): int(k) / 6 for s, k in enumerate(self.rng.binomial(6, p, self.level.size))}


class TaskDraw(Draw):
    """A synthetic task study (tau, salience, length): levels of sd 0.05, and each arm measured
    to 0.005 unless told otherwise."""

    spread = 0.05

    def arm(self, mean: float, noise: float = 0.005, censored: bool = False) -> dict[str, Any]:
        return super().arm(mean, noise, censored)


class SweepDraw(Draw):
    """A synthetic text LR study (its sweep's sensitivities and losses): levels of sd 0.1."""

    spread = 0.1


def around(mean: float, spread: float = 0.01, n: int = 6, seed: int = 0) -> dict[str, Any]:
    """One arm's ``n`` per-seed values around ``mean`` (no shared level), uncensored."""
    xs = mean + spread * np.random.default_rng(seed).standard_normal(n)
    return {"values": {str(i): float(v) for i, v in enumerate(xs)}, "censored": False}


def head_dim(draw: Draw, gap: float | Callable[[int], float], noise: float = 0.002,
             gpt2_gap: float = 0.0, dks: Sequence[int] = DKS) -> dict[str, Any]:
    """Head-dimension evidence (the study's arms scaled_dot and dot): dot − scaled_dot =
    gap(d_k) in the unit regime (``gap`` a number or a function of d_k), ``gpt2_gap`` in the
    GPT-2 one; C7's identity check held at every d_k."""
    gap_at = gap if callable(gap) else (lambda d: gap)
    loss = {}
    for init in ("gpt2", "unit"):
        for d in dks:
            g = gap_at(d) if init == "unit" else gpt2_gap
            loss[cell(init, d)] = {"scaled_dot": draw.arm(2.0, noise),
                                   "dot": draw.arm(2.0 + g, noise)}
    entropy = {k: {"dot": draw.arm(0.5, 0.01), "scaled_dot": draw.arm(0.9, 0.01)}
               for k in loss}
    run = {"steps": 20, "factor": 0.5, "max_weight_rel_diff": 0.0, "clipped_steps": 5}
    identity = {"exact": [{**run, "d_k": d, "partial": False, "max_loss_diff": 1e-12 * d}
                          for d in dks],
                "partial": [{**run, "d_k": dks[-1], "partial": True, "max_loss_diff": 0.15}]}
    return {"loss": loss, "entropy_init": entropy, "entropy_end": entropy,
            "saturated_end": entropy,
            "inits": ["gpt2", "unit"], "head_dims": list(dks),
            "seeds": list(range(draw.level.size)), "identity": identity}


# ------------------------------------------------------------------ scipy's numbers


def vals(arm: dict[str, Any]) -> np.ndarray:
    """An arm's per-seed values, in seed order."""
    return np.array(list(arm["values"].values()))


def one_sided(a: Sequence[float], b: Sequence[float], reading: str,
              delta: float = LOSS_DELTA) -> float:
    """scipy's one-sided paired p-value of a reading ("greater", "less" or "equal") of a − b
    against ±delta."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if reading == "greater":
        return stats.ttest_rel(a, b + delta, alternative="greater").pvalue
    if reading == "less":
        return stats.ttest_rel(a, b - delta, alternative="less").pvalue
    if reading == "equal":
        return max(stats.ttest_rel(a, b - delta, alternative="greater").pvalue,
                   stats.ttest_rel(a, b + delta, alternative="less").pvalue)
    raise ValueError(f"reading: {reading!r} is not one of {READINGS}")


def best_p(a: Sequence[float], b: Sequence[float], delta: float = LOSS_DELTA) -> float:
    """The smallest one-sided p over the three readings (the one a family keeps)."""
    return min(one_sided(a, b, r, delta) for r in READINGS)


def holm_by_hand(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment, written out: sort, multiply the k-th smallest by m − k + 1,
    keep the running maximum, cap at 1."""
    order, m, out, run = np.argsort(ps), len(ps), [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        run = max(run, min(1.0, (m - k) * ps[i]))
        out[i] = run
    return out


def assert_scipy(c: Any, a: dict[str, Any], b: dict[str, Any], delta: float,
                 p_holm: float | None = None) -> None:
    """A comparison of arm ``a`` against arm ``b`` (smallest real effect ``delta``) against
    scipy.stats.ttest_rel: its mean, 95% interval and p-value (``p_holm``: the expected
    adjusted p-value when the comparison is one of a family; else its own one-sided p, which
    needs a decided reading)."""
    a, b = vals(a), vals(b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert c.mean == pytest.approx(float(np.mean(a - b)), abs=1e-12)
    assert (c.lo, c.hi) == pytest.approx((ci.low, ci.high), rel=1e-9)
    want = one_sided(a, b, c.reading, delta) if p_holm is None else p_holm
    assert c.p_holm == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------------ sentences

# Phrases that assert one verdict; a sentence under any other verdict must not hold them.
ONLY = {
    V.SUPPORTED: ("Right:", "holds in its own regime", "wins every comparison",
                  "the bound limits cosine attention at every τ", "It cannot see a cue"),
    V.REFUTED: ("Wrong", "does not show at this budget", "No comparison favours",
                "Even τ=1 is enough", "It still found a cue", "None matched"),
    V.DEPENDS: ("Partly right", "it depends on τ", "Which alternative and which task decide",
                "does not grow with d_k at this budget", "Right for the typical row"),
    V.INCONCLUSIVE: ("Undecided", "too wide to", "Not decided", "not decided"),
}


def assert_reads_as(v: Verdict, verdict: str, claim: str) -> None:
    """``v`` is ``verdict``, no headline or plain-language sentence of it carries a phrase that
    only another verdict may use ("held up" or "Right:" for an undecided comparison,
    "Undecided" for a decided one), and its headline starts with its verdict."""
    assert v.verdict == verdict, (claim, v.verdict, v.because)
    for other, phrases in ONLY.items():
        if other == verdict:
            continue
        for sentence in [v.headline, *v.plain]:
            hit = [p for p in phrases if p in sentence]
            assert not hit, f"{claim} {verdict}: {hit} (a {other} phrase) in {sentence!r}"
    assert v.headline.startswith(verdict), v.headline


# ------------------------------------------------------------------------ figures


def png_info(path: str) -> tuple[int, int, float]:
    """(width, height, dpi) of a PNG, the dpi from its pHYs chunk (pixels per metre)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    pos, dpi = 8, 0.0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"pHYs":
            x, y, unit = struct.unpack(">IIB", data[pos + 8:pos + 17])
            assert unit == 1, "pHYs unit must be the metre"
            dpi = min(x, y) * 0.0254
        pos += 12 + length
    return width, height, dpi


def assert_print_quality(fig: dict[str, str]) -> None:
    """A report figure: a PNG of at least 600×400 pixels at 150 dpi or more, whose alt text
    states a finding (a sentence with a number in it, not a name like "C3 figure")."""
    assert set(fig) == {"path", "alt"}, fig
    width, height, dpi = png_info(fig["path"])
    assert dpi >= 150 and width >= 600 and height >= 400, (fig["path"], width, height, dpi)
    alt = fig["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and re.search(r"\d", alt), alt
    assert not GENERIC.match(alt), alt


def check_layout(fig: Any) -> list[str]:
    """Problems a reader would see: overlapping tick labels, tiny fonts, a legend over an axes'
    data area, raw TeX or a "√" outside mathtext."""
    problems = []
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    boxes = [ax.get_window_extent(renderer) for ax in axes]
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    for leg in (x for x in legends if x is not None):
        box = leg.get_window_extent(renderer)
        if any(box.overlaps(b) for b in boxes):
            problems.append(f"legend over data: {[t.get_text() for t in leg.get_texts()]}")
    texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    texts += [t for leg in legends if leg is not None for t in leg.get_texts()]
    texts += [fig._suptitle] if fig._suptitle is not None else []
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            texts += labels
            spans = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
            for a, b in pairwise(spans):
                if a.overlaps(b):
                    problems.append("overlapping tick labels")
            problems += [f"tick font {t.get_fontsize()}" for t in labels if t.get_fontsize() < 8]
    for t in texts:
        plain = re.sub(r"\$[^$]*\$", "", t.get_text())
        if re.search(r"\^\{|_\{|\\[a-z]+|√", plain):
            problems.append(f"raw math: {t.get_text()!r}")
    return problems


def layouts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """From now on, every figure saved through :func:`theory_plots.save_png` is drawn and its
    :func:`check_layout` problems kept: the returned list fills with (path, problems)."""
    saved: list[tuple[str, list[str]]] = []
    real = theory_plots.save_png

    def keep(fig: Any, path: str) -> str:
        fig.canvas.draw()
        saved.append((path, check_layout(fig)))
        return real(fig, path)
    monkeypatch.setattr(theory_plots, "save_png", keep)
    return saved


def assert_unlearned_draws_arms_only(claim: Any, ev: dict[str, Any], accuracy: float,
                                     folder: Path) -> None:
    """scaled_dot at ``accuracy`` (below twice chance): the claim's rule compares nothing and
    its figures are the arms figure alone, not a forest plot of no comparison."""
    ev["accuracy"]["all"]["scaled_dot"] = around(accuracy, 0.01, 10, 9)
    v = claim.CLAIM.decide(ev)
    assert v.verdict == "inconclusive" and "did not learn" in v.because and not v.numbers
    figs = claim.draw(ev, dict(v.numbers), folder)
    assert len(figs) == 1 and "effects" not in Path(figs[0]["path"]).name
