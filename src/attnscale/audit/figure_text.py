"""Alt text the shared figures use, and the formatting helpers every claim's alt text uses: one
or two sentences that state a figure's finding.

Every builder is a pure function of the evidence (and the rule's numbers) the figure draws, and
writes its numbers with f-strings, so the text changes when the data does. Where a number is
missing the sentence says less; it never fills a gap. A claim's own alt text lives in its
module (:mod:`attnscale.audit.claims`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from attnscale.lab.analysis import mean_ci

Evidence = Mapping[str, Any]
READINGS = ("greater", "less", "equal", "inconclusive", "not measurable")


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


def head_dim_alt(ev: Evidence, dot: Mapping[str, Any], other: Mapping[str, Any],
                 slope: Mapping[str, Any] | None = None) -> str:
    """C7, C13: the unscaled gap at the largest and smallest d_k (unit init), the slope per
    doubling (C13) and the GPT-2-init gap."""
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
    if finite(other.get(big, {}).get("mean")):
        text += f" At d_k = {big}, with GPT-2 init the gap is {interval(other[big], 'nats')}."
    return text


