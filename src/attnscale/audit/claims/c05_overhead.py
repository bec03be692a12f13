"""C5: "Cosine similarity adds computational overhead" (the thread; cosine attention as in
Henry et al. 2020, arXiv 2010.04245).

Decided from the overhead study (:func:`attnscale.measure.overhead.overhead_study`, its format
documented there): per sequence length N, the forward+backward time ratio cosine / scaled_dot on
the same fused kernel with its 95% interval, and the noise floor scaled_dot / scaled_dot
measured the same way. Both are measured in epochs of fresh closures (new buffers every 10
repeats: :func:`attnscale.measure.overhead.measure_fresh_ratio`) with batch-means intervals over
the epochs, their length planned from a pilot rather than stopped at the first narrow
interval, so neither where a closure's buffers landed nor a lucky look passes for precision.

The smallest overhead treated as real is δ = max(2%, worst floor deviation), the floor's
deviation at one N being |r_floor − 1| + its interval's larger half-width: identical work
measured by the same procedure cannot tell apart anything smaller. Cosine normalizes q and k,
O(N·d) work against O(N²·d) for attention (Henry et al. 2020), so the overhead is expected to
fall like 1/N, and the rule reads the weighted fit overhead(N) ≈ a + b/N rather than each N
alone: at each N measured, the fitted overhead with its 95% band (normal, from the fit's
covariance, widened by the Birge ratio √(χ²/dof) when the points scatter more than their
errors say). The fit pools every N, so one noisy repeat series cannot flip the verdict; the
standard preset plans each measurement for a half-width of 1%, half the smallest δ (a target
equal to δ let a true 1–1.5% overhead read absent in one run and undecided in the next).
Where the fitted overhead crosses δ, N* = b/(δ − a) says from which length on it is below what
counts. A fit the rule does not read (χ² above its 99th percentile, or too few N to test it) is
never quoted as a finding: the sentences, numbers, table and figure say it was rejected (with χ²
and its degrees of freedom) or untested, and give no a or b.

The claim also brings its own timing table (:func:`panels`) and its sentence among the page's
alternatives (:func:`says_alternatives`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from attnscale.audit.claim import Claim, Entry, Figure, Measurement, Panel, Says, Sources, register
from attnscale.audit.figure_text import finite
from attnscale.audit.interval import Interval
from attnscale.audit.studies import Preset
from attnscale.audit.theory_plots import BAND, log_ticks, outside, save, yerr
from attnscale.audit.timing_evidence import (
    Evidence,
    Fit,
    Ratio,
    Row,
    ci_pct,
    fit_text,
    ratio_text,
    unread_text,
)
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.measure import overhead

MIN_DELTA = 0.02  # below 2% a CPU timing difference is not worth a claim
MAX_DELTA = 0.10  # a floor noisier than this cannot show that an overhead is absent
SMALL = 0.10  # overheads under 10% are called small

RULE = ("From the overhead study: forward+backward time of cosine / scaled_dot on the same "
        "fused kernel, measured in interleaved repeats in epochs of fresh closures, as many "
        "epochs as a pilot says the 95% interval of the geometric-mean ratio (batch means "
        "over epochs) needs to reach the target (±1% in the standard preset, half "
        "of the smallest δ) or until a time budget runs out, at each N, beside a noise floor "
        "(scaled_dot / scaled_dot, same procedure). Margin δ = max(2%, the floor's worst "
        "|ratio − 1| plus half-width). The overhead at each N is read from the weighted fit "
        "a + b/N over every N (95% band from its covariance, widened by the Birge ratio when "
        "χ²/dof > 1; the measured interval itself when χ² rejects the fit at its 99th "
        "percentile or fewer than 4 N leave it untested): real if the band "
        "lies above +δ, absent if it lies within ±δ (only when δ ≤ 10%: a noisier floor "
        "cannot show absence), undecided otherwise. Supported if real at every N; refuted "
        "if absent at every N; depends (on N) if real at some N and absent at others with no "
        "unconverged undecided N; inconclusive otherwise")


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
               + (". Read from the fit a + b/N: " if fitted else
                  f". Read as measured, as {unread_text(ev.fit) or 'there is no fit'}: ")
               + "; ".join(f"N={r.n}: {band_text(read[r.n])} ({states[r.n]})" for r in rows)
               + f". Noise floor (scaled_dot / scaled_dot) worst deviation {floor_dev:.1%} at "
               f"N={worst_n}; margin δ = ±{delta:.1%}")
    threads: int | str = "?" if ev.threads is None else ev.threads
    return Verdict(
        verdict, RULE, because,
        {"delta": delta, "by_n": by_n, "from_fit": fitted, "crossing": cross,
         "fit": None if ev.fit is None else ev.fit.numbers()},
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
    fit_s = f" ({fit_text(fit)})" if fit_text(fit) else ""
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
    if fit is not None and fit.status() == "rejected":
        scaling += (f" But {unread_text(fit)}: the overhead does not follow a + b/N here, so "
                    f"each N is read as measured.")
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
    fit = Fit.model_validate(ev["fit"]) if ev.get("fit") else None
    if fit is not None and fit.status() == "rejected":
        text += (f" The fit a + b/N is not drawn: χ² = {fit.chi2:.1f} on {fit.dof} dof "
                 f"rejects it.")
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
    if fit is not None and fit.usable() and len(ns) > 1:  # only the fit the rule reads
        grid = np.geomspace(ns[0], ns[-1], 50)
        ax.plot(grid, 100 * (fit.a + fit.b / grid), "C0--", lw=0.8,
                label=f"fit $a + b/N$, $b$ = {fit.b:.3g}")
        bands = [fit.at(int(n)) for n in grid]
        ax.fill_between(grid, [100 * (b.lo - 1) for b in bands],
                        [100 * (b.hi - 1) for b in bands], color="C0", alpha=0.15,
                        label="fit's 95% band (what the rule reads)")
    elif fit is not None and fit.status() == "rejected":  # said, not drawn
        ax.plot([], [], " ", label=f"fit $a + b/N$ rejected ($\\chi^2$ = {fit.chi2:.1f} on "
                                   f"{fit.dof} dof): not drawn")
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


COLUMNS = ("N", "comparison", "time ratio", "95% interval", "repeats", "epochs")


def stop_note(e: Mapping[str, Any]) -> str:
    """"" for a measurement that reached its target width; otherwise why it ended: " (budget)",
    " (cap)" or " (plan short)" (the planned repeats left it wider; older evidence: budget)."""
    if e["converged"]:
        return ""
    why = e.get("stopped") or "budget"
    return f" ({'plan short' if why == 'plan' else why})"


def panel_rows(rows: list[Mapping[str, Any]]) -> tuple[tuple[str, ...], ...]:
    """Two table rows per N (cosine / scaled_dot, then the noise floor): the ratio, its
    interval, the repeats (with :func:`stop_note` where they ended before the target width)
    and the fresh-closure epochs they ran in ("—" in older evidence)."""
    out = []
    for r in sorted(rows, key=lambda r: r["n"]):
        for key, name in (("cosine", "cosine / scaled_dot"), ("floor", "scaled_dot / itself")):
            e = r[key]
            span = (f"[{e['lo']:.3f}, {e['hi']:.3f}]" if finite(e.get("lo")) and finite(e.get("hi"))
                    else "—")
            repeats = f"{e['n']}{stop_note(e)}"
            out.append((str(r["n"]), name, f"{e['ratio']:.3f}", span, repeats,
                        str(e.get("epochs") or "—")))
    return tuple(out)


def panels(entry: Entry) -> list[Panel]:
    """The timing table: cosine / scaled_dot and the noise floor at each N, from the entry's
    evidence; its note says how the intervals were made and whether the fit a + b/N is read."""
    ev = entry.get("evidence") or {}
    if not ev.get("rows"):
        return []
    fit = Fit.model_validate(ev["fit"]) if ev.get("fit") else None
    unread = unread_text(fit)
    reading = fit_text(fit) or (f"{unread}, so each N is read as measured" if unread
                                else "no fit a + b/N (fewer than 2 N)")
    note = ("Forward+backward time on CPU, geometric mean over interleaved repeats in epochs "
            "of fresh closures (new buffers every 10 repeats); 95% intervals are batch means "
            "over the epochs, as many as a pilot said the target width needs. The noise floor "
            "times "
            f"scaled_dot against itself the same way. {reading[0].upper()}{reading[1:]}.")
    return [Panel("Speed: cosine against scaled dot product", COLUMNS,
                  panel_rows(ev["rows"]), note)]


def says_alternatives(entry: Entry) -> list[str]:
    """Cosine's extra CPU time at each N measured, with its interval, and the margin below
    which this machine cannot tell an overhead from none."""
    numbers = entry.get("numbers") or {}
    by_n = numbers.get("by_n") or {}
    if not by_n:
        return []
    cost = ", ".join(f"{ratio_text(by_n[n]['ratio'], by_n[n].get('lo'), by_n[n].get('hi'))} "
                     f"at N = {n}" for n in sorted(by_n, key=int))
    delta = numbers.get("delta")
    floor = f"; the noise floor on this machine is ±{delta:.1%}" if finite(delta) else ""
    return [f"Cosine attention's extra time on CPU (forward + backward): {cost}{floor} (C5)."]


def scale(p: Preset) -> str:
    """One CPU thread, the N measured and the pilot's epochs."""
    bench = p.bench
    return (f"one CPU thread, N = {', '.join(map(str, bench['n_values']))}, a pilot of "
            f"{overhead.pilot_epochs(bench['min_repeats'])} epochs of {overhead.EPOCH} "
            f"interleaved repeats; other hardware differs")


CLAIM = register(Claim(
    id="C5", text="Cosine similarity adds computational overhead.",
    measures="interleaved timing ratios against a noise floor, N = 256 to 2048", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("bench", lambda p: {**p.bench, "interval": overhead.INTERVAL},
                              lambda p: overhead.overhead_study(**p.bench)),),
    scale=scale, panels=panels, says=(Says("alternatives", says_alternatives, rank=40),)))
