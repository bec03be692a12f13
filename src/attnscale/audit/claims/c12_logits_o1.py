"""C12: "Dividing by √d_k keeps logits O(1): no saturation, gradients flow" (the thread, after
Vaswani et al. 2017, arXiv 1706.03762, §3.2.1 footnote 4: q·k has variance d_k for unit-variance
components, so q·k/√d_k has variance 1).

Read at step 0 from the head-dimension study (scaled_dot's layer-1 logit std in the model
itself, every seed, both init regimes; O(1) means between 0.25 and 4) and after training from
the text LR sweep (scaled_dot's final max |logit| for every seed at every LR and width, against
4·s_c(n), s_c = √(2 ln n) the scale at which the softmax over n keys saturates; a diverged run
is +inf, past any limit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from attnscale.audit.claim import Claim, Figure, Sources, register
from attnscale.audit.evidence import Model, head_dim_evidence, init_logit_std, lr_text_evidence
from attnscale.audit.figure_text import arm_ci, finite, sci
from attnscale.audit.theory_plots import BAND, log_ticks, save, yerr
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict

RULE = ("Step 0: scaled_dot's logit std measured in the model itself (layer 1), every seed, "
        "in each init regime; O(1) means between 0.25 and 4. After training: scaled_dot's "
        "final max |logit| for every seed at EVERY LR of the sweep, against 4·s_c(n) (s_c = "
        "√(2 ln n), where softmax saturates); a diverged run counts as past it. An LR is "
        "'past' if any seed passes 4·s_c, 'below' if every seed stays under it. Supported "
        "if every unit-variance seed is O(1) at init and every LR is below; depends if init "
        "is O(1) but some LR is past; refuted if some unit-variance seed is not O(1) at "
        "init; inconclusive without data. Every seed is checked, so no mean can hide one")

BySeed = dict[str, float]  # seed -> value


class Evidence(Model):
    """scaled_dot's logits: ``init_std`` regime -> d_k -> seed -> step-0 logit std (layer 1,
    :func:`attnscale.audit.evidence.init_logit_std`); ``final_logit`` width -> LR -> seed ->
    final max |logit| (+inf when the run diverged); ``n`` the text study's sequence length."""

    init_std: dict[str, dict[str, BySeed]]
    final_logit: dict[str, dict[str, BySeed]]
    n: int

    def init_values(self, regime: str) -> list[float]:
        """Every seed's step-0 logit std in ``regime``, over every d_k."""
        return [v for by_seed in self.init_std.get(regime, {}).values()
                for v in by_seed.values()]

    def trained(self) -> dict[float, list[float]]:
        """LR -> every seed's final max |logit| at that LR, over every width."""
        out: dict[float, list[float]] = {}
        for by_lr in self.final_logit.values():
            for lr, by_seed in by_lr.items():
                out.setdefault(float(lr), []).extend(by_seed.values())
        return out


def limit_of(n: int) -> float:
    """4·s_c(n), s_c = √(2 ln n): the Gaussian maximum's scale over n logits."""
    return 4 * math.sqrt(2 * math.log(n))


def span(xs: list[float]) -> str:
    """``min–max`` to 3 significant digits, or "n/a"."""
    return f"{min(xs):.3g}–{max(xs):.3g}" if xs else "n/a"


def judge(ev: Evidence) -> Verdict:
    """C12: scaled_dot's logit size at init (both regimes) and after training at every LR."""
    unit = ev.init_values("unit")
    limit = limit_of(ev.n)
    trained = ev.trained()
    past = sorted(lr for lr, xs in trained.items() if any(x > limit for x in xs))
    init_ok = bool(unit) and all(0.25 <= v <= 4 for v in unit)
    if not unit or not trained:
        verdict = INCONCLUSIVE
    elif not init_ok:
        verdict = REFUTED
    else:
        verdict = DEPENDS if past else SUPPORTED
    plain = [f"At init, with unit-variance q and k, q·k/√d_k has std {span(unit)} over every "
             f"d_k and seed: {'O(1), as the thread says' if init_ok else 'not O(1)'}."]
    small = ev.init_values("gpt2")
    if small:
        size = ("far below 1, set by the init rather than the division" if max(small) < 0.25
                else "of order one")
        plain.append(f"With GPT-2 init the model's own logits start at std {span(small)}: "
                     f"{size}.")
    worst = max((max(xs) for xs in trained.values()), default=math.nan)
    below = sorted(set(trained) - set(past))
    plain.append(f"After training, the largest final logit is {worst:.3g} against 4·s_c = "
                 f"{limit:.1f}: below it at LR {', '.join(f'{x:g}' for x in below) or 'none'}, "
                 f"past it at LR {', '.join(f'{x:g}' for x in past) or 'none'}.")
    words = {SUPPORTED: "O(1) at init and after training", REFUTED: "not O(1) at init",
             INCONCLUSIVE: "no data", DEPENDS: f"O(1) at init; past 4·s_c after training at "
             f"LR ≥ {min(past) if past else 0:g}"}
    return Verdict(verdict, RULE, f"init logit std per seed: unit {span(unit)}, gpt2 "
                   f"{span(small)}; trained max |logit| by LR (largest seed) "
                   f"{ {f'{k:g}': round(max(v), 2) for k, v in sorted(trained.items())} } "
                   f"(limit {limit:.1f})", {"past": past, "limit": limit},
                   headline=f"{verdict}: {words[verdict]}", plain=plain,
                   regime="both init regimes; text LR sweep",
                   smallest="O(1) = within a factor 4 of 1; saturation from 4·s_c(n)")


