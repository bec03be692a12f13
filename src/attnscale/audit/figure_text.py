"""Alt text for the report's figures: one or two sentences that state each figure's finding.

Every builder is a pure function of the evidence (and the rule's numbers) the figure draws, and
writes its numbers with f-strings, so the text changes when the data does. Where a number is
missing the sentence says less; it never fills a gap. The figures themselves live in
:mod:`attnscale.audit.figures`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from attnscale.audit.rules_cost import ci_pct
from attnscale.lab.analysis import mean_ci

Evidence = Mapping[str, Any]
READINGS = ("greater", "less", "equal", "inconclusive")


def finite(x: Any) -> bool:
    """``x`` is a real, finite number (None, NaN, ±inf, strings and bools are not)."""
    if x is None or isinstance(x, bool | str):
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def sci(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, exponents written short: 8.99e5, 1e4, 0.02."""
    text = f"{x:.{digits}g}"
    if "e" not in text:
        return text
    mant, exp = text.split("e")
    return f"{mant}e{int(exp)}"


def signed(x: float, digits: int = 2) -> str:
    """``+0.33``: a signed number with ``digits`` decimals."""
    return f"{x:+.{digits}f}"


def interval(c: Mapping[str, Any], unit: str = "", digits: int = 2, sign: bool = True) -> str:
    """``+0.33 nats [+0.25, +0.41]`` for a mean ± CI dict; the mean alone without an interval."""
    fmt = (lambda x: signed(x, digits)) if sign else (lambda x: f"{x:.{digits}f}")
    u = f" {unit}" if unit else ""
    text = f"{fmt(c['mean'])}{u}"
    if finite(c.get("lo")) and finite(c.get("hi")):
        text += f" [{fmt(c['lo'])}, {fmt(c['hi'])}]"
    return text


def arm_ci(arm: Mapping[str, Any] | None) -> dict[str, Any]:
    """Mean ± 95% Student-t interval over an arm's per-seed ``values`` (``n`` = 0 when none)."""
    return mean_ci(list((arm or {}).get("values", {}).values())).to_dict()


def n_seeds(comps: Mapping[str, Any]) -> int:
    """The largest number of paired seeds among a family of comparisons."""
    return max((int(c.get("n") or 0) for c in comps.values()), default=0)


def c1_alt(cases: list[dict[str, Any]]) -> str:
    """C1: the largest error against the float64 formula and against torch SDPA."""
    ref = max(c["err_reference"] for c in cases)
    sdpa = max(c["err_sdpa"] for c in cases)
    vs_sdpa = ("is bitwise equal to torch SDPA" if sdpa == 0 else
               f"is within {sdpa:.1e} of torch SDPA")
    return (f"Over {len(cases)} cases (causal, masked, GQA) attnscale's scaled_dot is within "
            f"{ref:.1e} of the float64 formula softmax(QKᵀ/√d_k)V, {1e-5 / max(ref, 1e-30):.0f}× "
            f"under the 1e-5 tolerance, and {vs_sdpa}.")


def c2_alt(ev: Evidence, ds: tuple[int, ...]) -> str:
    """C2: cos(q, k) of random vectors has std 1/√d; the measured cosine logits stay in ±τ."""
    spread = f"its std is exactly 1/√d: {1 / math.sqrt(ds[0]):.2f} at d = {ds[0]} and " \
             f"{1 / math.sqrt(ds[-1]):.3f} at d = {ds[-1]}"
    measured = ""
    if finite(ev.get("max_abs_logit_tau1")) and finite(ev.get("max_abs_logit_tau10")):
        measured = (f" Measured cosine logits never left [−τ, τ]: largest |logit| "
                    f"{ev['max_abs_logit_tau1']:.3f} at τ = 1 and {ev['max_abs_logit_tau10']:.2f}"
                    f" at τ = 10, for q, k norms from 1e-3 to 1e3.")
    return (f"For random q, k the cosine logit lies in [−1, 1] and concentrates near 0 as d "
            f"grows ({spread}), so at τ = 1 every logit is O(1/√d)." + measured)


