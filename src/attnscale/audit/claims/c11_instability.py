"""C11: "Training is unstable without scaling, especially for larger models" (the thread; the
attention-logit growth behind it is Wortsman et al. 2023, arXiv 2309.14322, and Dehghani et al.
2023, arXiv 2302.05442).

Read from the text LR sweep at two widths; the unit-variance init cells decide (Vaswani et al.'s
regime), the GPT-2 init cells are context. Per width, paired per-seed differences dot −
scaled_dot of LR sensitivity (mean clipped loss over the grid above a reference shared by both
arms) and, where some run of either arm was unstable, of the unstable fraction of the grid (a
divergence, or a loss that blew up and stayed up); and the growth of the sensitivity excess from
the smaller to the larger width. Holm over the per-width comparisons (read through "or" and
"somewhere"); the growth, only ever read through "and", alone. Where no run was unstable the
instability half reads "not observed at this scale": there is nothing to test, and no number of
seeds would change that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D

from attnscale.audit.claim import Claim, Figure, Says, Sources, register
from attnscale.audit.compare import Pair, family
from attnscale.audit.deep_readings import (
    Unstable,
    unstable_evidence,
    unstable_pairs,
    unstable_sentence,
)
from attnscale.audit.evidence import Arm, LRText, SweepArm, lr_text_evidence
from attnscale.audit.figure_text import finite, n_seeds, sci
from attnscale.audit.figures import fig_forest
from attnscale.audit.interval import Comparison
from attnscale.audit.readings import text_evidence
from attnscale.audit.sweep_readings import SweepKey, divergence_counts, grid_of, sweep_arm
from attnscale.audit.theory_plots import below, save
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    REFUTED,
    SUPPORTED,
    Verdict,
)

UNIT, GPT2 = "unit", "gpt2"  # the deciding init regime, and the context one
LITERATURE = ("Wortsman et al. 2023 (arXiv 2309.14322) saw attention-logit growth make small "
              "Transformers (roughly 10M to 1B parameters) unstable at high learning rates, "
              "and Dehghani et al. 2023 (arXiv 2302.05442) saw it diverge ViT-22B (22 billion "
              "parameters)")
RULE = ("LR sweep at two widths; the unit-variance init cells decide, GPT-2 init is context. "
        "Per width, paired per-seed differences dot − scaled_dot of LR sensitivity (mean "
        "clipped loss over the grid above a reference shared by both arms; smallest effect "
        "0.02 nats) and, where some run of either arm at that width was unstable, of the "
        "unstable fraction of the grid (divergence, or a loss that blew up and stayed up; "
        "smallest effect 0.6/|grid|: one more unstable LR is real); where none was, "
        "instability is 'not observed at this scale' and is not a comparison; and the growth "
        "of the sensitivity excess from the smaller to the larger width. Supported if dot is "
        "more unstable at the larger width AND the sensitivity excess grows with width (the "
        "claim is about instability: more LR sensitivity without a single unstable run is "
        "not it); refuted if dot is no worse (non-inferior within δ) on every measure read, "
        "at every width; depends if dot is worse somewhere otherwise (e.g. more LR-sensitive, "
        "and more so when wider, but never unstable); inconclusive otherwise. Holm over the "
        "per-width comparisons (the rule reads them "
        "through 'or' and 'somewhere'); the growth, only ever read through 'and', alone. "
        "With --deep, the instability study (1,000 steps, widths 64 and 256, high LRs, with "
        "and without the gradient clip) adds its dot − scaled_dot unstable shares where some "
        "run was unstable, read as the larger width's")



class Evidence(LRText):
    """The text LR study (:func:`attnscale.audit.evidence.lr_text_evidence`) and, in the deep
    preset, its instability study (:func:`attnscale.audit.deep_readings.unstable_evidence`)."""

    unstable: Unstable | None = None


def parts(label: str) -> dict[str, str]:
    """A cell label's fields: "init=unit d_model=32" -> {"init": "unit", "d_model": "32"}; a
    label without an init counts as GPT-2 init (the study before it had two)."""
    out = dict(x.split("=", 1) for x in label.split())
    out.setdefault("init", GPT2)
    return out


def labels(ev: LRText | Mapping[str, Any], init: str) -> list[str]:
    """The sweep's cell labels in init regime ``init``, narrowest width first."""
    sweep = ev.sweep if isinstance(ev, LRText) else ev["sweep"]
    mine = [w for w in sweep if parts(w)["init"] == init]
    return sorted(mine, key=lambda w: int(parts(w).get("d_model", 0)))


