"""C12: "Dividing by √d_k keeps logits O(1): no saturation, gradients flow" (the thread, after
Vaswani et al. 2017, arXiv 1706.03762, §3.2.1 footnote 4: q·k has variance d_k for unit-variance
components, so q·k/√d_k has variance 1).

The claim is about a row of logits, the thing one softmax normalizes, so both halves read the
typical row's spread (:func:`attnscale.lab.runlog.row_spread`, per query row over the keys it
sees, averaged over rows and heads), never the largest of the ~10⁴ logits a logged batch holds
(about 4 even for pure N(0, 1) logits):

* at init, from the head-dimension study: scaled_dot's row std σ in layer 1 at step 0, every
  seed, both init regimes; O(1) means between 0.25 and 4;
* after training, from the text LR sweep: scaled_dot's final σ_i / s_c(n_i) (the larger of its
  layers) at each seed's own cross-fitted LR, per width, where s_c(n) = √(2 ln n) is the
  softmax's freezing scale over the n_i keys row i sees (Derrida 1981's Random Energy Model:
  for n Gaussian logits of std s_c the top key takes about half the weight, 0.40-0.57 for
  n = 8-512; about 0.1-0.37 at s_c/2 and 0.69-0.76 at 2·s_c).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import family
from attnscale.audit.evidence import Arm, Model, row_spread_evidence
from attnscale.audit.figure_text import arm_ci, finite
from attnscale.audit.interval import Comparison
from attnscale.audit.theory_plots import BAND, log_ticks, save, yerr
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.lab.paired import EQUAL, GREATER, LESS

FACTOR_DELTA = math.log(2)  # a factor of 2 from the freezing scale, on the log scale
RULE = ("Step 0: scaled_dot's row logit std σ (per query row, over the keys it sees, averaged "
        "over rows and heads) in layer 1, every seed, in each init regime; O(1) means between "
        "0.25 and 4. After training: scaled_dot's final σ_i/s_c(n_i) (row i's std over the "
        "freezing scale of its own n_i keys, s_c(n) = √(2 ln n); averaged over rows; the larger "
        "layer) at each seed's cross-fitted LR, per width, paired per seed on the log scale "
        "against 1, smallest effect a factor 2, Holm over the widths; a seed whose run "
        "diverged or whose rows blew up puts its width past the scale. Supported if every "
        "unit-variance seed is O(1) at init and every width reads below the freezing scale by "
        "more than a factor 2; depends if init is O(1) and some width reads within a factor 2 "
        "of it or past it (equal or greater, or the one-sided test that σ/s_c exceeds ½, Holm "
        "over the widths on its own); refuted if some unit-variance seed is not O(1) at init; "
        "inconclusive otherwise")

BySeed = dict[str, float]  # seed -> value


class Evidence(Model):
    """scaled_dot's row spread: ``init_std`` regime -> d_k -> seed -> step-0 σ (layer 1);
    ``trained`` width -> the final σ/s_c per seed at its cross-fitted LR (larger layer; +inf
    where the run diverged or its rows blew up); ``n`` the text study's sequence length;
    ``steps`` its training steps."""

    init_std: dict[str, dict[str, BySeed]]
    trained: dict[str, Arm]
    n: int
    steps: int

    def init_values(self, regime: str) -> list[float]:
        """Every seed's step-0 σ in ``regime``, over every d_k."""
        return [v for by_seed in self.init_std.get(regime, {}).values()
                for v in by_seed.values()]


def span(xs: list[float]) -> str:
    """``min–max`` to 3 significant digits, or "n/a"."""
    return f"{min(xs):.3g}–{max(xs):.3g}" if xs else "n/a"


def blown(arm: Arm) -> list[str]:
    """The seeds whose rows blew up (or whose run diverged): +inf; a σ ≤ 0 is a bug."""
    bad = [s for s, v in arm.values.items() if not v > 0 and not math.isnan(v)]
    if bad or any(math.isnan(v) for v in arm.values.values()):
        raise ValueError(f"C12: a row spread that is not positive (seeds {bad or 'NaN'}): "
                         "the row statistic is wrong, not the model")
    return [s for s, v in arm.values.items() if math.isinf(v)]


def against_scale(ev: Evidence) -> dict[str, Comparison]:
    """Per width, ln(σ/s_c) per seed against 0, read against ±ln 2 with Holm over the widths
    whose seeds all stayed finite; a width with a blown-up seed reads greater outright."""
    pairs, out = {}, {}
    for w, a in ev.trained.items():
        gone = blown(a)
        if gone:
            out[w] = Comparison(mean=math.inf, n=len(a.values), reading=GREATER,
                                smallest=FACTOR_DELTA,
                                why=f"seed {', '.join(gone)} blew up at its own LR")
        else:
            pairs[w] = (Arm(values={s: math.log(v) for s, v in a.values.items()},
                            censored=a.censored), Arm(values=dict.fromkeys(a.values, 0.0)))
    out.update(family(pairs, FACTOR_DELTA))
    return {w: out[w] for w in ev.trained}


