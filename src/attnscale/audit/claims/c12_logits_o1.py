"""C12: "Dividing by √d_k keeps logits O(1): no saturation, gradients flow" (the thread, after
Vaswani et al. 2017, arXiv 1706.03762, §3.2.1 footnote 4: q·k has variance d_k for unit-variance
components, so q·k/√d_k has variance 1).

Two halves, both about scaled_dot:

* at init, from the head-dimension study: the row std σ of layer 1's logits at step 0 (per
  query row over the keys it sees, averaged over rows and heads; every seed, both init
  regimes); O(1) means between 0.25 and 4, and the unit-variance regime decides;
* after training, from the text LR sweep: measured saturation, the mean max attention weight
  and the share of rows whose max weight exceeds 0.9 (the larger of the layers, last logged
  step), compared across widths at a matched LR: for every LR the study ran at both widths,
  the wider model minus the narrower, paired per seed, in the unit-init cells (the decision;
  GPT-2 init is context). Reading each arm at its own chosen LR would measure the LR, not the
  width: σ/s_c read that way moved by a factor 8 between the chosen and the runner-up LRs.

Beside them, the trained max |logit| per width and LR: 1/√d_k fixes the logits' size at init
only; under training they grow with LR and width (Wortsman et al. 2023, arXiv 2309.14322;
Dehghani et al. 2023, arXiv 2302.05442, at ViT-22B), which is why QK-norm, logit soft-capping
and QK-Clip exist.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.compare import Pair, family
from attnscale.audit.evidence import Arm, Model, Run, row_spread_evidence
from attnscale.audit.figure_text import arm_ci, finite
from attnscale.audit.interval import Comparison
from attnscale.audit.selection import cell_label, cells, in_cell
from attnscale.audit.studies import Study
from attnscale.audit.theory_plots import BAND, log_ticks, save, yerr
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    REFUTED,
    SUPPORTED,
    MissingEvidence,
    Verdict,
)
from attnscale.lab import analysis

SAT_DELTA = 0.05  # a share of rows, or of the weight: one row in twenty
UNIT, GPT2 = "unit", "gpt2"
STATS = {"max_weight": "mean max weight", "saturated_fraction": "rows above 0.9"}
BLOWN = {"max_weight": 1.0, "saturated_fraction": 1.0, "max_abs_logit": math.inf}
RULE = ("Step 0: scaled_dot's row logit std σ (per query row, over the keys it sees, averaged "
        "over rows and heads) in layer 1, every seed, in each init regime; O(1) means between "
        "0.25 and 4. After training, at a matched LR: for every LR of the text sweep run at "
        "both widths, in the unit-variance init cells, scaled_dot's final mean max attention "
        "weight and share of rows with max weight above 0.9 (the larger of the layers; 1 for "
        "a run that diverged or whose logits blew up), wider minus narrower width paired per "
        "seed, smallest effect 0.05, Holm over every LR and both measures. Supported if every "
        "unit-variance seed is O(1) at init and at every matched LR the wider model saturates "
        "no more (non-inferior within δ); depends if init is O(1) and at some matched LR the "
        "wider model saturates more; refuted if some unit-variance seed is not O(1) at init; "
        "inconclusive otherwise. GPT-2 init and the trained max |logit| per width and LR are "
        "context")

BySeed = dict[str, float]  # seed -> value
ByLR = dict[str, BySeed]  # LR (as str(float)) -> seed -> value


class Trained(Model):
    """scaled_dot in one (init, width) cell of the text LR sweep, at its last logged step, per
    LR and seed, the largest over layers of: the mean max attention weight, the share of rows
    with max weight above 0.9, and max |logit| (:data:`BLOWN` for a run that blew up)."""

    max_weight: ByLR
    saturated_fraction: ByLR
    max_abs_logit: ByLR


class Evidence(Model):
    """scaled_dot: ``init_std`` regime -> d_k -> seed -> step-0 σ (layer 1); ``trained`` init
    regime -> width label ("d_model=32") -> :class:`Trained`; ``n`` the text study's sequence
    length; ``steps`` its training steps."""

    init_std: dict[str, dict[str, BySeed]]
    trained: dict[str, dict[str, Trained]]
    n: int
    steps: int

    def init_values(self, regime: str) -> list[float]:
        """Every seed's step-0 σ in ``regime``, over every d_k."""
        return [v for by_seed in self.init_std.get(regime, {}).values()
                for v in by_seed.values()]

    def widths(self, init: str) -> list[str]:
        """The width labels of ``init``'s trained cells, narrowest first."""
        return sorted(self.trained.get(init, {}), key=width_of)

    def matched(self, init: str) -> list[str]:
        """The LRs both the narrowest and the widest width of ``init`` ran, in order."""
        w = self.widths(init)
        if len(w) < 2:
            return []
        lo, hi = (self.trained[init][x].max_weight for x in (w[0], w[-1]))
        return sorted(set(lo) & set(hi), key=float)


