"""Readings of the text LR sweep at two widths that C11 and Q1 share (Wortsman et al. 2023,
arXiv 2309.14322): one arm's per-seed LR sensitivity or unstable fraction as a comparable
:class:`attnscale.audit.evidence.Arm`, the sweep's divergence counts, and its regime line.

LR sensitivity is the mean clipped loss over the grid minus a reference shared by every arm of
the width (:func:`attnscale.audit.evidence.lr_sweep_arm`); the unstable fraction is the share of
the grid where a run diverged or its loss blew up and stayed more than 1 nat above its own low.
"""

from __future__ import annotations

from typing import Literal

from attnscale.audit.evidence import Arm, LRText

GPT2 = "GPT-2 init (weights std 0.02), character-level text"
SweepKey = Literal["sensitivity", "unstable"]


def sweep_arm(ev: LRText, width: str, arm: str, key: SweepKey) -> Arm | None:
    """Per-seed values of ``key`` ("sensitivity" or "unstable") for one arm at one width, as
    an uncensored :class:`Arm` (None when the arm was not swept there)."""
    a = ev.sweep.get(width, {}).get(arm)
    return Arm(values=getattr(a, key), censored=False) if a else None


def divergence_counts(ev: LRText) -> dict[str, int]:
    """Over every arm and width of the sweep: runs, divergences, runs past 1e4."""
    arms = [a for by_arm in ev.sweep.values() for a in by_arm.values()]
    return {"runs": sum(a.n_runs for a in arms),
            "diverged": sum(a.n_diverged for a in arms),
            "past": sum(a.n_past_logit_limit for a in arms)}


def grid_of(ev: LRText, init: str) -> str:
    """", LRs 0.001–0.03": the LRs the sweep ran in the cells of init regime ``init`` (the
    GPT-2-init context runs a shorter grid than the unit-init cells that decide), or "" when
    the cells record no loss per LR."""
    lrs = sorted({float(lr) for label, by_arm in ev.sweep.items() if f"init={init}" in label
                  for a in by_arm.values() for lr in a.loss_by_lr})
    return f", LRs {lrs[0]:g}–{lrs[-1]:g}" if lrs else ""


def sweep_regime(ev: LRText, counts: dict[str, int]) -> str:
    """The regime line, with what the study cannot show."""
    widths = ", ".join(w.split("=")[-1] for w in ev.sweep)
    line = f"{GPT2}; widths {widths}; {counts['diverged']} of {counts['runs']} runs diverged"
    if counts["diverged"] == 0:
        line += (", so this sweep shows logit growth and LR sensitivity, not divergence, and "
                 "says nothing of the long runs where Wortsman et al. saw it")
    return line
