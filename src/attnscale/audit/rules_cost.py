"""The rule for the cost claim C5: "cosine similarity adds computational overhead".

:func:`judge_c5` is a pure function of the evidence dict that
:func:`attnscale.measure.overhead.overhead_study` returns (its format is documented there):
per sequence length N, the forward+backward time ratio cosine / scaled_dot on the same fused
kernel with its 95% interval, and the noise floor scaled_dot / scaled_dot measured the same way.

The smallest overhead treated as real is δ = max(2%, worst floor deviation), the floor's
deviation at one N being |r_floor − 1| + its interval's larger half-width: identical work
measured by the same procedure cannot tell apart anything smaller. Cosine normalizes q and k,
O(N·d) work against O(N²·d) for attention (Henry et al. 2020, arXiv 2010.04245), so the
overhead is expected to fall like 1/N; the evidence's fit overhead ≈ a + b/N shows whether it
does.
"""

from __future__ import annotations

from typing import Any

from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    REFUTED,
    SUPPORTED,
    Evidence,
    Verdict,
)

MIN_DELTA = 0.02  # below 2% a CPU timing difference is not worth a claim
MAX_DELTA = 0.10  # a floor noisier than this cannot show that an overhead is absent
SMALL = 0.10  # overheads under 10% are called small

C5_RULE = ("From the overhead study: forward+backward time of cosine / scaled_dot on the same "
           "fused kernel, measured in interleaved repeats until the 95% interval of the "
           "geometric-mean ratio is within ±2% (or a time budget runs out), at each N, beside "
           "a noise floor (scaled_dot / scaled_dot, same procedure). Margin δ = max(2%, the "
           "floor's worst |ratio − 1| plus half-width). At each N the overhead is real if the "
           "interval lies above 1 + δ, absent if it lies within (1 − δ, 1 + δ) (only when δ ≤ "
           "10%: a noisier floor cannot show absence), undecided otherwise. Supported if real "
           "at every N; refuted if absent at every N; depends (on N) if real at some N and "
           "absent at others with no unconverged undecided N; inconclusive otherwise")


def floor_deviation(est: dict[str, Any]) -> float:
    """|ratio − 1| plus the larger half-width of the interval (the whole ratio when the
    interval is missing: an unmeasured floor allows no margin below it)."""
    r, lo, hi = est["ratio"], est.get("lo"), est.get("hi")
    if lo is None or hi is None:
        return abs(r - 1) + abs(r)
    return abs(r - 1) + max(hi - r, r - lo)


def margin(ev: Evidence) -> tuple[float, int | None]:
    """δ = max(2%, the floor's worst deviation), and the N of that worst deviation."""
    devs = {row["n"]: floor_deviation(row["floor"]) for row in ev["rows"]}
    worst = max(devs, key=devs.get) if devs else None
    return max(MIN_DELTA, devs[worst] if worst is not None else 0.0), worst


def classify(est: dict[str, Any], delta: float) -> str:
    """"real", "absent" or "undecided" for one cosine / scaled_dot ratio and its interval."""
    lo, hi = est.get("lo"), est.get("hi")
    if lo is None or hi is None:
        return "undecided"
    if lo > 1 + delta:
        return "real"
    if delta <= MAX_DELTA and lo > 1 - delta and hi < 1 + delta:
        return "absent"
    return "undecided"


def pct(x: float) -> str:
    """An overhead ratio as a signed percentage: 1.031 -> "+3.1%"."""
    return f"{(x - 1) * 100:+.1f}%"


def ci_pct(est: dict[str, Any]) -> str:
    """"+3.1% [+2.0%, +4.2%]" for a ratio and its interval."""
    if est.get("lo") is None or est.get("hi") is None:
        return pct(est["ratio"])
    return f"{pct(est['ratio'])} [{pct(est['lo'])}, {pct(est['hi'])}]"


def fit_text(fit: dict[str, Any] | None) -> str:
    """"fit: a + b/N with a = …, b = …" (or "" without a fit)."""
    if not fit:
        return ""
    a_se = "" if fit.get("a_se") is None else f" ± {fit['a_se'] * 100:.1f}%"
    b_se = "" if fit.get("b_se") is None else f" ± {fit['b_se']:.2g}"
    return f"fit: overhead ≈ a + b/N, a = {fit['a'] * 100:+.1f}%{a_se}, b = {fit['b']:.3g}{b_se}"


