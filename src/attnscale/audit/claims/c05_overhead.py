"""C5: "Cosine similarity adds computational overhead" (the thread; cosine attention as in
Henry et al. 2020, arXiv 2010.04245).

Decided from the overhead study (:func:`attnscale.measure.overhead.overhead_study`, its format
documented there): per sequence length N, the forward+backward time ratio cosine / scaled_dot on
the same fused kernel with its 95% interval, and the noise floor scaled_dot / scaled_dot
measured the same way.

The smallest overhead treated as real is δ = max(2%, worst floor deviation), the floor's
deviation at one N being |r_floor − 1| + its interval's larger half-width: identical work
measured by the same procedure cannot tell apart anything smaller. Cosine normalizes q and k,
O(N·d) work against O(N²·d) for attention (Henry et al. 2020), so the overhead is expected to
fall like 1/N, and the rule reads the weighted fit overhead(N) ≈ a + b/N rather than each N
alone: at each N measured, the fitted overhead with its 95% band (normal, from the fit's
covariance, widened by the Birge ratio √(χ²/dof) when the points scatter more than their
errors say). The fit pools every N, so one noisy repeat series cannot flip the verdict; the
standard preset stops each measurement at a half-width of 1%, half the smallest δ (a target
equal to δ let a true 1–1.5% overhead read absent in one run and undecided in the next).
Where the fitted overhead crosses δ, N* = b/(δ − a) says from which length on it is below what
counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)
from pydantic import ConfigDict, Field

from attnscale.audit.claim import Claim, Figure, Measurement, Sources, register
from attnscale.audit.evidence import Model
from attnscale.audit.figure_text import finite
from attnscale.audit.interval import Interval
from attnscale.audit.studies import Preset
from attnscale.audit.theory_plots import BAND, log_ticks, outside, save, yerr
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.measure import overhead

Z95 = 1.959963984540054  # the fit's errors are absolute (weights 1/σ²): a normal band
MIN_DOF = 2  # a + b/N through fewer than 4 points cannot test itself: read each N as measured

MIN_DELTA = 0.02  # below 2% a CPU timing difference is not worth a claim
MAX_DELTA = 0.10  # a floor noisier than this cannot show that an overhead is absent
SMALL = 0.10  # overheads under 10% are called small

RULE = ("From the overhead study: forward+backward time of cosine / scaled_dot on the same "
        "fused kernel, measured in interleaved repeats until the 95% interval of the "
        "geometric-mean ratio reaches the stopping target (±1% in the standard preset, half "
        "of the smallest δ) or a time budget runs out, at each N, beside a noise floor "
        "(scaled_dot / scaled_dot, same procedure). Margin δ = max(2%, the floor's worst "
        "|ratio − 1| plus half-width). The overhead at each N is read from the weighted fit "
        "a + b/N over every N (95% band from its covariance, widened by the Birge ratio when "
        "χ²/dof > 1; the measured interval itself when there is no fit): real if the band "
        "lies above +δ, absent if it lies within ±δ (only when δ ≤ 10%: a noisier floor "
        "cannot show absence), undecided otherwise. Supported if real at every N; refuted "
        "if absent at every N; depends (on N) if real at some N and absent at others with no "
        "unconverged undecided N; inconclusive otherwise")


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
    geometric-mean time ratio and its 95% Student-t interval over ``n`` repeats (lo/hi None
    below 2 repeats), and whether it reached its target width."""

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

    def usable(self) -> bool:
        """A weighted fit with its whole covariance (older evidence lacks cov_ab), at least
        :data:`MIN_DOF` degrees of freedom, that its points do not reject: χ² below its 99th
        percentile (a misfit means the overhead does not follow a + b/N, and each N is read as
        measured)."""
        if not self.weighted or None in (self.a_se, self.b_se, self.cov_ab, self.chi2):
            return False
        return (self.dof or 0) >= MIN_DOF and (
            self.chi2 <= scipy.stats.chi2.ppf(0.99, self.dof))

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


class Evidence(Model):
    """The overhead study (:func:`attnscale.measure.overhead.overhead_study`)."""

    rows: list[Row]
    fit: Fit | None = None
    settings: Settings = Settings()
    threads: int | None = None
    versions: dict[str, Any] = Field(default_factory=dict)
    seconds: float | None = None