def forest_alt(comps: Mapping[str, Any], unit_of: Callable[[str], str], what: str) -> str:
    """A family of paired comparisons: how many read each way, and the largest decided one
    (or, with none decided, the largest estimate and its reading)."""
    read = {r: [k for k, c in comps.items() if c.get("reading") == r] for r in READINGS}
    counts = ", ".join(f"{len(read[r])} {r}" for r in READINGS if read[r])
    deltas = sorted({float(c["smallest"]) for c in comps.values() if finite(c.get("smallest"))})
    first = (f"{what}: of {len(comps)} paired comparisons ({n_seeds(comps)} seeds, 95% CI, "
             f"Holm-corrected, smallest real effect δ = {' or '.join(sci(d, 2) for d in deltas)})"
             f" {counts}.")
    decided = [k for k in read["greater"] + read["less"] if finite(comps[k].get("mean"))]
    shown = decided or [k for k in comps if finite(comps[k].get("mean"))]
    if not shown:
        return first + " None has an estimate at this many seeds."
    k = max(shown, key=lambda x: abs(comps[x]["mean"]))
    name = k.replace("d_model=", "width ")
    if decided:
        return first + f" Largest decided: {name}, {interval(comps[k], unit_of(k), 3)}."
    return first + (f" None is decided; the largest estimate is {name}, "
                    f"{interval(comps[k], unit_of(k), 3)} ({comps[k].get('reading')}).")


def arms_alt(ev: Evidence, extra: str = "") -> str:
    """C3, C4: the baseline's accuracy with its interval, the lowest arm, chance; ``extra``."""
    arms = {a: arm_ci(v) for a, v in ev["accuracy"]["all"].items()}
    arms = {a: c for a, c in arms.items() if c["n"]}
    if not arms:
        raise ValueError("ev: no arm has accuracy values")
    base = "scaled_dot" if "scaled_dot" in arms else next(iter(arms))
    low = min(arms, key=lambda a: arms[a]["mean"])
    n = max(c["n"] for c in arms.values())
    text = (f"scaled_dot reaches {interval(arms[base], '', 2, False)} accuracy over {n} seeds "
            f"(chance {ev['chance']:.2f})" if base == "scaled_dot" else
            f"{base} reaches {interval(arms[base], '', 2, False)} accuracy (chance "
            f"{ev['chance']:.2f})")
    if low != base:
        text += f"; the lowest arm is {low} at {interval(arms[low], '', 2, False)}"
    return text + "." + (f" {extra}" if extra else "")


def c3_extra(ev: Evidence) -> str:
    """C3's second sentence: the controls, which must sit at chance."""
    acc = ev["accuracy"]["all"]
    parts = [f"{c} {arm_ci(acc.get(c))['mean']:.2f}" for c in ev.get("controls", ())
             if arm_ci(acc.get(c))["n"]]
    return f"The controls stay near chance: {', '.join(parts)}." if parts else ""


def c4_extra(ev: Evidence) -> str:
    """C4's second sentence: the exact cap on one key's weight at τ = 1."""
    b = ev.get("bound", {})
    if not finite(b.get("cosine_tau1")):
        return ""
    more = f", {b['cosine_tau4']:.2f} at τ = 4" if finite(b.get("cosine_tau4")) else ""
    return (f"Theory caps one key's weight at e^(2τ)/(e^(2τ)+n−1) = {b['cosine_tau1']:.2f} at "
            f"τ = 1 over {ev['n']} keys{more}.")


def c5_alt(ev: Evidence, delta: float | None) -> str:
    """C5: the overhead at the smallest and largest N, and the noise-floor margin."""
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


def head_dim_alt(ev: Evidence, dot: Mapping[str, Any], absorbed: Mapping[str, Any],
                 other: Mapping[str, Any], slope: Mapping[str, Any] | None = None) -> str:
    """C7, C13: the unscaled gap at the largest and smallest d_k (unit init), the absorbed
    arm there, the slope per doubling (C13) and the GPT-2-init gap."""
    big, small = str(ev["head_dims"][-1]), str(ev["head_dims"][0])
    g = dot.get(big, {})
    if not finite(g.get("mean")):
        raise ValueError("ev: no unit-init gap at the largest d_k")
    text = (f"Without 1/√d_k the eval loss moves by {interval(g, 'nats')} at d_k = {big} under "
            f"unit-variance init")
    if finite(dot.get(small, {}).get("mean")):
        text += f" against {interval(dot[small], 'nats')} at d_k = {small}"
    if slope and finite(slope.get("mean")):
        text += f", a change of {interval(slope, 'nats', 3)} per doubling of d_k"
    text += "."
    more = []
    if finite(absorbed.get(big, {}).get("mean")):
        more.append(f"rescaling q, k init and LR by d_k^(−1/4) leaves "
                    f"{interval(absorbed[big], 'nats')}")
    if finite(other.get(big, {}).get("mean")):
        more.append(f"with GPT-2 init the gap is {interval(other[big], 'nats')}")
    return text + (f" At d_k = {big}, {'; '.join(more)}." if more else "")


