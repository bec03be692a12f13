"""C7: "Dropping the scaling would also keep magnitude information; why a constant √d_k?"
(the thread's follow-up question to Vaswani et al. 2017, arXiv 1706.03762, §3.2.1).

Decided from an exact identity and one training comparison. With c = d_k^(−1/4), unscaled
attention whose q and k projections have init × c, Adam LR × c, Adam ε ÷ c and a gradient clip
that reads the scaled model's norm IS scaled attention, step for step
(:func:`attnscale.lab.identity.absorbed_identity`, checked in float64); the question left is
whether the LR grid alone absorbs the constant: plain dot at its own tuned LR against scaled.

Read the other way, the identity says what the scale is: a per-layer learning rate and init for
W_q and W_k. Dropping 1/√d_k is keeping it with W_q's and W_k's init and Adam LR × d_k^(1/4)
(Adam's ε ÷ d_k^(1/4), the clip matched), √d_k on the logits; the sentences print that factor at
every d_k of the study (:func:`per_layer_lr`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from attnscale.audit import figure_text as T
from attnscale.audit.claim import Claim, Figure, Measurement, Says, Sources, register
from attnscale.audit.compare import family
from attnscale.audit.evidence import HeadDim, Model, head_dim_evidence
from attnscale.audit.figures import fig_head_dim
from attnscale.audit.readings import REGIMES, UNIT, gap_pairs, gap_text, gaps
from attnscale.audit.studies import TEXT, Preset
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    LOSS_DELTA,
    LOSS_WHY,
    SUPPORTED,
    MissingEvidence,
    Verdict,
)

# nats: float64 rounding grown by 20 steps of training reaches ~2e-9 (d_k = 64); leaving Adam's
# ε and the clip uncorrected moves the loss by 1e-2 to 2e-1 in the same steps
IDENTITY_TOL = 1e-6

RULE = ("Head-dimension study, one head, d_model = d_k, unit-variance regime. First the "
        "identity: with c = d_k^(−1/4), unscaled attention whose q and k projections have "
        "init × c, Adam LR × c, Adam ε ÷ c and a gradient clip that reads the scaled "
        "model's norm IS scaled attention, step for step; checked in float64 over the first "
        "steps at every d_k (loss within 1e-6; a failure is a bug, never a verdict). So the "
        "constant can always be absorbed, and the question is whether the LR grid alone "
        "absorbs it: per d_k the paired difference of clipped eval loss dot − scaled_dot, "
        "each at the LR its tuning seeds chose. Supported if plain dot is no worse "
        "(non-inferior within δ) at every d_k; depends (absorbed only by the "
        "reparametrization) if it is worse at some d_k; inconclusive otherwise. Holm over "
        "the d_k (read through 'some'). Refuted would need the identity to fail")


class IdentityRun(Model):
    """One float64 run of the absorbed arm beside the scaled one (losses left out)."""

    steps: int
    d_k: int
    factor: float
    partial: bool
    max_loss_diff: float
    max_weight_rel_diff: float
    clipped_steps: int


class Identity(Model):
    """The identity at every d_k ("exact"), and uncorrected ε and clip at the largest
    ("partial", context)."""

    exact: list[IdentityRun]
    partial: list[IdentityRun] = Field(default_factory=list)


class Evidence(HeadDim):
    """The head-dimension study and the identity check."""

    identity: Identity


def measure(p: Preset) -> dict[str, Any]:
    """The absorbed-scale identity in float64 at every d_k of the head-dimension study (unit
    init, LR 1e-2, seed 0); "partial" (the largest d_k only: it is context) leaves Adam's ε
    and the clip uncorrected (:func:`attnscale.lab.identity.absorbed_identity`)."""
    from attnscale.lab.identity import absorbed_identity

    out: dict[str, Any] = {"exact": [], "partial": []}
    steps = p.identity_steps
    for d in p.head_dims:
        config = {**TEXT, "n_heads": 1, "d_model": d, "init": "unit", "lr": 1e-2, "seed": 0,
                  "steps": steps, "warmup_steps": 2}
        for kind in ("exact", "partial") if d == p.head_dims[-1] else ("exact",):
            r = absorbed_identity(config, steps, partial=kind == "partial")
            out[kind].append({k: v for k, v in r.items() if k != "losses"})
    return out


def check_identity(ev: Evidence) -> list[IdentityRun]:
    """The identity runs; ValueError (a bug) where one broke."""
    if not ev.identity.exact:
        raise MissingEvidence("C7: no identity check was measured (measurements 'identity')")
    for r in ev.identity.exact:
        if not r.max_loss_diff <= IDENTITY_TOL:
            raise ValueError(f"C7: the absorbed-scale identity broke at d_k={r.d_k}: losses "
                             f"differ by {r.max_loss_diff:.3g} over {r.steps} steps; "
                             "the reparametrization in attnscale.lab.build is wrong")
    return ev.identity.exact


def factors(dks: list[int]) -> str:
    """``× 2, 2.83 at d_k = 16, 64 (√d_k = 4, 8 on the logits)``: the per-matrix factor
    d_k^(1/4) and its square on the logits."""
    per = ", ".join(f"{d ** 0.25:.3g}" for d in dks)
    logit = ", ".join(f"{d ** 0.5:.3g}" for d in dks)
    return f"× {per} at d_k = {', '.join(map(str, dks))} (√d_k = {logit} on the logits)"


def per_layer_lr(dks: list[int]) -> str:
    """The identity read as what the scale is: a per-layer LR and init for W_q and W_k."""
    return (f"So the scale is a per-layer learning rate and init for W_q and W_k: dropping "
            f"1/√d_k is exactly keeping it with W_q's and W_k's init and Adam LR "
            f"{factors(dks)}, with Adam's ε ÷ d_k^(1/4) and the clip matched. What dropping it "
            f"changes is the effective LR and init of those two layers; whether one LR shared "
            f"by every layer absorbs that is what the study tests.")


def identity_text(runs: list[IdentityRun], partial: list[IdentityRun]) -> str:
    """How closely the identity held, and how far the uncorrected arms drift."""
    ident = (f"the identity held to {max(r.max_loss_diff for r in runs):.1g} nats over "
             f"{runs[0].steps} float64 steps at d_k = {', '.join(str(r.d_k) for r in runs)}, "
             f"clipping active in {sum(r.clipped_steps for r in runs)} of "
             f"{sum(r.steps for r in runs)}")
    drift = (f"; with the LR and init scaled but Adam's ε and the clip left alone the arms "
             f"already differ by {max(r.max_loss_diff for r in partial):.2g} nats after "
             f"{partial[0].steps} steps" if partial else "")
    return ident + drift


def judge(ev: Evidence) -> Verdict:
    """The exact reparametrization that absorbs 1/√d_k, and whether the LR alone does."""
    runs = check_identity(ev)
    comps = family(gap_pairs(ev, UNIT), LOSS_DELTA)
    worse = [d for d, c in comps.items() if c.greater()]
    fine = [c.no_worse() for c in comps.values()]
    verdict = SUPPORTED if fine and all(fine) else DEPENDS if worse else INCONCLUSIVE
    big = str(ev.head_dims[-1])
    d_ = comps[big]
    ident = identity_text(runs, ev.identity.partial)
    first = {
        SUPPORTED: f"Right: at its own tuned LR plain dot is no worse than scaled_dot at every "
                   f"d_k (at d_k={big}: {d_.mean:+.3f} nats).",
        DEPENDS: f"Partly right: the constant can be absorbed exactly, but by rescaling q and k "
                 f"(init and LR × d_k^(−1/4), Adam's ε ÷ d_k^(−1/4), the clip on the scaled "
                 f"norm), not by the LR alone: plain dot is worse at d_k = {', '.join(worse)} "
                 f"(at d_k={big}: {d_.mean:+.3f} nats).",
        INCONCLUSIVE: f"Undecided whether the LR alone absorbs it: the intervals are too wide "
                      f"(at d_k={big}: {d_.mean:+.3f} nats, {d_.reading}).",
    }[verdict]
    plain = [first, f"The reparametrization is exact: {ident}.", per_layer_lr(ev.head_dims)]
    plain += [f"With {init} init plain dot is {c[big].mean:+.3f} nats from scaled_dot at "
              f"d_k={big} ({c[big].reading})." for init, c in
              ((i, gaps(ev, i)) for i in ev.inits if i != UNIT)]
    return Verdict(verdict, RULE, f"identity: {ident}; dot − scaled: {gap_text(comps)}",
                   {"dot": comps, "identity": runs, "partial": ev.identity.partial},
                   headline=f"{verdict}: at d_k={big} dot {d_.mean:+.3f} nats; the exact "
                   "reparametrization absorbs the rest", plain=plain,
                   regime=REGIMES[UNIT], smallest=LOSS_WHY + "; identity: 1e-6 nats in float64")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """The head-dimension figure, captioned with the unscaled gaps."""
    other = ({d: c.model_dump() for d, c in gaps(Evidence.model_validate(ev), "gpt2").items()}
             if "gpt2" in ev["inits"] else {})
    alt = T.head_dim_alt(ev, numbers["dot"], other)
    return [fig_head_dim(ev, folder, alt, "c7_head_dim")]


def gather(src: Sources) -> dict[str, Any]:
    return {**src.study("head_dim", head_dim_evidence), "identity": src.measured["identity"]}


def says_scale(e: dict[str, Any]) -> list[str]:
    """The float64 identity read as what the scale is: a per-layer LR and init for W_q, W_k,
    with the factor at every d_k the identity was checked at."""
    ident = e["numbers"].get("identity") or []
    if not ident:
        return []
    dks = sorted({int(r["d_k"]) for r in ident})
    return [f"The scale is a per-layer learning rate and init for W_q and W_k: dropping 1/√d_k "
            f"is exactly keeping it with their init and Adam LR {factors(dks)}, Adam's ε and "
            f"the clip matched; in float64 the two trained alike to "
            f"{max(r['max_loss_diff'] for r in ident):.1g} nats (C7). So what dropping it "
            f"changes is the effective LR and init of those two layers."]


CLAIM = register(Claim(
    id="C7", text="Dropping the scaling would also keep magnitude information; why a constant "
    "√d_k?", measures="unscaled and scaled over d_k, both init regimes; the absorbed "
    "reparametrization checked exactly in float64", rule=RULE,
    evidence=Evidence, gather=gather, judge=judge, draw=draw, studies=("head_dim",),
    measurements=(Measurement("identity", lambda p: {"head_dims": list(p.head_dims),
                                                     "steps": p.identity_steps}, measure),),
    says=(Says("scale", says_scale, rank=30),)))