def width(label: str) -> str:
    """"width 128 (unit init)" for a cell label."""
    p = parts(label)
    return f"width {p.get('d_model', '?')} ({p['init']} init)"


def excess(ev: LRText, small: str, large: str, key: SweepKey, arm: str = "dot") -> Arm:
    """Per-seed ``arm`` − scaled_dot difference of ``key`` at cell ``large`` minus at cell
    ``small``, (a_L − s_L) − (a_S − s_S): does the excess grow with width?"""
    lo, hi = ev.sweep[small], ev.sweep[large]
    if arm not in lo or arm not in hi:
        return Arm(values={})
    a_s, a_l = getattr(lo[arm], key), getattr(hi[arm], key)
    s_s, s_l = getattr(lo["scaled_dot"], key), getattr(hi["scaled_dot"], key)
    seeds = sorted(set(a_s) & set(a_l) & set(s_s) & set(s_l))
    return Arm(values={s: (a_l[s] - s_l[s]) - (a_s[s] - s_s[s]) for s in seeds})


def unstable_delta(ev: LRText) -> float:
    """The smallest real difference of unstable fractions: 0.6/|grid|, under one LR (0.1 for
    a six-point grid, and for an empty one)."""
    return 0.6 / max(1, len(ev.lrs or range(6)))


def unstable_runs(arms: list[SweepArm]) -> int:
    """How many runs of ``arms`` were unstable (each seed's unstable share × its runs)."""
    return sum(round(sum(a.unstable.values()) / len(a.unstable) * a.n_runs)
               for a in arms if a.unstable)


def observed(ev: LRText, label: str) -> bool:
    """Some run of dot or scaled_dot in cell ``label`` was unstable."""
    row = ev.sweep[label]
    return unstable_runs([row[a] for a in ("dot", "scaled_dot") if a in row]) > 0


def c11_family(ev: LRText, init: str) -> dict[str, Comparison]:
    """Sensitivity comparisons per width and instability ones where it was observed (one Holm
    family), and the growth of the excess against zero (alone), in init regime ``init``."""
    cells = labels(ev, init)
    pairs: dict[str, Pair] = {}
    deltas: dict[str, float] = {}
    for w in cells:
        reads: list[tuple[SweepKey, float]] = [("sensitivity", LOSS_DELTA)]
        reads += [("unstable", unstable_delta(ev))] if observed(ev, w) else []
        for key, delta in reads:
            pairs[f"{w} {key}"] = (sweep_arm(ev, w, "dot", key),
                                   sweep_arm(ev, w, "scaled_dot", key))
            deltas[f"{w} {key}"] = delta
    if isinstance(ev, Evidence) and ev.unstable is not None and init == UNIT:
        deep = unstable_pairs(ev.unstable)  # read through "or", like the per-width ones
        pairs.update(deep)
        deltas.update(dict.fromkeys(deep, 0.6 / len(ev.unstable.lrs)))
    grow = excess(ev, cells[0], cells[-1], "sensitivity") if len(cells) > 1 else Arm(values={})
    pairs["growth"] = (grow, Arm(values=dict.fromkeys(grow.values, 0.0)))
    deltas["growth"] = LOSS_DELTA
    return family(pairs, deltas, holm_over=[[k for k in pairs if k != "growth"]])


def verdict_of(comps: Mapping[str, Comparison], largest: str) -> str:
    """Supported, refuted, depends or inconclusive, as :data:`RULE` says."""
    large = [c for k, c in comps.items() if k.startswith((largest + " ", "deep "))]
    per_width = [c for k, c in comps.items() if k != "growth"]
    growth = comps["growth"]
    # the claim is about instability: LR sensitivity alone, however it grows, is not it
    unstable = [c for k, c in comps.items() if "unstable" in k and c in large]
    if any(c.greater() for c in unstable) and growth.greater():
        return SUPPORTED
    if per_width and all(c.no_worse() for c in per_width):
        return REFUTED
    if any(c.greater() for c in per_width):
        return DEPENDS
    return INCONCLUSIVE