def c8_alt(ev: Evidence, slope: float | None) -> str:
    """C8: the mean of q·k stays at 0 while its spread grows like √d_k."""
    rows = sorted(ev["by_d"], key=lambda r: r["d"])
    z = max(abs(r["mean"]) / r["se_mean"] for r in rows)
    grow = f" as d_k^{slope:.2f} (√d_k is 0.50)" if finite(slope) else ""
    scaled = [r["std_scaled"] for r in rows]
    return (f"Monte Carlo over d_k = {rows[0]['d']}–{rows[-1]['d']}: the mean of q·k stays within "
            f"{z:.1f} standard errors of 0, while its std grows from {rows[0]['std']:.1f} to "
            f"{rows[-1]['std']:.1f}{grow}. After dividing by √d_k the std is "
            f"{min(scaled):.2f}–{max(scaled):.2f} at every d_k.")


def entropy_half(curve: Mapping[str, Any]) -> float | None:
    """The logit std s where E[entropy]/ln n first falls through 1/2 (linear interpolation)."""
    s, h = curve["s"], curve["entropy_norm"]
    for i in range(1, len(s)):
        if h[i - 1] >= 0.5 > h[i]:
            return s[i - 1] + (h[i - 1] - 0.5) / (h[i - 1] - h[i]) * (s[i] - s[i - 1])
    return None


def rem_alt(ev: Evidence) -> str:
    """C9: where the entropy halves, against s_c, and the max weight at s = 8 against s = 1."""
    parts = []
    for c in ev["curves"]:
        s = entropy_half(c)
        if s is not None:
            parts.append(f"s = {s:.2f} at n = {c['n']} (s_c = {c['s_c']:.2f})")
    text = ("Exact theory: the softmax entropy of n i.i.d. N(0, s²) logits falls through half "
            f"of ln n at {', '.join(parts)}." if parts else
            "Exact theory: the softmax entropy of n i.i.d. N(0, s²) logits falls with s.")
    un, sc = ev.get("max_weight_unscaled_64_512"), ev.get("max_weight_scaled_64_512")
    if finite(un) and finite(sc):
        text += (f" Over 512 keys, unscaled logits at d_k = 64 (s = 8) put {un:.2f} of the "
                 f"weight on one key on average; scaled ones (s = 1) put {sc:.3f}.")
    return text


def phase_alt(summary: Mapping[str, Any]) -> str:
    """C9's phase diagram (:func:`attnscale.audit.theory_plots.phase_summary`)."""
    at = ", ".join(f"d_k ≈ {d:.0f} at n = {n:,} (REM line 2 ln n = {2 * math.log(n):.1f})"
                   for n, d in summary["half_d"].items() if d is not None)
    return (f"Exact theory over d_k ≤ {summary['d_max']:,} and n ≤ {summary['n_max']:,} keys: "
            f"without 1/√d_k the softmax entropy falls below half of ln n at "
            f"{at}, and is {summary['unscaled_64_512']:.2f}·ln n at d_k = 64, n = 512. Scaled "
            f"by 1/√d_k it never saturates: at least {summary['scaled_min']:.2f}·ln n everywhere.")


def c10_alt(ev: Evidence, per_n: list[dict[str, Any]]) -> str:
    """C10: the median row's ‖J‖_F at its peak and by 10·s_c, and the fraction below 1e-3."""
    judged = [r for r in per_n if finite(r.get("median"))]
    if not judged:
        raise ValueError("per_n: no n was judged")
    peak = max(r["peak_median"] for r in judged)
    cross = ", ".join(f"{r['crossing_s_over_sc']:.1f}·s_c at n = {r['n']}" for r in judged
                      if finite(r.get("crossing_s_over_sc")))
    ends = ", ".join(f"{r['frac']:.0%} at n = {r['n']}" for r in judged)
    where = f" and falls below 1e-3 only at {cross}" if cross else \
        " and does not fall below 1e-3 in the measured range"
    return (f"The median row's softmax Jacobian norm ‖J‖_F peaks near s_c at about {peak:.2f}"
            f"{where}; at {judged[0]['s_over_sc']:.0f}·s_c the share of rows below 1e-3 is "
            f"{ends}. Toward uniform it levels off at √(n−1)/n instead of vanishing."
            + "".join(f" By the law at 100·s_c the median row's norm is {r['law_median'][-1]:.0e}"
                      f" while the RMS is {r['law_rms'][-1]:.2g}, falling like "
                      f"s^{r['rms_slope']:+.2f} (n = {r['n']})." for r in judged[-1:]
                      if "law_rms" in r))


