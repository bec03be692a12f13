"""Readings of the deep preset's two studies (:func:`attnscale.audit.studies.deep_studies`):
the 1,500-step text study (C6's longer regime) and the high-LR instability study without
gradient clipping (C11's instability half, where it can show). Outside ``--deep`` both studies
are planned with no seeds, so their evidence is None and the claims say the study was not run.

An instability study's unit is the seed: per (width, arm), the share of its LRs at which the run
was unstable (:func:`attnscale.audit.evidence.unstable`: it diverged, or its loss blew up and
stayed up), so arms compare by paired per-seed shares as C11's sweep does.
"""

from __future__ import annotations

from typing import Any

from attnscale.audit.compare import Pair
from attnscale.audit.evidence import Arm, ArmTable, Model, Run, arms_table, unstable
from attnscale.audit.selection import cell_label, cells, in_cell
from attnscale.audit.studies import Study
from attnscale.lab import analysis

# (arm, reference) pairs the instability study compares: unscaled against scaled, with and
# without the gradient-norm clip
UNSTABLE_PAIRS = (("dot", "scaled_dot"), ("dot_noclip", "scaled_dot_noclip"))


class UnstableArm(Model):
    """One arm at one width of the instability study."""

    unstable: dict[str, float]  # seed -> share of the LRs at which the run was unstable
    n_runs: int
    n_unstable: int
    peak_logit: float | None  # the largest peak max |logit| of any of its runs


class Unstable(Model):
    """The instability study (:func:`unstable_evidence`)."""

    cells: dict[str, dict[str, UnstableArm]]
    steps: int
    lrs: list[float]


class LongText(Model):
    """The 1,500-step text study (:func:`long_text_evidence`): LOO-chosen clipped losses."""

    loss: ArmTable
    steps: int


def _seed(run: Run) -> str:
    return str(run.seed)


def unstable_arm(runs: list[Run]) -> dict[str, Any]:
    """Per seed the share of its runs (one per LR) that were unstable; the counts; the peak."""
    by_seed: dict[str, list[bool]] = {}
    for r in runs:
        by_seed.setdefault(_seed(r), []).append(unstable(r))
    peaks = [p for p in map(analysis.peak_max_logit, runs) if p is not None]
    return {"unstable": {s: sum(u) / len(u) for s, u in by_seed.items()},
            "n_runs": len(runs), "n_unstable": sum(map(unstable, runs)),
            "peak_logit": float(max(peaks)) if peaks else None}


def unstable_evidence(study: Study, runs: list[Run]) -> dict[str, Any] | None:
    """Per width and arm, :func:`unstable_arm` over the study's runs; None when the preset did
    not run the study (no seeds)."""
    if not study.seeds:
        return None
    table = {cell_label(c): {a: unstable_arm([r for r in runs if in_cell(r, c, a)])
                             for a in study.arms if any(in_cell(r, c, a) for r in runs)}
             for c in cells(study)}
    return {"cells": table, "steps": study.base["steps"], "lrs": list(study.lrs)}


def long_text_evidence(study: Study, runs: list[Run]) -> dict[str, Any] | None:
    """Clipped loss per init and arm at the LR chosen leave-one-seed-out; None when the preset
    did not run the study."""
    if not study.seeds:
        return None
    return {"loss": arms_table(study, runs), "steps": study.base["steps"]}


def observed(ev: Unstable) -> int:
    """How many runs of the instability study were unstable."""
    return sum(a.n_unstable for row in ev.cells.values() for a in row.values())


def unstable_pairs(ev: Unstable) -> dict[str, Pair]:
    """arm − reference unstable share per width, for the widths where some run of the pair was
    unstable (where none was, there is nothing to compare)."""
    out: dict[str, Pair] = {}
    for label, row in ev.cells.items():
        for arm, ref in UNSTABLE_PAIRS:
            if arm in row and ref in row and row[arm].n_unstable + row[ref].n_unstable:
                out[f"deep {label} unstable: {arm} − {ref}"] = (
                    Arm(values=row[arm].unstable), Arm(values=row[ref].unstable))
    return out


def unstable_sentence(ev: Unstable | None) -> str:
    """What the instability study saw, or that this preset did not run it."""
    if ev is None:
        return ("The deep preset's instability study (1,000 steps, widths 64 and 256, LRs up to "
                "0.3, with and without the gradient clip) was not run here: `attnscale report "
                "--deep`.")
    runs = sum(a.n_runs for row in ev.cells.values() for a in row.values())
    peak = max((a.peak_logit for row in ev.cells.values() for a in row.values()
                if a.peak_logit is not None), default=None)
    widths = ", ".join(x.split("=")[-1] for x in ev.cells)
    lrs = ", ".join(f"{x:g}" for x in ev.lrs)
    peak_text = f"; the largest max |logit| was {peak:.3g}" if peak is not None else ""
    what = (f"{observed(ev)} of {runs} were unstable" if observed(ev)
            else f"none of {runs} was unstable: not observed at this scale either")
    return (f"In the deep instability study ({ev.steps} steps, widths {widths}, LRs {lrs}, with "
            f"and without the gradient-norm clip) {what}{peak_text}.")