def instability_text(ev: LRText, comps: Mapping[str, Comparison]) -> str:
    """The instability half: not observed at this scale, or its comparisons where it was."""
    arms = [a for row in ev.sweep.values() for a in row.values()]
    runs, bad = sum(a.n_runs for a in arms), unstable_runs(arms)
    widths = ", ".join(sorted({parts(w).get("d_model", "?") for w in ev.sweep}, key=int))
    deep = unstable_sentence(ev.unstable) if isinstance(ev, Evidence) else ""
    if not bad:
        return (f"Instability is not observed at this scale: no run of any arm at any LR was "
                f"unstable (0 of {runs}: none diverged, none blew up and stayed up; widths "
                f"{widths}, {ev.n} tokens). {deep} {LITERATURE}.")
    read = [f"{width(k[:-len(' unstable')])} {c.effect('of the grid')}"
            for k, c in comps.items() if k.endswith(" unstable")]
    where = "; ".join(read) if read else "none in the deciding cells"
    return (f"{bad} of {runs} runs were unstable; dot − scaled_dot unstable share of the LR "
            f"grid: {where}. {deep} {LITERATURE}.")


def regime_of(ev: LRText) -> str:
    """The regime line: which init decides, the widths, and what the sweep cannot show."""
    counts = divergence_counts(ev)
    arms = [a for row in ev.sweep.values() for a in row.values()]
    widths = ", ".join(sorted({parts(w).get("d_model", "?") for w in ev.sweep}, key=int))
    line = (f"unit-variance q, k at init decides, GPT-2 init (weights std 0.02) is context; "
            f"character-level text, widths {widths}; {counts['diverged']} of {counts['runs']} "
            f"runs diverged, {unstable_runs(arms)} unstable")
    if not unstable_runs(arms):
        line += (", so this sweep shows logit growth and LR sensitivity, not instability, and "
                 "says nothing of the model sizes where Wortsman et al. and Dehghani et al. "
                 "saw it")
    return line


def peaks_text(ev: LRText, cells: list[str]) -> str:
    """Unscaled attention's largest mean peak max |logit| per cell, and the counts past 1e4."""
    peaks = {}
    for w in cells:
        dot = ev.sweep[w].get("dot")
        peaks[w] = max((v for v in (dot.peak_logit_by_lr if dot else {}).values()
                        if v is not None), default=math.nan)
    counts = divergence_counts(ev)
    reach = ", ".join(f"{v:.3g} at {width(w)}" for w, v in peaks.items())
    return (f"Its largest logits reach {reach}; {counts['past']} of {counts['runs']} runs "
            f"passed 1e4, the growth Wortsman et al. saw before divergence, and "
            f"{counts['diverged']} diverged.")


def context_text(ev: LRText) -> str | None:
    """GPT-2 init's sensitivity comparisons, as context (never part of the verdict)."""
    if not labels(ev, GPT2) or not labels(ev, UNIT):
        return None
    comps = c11_family(ev, GPT2)
    sens = [f"{width(k[:-len(' sensitivity')])} {c.effect('nats')}"
            for k, c in comps.items() if k.endswith(" sensitivity")]
    return (f"Context, GPT-2 init{grid_of(ev, GPT2)}: dot − scaled_dot LR sensitivity "
            f"{'; '.join(sens)}.")


