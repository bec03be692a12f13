"""C5's evidence, typed: the overhead study (:func:`attnscale.measure.overhead.overhead_study`)
as pydantic models, the weighted fit a + b/N read through its χ² test, and the ratio texts the
claim's sentences, table and figure share (split from :mod:`attnscale.audit.claims.c05_overhead`
to keep each module readable).

A ratio r prints as a signed percentage (r − 1)·100; an interval [lo, hi] of a time ratio is
the study's batch-means interval over fresh-closure epochs (:func:`attnscale.measure.overhead.
measure_fresh_ratio`; a moving-block bootstrap in older evidence). The fit overhead(N) ≈
a + b/N (:func:`attnscale.measure.overhead.fit_inverse_n`) is *used* only when it is weighted,
has its covariance, at least :data:`MIN_DOF` degrees of freedom and χ² at most its 99th
percentile χ²_{0.99, dof}; a fit that χ² rejects is reported as rejected (χ², dof, the
percentile), never by its a and b.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)
from pydantic import ConfigDict, Field

from attnscale.audit.evidence import Model
from attnscale.audit.interval import Interval

Z95 = 1.959963984540054  # the fit's errors are absolute (weights 1/σ²): a normal band
MIN_DOF = 2  # a + b/N through fewer than 4 points cannot test itself: read each N as measured


def pct(x: float) -> str:
    """An overhead ratio as a signed percentage: 1.031 -> "+3.1%"."""
    return f"{(x - 1) * 100:+.1f}%"


def ratio_text(ratio: float, lo: float | None, hi: float | None) -> str:
    """"+3.1% [+2.0%, +4.2%]" for a ratio and its interval (the ratio alone without one)."""
    if lo is None or hi is None:
        return pct(ratio)
    return f"{pct(ratio)} [{pct(lo)}, {pct(hi)}]"


def ci_pct(est: Mapping[str, Any]) -> str:
    """:func:`ratio_text` of a ratio estimate in its plain dict form {"ratio", "lo", "hi"}."""
    return ratio_text(est["ratio"], est.get("lo"), est.get("hi"))


class Ratio(Model):
    """One ratio estimate (:meth:`attnscale.measure.overhead.RatioEstimate.to_dict`): the
    geometric-mean time ratio and its 95% interval over ``n`` repeats (lo/hi None below 2
    repeats; batch means over ``epochs`` fresh-closure epochs of ``block`` repeats, or in older
    evidence a moving-block bootstrap with blocks of ``block`` repeats, 1 = independent
    repeats), whether it reached its target width, and why its repeats ended ("plan", "cap",
    "budget"; None in older evidence)."""

    ratio: float
    lo: float | None = None
    hi: float | None = None
    n: int
    converged: bool
    seconds: float | None = None
    ms: float | None = None
    baseline_ms: float | None = None
    number: int | None = None
    half_width: float | None = None
    se_log: float | None = None
    target: float | None = None
    block: int | None = None
    epochs: int | None = None
    stopped: str | None = None

    def interval(self) -> Interval:
        """The ratio as the audit's interval type (mean = ratio)."""
        return Interval(mean=self.ratio, lo=self.lo, hi=self.hi, n=self.n)

    def text(self) -> str:
        """"+3.1% [+2.0%, +4.2%]"."""
        return ratio_text(self.ratio, self.lo, self.hi)


class Row(Model):
    """One sequence length N: cosine / scaled_dot, and the floor scaled_dot / scaled_dot."""

    n: int
    batch: int | None = None
    heads: int | None = None
    cosine: Ratio
    floor: Ratio