def verdict_of(unit: list[float], cmp: dict[str, Comparison]) -> tuple[str, bool, list[str]]:
    """(verdict, init O(1), the widths at or past the freezing scale)."""
    init_ok = bool(unit) and all(0.25 <= v <= 4 for v in unit)
    # within a factor 2 or past: either decided reading, or σ/s_c > ½ one-sided (an interval
    # that straddles 2 is still not below the scale)
    near = [w for w, c in cmp.items() if c.reading in (GREATER, EQUAL) or c.no_better()]
    if not unit:
        return INCONCLUSIVE, init_ok, near
    if not init_ok:
        return REFUTED, init_ok, near
    if near:
        return DEPENDS, init_ok, near
    if cmp and all(c.reading == LESS for c in cmp.values()):
        return SUPPORTED, init_ok, near
    return INCONCLUSIVE, init_ok, near


def judge(ev: Evidence) -> Verdict:
    """C12: scaled_dot's row spread at init (both regimes) and after training at its own LR."""
    unit = ev.init_values("unit")
    cmp = against_scale(ev)
    verdict, init_ok, near = verdict_of(unit, cmp)
    plain = [f"At init, with unit-variance q and k, a row of q·k/√d_k logits has std "
             f"{span(unit)} over every d_k and seed: "
             f"{'O(1), as the thread says' if init_ok else 'not O(1)'}."]
    small = ev.init_values("gpt2")
    if small:
        size = ("far below 1, set by the init rather than the division" if max(small) < 0.25
                else "of order one")
        plain.append(f"With GPT-2 init the model's own rows start at std {span(small)}: {size}.")
    plain += [trained_sentence(w, c) for w, c in cmp.items()]
    words = {SUPPORTED: "O(1) at init and below the freezing scale after training",
             REFUTED: "not O(1) at init",
             INCONCLUSIVE: "not decided after training" if unit else "no data",
             DEPENDS: "O(1) at init; within a factor 2 of the freezing scale, or past it, after "
                      f"training at {', '.join(w.replace('d_model=', 'width ') for w in near)}"}
    return Verdict(verdict, RULE, f"init row σ per seed: unit {span(unit)}, gpt2 {span(small)}; "
                   f"trained ln(σ/s_c) by width: {({w: c.effect() for w, c in cmp.items()})}",
                   {"near_or_past": near, "trained": {w: c.model_dump() for w, c in cmp.items()}},
                   headline=f"{verdict}: {words[verdict]}", plain=plain,
                   regime=(f"both init regimes; text LR sweep after {ev.steps} steps at widths "
                           f"{', '.join(w.split('=')[1] for w in cmp) or 'none'} (n = {ev.n}), "
                           "each seed at its own cross-fitted LR; it cannot show longer "
                           "training or other LRs"),
                   smallest="O(1) = within a factor 4 of 1; trained: a factor 2 from the "
                            "freezing scale s_c(n_i) = √(2 ln n_i)")


def trained_sentence(width: str, c: Comparison) -> str:
    """One width's reading of the trained σ/s_c."""
    w = width.replace("d_model=", "width ")
    if c.why and c.reading == GREATER:
        return f"At {w}, after training, {c.why}: its rows are past the freezing scale."
    if not c.has_interval():
        return f"At {w} the trained rows could not be read ({c.why or 'no interval'})."
    ratio = f"{math.exp(c.mean):.2g}× [{math.exp(c.lo):.2g}, {math.exp(c.hi):.2g}]"
    where = {LESS: "below it by more than a factor 2",
             GREATER: "past it by more than a factor 2",
             EQUAL: "within a factor 2 of it, where a few keys start to take most of a row's "
                    "weight"}.get(c.reading)
    if where is None and c.no_better():
        return (f"At {w}, after training, a typical row's σ is {ratio} the freezing scale of "
                f"its keys: not below half of it, so within a factor 2 of it or past it.")
    if where is None:
        more = f"; about {c.seeds_to_decide} seeds would decide" if c.seeds_to_decide else ""
        return (f"At {w}, after training, a typical row's σ is {ratio} the freezing scale of "
                f"its keys: its interval still spans a factor-2 boundary{more}.")
    return (f"At {w}, after training, a typical row's σ is {ratio} the freezing scale of its "
            f"keys: {where}.")


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
    parts = [f"{w.replace('d_model=', 'width ')} {min(xs):.2g}–{max(xs):.2g}"
             for w, xs in trained.items()]
    return (first + f" After training, at each seed's own LR, a row's std is {'; '.join(parts)} "
            "times the freezing scale of its keys.")