def width_of(label: str) -> int:
    """128 for "d_model=128"."""
    return int(label.split("=")[-1])


def span(xs: list[float]) -> str:
    """``min–max`` to 3 significant digits, or "n/a"."""
    return f"{min(xs):.3g}–{max(xs):.3g}" if xs else "n/a"


def mean(by_seed: Mapping[str, float]) -> float:
    """Mean over seeds (nan for none)."""
    return float(np.mean(list(by_seed.values()))) if by_seed else math.nan


def width_family(ev: Evidence, init: str) -> dict[str, Comparison]:
    """At every matched LR, wider minus narrower width of both saturation measures (one Holm
    family: the rule reads them through 'some')."""
    w = ev.widths(init)
    pairs: dict[str, Pair] = {}
    for lr in ev.matched(init):
        for stat in STATS:
            lo, hi = (getattr(ev.trained[init][x], stat)[lr] for x in (w[0], w[-1]))
            pairs[f"lr {float(lr):g} {stat}"] = (Arm(values=hi), Arm(values=lo))
    return family(pairs, SAT_DELTA) if pairs else {}


def grouped(keys: list[str], short: bool = False) -> str:
    """"lr 0.01 (mean max weight), lr 0.1 (mean max weight, rows above 0.9)" for comparison
    names of :func:`width_family` (``short``: "lr 0.01, 0.1")."""
    by_lr: dict[str, list[str]] = {}
    for k in keys:
        lr, stat = k.rsplit(" ", 1)
        by_lr.setdefault(lr, []).append(STATS[stat])
    if short:
        return "lr " + ", ".join(lr.removeprefix("lr ") for lr in by_lr)
    return ", ".join(f"{lr} ({', '.join(words)})" for lr, words in by_lr.items())


def verdict_of(unit: list[float], cmp: Mapping[str, Comparison]) -> tuple[str, bool, list[str]]:
    """(verdict, init O(1), the matched comparisons where the wider model saturates more)."""
    init_ok = bool(unit) and all(0.25 <= v <= 4 for v in unit)
    more = [k for k, c in cmp.items() if c.greater()]
    if not unit:
        return INCONCLUSIVE, init_ok, more
    if not init_ok:
        return REFUTED, init_ok, more
    if more:
        return DEPENDS, init_ok, more
    # a matched LR where both widths saturate identically on every seed (e.g. rows at the 1/n
    # floor) is not measurable: it neither blocks nor makes the verdict; at least one must be
    read = [c for c in cmp.values() if c.measurable()]
    if read and all(c.no_worse() for c in read):
        return SUPPORTED, init_ok, more
    return INCONCLUSIVE, init_ok, more


def table(ev: Evidence) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """init -> width -> LR -> measure -> mean over seeds (every measure of :class:`Trained`)."""
    return {init: {w: {lr: {stat: mean(getattr(t, stat)[lr]) for stat in BLOWN}
                       for lr in sorted(t.max_weight, key=float)}
                   for w, t in by_w.items()} for init, by_w in ev.trained.items()}


def saturation_text(ev: Evidence, init: str) -> str | None:
    """Mean max weight and share above 0.9 per matched LR, narrower → wider width."""
    w, lrs = ev.widths(init), ev.matched(init)
    if not lrs:
        return None
    lo, hi = (ev.trained[init][x] for x in (w[0], w[-1]))
    per = "; ".join(f"lr {float(lr):g}: {mean(lo.max_weight[lr]):.2f} → "
                    f"{mean(hi.max_weight[lr]):.2f} ({mean(lo.saturated_fraction[lr]):.0%} → "
                    f"{mean(hi.saturated_fraction[lr]):.0%} of rows above 0.9)" for lr in lrs)
    return (f"After {ev.steps} steps at the same LR ({init} init), scaled_dot's mean max "
            f"attention weight goes from width {width_of(w[0])} to width {width_of(w[-1])}: "
            f"{per} (the first row of each causal sequence sees one key, so 1/{ev.n} of rows are "
            f"always above 0.9).")