def floor_deviation(est: Ratio) -> float:
    """|ratio − 1| plus the larger half-width of the interval (the whole ratio when the
    interval is missing: an unmeasured floor allows no margin below it)."""
    r, lo, hi = est.ratio, est.lo, est.hi
    if lo is None or hi is None:
        return abs(r - 1) + abs(r)
    return abs(r - 1) + max(hi - r, r - lo)


def margin(ev: Evidence) -> tuple[float, int | None]:
    """δ = max(2%, the floor's worst deviation), and the N of that worst deviation."""
    devs = {row.n: floor_deviation(row.floor) for row in ev.rows}
    worst = max(devs, key=devs.get) if devs else None
    return max(MIN_DELTA, devs[worst] if worst is not None else 0.0), worst


def read_at(ev: Evidence) -> dict[int, Interval]:
    """N -> the overhead the rule reads there: the fit's band when the fit is usable, else the
    measured interval."""
    fit = ev.fit if ev.fit is not None and ev.fit.usable() else None
    return {r.n: fit.at(r.n) if fit else r.cosine.interval() for r in ev.rows}


def classify(est: Ratio | Interval, delta: float) -> str:
    """"real", "absent" or "undecided" for one cosine / scaled_dot ratio and its interval."""
    lo, hi = est.lo, est.hi
    if lo is None or hi is None:
        return "undecided"
    if lo > 1 + delta:
        return "real"
    if delta <= MAX_DELTA and lo > 1 - delta and hi < 1 + delta:
        return "absent"
    return "undecided"


def fit_text(fit: Fit | None) -> str:
    """"fit: a + b/N with a = …, b = …" (or "" without a fit)."""
    if not fit:
        return ""
    a_se = "" if fit.a_se is None else f" ± {fit.a_se * 100:.1f}%"
    b_se = "" if fit.b_se is None else f" ± {fit.b_se:.2g}"
    return f"fit: overhead ≈ a + b/N, a = {fit.a * 100:+.1f}%{a_se}, b = {fit.b:.3g}{b_se}"


def judge(ev: Evidence) -> Verdict:
    """C5: is cosine's forward+backward time above scaled_dot's by more than the margin δ,
    at every N measured? (Rule: :data:`RULE`.)"""
    rows = sorted(ev.rows, key=lambda r: r.n)
    if not rows:
        raise ValueError("ev: the overhead study has no rows")
    delta, worst_n = margin(ev)
    read = read_at(ev)
    states = {r.n: classify(read[r.n], delta) for r in rows}
    unresolved = any(states[r.n] == "undecided" and not r.cosine.converged for r in rows)
    kinds = set(states.values())
    if kinds == {"real"}:
        verdict = SUPPORTED
    elif kinds == {"absent"}:
        verdict = REFUTED
    elif {"real", "absent"} <= kinds and not unresolved:
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    by_n = {str(r.n): {"ratio": r.cosine.ratio, "lo": r.cosine.lo, "hi": r.cosine.hi,
                       "read": read[r.n].model_dump(), "state": states[r.n],
                       "converged": r.cosine.converged, "floor": r.floor.ratio} for r in rows}
    fitted = ev.fit is not None and ev.fit.usable()
    cross = ev.fit.crossing(delta) if fitted else None
    floor_dev = floor_deviation(next(r.floor for r in rows if r.n == worst_n))
    because = ("cosine / scaled_dot fwd+bwd, measured: "
               + "; ".join(f"N={r.n}: {r.cosine.text()}"
                           f"{'' if r.cosine.converged else ' (not converged)'}" for r in rows)
               + (". Read from the fit a + b/N: " if fitted else ". Read as measured: ")
               + "; ".join(f"N={r.n}: {band_text(read[r.n])} ({states[r.n]})" for r in rows)
               + f". Noise floor (scaled_dot / scaled_dot) worst deviation {floor_dev:.1%} at "
               f"N={worst_n}; margin δ = ±{delta:.1%}")
    threads: int | str = "?" if ev.threads is None else ev.threads
    return Verdict(
        verdict, RULE, because,
        {"delta": delta, "by_n": by_n, "from_fit": fitted, "crossing": cross,
         "fit": None if ev.fit is None else ev.fit.model_dump(exclude_unset=True)},
        headline=headline(verdict, rows, read, states, delta),
        plain=plain(verdict, rows, read, states, delta, ev.fit, cross),
        regime=f"CPU float32, forward+backward, D={ev.settings.head_dim}, {threads} "
               f"thread{'' if threads == 1 else 's'}",
        smallest=(f"±{delta:.1%}: the larger of {MIN_DELTA:.0%} and the noise floor's worst "
                  f"deviation (|scaled_dot / scaled_dot − 1| plus its half-width: "
                  f"{floor_dev:.1%} at N={worst_n}); identical work measured the same way "
                  f"cannot resolve less"))