def init_panel(ax: plt.Axes, init_std: Mapping[str, Any]) -> None:
    """The left panel: scaled_dot's step-0 row std against d_k per regime (95% CI)."""
    for i, (regime, by_d) in enumerate(init_std.items()):
        ds = sorted(by_d, key=int)
        cs = [arm_ci({"values": by_d[d]}) for d in ds]
        ax.errorbar([int(d) for d in ds], [c["mean"] for c in cs], yerr=yerr(cs), marker="o",
                    capsize=3, color=f"C{i}", label=f"{regime} init, 95% CI")
    ax.axhspan(0.25, 4, color=BAND, zorder=0, label="O(1): 0.25 to 4")
    ax.set(yscale="log", ylabel="row logit std σ at step 0", title="at init (layer 1)")
    log_ticks(ax, sorted({int(d) for by_d in init_std.values() for d in by_d}))
    ax.set_xlabel("$d_k$")


def geometric_ci(xs: list[float]) -> dict[str, float]:
    """The geometric mean with the exponentiated 95% interval of the mean log (what the rule
    reads), as {"mean", "lo", "hi"}."""
    c = arm_ci({"values": dict(enumerate(np.log(xs).tolist()))})
    return {k: math.exp(c[k]) if finite(c[k]) else math.nan for k in ("mean", "lo", "hi")}


def trained_panel(b: plt.Axes, ev: Mapping[str, Any]) -> None:
    """The right panel: each seed's final σ/s_c per width (at its own LR) with the geometric
    mean's 95% CI, against 1 and the factor-2 band; a blown-up run is drawn at the top as ▲."""
    widths = list(ev["trained"])
    values = [x for a in ev["trained"].values() for x in a["values"].values()]
    top = 3 * max([x for x in values if finite(x)] + [2.0])
    for i, w in enumerate(widths):
        xs = list(ev["trained"][w]["values"].values())
        ok = [x for x in xs if finite(x)]
        b.scatter([i] * len(ok), ok, s=14, color=f"C{i}", alpha=0.7,
                  label="each seed" if i == 0 else None)
        if len(ok) > 1 and len(ok) == len(xs):
            c = geometric_ci(ok)
            b.errorbar([i + 0.15], [c["mean"]], yerr=yerr([c]), marker="o", capsize=3,
                       color="k", label="geometric mean, 95% CI" if i == 0 else None)
        if len(xs) > len(ok):
            b.scatter([i] * (len(xs) - len(ok)), [top] * (len(xs) - len(ok)), marker="^",
                      color=f"C{i}", label="diverged or blew up")
    b.axhline(1.0, color="C3", ls="--", label=r"freezing scale $s_c(n_i)=\sqrt{2\ln n_i}$")
    b.axhspan(0.5, 2.0, color=BAND, zorder=0, label="within a factor 2 of it")
    b.set_xticks(range(len(widths)), [w.replace("d_model=", "width ") for w in widths])
    b.set(yscale="log", ylabel=r"final row std / $s_c(n_i)$", title="after training, own LR",
          xlim=(-0.5, len(widths) - 0.3))
    b.yaxis.set_minor_formatter(NullFormatter())  # log minor labels collide with the label


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """scaled_dot's row std at init per regime, and its final row std over the freezing scale
    per width at each seed's own LR."""
    at_init = [v for by_d in ev["init_std"].values() for seeds in by_d.values()
               for v in seeds.values() if finite(v)]
    if not at_init and not any(a["values"] for a in ev["trained"].values()):
        raise ValueError("ev: no scaled_dot logit was measured")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 4.1))
    if at_init:
        init_panel(a, ev["init_std"])
    trained_panel(b, ev)
    for ax in (a, b):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=8,
                  frameon=False)
    fig.suptitle(f"C12: scaled_dot's row logit spread, char-level text (n = {ev['n']} keys)",
                 fontsize=11)
    return [save(fig, folder, "c12_row_spread", alt(ev, numbers))]


def gather(src: Sources) -> dict[str, Any]:
    """scaled_dot's step-0 row std (layer 1) per init regime and d_k from the head-dimension
    study, its final σ/s_c (larger layer) per width at each seed's cross-fitted LR from the text
    LR study, and that study's length and steps."""
    init: dict[str, dict[str, BySeed]] = {}
    for label, arm in row_spread_evidence(src.studies["head_dim"], src.runs["head_dim"], 0,
                                          "row_logit_std", layer=0).items():
        fields = dict(part.split("=") for part in label.split())
        init.setdefault(fields["init"], {})[fields["d_model"]] = dict(arm["values"])
    text = src.studies["lr_text"]
    trained = row_spread_evidence(text, src.runs["lr_text"], -1, "row_freeze_ratio")
    return {"init_std": init, "trained": trained, "n": text.base["seq_len"],
            "steps": text.base["steps"]}


CLAIM = register(Claim(
    id="C12", text="Dividing by √d_k keeps logits O(1): no saturation, gradients flow.",
    measures="a row of logits' spread at init, and after training at each seed's own LR",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("head_dim", "lr_text")))