class Fit(Model):
    """Weighted least squares overhead(N) ≈ a + b/N (:func:`overhead.fit_inverse_n`)."""

    a: float
    b: float
    a_se: float | None = None
    b_se: float | None = None
    cov_ab: float | None = None
    chi2: float | None = None
    dof: int | None = None
    weighted: bool | None = None
    points: int | None = None

    def limit(self) -> float | None:
        """The 99th percentile of χ² with the fit's degrees of freedom (None below 1 dof)."""
        return float(scipy.stats.chi2.ppf(0.99, self.dof)) if (self.dof or 0) >= 1 else None

    def status(self) -> str:
        """"used": a weighted fit with its whole covariance (older evidence lacks cov_ab) and
        at least :data:`MIN_DOF` degrees of freedom whose χ² is at most its 99th percentile;
        "rejected": χ² above it (the overhead does not follow a + b/N); "untested" otherwise.
        Only a used fit is read (and quoted): otherwise each N is read as measured."""
        if (not self.weighted or None in (self.a_se, self.b_se, self.cov_ab, self.chi2)
                or (self.dof or 0) < MIN_DOF):
            return "untested"
        return "used" if self.chi2 <= self.limit() else "rejected"

    def usable(self) -> bool:
        """The rule reads this fit (:meth:`status` "used")."""
        return self.status() == "used"

    def numbers(self) -> dict[str, Any]:
        """The fit as the verdict's numbers: every field when used; otherwise its status, χ²,
        dof and 99th percentile only (a rejected fit's a and b are not a finding)."""
        out = {"status": self.status(), "chi2": self.chi2, "dof": self.dof,
               "chi2_99": self.limit(), "points": self.points}
        return {**self.model_dump(exclude_unset=True), **out} if out["status"] == "used" else out

    def birge(self) -> float:
        """√(χ²/dof), at least 1: how far the points scatter beyond their stated errors."""
        if not self.dof or self.chi2 is None:
            return 1.0
        return max(1.0, (self.chi2 / self.dof) ** 0.5)

    def at(self, n: int) -> Interval:
        """The fitted overhead a + b/N with its 95% band (as a ratio, 1 + overhead)."""
        x = 1.0 / n
        var = self.a_se**2 + (x * self.b_se) ** 2 + 2 * x * self.cov_ab
        # a scale estimated from the residuals (Birge > 1) takes Student's t with the fit's dof
        q = Z95 if self.birge() == 1.0 else float(scipy.stats.t.ppf(0.975, self.dof))
        half = q * self.birge() * max(var, 0.0) ** 0.5
        mid = 1 + self.a + self.b * x
        return Interval(mean=mid, lo=mid - half, hi=mid + half, n=self.points or 0)

    def crossing(self, delta: float) -> float | None:
        """N* = b/(δ − a), where the fitted overhead falls to δ (None if it never does)."""
        if self.b <= 0 or self.a >= delta:
            return None
        return self.b / (delta - self.a)


class Settings(Model):
    """The study's settings (only ``head_dim`` enters the verdict's regime)."""

    model_config = ConfigDict(serialize_by_alias=True)

    head_dim: int = 64
    dtype: str | None = None
    causal: bool | None = None
    pass_: str | None = Field(None, alias="pass")
    tau: float | None = None
    work: int | None = None
    target: float | None = None
    min_repeats: int | None = None
    budget_s: float | None = None
    block_s: float | None = None
    level: float | None = None
    interval: str | None = None
    epoch: int | None = None


class Evidence(Model):
    """The overhead study (:func:`attnscale.measure.overhead.overhead_study`)."""

    rows: list[Row]
    fit: Fit | None = None
    settings: Settings = Settings()
    threads: int | None = None
    versions: dict[str, Any] = Field(default_factory=dict)
    seconds: float | None = None


def fit_text(fit: Fit | None) -> str:
    """"fit: a + b/N with a = …, b = …" for a fit the rule reads ("" for any other)."""
    if not fit or not fit.usable():
        return ""
    a_se = "" if fit.a_se is None else f" ± {fit.a_se * 100:.1f}%"
    b_se = "" if fit.b_se is None else f" ± {fit.b_se:.2g}"
    return f"fit: overhead ≈ a + b/N, a = {fit.a * 100:+.1f}%{a_se}, b = {fit.b:.3g}{b_se}"


def unread_text(fit: Fit | None) -> str:
    """Why the rule does not read a fit, with χ² and dof: "the fit a + b/N is rejected (χ² =
    23.4 on 3 dof, above its 99th percentile 11.3)" or "… is not tested (…)"; "" for a fit the
    rule reads or no fit."""
    if not fit or fit.usable():
        return ""
    if fit.status() == "rejected":
        return (f"the fit a + b/N is rejected (χ² = {fit.chi2:.1f} on {fit.dof} dof, above its "
                f"99th percentile {fit.limit():.1f})")
    why = (f"{fit.points} N leave {fit.dof} degree{'' if fit.dof == 1 else 's'} of freedom, "
           f"fewer than {MIN_DOF}" if (fit.dof or 0) < MIN_DOF else "its errors are missing")
    return f"the fit a + b/N is not tested ({why})"