def judge(ev: LRText) -> Verdict:
    """C11: LR sensitivity (and instability, where observed) of unscaled against scaled in the
    unit-init cells, and its growth with width."""
    cells = labels(ev, UNIT)
    if not cells:
        return Verdict(INCONCLUSIVE, RULE, "no unit-init LR sweep was run", regime=regime_of(ev))
    comps = c11_family(ev, UNIT)
    verdict = verdict_of(comps, cells[-1])
    sens = comps[f"{cells[-1]} sensitivity"]
    plain = [
        f"At {width(cells[-1])} unscaled attention's LR sensitivity differs from scaled by "
        f"{sens.mean:+.3f} nats (its mean loss over the grid, against a shared reference; "
        f"{sens.reading}); growth with width: {comps['growth'].effect('nats')}.",
        instability_text(ev, comps), peaks_text(ev, cells),
        "The sensitivity answer depends on the LR range one is willing to tune over."]
    context = context_text(ev)
    plain += [context] if context else []
    grid = ", ".join(f"{x:g}" for x in ev.lrs)
    return Verdict(verdict, RULE.replace("LR sweep", f"LR sweep ({grid})", 1),
                   "; ".join(f"{k}: {c.effect()}" for k, c in comps.items()), comps,
                   headline=f"{verdict}: {width(cells[-1])} sensitivity {sens.mean:+.3f} nats",
                   plain=plain, regime=regime_of(ev),
                   smallest=f"{LOSS_WHY}; instability: {unstable_delta(ev):.2g} of the grid, "
                   "so one more unstable LR counts")


def shown(ev: Mapping[str, Any]) -> list[str]:
    """The cells the figures show: unit init first, then GPT-2, narrowest width first."""
    return [*labels(ev, UNIT), *labels(ev, GPT2)]


def alt(ev: Mapping[str, Any]) -> str:
    """Per arm at the largest width of the deciding init, the first LR whose mean peak logit
    passes 1e4."""
    cell = (labels(ev, UNIT) or labels(ev, GPT2))[-1]
    limit = ev["logit_limit"]
    found = []
    for arm in ("dot", "scaled_dot", "qk_layernorm"):
        peaks = {float(lr): v for lr, v in ev["sweep"][cell].get(arm, {})
                 .get("peak_logit_by_lr", {}).items() if finite(v)}
        if not peaks:
            continue
        past = [lr for lr, v in sorted(peaks.items()) if v > limit]
        found.append(f"{arm} from LR {past[0]:g}" if past else
                     f"{arm} at no LR (largest {sci(max(peaks.values()))})")
    if not found:
        raise ValueError("ev: no peak logits at the largest width")
    return (f"At {width(cell)} the mean peak max |logit| passes Wortsman et al.'s {sci(limit)} "
            f"instability marker for {', '.join(found)}; larger LRs give larger logits in "
            f"every arm.")


def fig_logits(ev: Mapping[str, Any], folder: Path) -> Figure:
    """Max |logit| against step, one panel per (cell, arm): unscaled, scaled and QK-LayerNorm
    (Wortsman et al. 2023's attention-logit growth, and its remedy), unit init's cells first;
    one colour per LR from one sequential colormap, one colorbar for every panel."""
    cells = shown(ev)
    arms = [a for a in ("dot", "scaled_dot", "qk_layernorm") if a in ev["sweep"][cells[0]]]
    lrs = sorted(float(x) for x in ev["lrs"])
    norm = LogNorm(lrs[0], lrs[-1] * (1.0001 if len(lrs) == 1 else 1))  # one LR: vmin < vmax
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(len(cells), len(arms), figsize=(3.5 * len(arms) + 1.2,
                             2.4 * len(cells) + 0.9), sharex=True, sharey=True, squeeze=False,
                             layout="constrained")
    for (r, w), (col, arm) in ((x, y) for x in enumerate(cells) for y in enumerate(arms)):
        ax = axes[r, col]
        for lr, curve in ev["sweep"][w].get(arm, {}).get("logit_curves", {}).items():
            pts = [(s, v) for s, v in curve if finite(v) and v > 0]
            if pts:
                ax.plot(*zip(*pts, strict=True), color=cmap(norm(float(lr))), lw=1.4)
        ax.axhline(ev["logit_limit"], color="C3", ls="--", lw=0.9)
        ax.set_yscale("log")
        ax.set_title(f"{arm}, {width(w)}", fontsize=9)
        if r == len(cells) - 1:
            ax.set_xlabel("step")
        if col == 0:
            ax.set_ylabel("max |logit|")
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="peak LR")
    bar.set_ticks(lrs, labels=[f"{x:g}" for x in lrs])
    bar.minorticks_off()
    fig.suptitle("C11: max |logit| during training, char-level text, first seed at each LR",
                 fontsize=11)
    below(fig, [Line2D([], [], color="C3", ls="--", label=f"{sci(ev['logit_limit'])}: "
                       "Wortsman et al. 2023's instability marker")], ncol=1)
    return save(fig, folder, "c11_max_logit", alt(ev))