def alt(ev: Mapping[str, Any], numbers: Mapping[str, Any]) -> str:
    """The step-0 logit std per regime, and which LRs end past 4·s_c."""
    spans = {}
    for regime, by_d in ev["init_std"].items():
        xs = [v for seeds in by_d.values() for v in seeds.values() if finite(v)]
        if xs:
            spans[regime] = f"{min(xs):.2g}–{max(xs):.2g}"
    first = ("At init scaled_dot's logit std is " + ", ".join(
        f"{s} with {r} init" for r, s in spans.items()) + ".") if spans else ""
    trained = [(float(lr), x) for by_lr in ev["final_logit"].values()
               for lr, seeds in by_lr.items() for x in seeds.values()]
    if not trained:
        return first or "No scaled_dot logit was measured."
    limit = numbers.get("limit", limit_of(ev["n"]))
    past = numbers.get("past") or sorted({lr for lr, x in trained if x > limit})
    worst = max(x for _, x in trained)
    second = (f" After training the largest final max |logit| is {sci(worst)} against "
              f"4·s_c = {limit:.1f}; " + (f"seeds pass it from LR {min(past):g}." if past else
                                         "no LR passes it."))
    return first + second


def init_panel(ax: plt.Axes, init_std: Mapping[str, Any]) -> None:
    """The left panel: scaled_dot's step-0 logit std against d_k per regime (95% CI)."""
    for i, (regime, by_d) in enumerate(init_std.items()):
        ds = sorted(by_d, key=int)
        cs = [arm_ci({"values": by_d[d]}) for d in ds]
        ax.errorbar([int(d) for d in ds], [c["mean"] for c in cs], yerr=yerr(cs), marker="o",
                    capsize=3, color=f"C{i}", label=f"{regime} init, 95% CI")
    ax.axhspan(0.25, 4, color=BAND, zorder=0, label="O(1): 0.25 to 4")
    ax.set(yscale="log", ylabel="logit std at step 0", title="at init (layer 1)")
    log_ticks(ax, sorted({int(d) for by_d in init_std.values() for d in by_d}))
    ax.set_xlabel("$d_k$")


def trained_panel(b: plt.Axes, ev: Mapping[str, Any], limit: float) -> None:
    """The right panel: final max |logit| per seed against LR per width, with 4·s_c(n); a
    diverged run is drawn at the top as ▲."""
    finite_all = [x for by_lr in ev["final_logit"].values() for s in by_lr.values()
                  for x in s.values() if finite(x)]
    top = 3 * max(finite_all, default=limit)
    for i, (w, by_lr) in enumerate(ev["final_logit"].items()):
        shift = 1 + 0.12 * (i - (len(ev["final_logit"]) - 1) / 2)
        pts = [(float(lr) * shift, x) for lr, seeds in by_lr.items() for x in seeds.values()]
        ok = [(p, x) for p, x in pts if finite(x)]
        if ok:
            b.scatter(*zip(*ok, strict=True), s=14, color=f"C{i}", alpha=0.8,
                      label=f"{w.replace('d_model=', 'width ')}, each seed")
        bad = [p for p, x in pts if not finite(x)]
        if bad:
            b.scatter(bad, [top] * len(bad), marker="^", color=f"C{i}", label="diverged")
    b.axhline(limit, color="C3", ls="--", label=rf"$4\,s_c(n)=4\sqrt{{2\ln {ev['n']}}}$"
              f" = {limit:.1f}")
    lrs = sorted({float(lr) for by_lr in ev["final_logit"].values() for lr in by_lr})
    if lrs:
        log_ticks(b, lrs)
    b.set(yscale="log", xlabel="peak LR", ylabel="final max |logit|", title="after training")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """scaled_dot's logit std at init per regime, and its final max |logit| per seed against
    LR per width, with 4·s_c(n); a diverged run is drawn at the top as ▲."""
    at_init = [v for by_d in ev["init_std"].values() for seeds in by_d.values()
               for v in seeds.values() if finite(v)]
    if not at_init and not any(ev["final_logit"].values()):
        raise ValueError("ev: no scaled_dot logit was measured")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 4.1))
    if at_init:
        init_panel(a, ev["init_std"])
    trained_panel(b, ev, numbers.get("limit", limit_of(ev["n"])))
    for ax in (a, b):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=8,
                  frameon=False)
    fig.suptitle(f"C12: scaled_dot's logits, char-level text (n = {ev['n']} keys)",
                 fontsize=11)
    return [save(fig, folder, "c12_trained_logits", alt(ev, numbers))]


def gather(src: Sources) -> dict[str, Any]:
    """scaled_dot's step-0 logit std from the head-dimension study, its final max |logit| per
    width, LR and seed from the text LR study, and that study's sequence length."""
    dk = src.study("head_dim", head_dim_evidence)
    text = src.study("lr_text", lr_text_evidence)
    final_logit = {w: a.get("scaled_dot", {}).get("final_logit_by_lr", {})
                   for w, a in text["sweep"].items()}
    return {"init_std": init_logit_std(dk), "final_logit": final_logit, "n": text["n"]}


CLAIM = register(Claim(
    id="C12", text="Dividing by √d_k keeps logits O(1): no saturation, gradients flow.",
    measures="the model's logit std at init; trained max |logit| at every LR", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw,
    studies=("head_dim", "lr_text")))