def grows(ev: Evidence) -> tuple[bool, bool]:
    """(unit init's final max |logit| is larger at the largest LR than at the smallest at every
    width, larger at the widest width than at the narrowest at the largest matched LR)."""
    cells = ev.trained.get(UNIT, {})
    by_lr = []
    for t in cells.values():
        lrs = sorted(t.max_abs_logit, key=float)
        by_lr.append(len(lrs) > 1 and mean(t.max_abs_logit[lrs[-1]]) >
                     mean(t.max_abs_logit[lrs[0]]))
    lrs, w = ev.matched(UNIT), ev.widths(UNIT)
    by_width = bool(lrs) and (mean(cells[w[-1]].max_abs_logit[lrs[-1]]) >
                              mean(cells[w[0]].max_abs_logit[lrs[-1]]))
    return bool(by_lr) and all(by_lr), by_width


def growth_text(ev: Evidence) -> str | None:
    """The trained max |logit| at the smallest and largest LR of each width (unit init first),
    whether it grows with LR and width, and the literature on that growth."""
    parts = []
    for init in (UNIT, GPT2):
        for w in ev.widths(init):
            by_lr = ev.trained[init][w].max_abs_logit
            lrs = sorted(by_lr, key=float)
            if lrs:
                parts.append(f"{mean(by_lr[lrs[0]]):.3g} → {mean(by_lr[lrs[-1]]):.3g} at width "
                             f"{width_of(w)} ({init} init)")
    if not parts:
        return None
    lrs = sorted({float(x) for t in ev.trained.get(UNIT, {}).values() for x in t.max_abs_logit})
    grid = f" from lr {lrs[0]:g} to {lrs[-1]:g}" if lrs else ""
    lead = {(True, True): "Trained logits grow with LR and width",
            (True, False): "Trained logits grow with LR (not with width here)",
            (False, True): "Trained logits grow with width (not with LR here)",
            (False, False): "Trained logits did not grow with LR or width here"}[grows(ev)]
    return (f"{lead}: scaled_dot's final max |logit|{grid} is {'; '.join(parts)}. 1/√d_k fixes "
            f"the logits' size at init only; under training they can grow with LR and model "
            f"size, as Wortsman et al. 2023 (arXiv 2309.14322) and Dehghani et al. 2023 (arXiv "
            f"2302.05442) saw, which is why QK-norm, logit soft-capping and QK-Clip exist.")


def judge(ev: Evidence) -> Verdict:
    """C12: scaled_dot's row spread at init (both regimes), and its saturation after training
    across widths at matched LRs (unit init decides)."""
    unit = ev.init_values(UNIT)
    cmp = width_family(ev, UNIT)
    verdict, init_ok, more = verdict_of(unit, cmp)
    plain = [f"At init, with unit-variance q and k, a row of q·k/√d_k logits has std "
             f"{span(unit)} over every d_k and seed: "
             f"{'O(1), as the thread says' if init_ok else 'not O(1)'}."]
    small = ev.init_values(GPT2)
    if small:
        size = ("far below 1, set by the init rather than the division" if max(small) < 0.25
                else "of order one")
        plain.append(f"With GPT-2 init the model's own rows start at std {span(small)}: {size}.")
    plain += [x for x in (saturation_text(ev, UNIT), width_sentence(cmp, more),
                          saturation_text(ev, GPT2), growth_text(ev)) if x]
    words = {SUPPORTED: "O(1) at init; at every matched LR the wider model saturates no more",
             REFUTED: "not O(1) at init",
             INCONCLUSIVE: "not decided after training" if unit else "no data",
             DEPENDS: f"O(1) at init; after training the wider model saturates more at "
                      f"{len({k.rsplit(' ', 1)[0] for k in more})} of {len(ev.matched(UNIT))} "
                      f"matched LRs ({grouped(more, short=True)})"}
    w = ev.widths(UNIT)
    widths = f"widths {', '.join(str(width_of(x)) for x in w)}" if w else "no unit-init width"
    lrs = ", ".join(f"{float(x):g}" for x in ev.matched(UNIT)) or "none"
    return Verdict(verdict, RULE, f"init row σ per seed: unit {span(unit)}, gpt2 {span(small)}; "
                   f"wider − narrower at matched LRs: "
                   f"{'; '.join(f'{k}: {c.effect()}' for k, c in cmp.items()) or 'none'}",
                   {"width": cmp, "more": more, "table": table(ev)},
                   headline=f"{verdict}: {words[verdict]}", plain=plain,
                   regime=(f"unit-variance init decides, GPT-2 init is context; text LR sweep "
                           f"after {ev.steps} steps at {widths} (n = {ev.n}), compared at "
                           f"matched LRs ({lrs}); "
                           "it cannot show longer training or larger models"),
                   smallest="O(1) = within a factor 4 of 1; trained: 0.05 of the weight or of "
                            "the rows (one row in twenty)")