def sweep_unit(key: str) -> str:
    """C11's comparisons: LR sensitivity (and its growth) in nats, instability as a share."""
    return "share of LR grid" if key.endswith("unstable") else "nats"


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """Max |logit| against step per width and arm, and the forest plot of the rule's
    comparisons (sensitivity in nats, instability as a share of the grid)."""
    title = (f"C11: dot − scaled_dot, LR sweep, {n_seeds(numbers)} seeds, mean and 95% CI")
    return [fig_logits(ev, folder),
            fig_forest(dict(numbers), folder, "c11_effects", title, sweep_unit,
                       "Unscaled minus scaled LR sensitivity and instability")]


def gather(src: Sources) -> dict[str, Any]:
    """The text LR study's evidence (:func:`attnscale.audit.evidence.lr_text_evidence`) and the
    deep instability study's (None outside ``--deep``)."""
    return {**text_evidence(src.study("lr_text", lr_text_evidence),
                            src.study("lr_text_gpt2", lr_text_evidence)),
            "unstable": src.study("unstable", unstable_evidence)}


def _peak(ev: dict[str, Any], cell: str, arm: str) -> tuple[float, float] | None:
    """(LR, mean peak max |logit|) at the largest LR where ``arm`` logged logits."""
    peaks = ev["sweep"].get(cell, {}).get(arm, {}).get("peak_logit_by_lr", {})
    pts = [(float(lr), v) for lr, v in peaks.items() if v is not None and math.isfinite(v)]
    return max(pts) if pts else None


def says_when(e: dict[str, Any]) -> list[str]:
    """QK-norm when logits grow: the peak max |logit| of scaled dot and QK-LayerNorm at the
    largest width (unit init where the sweep has it), and whether any run was unstable."""
    ev = e["evidence"]
    cells = labels(ev, UNIT) or labels(ev, GPT2)
    if not cells:
        return []
    cell = cells[-1]
    sd, qk = _peak(ev, cell, "scaled_dot"), _peak(ev, cell, "qk_layernorm")
    if not (sd and qk):
        return []
    arms = [a for row in ev["sweep"].values() for a in row.values()]
    diverged = sum(a.get("n_diverged", 0) for a in arms)
    bad = sum(round(sum(a["unstable"].values()) / len(a["unstable"]) * a.get("n_runs", 0))
              for a in arms if a.get("unstable"))
    here = (f"here {diverged} runs diverged" if diverged else
            "here no run of the sweep diverged" + (f" ({bad} blew up and stayed up)" if bad
                                                   else " or was unstable"))
    unseen = (", so instability is not observed at this scale (they saw it in small "
              "Transformers, roughly 10M to 1B parameters, at high learning rates, and Dehghani "
              "et al. 2023 in ViT-22B)" if not diverged and not bad else "")
    return [f"QK-norm, when logits grow during training: at {width(cell)} and the largest LRs "
            f"scaled dot's max |logit| reached {sd[1]:.3g} (lr {sd[0]:g}), QK-LayerNorm's "
            f"{qk[1]:.3g} (lr {qk[0]:g}) (C11). Wortsman et al. 2023 saw divergence in longer "
            f"runs once it passes about 1e4; {here}{unseen}."]


CLAIM = register(Claim(
    id="C11", text="Training is unstable without scaling, especially for larger models.",
    measures="LR sweeps at two widths in two init regimes: LR sensitivity, instability where "
             "observed, max |logit|",
    rule=RULE, evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("lr_text", "lr_text_gpt2", "unstable"),
    says=(Says("when", says_when, rank=10),)))