def band_text(i: Interval) -> str:
    """"+3.1% [+2.0%, +4.2%]" for an overhead read as a ratio interval."""
    return ratio_text(i.mean, i.lo, i.hi)


def headline(verdict: str, rows: list[Row], read: dict[int, Interval], states: dict[int, str],
             delta: float) -> str:
    """A few words with the effect: the overhead at the smallest N (or where it is real)."""
    first = rows[0]
    if verdict == SUPPORTED:
        largest = max(read[r.n].mean for r in rows) - 1
        kind = "supported, small" if largest < SMALL else "supported"
        return f"{kind}: {band_text(read[first.n])} at N={first.n}"
    if verdict == REFUTED:
        return f"refuted: within ±{delta:.1%} at every N"
    if verdict == DEPENDS:
        real = [r for r in rows if states[r.n] == "real"]
        gone = [r.n for r in rows if states[r.n] == "absent"]
        return (f"depends on N: {band_text(read[real[0].n])} at N={real[0].n}, within "
                f"±{delta:.1%} at N={', '.join(map(str, gone))}")
    return f"inconclusive: {band_text(read[first.n])} at N={first.n}, margin ±{delta:.1%}"


def scaling_text(rows: list[Row], read: dict[int, Interval],
                 fit: Fit | None) -> tuple[str, str, bool]:
    """The O(N·d) against O(N²·d) sentence with the trend the verdict reads (the fit's band, or
    the measured interval, and which), the trend alone, and whether the overhead falls with
    N."""
    first, last = rows[0], rows[-1]
    x, y = band_text(read[first.n]), band_text(read[last.n])
    source = "fitted" if fit is not None and fit.usable() else "measured"
    trend = (f"from {x} at N={first.n} to {y} at N={last.n} ({source})" if len(rows) > 1
             else f"{x} at N={first.n} ({source})")
    falls = len(rows) > 1 and read[last.n].mean < read[first.n].mean
    fit_s = f" ({fit_text(fit)})" if fit else ""
    if len(rows) == 1:
        return (f"the extra work is O(N·d) normalization against O(N²·d) attention, so it "
                f"should fall with N; only N={first.n} was measured: {trend}.", trend, falls)
    if falls:
        return (f"the extra work is O(N·d) normalization against O(N²·d) attention, so it "
                f"falls with N: {trend}{fit_s}.", trend, falls)
    return (f"the extra work is O(N·d) normalization against O(N²·d) attention, so it "
            f"should fall with N, but here it did not fall: {trend}{fit_s}.", trend, falls)


def plain(verdict: str, rows: list[Row], read: dict[int, Interval], states: dict[int, str],
          delta: float, fit: Fit | None, cross: float | None) -> list[str]:
    """Two or three sentences on what the thread got right and wrong, from the numbers."""
    scaling, trend, falls = scaling_text(rows, read, fit)
    if cross is not None and rows[0].n <= cross <= rows[-1].n and verdict != INCONCLUSIVE:
        scaling += f" The fitted overhead falls below +{delta:.1%} from N ≈ {cross:.3g}."
    if verdict == SUPPORTED:
        largest = max(read[r.n].mean for r in rows) - 1
        size = f"small: at most {largest:+.1%}" if largest < SMALL else f"up to {largest:+.1%}"
        lead = "Overstated as a fixed cost: " if falls else "What it depends on: "
        return [f"Right: normalizing q and k costs extra work at every N measured ({size} of "
                f"a forward+backward pass).", lead + scaling]
    if verdict == REFUTED:
        return [f"Wrong as measured: cosine stays within ±{delta:.1%} of scaled_dot at every N "
                f"({trend}).", "Right only in principle: normalizing q and k is O(N·d) extra "
                "work, too small against O(N²·d) attention for this machine to resolve."]
    if verdict == DEPENDS:
        real = [r.n for r in rows if states[r.n] == "real"]
        gone = [r.n for r in rows if states[r.n] == "absent"]
        return [f"Right at N={', '.join(map(str, real))}: cosine costs measurably more than "
                f"scaled_dot.", f"Wrong at N={', '.join(map(str, gone))}: within ±{delta:.1%}; "
                + scaling]
    open_n = [str(r.n) for r in rows if states[r.n] == "undecided"]
    why = ("the noise floor is too wide to show absence" if delta > MAX_DELTA
           else "the interval straddles the margin")
    return [f"Undecided at N={', '.join(open_n)}: {why} (±{delta:.1%}), so this run cannot say "
            f"whether cosine costs more there.", "In principle, " + scaling]


