"""C12: "Dividing by √d_k keeps logits O(1): no saturation, gradients flow" (the thread, after
Vaswani et al. 2017, arXiv 1706.03762, §3.2.1 footnote 4: q·k has variance d_k for unit-variance
components, so q·k/√d_k has variance 1).

The claim is about a row of logits, the thing one softmax normalizes, so both halves read the
typical row's spread σ (:func:`attnscale.lab.runlog.row_logit_std`: per query row, the standard
deviation of the logits over the keys it sees, averaged over rows and heads), never the largest
of the 10⁴ logits of a batch (about 4 even for pure N(0, 1) logits):

* at init, from the head-dimension study: scaled_dot's σ in layer 1 at step 0, every seed, both
  init regimes; O(1) means between 0.25 and 4;
* after training, from the text LR sweep: scaled_dot's final σ (the larger of its layers) at
  each seed's own cross-fitted LR, per width, against the softmax's freezing scale s_c(n) =
  √(2 ln n) (Derrida 1981's Random Energy Model; for n Gaussian logits the top key's weight is
  about ½ at σ = s_c: its logit σ·s_c above the mean against n·e^{σ²/2} for the rest).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import family
from attnscale.audit.evidence import Arm, Model, head_dim_evidence, init_row_std, lr_text_evidence
from attnscale.audit.figure_text import arm_ci, finite
from attnscale.audit.interval import Comparison
from attnscale.audit.theory_plots import BAND, log_ticks, save, yerr
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.lab.paired import EQUAL, GREATER, LESS
from attnscale.measure.theory import rem_critical_scale

FACTOR_DELTA = math.log(2)  # a factor of 2 from s_c, on the log scale
RULE = ("Step 0: scaled_dot's row logit spread σ (per query row, the std of its logits over "
        "the keys it sees, averaged over rows and heads) in layer 1, every seed, in each init "
        "regime; O(1) means between 0.25 and 4. After training: scaled_dot's final σ (larger "
        "layer) at each seed's cross-fitted LR, per width, paired per seed against the "
        "freezing scale s_c(n) = √(2 ln n) on the log scale, smallest effect a factor of 2, "
        "Holm over the widths. Supported if every unit-variance seed is O(1) at init and "
        "every width reads below s_c; depends if init is O(1) and some width reads at s_c "
        "(within a factor 2) or past it; refuted if some unit-variance seed is not O(1) at "
        "init; inconclusive otherwise")

BySeed = dict[str, float]  # seed -> value


class Evidence(Model):
    """scaled_dot's row logit spread: ``init_std`` regime -> d_k -> seed -> step-0 σ (layer
    1, :func:`attnscale.audit.evidence.init_row_std`); ``trained`` width -> the final σ (larger
    layer) per seed at its cross-fitted LR; ``n`` the text study's sequence length."""

    init_std: dict[str, dict[str, BySeed]]
    trained: dict[str, Arm]
    n: int

    def init_values(self, regime: str) -> list[float]:
        """Every seed's step-0 σ in ``regime``, over every d_k."""
        return [v for by_seed in self.init_std.get(regime, {}).values()
                for v in by_seed.values()]


def limit_of(n: int) -> float:
    """s_c(n) = √(2 ln n), the softmax's freezing scale over n keys."""
    return float(rem_critical_scale(n))


def span(xs: list[float]) -> str:
    """``min–max`` to 3 significant digits, or "n/a"."""
    return f"{min(xs):.3g}–{max(xs):.3g}" if xs else "n/a"


def against_limit(ev: Evidence) -> dict[str, Comparison]:
    """Per width, ln σ − ln s_c per seed (a non-finite σ, a blown-up row, counts as past),
    read against ±ln 2 with Holm over the widths."""
    log_limit = math.log(limit_of(ev.n))
    def log_of(v: float) -> float:
        return math.log(v) if v > 0 and math.isfinite(v) else math.log(1e12)
    pairs = {w: (Arm(values={s: log_of(v) for s, v in a.values.items()}, censored=a.censored),
                 Arm(values=dict.fromkeys(a.values, log_limit)))
             for w, a in ev.trained.items()}
    return family(pairs, FACTOR_DELTA)