def c11_alt(ev: Evidence) -> str:
    """C11: per arm at the largest width, the first LR whose mean peak logit passes 1e4."""
    width = list(ev["sweep"])[-1]
    limit = ev["logit_limit"]
    parts = []
    for arm in ("dot", "scaled_dot", "qk_layernorm"):
        peaks = {float(lr): v for lr, v in ev["sweep"][width].get(arm, {})
                 .get("peak_logit_by_lr", {}).items() if finite(v)}
        if not peaks:
            continue
        past = [lr for lr, v in sorted(peaks.items()) if v > limit]
        parts.append(f"{arm} from LR {past[0]:g}" if past else
                     f"{arm} at no LR (largest {sci(max(peaks.values()))})")
    if not parts:
        raise ValueError("ev: no peak logits at the largest width")
    return (f"At {width.replace('d_model=', 'width ')} the mean peak max |logit| passes "
            f"Wortsman et al.'s {sci(limit)} instability marker for {', '.join(parts)}; larger "
            f"LRs give larger logits in every arm.")


def c12_alt(ev: Evidence, numbers: Mapping[str, Any]) -> str:
    """C12: the step-0 logit std per regime, and which LRs end past 4·s_c."""
    span = {}
    for regime, by_d in ev["init_std"].items():
        xs = [v for seeds in by_d.values() for v in seeds.values() if finite(v)]
        if xs:
            span[regime] = f"{min(xs):.2g}–{max(xs):.2g}"
    first = ("At init scaled_dot's logit std is " + ", ".join(
        f"{s} with {r} init" for r, s in span.items()) + ".") if span else ""
    trained = [(float(lr), x) for by_lr in ev["final_logit"].values()
               for lr, seeds in by_lr.items() for x in seeds.values()]
    if not trained:
        return first or "No scaled_dot logit was measured."
    limit = numbers.get("limit", 4 * math.sqrt(2 * math.log(ev["n"])))
    past = numbers.get("past") or sorted({lr for lr, x in trained if x > limit})
    worst = max(x for _, x in trained)
    second = (f" After training the largest final max |logit| is {sci(worst)} against "
              f"4·s_c = {limit:.1f}; " + (f"seeds pass it from LR {min(past):g}." if past else
                                         "no LR passes it."))
    return first + second


def q2_alt(result: Mapping[str, Any]) -> str:
    """Q2: MiniLM's logit size and entropy, and what removing 1/√d would do."""
    s = result["summary"]
    heads = [(layer["layer"], h) for layer in result["layers"] for h in layer["heads"]]
    li, top = max(heads, key=lambda x: x[1]["max_abs_logit"])
    return (f"In {result['model']} ({result['n_tokens']} tokens) the pre-softmax logits have "
            f"mean std {s['logit_std']:.2f} (largest |logit| {top['max_abs_logit']:.1f}, layer "
            f"{li} head {top['head']}) and attention keeps {s['entropy']:.2f} of "
            f"{s['entropy_uniform']:.2f} nats. Without 1/√d the same q and k would give "
            f"{s['entropy_unscaled']:.2f} nats ({s['entropy_unscaled'] / s['entropy']:.0%} of the "
            f"actual).")


def q3_alt(ev: Evidence) -> str:
    """Q3: eval loss, accuracy and attention on the answer at the longest evaluation length,
    per arm."""
    lengths = ev["lengths"]
    if len(lengths) < 2:
        raise ValueError("ev: Q3 needs at least two evaluation lengths")
    last = lengths[-1]
    loss = {a: arm_ci(v) for a, v in ev["loss"][last]["all"].items()}
    acc = {a: arm_ci(v) for a, v in ev["accuracy"][last]["all"].items()}
    text = (f"Trained at {lengths[0]} and evaluated at {last}, eval loss is "
            + ", ".join(f"{a} {interval(c, 'nats', 3, False)}" for a, c in loss.items()
                        if c["n"])
            + "; accuracy is "
            + ", ".join(f"{a} {interval(c, '', 2, False)}" for a, c in acc.items() if c["n"])
            + ".")
    weight = {a: arm_ci(v) for a, v in ev.get("answer_weight", {}).get(last, {})
              .get("all", {}).items()}
    parts = [f"{a} {c['mean']:.2f}" for a, c in weight.items() if c["n"]]
    if parts:
        text += f" The attention weight on the answer at {last} is {', '.join(parts)}."
    return text