def width_sentence(cmp: Mapping[str, Comparison], more: list[str]) -> str | None:
    """How the matched-LR width comparisons read, in one sentence."""
    if not cmp:
        return ("After training the widths could not be compared at a matched LR (the sweep "
                "needs two widths run at the same LR).")
    if more:
        return (f"At a matched LR the wider model's attention saturates more, at "
                f"{grouped(more)}: " + "; ".join(f"{k}: {cmp[k].effect()}" for k in more)
                + ".")
    read = {k: c for k, c in cmp.items() if c.measurable()}
    if read and all(c.no_worse() for c in read.values()):
        big = max(read.items(), key=lambda kc: kc[1].mean)
        return (f"At every matched LR the wider model saturates no more than the narrower one "
                f"(largest difference {big[0]}: {big[1].effect()}).")
    if not any(c.measurable() for c in cmp.values()):
        return ("At every matched LR both widths saturate identically on every seed: not "
                "measurable, since no test reads differences that are all the same.")
    near = min((c for c in cmp.values() if c.seeds_to_decide), default=None,
               key=lambda c: c.seeds_to_decide or 0)
    more_seeds = f"; about {near.seeds_to_decide} seeds would decide the nearest" if near else ""
    return ("Whether the wider model saturates more at a matched LR is undecided: the "
            f"intervals still span ±{SAT_DELTA:g}{more_seeds}.")


def alt(ev: Mapping[str, Any], numbers: Mapping[str, Any]) -> str:
    """The step-0 row spread per regime, and the trained mean max weight and max |logit| at
    the largest LR both widths ran (unit init)."""
    spans = {}
    for regime, by_d in ev["init_std"].items():
        xs = [v for seeds in by_d.values() for v in seeds.values() if finite(v)]
        if xs:
            spans[regime] = f"{min(xs):.2g}–{max(xs):.2g}"
    first = ("At init a row of scaled_dot's logits has std " + ", ".join(
        f"{s} with {r} init" for r, s in spans.items()) + ".") if spans else ""
    tab = numbers.get("table", {}).get(UNIT, {})
    widths = sorted(tab, key=width_of)
    shared = sorted(set.intersection(*(set(tab[w]) for w in widths)), key=float) if widths \
        else []
    if not shared:
        return first or "No scaled_dot logit was measured."
    lr = shared[-1]
    parts = [f"width {width_of(w)} {tab[w][lr]['max_weight']:.2f} (max |logit| "
             f"{tab[w][lr]['max_abs_logit']:.3g})" for w in widths]
    return (first + f" After training at lr {float(lr):g} (unit init) the mean max attention "
            f"weight is {', '.join(parts)}.").strip()


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