def judge(ev: Evidence) -> Verdict:
    """C12: scaled_dot's row spread at init (both regimes) and after training at its own LR."""
    unit = ev.init_values("unit")
    limit = limit_of(ev.n)
    cmp = against_limit(ev)
    init_ok = bool(unit) and all(0.25 <= v <= 4 for v in unit)
    at_or_past = [w for w, c in cmp.items() if c.reading in (GREATER, EQUAL)]
    if not unit:
        verdict = INCONCLUSIVE
    elif not init_ok:
        verdict = REFUTED
    elif at_or_past:
        verdict = DEPENDS
    elif cmp and all(c.reading == LESS for c in cmp.values()):
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    plain = [f"At init, with unit-variance q and k, a row of q·k/√d_k logits has std "
             f"{span(unit)} over every d_k and seed: "
             f"{'O(1), as the thread says' if init_ok else 'not O(1)'}."]
    small = ev.init_values("gpt2")
    if small:
        size = ("far below 1, set by the init rather than the division" if max(small) < 0.25
                else "of order one")
        plain.append(f"With GPT-2 init the model's own rows start at std {span(small)}: {size}.")
    plain += [trained_sentence(w, c, limit) for w, c in cmp.items()]
    words = {SUPPORTED: "O(1) at init and below the freezing scale after training",
             REFUTED: "not O(1) at init", INCONCLUSIVE: "not decided after training" if unit
             else "no data",
             DEPENDS: f"O(1) at init; at or past the freezing scale after training at "
                      f"{', '.join(w.replace('d_model=', 'width ') for w in at_or_past)}"}
    return Verdict(verdict, RULE, f"init row σ per seed: unit {span(unit)}, gpt2 {span(small)}; "
                   f"trained ln(σ/s_c) by width: "
                   f"{ {w: c.effect() for w, c in cmp.items()} } (s_c = {limit:.2f})",
                   {"limit": limit, "at_or_past": at_or_past,
                    "trained": {w: c.model_dump() for w, c in cmp.items()}},
                   headline=f"{verdict}: {words[verdict]}", plain=plain,
                   regime=("both init regimes; text LR sweep after 150 steps at widths "
                           f"{', '.join(w.split('=')[1] for w in cmp) or 'none'}, each seed at "
                           "its own cross-fitted LR; it cannot show longer training or other "
                           "LRs"),
                   smallest="O(1) = within a factor 4 of 1; trained: a factor 2 from s_c(n)")


def trained_sentence(width: str, c: Comparison, limit: float) -> str:
    """One width's reading of the trained σ against s_c, as a ratio."""
    w = width.replace("d_model=", "width ")
    if not c.has_interval():
        return f"At {w} the trained rows could not be read ({c.why or 'no interval'})."
    ratio = f"{math.exp(c.mean):.2g}× s_c [{math.exp(c.lo):.2g}, {math.exp(c.hi):.2g}]"
    where = {LESS: "below the freezing scale by more than a factor 2",
             GREATER: "past the freezing scale by more than a factor 2",
             EQUAL: "within a factor 2 of the freezing scale, where the top key takes about "
                    "half the weight"}.get(c.reading)
    if where is None:
        more = f"; about {c.seeds_to_decide} seeds would decide" if c.seeds_to_decide else ""
        return (f"At {w}, after training, a typical row's σ is {ratio} (s_c = {limit:.2f}): "
                f"its interval still spans a factor-2 boundary{more}.")
    return f"At {w}, after training, a typical row's σ is {ratio} (s_c = {limit:.2f}): {where}."


def alt(ev: Mapping[str, Any], numbers: Mapping[str, Any]) -> str:
    """The step-0 row spread per regime, and the trained one per width against s_c."""
    spans = {}
    for regime, by_d in ev["init_std"].items():
        xs = [v for seeds in by_d.values() for v in seeds.values() if finite(v)]
        if xs:
            spans[regime] = f"{min(xs):.2g}–{max(xs):.2g}"
    first = ("At init a row of scaled_dot's logits has std " + ", ".join(
        f"{s} with {r} init" for r, s in spans.items()) + ".") if spans else ""
    trained = {w: list(a["values"].values()) for w, a in ev["trained"].items() if a["values"]}
    if not trained:
        return first or "No scaled_dot logit was measured."
    limit = numbers.get("limit", limit_of(ev["n"]))
    parts = [f"{w.replace('d_model=', 'width ')} {min(xs):.2g}–{max(xs):.2g}"
             for w, xs in trained.items()]
    return (first + f" After training, at each seed's own LR, it is {'; '.join(parts)}, "
            f"against the freezing scale s_c = {limit:.2f}.")