def alt(ev: Mapping[str, Any], delta: float | None) -> str:
    """The overhead at the smallest and largest N, and the noise-floor margin."""
    rows = sorted(ev["rows"], key=lambda r: r["n"])
    first, last = rows[0], rows[-1]
    text = f"Cosine attention costs {ci_pct(first['cosine'])} over scaled_dot at N = {first['n']}"
    if len(rows) > 1:
        text += f", {ci_pct(last['cosine'])} at N = {last['n']}"
    text += " (forward+backward, CPU float32)."
    if finite(delta):
        text += (f" Timing scaled_dot against itself the same way stays within ±{delta:.1%}, "
                 f"the smallest overhead this machine can resolve.")
    return text


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Cosine's extra time over scaled_dot, and the noise floor, against N (95% CI), the ±δ
    margin (``numbers["delta"]``) and the fit a + b/N."""
    delta = numbers.get("delta")
    rows = sorted(ev["rows"], key=lambda r: r["n"])
    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for key, label, color, shift in (("cosine", "cosine / scaled_dot", "C0", 0.97),
                                     ("floor", "scaled_dot / itself (noise floor)", "C7", 1.03)):
        est = [{"mean": 100 * (r[key]["ratio"] - 1),
                "lo": 100 * (r[key]["lo"] - 1) if finite(r[key].get("lo")) else None,
                "hi": 100 * (r[key]["hi"] - 1) if finite(r[key].get("hi")) else None}
               for r in rows]
        ax.errorbar([n * shift for n in ns], [e["mean"] for e in est], yerr=yerr(est),
                    marker="o", capsize=3, color=color, label=f"{label}, 95% CI")
    fit = Fit.model_validate(ev["fit"]) if ev.get("fit") else None
    if fit is not None and len(ns) > 1:
        grid = np.geomspace(ns[0], ns[-1], 50)
        ax.plot(grid, 100 * (fit.a + fit.b / grid), "C0--", lw=0.8,
                label=f"fit $a + b/N$, $b$ = {fit.b:.3g}")
        if fit.usable():  # the band the verdict reads
            bands = [fit.at(int(n)) for n in grid]
            ax.fill_between(grid, [100 * (b.lo - 1) for b in bands],
                            [100 * (b.hi - 1) for b in bands], color="C0", alpha=0.15,
                            label="fit's 95% band (what the rule reads)")
    if finite(delta):
        ax.axhspan(-100 * delta, 100 * delta, color=BAND, zorder=0,
                   label=f"±δ = ±{delta:.1%}: smallest resolvable")
    ax.axhline(0, color="k", lw=0.8)
    log_ticks(ax, ns)
    ax.set(xlabel="sequence length $N$", ylabel="extra time vs scaled_dot (%)")
    settings = ev.get("settings", {})
    threads = ev.get("threads", "?")
    ax.set_title(f"C5: cosine attention's overhead, forward+backward, CPU float32, "
                 f"$D={settings.get('head_dim', 64)}$, {threads} thread"
                 f"{'' if threads == 1 else 's'}", fontsize=10)
    outside(ax)
    return [save(fig, folder, "c5_overhead", alt(ev, delta))]


def gather(src: Sources) -> dict[str, Any]:
    return src.measured["bench"]


def scale(p: Preset) -> str:
    """One CPU thread, the N measured and the least number of repeats."""
    bench = p.bench
    return (f"one CPU thread, N = {', '.join(map(str, bench['n_values']))}, ≥ "
            f"{bench['min_repeats']} interleaved repeats; other hardware differs")


CLAIM = register(Claim(
    id="C5", text="Cosine similarity adds computational overhead.",
    measures="interleaved timing ratios against a noise floor, N = 256 to 4096", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("bench", lambda p: dict(p.bench),
                              lambda p: overhead.overhead_study(**p.bench)),),
    scale=scale))