def lr_panel(ax: plt.Axes, tab: Mapping[str, Any], stat: str, ylabel: str) -> None:
    """One trained measure against LR: a line per (init, width), unit init solid, GPT-2
    dashed, one colour per width."""
    widths = sorted({w for by_w in tab.values() for w in by_w}, key=width_of)
    for init, by_w in tab.items():
        for w, by_lr in sorted(by_w.items(), key=lambda kv: width_of(kv[0])):
            pts = [(float(lr), v[stat]) for lr, v in by_lr.items() if finite(v[stat])]
            if pts:
                ax.plot(*zip(*sorted(pts), strict=True), marker="o", ms=4,
                        color=f"C{widths.index(w) + 2}", ls="-" if init == UNIT else "--",
                        label=f"width {width_of(w)}, {init} init")
    ax.set(xscale="log", xlabel="peak LR", ylabel=ylabel)


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """scaled_dot's row std at init per regime; after training, its mean max attention
    weight and its max |logit| against the LR per width and init regime."""
    at_init = [v for by_d in ev["init_std"].values() for seeds in by_d.values()
               for v in seeds.values() if finite(v)]
    tab = numbers.get("table") or {}
    if not at_init and not any(tab.values()):
        raise ValueError("ev: no scaled_dot logit was measured")
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4.2))
    if at_init:
        init_panel(a, ev["init_std"])
    lr_panel(b, tab, "max_weight", "final mean max attention weight")
    b.axhline(0.9, color="C3", ls=":", lw=0.9, label="0.9: a saturated row")
    b.set(ylim=(0, 1.02), title="after training: saturation")
    lr_panel(c, tab, "max_abs_logit", "final max |logit|")
    c.set(yscale="log", title="after training: logit size")
    for ax in (a, b, c):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=8,
                      frameon=False)
    fig.suptitle(f"C12: scaled_dot's logits at init and after training, char-level text "
                 f"(n = {ev['n']} keys)", fontsize=11)
    return [save(fig, folder, "c12_saturation", alt(ev, numbers))]


def final_stat(run: Run, name: str) -> float:
    """The largest over layers of ``name`` at the run's last logged step; :data:`BLOWN` for a
    run that diverged or a layer that logged None (its logits blew up);
    :class:`MissingEvidence` naming the run when it logged no such statistic."""
    if run.status == "diverged":
        return BLOWN[name]
    history = run.history
    layers = (history[-1].get("layers") or []) if history else []
    if not layers or any(name not in x for x in layers):
        raise MissingEvidence(f"run {run.id} logged no {name!r} (stored before it was "
                              "logged: train again into a new results database)")
    values = [x[name] for x in layers]
    return BLOWN[name] if any(v is None for v in values) else float(max(values))


def trained_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """init -> width label -> :class:`Trained` as a dict: scaled_dot's reported seeds at every
    LR; a cell without an init axis counts as GPT-2 init."""
    out: dict[str, Any] = {}
    done = analysis.finished(runs)
    for cell in cells(study):
        mine = [r for r in done if in_cell(r, cell, "scaled_dot")
                and r.seed in study.seeds]
        if not mine:
            continue
        axes = dict(cell)
        init = str(axes.pop("init", GPT2))
        row: dict[str, ByLR] = {name: {} for name in BLOWN}
        for r in mine:
            lr, seed = str(r.lr), str(r.seed)
            for name in BLOWN:
                row[name].setdefault(lr, {})[seed] = final_stat(r, name)
        out.setdefault(init, {})[cell_label(tuple(axes.items()))] = row
    return out


def gather(src: Sources) -> dict[str, Any]:
    """scaled_dot's step-0 row std (layer 1) per init regime and d_k from the head-dimension
    study; its final saturation and max |logit| per init, width, LR and seed from the text LR
    study (:func:`trained_evidence`), and that study's length and steps."""
    init: dict[str, dict[str, BySeed]] = {}
    for label, arm in row_spread_evidence(src.studies["head_dim"], src.runs["head_dim"], 0,
                                          "row_logit_std", layer=0).items():
        fields = dict(part.split("=") for part in label.split())
        init.setdefault(fields["init"], {})[fields["d_model"]] = dict(arm["values"])
    text = src.studies["lr_text"]
    return {"init_std": init, "trained": src.study("lr_text", trained_evidence),
            "n": text.base["seq_len"], "steps": text.base["steps"]}


CLAIM = register(Claim(
    id="C12", text="Dividing by √d_k keeps logits O(1): no saturation, gradients flow.",
    measures="a row of logits' spread at init; after training, attention saturation across "
             "widths at matched LRs, and the max |logit| per width and LR",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("head_dim", "lr_text")))