def judge_c5(ev: Evidence) -> Verdict:
    """C5: is cosine's forward+backward time above scaled_dot's by more than the margin δ,
    at every N measured? (Rule: :data:`C5_RULE`.)"""
    rows = sorted(ev["rows"], key=lambda r: r["n"])
    if not rows:
        raise ValueError("ev: the overhead study has no rows")
    delta, worst_n = margin(ev)
    states = {r["n"]: classify(r["cosine"], delta) for r in rows}
    unresolved = any(states[r["n"]] == "undecided" and not r["cosine"]["converged"] for r in rows)
    kinds = set(states.values())
    if kinds == {"real"}:
        verdict = SUPPORTED
    elif kinds == {"absent"}:
        verdict = REFUTED
    elif {"real", "absent"} <= kinds and not unresolved:
        verdict = DEPENDS
    else:
        verdict = INCONCLUSIVE
    by_n = {str(r["n"]): {"ratio": r["cosine"]["ratio"], "lo": r["cosine"]["lo"],
                          "hi": r["cosine"]["hi"], "state": states[r["n"]],
                          "converged": r["cosine"]["converged"],
                          "floor": r["floor"]["ratio"]} for r in rows}
    floor_dev = floor_deviation(next(r["floor"] for r in rows if r["n"] == worst_n))
    because = ("cosine / scaled_dot fwd+bwd: "
               + "; ".join(f"N={r['n']}: {ci_pct(r['cosine'])} ({states[r['n']]}"
                           f"{'' if r['cosine']['converged'] else ', not converged'})"
                           for r in rows)
               + f". Noise floor (scaled_dot / scaled_dot) worst deviation {floor_dev:.1%} at "
               f"N={worst_n}; margin δ = ±{delta:.1%}")
    fit = ev.get("fit")
    threads = ev.get("threads", "?")
    head_dim = ev.get("settings", {}).get("head_dim", 64)
    return Verdict(
        verdict, C5_RULE, because,
        {"delta": delta, "by_n": by_n, "fit": fit},
        headline=headline(verdict, rows, states, delta),
        plain=plain(verdict, rows, states, delta, fit),
        regime=f"CPU float32, forward+backward, D={head_dim}, {threads} "
               f"thread{'' if threads == 1 else 's'}",
        smallest=(f"±{delta:.1%}: the larger of {MIN_DELTA:.0%} and the noise floor's worst "
                  f"deviation (|scaled_dot / scaled_dot − 1| plus its half-width: "
                  f"{floor_dev:.1%} at N={worst_n}); identical work measured the same way "
                  f"cannot resolve less"))


def headline(verdict: str, rows: list[dict], states: dict[int, str], delta: float) -> str:
    """A few words with the effect: the overhead at the smallest N (or where it is real)."""
    first = rows[0]
    if verdict == SUPPORTED:
        largest = max(r["cosine"]["ratio"] for r in rows) - 1
        kind = "supported, small" if largest < SMALL else "supported"
        return f"{kind}: {ci_pct(first['cosine'])} at N={first['n']}"
    if verdict == REFUTED:
        return f"refuted: within ±{delta:.1%} at every N"
    if verdict == DEPENDS:
        real = [r for r in rows if states[r["n"]] == "real"]
        gone = [r["n"] for r in rows if states[r["n"]] == "absent"]
        return (f"depends on N: {ci_pct(real[0]['cosine'])} at N={real[0]['n']}, within "
                f"±{delta:.1%} at N={', '.join(map(str, gone))}")
    return f"inconclusive: {ci_pct(first['cosine'])} at N={first['n']}, margin ±{delta:.1%}"


def plain(
    verdict: str, rows: list[dict], states: dict[int, str], delta: float,
    fit: dict[str, Any] | None,
) -> list[str]:
    """Two or three sentences on what the thread got right and wrong, from the numbers."""
    first, last = rows[0], rows[-1]
    x, y = ci_pct(first["cosine"]), ci_pct(last["cosine"])
    trend = (f"from {x} at N={first['n']} to {y} at N={last['n']}" if len(rows) > 1
             else f"{x} at N={first['n']}")
    falls = len(rows) > 1 and last["cosine"]["ratio"] < first["cosine"]["ratio"]
    fit_s = f" ({fit_text(fit)})" if fit else ""
    if len(rows) == 1:
        scaling = (f"the extra work is O(N·d) normalization against O(N²·d) attention, so it "
                   f"should fall with N; only N={first['n']} was measured: {trend}.")
    elif falls:
        scaling = (f"the extra work is O(N·d) normalization against O(N²·d) attention, so it "
                   f"falls with N: {trend}{fit_s}.")
    else:
        scaling = (f"the extra work is O(N·d) normalization against O(N²·d) attention, so it "
                   f"should fall with N, but here it did not fall: {trend}{fit_s}.")
    if verdict == SUPPORTED:
        largest = max(r["cosine"]["ratio"] for r in rows) - 1
        size = f"small: at most {largest:+.1%}" if largest < SMALL else f"up to {largest:+.1%}"
        lead = "Overstated as a fixed cost: " if falls else "What it depends on: "
        return [f"Right: normalizing q and k costs extra work at every N measured ({size} of "
                f"a forward+backward pass).", lead + scaling]
    if verdict == REFUTED:
        return [f"Wrong as measured: cosine stays within ±{delta:.1%} of scaled_dot at every N "
                f"({trend}).", "Right only in principle: normalizing q and k is O(N·d) extra "
                "work, too small against O(N²·d) attention for this machine to resolve."]
    if verdict == DEPENDS:
        real = [r["n"] for r in rows if states[r["n"]] == "real"]
        gone = [r["n"] for r in rows if states[r["n"]] == "absent"]
        return [f"Right at N={', '.join(map(str, real))}: cosine costs measurably more than "
                f"scaled_dot.", f"Wrong at N={', '.join(map(str, gone))}: within ±{delta:.1%}; "
                + scaling]
    open_n = [str(r["n"]) for r in rows if states[r["n"]] == "undecided"]
    why = ("the noise floor is too wide to show absence" if delta > MAX_DELTA
           else "the interval straddles the margin")
    return [f"Undecided at N={', '.join(open_n)}: {why} (±{delta:.1%}), so this run cannot say "
            f"whether cosine costs more there.", "In principle, " + scaling]