def init_panel(ax: plt.Axes, init_std: Mapping[str, Any]) -> None:
    """The left panel: scaled_dot's step-0 row spread against d_k per regime (95% CI)."""
    for i, (regime, by_d) in enumerate(init_std.items()):
        ds = sorted(by_d, key=int)
        cs = [arm_ci({"values": by_d[d]}) for d in ds]
        ax.errorbar([int(d) for d in ds], [c["mean"] for c in cs], yerr=yerr(cs), marker="o",
                    capsize=3, color=f"C{i}", label=f"{regime} init, 95% CI")
    ax.axhspan(0.25, 4, color=BAND, zorder=0, label="O(1): 0.25 to 4")
    ax.set(yscale="log", ylabel="row logit std σ at step 0", title="at init (layer 1)")
    log_ticks(ax, sorted({int(d) for by_d in init_std.values() for d in by_d}))
    ax.set_xlabel("$d_k$")


def trained_panel(b: plt.Axes, ev: Mapping[str, Any], limit: float) -> None:
    """The right panel: each seed's final row spread per width (at its own LR) with the mean's
    95% CI, against s_c(n); a diverged run is drawn at the top as ▲."""
    widths = list(ev["trained"])
    values = [x for a in ev["trained"].values() for x in a["values"].values()]
    top = 3 * max([x for x in values if finite(x)] + [limit])
    for i, w in enumerate(widths):
        xs = list(ev["trained"][w]["values"].values())
        ok = [x for x in xs if finite(x)]
        b.scatter([i] * len(ok), ok, s=14, color=f"C{i}", alpha=0.7,
                  label="each seed" if i == 0 else None)
        if len(ok) > 1:
            c = arm_ci({"values": dict(enumerate(ok))})
            b.errorbar([i + 0.15], [c["mean"]], yerr=yerr([c]), marker="o", capsize=3,
                       color="k", label="mean, 95% CI" if i == 0 else None)
        bad = len(xs) - len(ok)
        if bad:
            b.scatter([i] * bad, [top] * bad, marker="^", color=f"C{i}", label="diverged")
    b.axhline(limit, color="C3", ls="--", label=rf"$s_c(n)=\sqrt{{2\ln {ev['n']}}}$"
              f" = {limit:.2f}")
    b.axhspan(limit / 2, limit * 2, color=BAND, zorder=0, label="within a factor 2 of s_c")
    b.set_xticks(range(len(widths)), [w.replace("d_model=", "width ") for w in widths])
    b.set(yscale="log", ylabel="final row logit std σ", title="after training, own LR",
          xlim=(-0.5, len(widths) - 0.3))
    b.yaxis.set_minor_formatter(NullFormatter())  # log minor labels collide with the label


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """scaled_dot's row logit spread at init per regime, and its final spread per width at each
    seed's own LR, with s_c(n)."""
    at_init = [v for by_d in ev["init_std"].values() for seeds in by_d.values()
               for v in seeds.values() if finite(v)]
    if not at_init and not any(a["values"] for a in ev["trained"].values()):
        raise ValueError("ev: no scaled_dot logit was measured")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 4.1))
    if at_init:
        init_panel(a, ev["init_std"])
    trained_panel(b, ev, numbers.get("limit", limit_of(ev["n"])))
    for ax in (a, b):
        ax.legend(loc="upper center",
                  bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"C12: scaled_dot's row logit spread, char-level text (n = {ev['n']} keys)",
                 fontsize=11)
    return [save(fig, folder, "c12_row_spread", alt(ev, numbers))]


def gather(src: Sources) -> dict[str, Any]:
    """scaled_dot's step-0 row spread from the head-dimension study, its final row spread per
    width at each seed's cross-fitted LR from the text LR study, and that study's length."""
    dk = src.study("head_dim", head_dim_evidence)
    text = src.study("lr_text", lr_text_evidence)
    trained = {w: row["scaled_dot"] for w, row in text["row_std_end"].items()
               if "scaled_dot" in row}
    return {"init_std": init_row_std(dk), "trained": trained, "n": text["n"]}


CLAIM = register(Claim(
    id="C12", text="Dividing by √d_k keeps logits O(1): no saturation, gradients flow.",
    measures="a row of logits' spread at init, and after training at each seed's own LR",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("head_dim", "lr_text")))
