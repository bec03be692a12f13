"""Choosing each arm's learning rate on data that is not reported, and reading an arm's
per-seed values at it. Pure functions of stored runs (typed records,
:class:`attnscale.lab.records.Run`; see :mod:`attnscale.lab.analysis`).

* **tuned** studies: the tuning seeds' mean clipped loss per LR picks the LR
  (:func:`tuned_choice`); a best LR at an edge of the grid that cannot be extended further is
  *censored*: the true optimum may lie beyond it.
* **grid** studies: seed s is read at the LR whose mean clipped loss over the *other* seeds is
  lowest (:func:`loo_choice`, leave-one-seed-out); the arm is censored when the optimum over all
  seeds sits at an edge of the grid.

The clipped loss is Wortsman et al. 2023's (arXiv 2309.14322): min(L_T, L₀), L₀ for a diverged
run (:func:`attnscale.lab.analysis.clipped_loss`).

**The runner-up LR.** A choice of LR is itself uncertain: two tuning seeds cannot tell apart two
LRs that both solve a task (docs/claims.md, "The LR choice"). Each arm therefore also has a
*runner-up*: the better grid neighbour of its chosen LR (:func:`runner_up`). A tuned study
trains its reported seeds there too unless every tuning seed puts it more than δ = 0.02 nats
above the choice (:func:`separated`). It is read unless it is clearly worse
(:func:`clearly_worse`): the one-sided 95% lower bound of its paired loss gap over the reported
seeds (for a grid study, every other seed; never the tuning seeds, which picked the choice) lies
above δ, so it cannot be the best LR (a comparison with the best, Hsu 1984, Ann. Statist.
12(3)). :class:`ArmValues` carries the reported seeds' values at the runner-up beside those at
the choice; the report asks that a verdict hold at both (:mod:`attnscale.audit.lr_choice`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy  # its submodules load on first use

from attnscale.audit.studies import Study
from attnscale.lab import analysis
from attnscale.lab.records import Run

Cell = tuple[tuple[str, Any], ...]  # ((field, value), ...) in the study's cell order
SEPARATION = 0.02  # nats: the smallest loss effect of the training claims (verdicts.LOSS_DELTA)


@dataclass(frozen=True)
class ArmValues:
    """One arm in one cell: a value per reported seed, the LR each was read at, and whether the
    LR choice is censored (best LR at an edge of the grid)."""

    values: dict[int, float]
    lrs: dict[int, float]
    censored: bool
    curve: dict[float, float] = field(default_factory=dict)  # LR -> mean clipped loss
    # the same seeds read at the runner-up LR where it is not clearly worse (else
    # at the choice); empty when no seed has a runner-up
    alt: dict[int, float] = field(default_factory=dict)
    alt_lrs: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers (seed and LR keys as strings), for evidence and JSON."""
        def keyed(d: Mapping[Any, float]) -> dict[str, float]:
            return {str(k): v for k, v in d.items()}
        return {"values": keyed(self.values), "lrs": keyed(self.lrs), "censored": self.censored,
                "curve": keyed(self.curve), "alt": keyed(self.alt),
                "alt_lrs": keyed(self.alt_lrs)}


def cells(study: Study) -> list[Cell]:
    """Every cell of ``study``: the product of its cell axes, in order."""
    out: list[Cell] = [()]
    for name, values in study.cells.items():
        out = [(*c, (name, v)) for c in out for v in values]
    return out


def cell_label(cell: Cell) -> str:
    """``init=unit d_model=256``, or ``all`` for a study without cells."""
    return " ".join(f"{k}={v}" for k, v in cell) or "all"


def in_cell(run: Run, cell: Cell, arm: str) -> bool:
    """The run is arm ``arm`` of ``cell`` (cell keys are flat config names)."""
    return run.variant == arm and all(run.value(k) == v for k, v in cell)


def clipped(runs: Iterable[Run]) -> dict[tuple[float, int], float]:
    """(LR, seed) -> clipped loss of each finished run that has a finite loss at init (a run
    whose very first loss is not finite measured nothing)."""
    done = [r for r in analysis.finished(runs) if analysis.initial_loss(r) is not None]
    if not done:
        return {}
    out = {}
    for lr, losses in analysis.clipped_losses_by_lr(done).items():
        seeds = [r.seed for r in done if r.lr == lr]
        out.update({(lr, s): c for s, c in zip(seeds, losses, strict=True)})
    return out


def best_lr(curve: Mapping[float, float]) -> tuple[float, bool]:
    """(the LR of the lowest mean loss, whether it sits at an edge of the grid); a one-point
    grid is not an edge (nothing was chosen)."""
    lr = min(curve, key=curve.__getitem__)
    return lr, len(curve) > 1 and lr in (min(curve), max(curve))


def runner_up(curve: Mapping[float, float], lr: float) -> float | None:
    """The grid neighbour of ``lr`` with the lower mean loss in ``curve`` (None for a one-point
    grid)."""
    grid = sorted(curve)
    i = grid.index(lr)
    near = [grid[j] for j in (i - 1, i + 1) if 0 <= j < len(grid)]
    return min(near, key=curve.__getitem__) if near else None


def separated(table: Mapping[tuple[float, int], float], chosen: float, other: float,
              seeds: Iterable[int]) -> bool:
    """Every one of ``seeds`` that ran both LRs puts ``other`` more than :data:`SEPARATION`
    above ``chosen`` (``table``: (LR, seed) -> clipped loss, as :func:`clipped`); False when no
    seed ran both (nothing separates them)."""
    both = [s for s in seeds if (chosen, s) in table and (other, s) in table]
    return bool(both) and all(table[other, s] - table[chosen, s] > SEPARATION for s in both)


def clearly_worse(table: Mapping[tuple[float, int], float], chosen: float, other: float,
                  seeds: Iterable[int]) -> bool:
    """The paired gap loss(other) − loss(chosen) over ``seeds`` that ran both LRs has its
    one-sided 95% Student-t lower bound above :data:`SEPARATION` (with no spread: every gap
    above it); False with fewer than two such seeds."""
    gaps = np.array([table[other, s] - table[chosen, s] for s in seeds
                     if (chosen, s) in table and (other, s) in table])
    if len(gaps) < 2:
        return False
    sd = float(gaps.std(ddof=1))
    if sd == 0.0:
        return bool(gaps.min() > SEPARATION)
    t = float(scipy.stats.t.ppf(0.95, len(gaps) - 1))
    return float(gaps.mean()) - t * sd / math.sqrt(len(gaps)) > SEPARATION


def tuned_lrs(tune_runs: Iterable[Run]) -> tuple[float, float | None, bool, dict[float, float]]:
    """(chosen LR, its runner-up or None when the tuning separates them, at an edge?, curve)
    from the tuning runs of one cell and arm (:func:`tuned_choice`, :func:`runner_up`,
    :func:`separated`); ValueError when the tuning measured nothing."""
    runs = list(tune_runs)
    lr, edge, curve = tuned_choice(runs)
    table = clipped(runs)
    other = runner_up(curve, lr)
    if other is not None and separated(table, lr, other, {s for _, s in table}):
        other = None
    return lr, other, edge, curve


def tuned_choice(tune_runs: Iterable[Run]) -> tuple[float, bool, dict[float, float]]:
    """(chosen LR, at an edge?, LR -> mean clipped loss over the tuning seeds)."""
    table = clipped(tune_runs)
    by_lr: dict[float, list[float]] = {}
    for (lr_, _), c in table.items():
        by_lr.setdefault(lr_, []).append(c)
    curve = {k: sum(v) / len(v) for k, v in sorted(by_lr.items())}
    if not curve:
        raise ValueError("tune_runs: no finished run with a finite loss at init")
    lr, edge = best_lr(curve)
    return lr, edge, curve


def loo_runner_ups(runs: Iterable[Run], chosen: Mapping[int, float]) -> dict[int, float]:
    """seed -> the runner-up of its leave-one-seed-out choice ``chosen[seed]``
    (:func:`runner_up` on the other seeds' curve), for the seeds whose other seeds do not show
    it clearly worse (:func:`clearly_worse`)."""
    table = clipped(runs)
    seeds = sorted({s for _, s in table})
    out = {}
    for s in seeds:
        if s not in chosen or len(seeds) < 2:
            continue
        others = [x for x in seeds if x != s]
        by_lr: dict[float, list[float]] = {}
        for (lr_, x), c in table.items():
            if x != s:
                by_lr.setdefault(lr_, []).append(c)
        curve = {k: sum(v) / len(v) for k, v in by_lr.items()}
        other = runner_up(curve, chosen[s]) if chosen[s] in curve else None
        if other is not None and not clearly_worse(table, chosen[s], other, others):
            out[s] = other
    return out


def loo_choice(runs: Iterable[Run]) -> tuple[dict[int, float], bool, dict[float, float]]:
    """Leave-one-seed-out LR per seed, whether the all-seed optimum is at an edge, and the
    all-seed curve (empty, and not at an edge, when no run measured anything). A seed alone
    in the grid keeps the all-seed choice."""
    table = clipped(runs)
    if not table:  # nothing measured: no choice (as tuned_choice's caller reads it)
        return {}, False, {}
    seeds = sorted({s for _, s in table})
    lrs = sorted({lr for lr, _ in table})
    def curve(exclude: int | None) -> dict[float, float]:
        out = {}
        for lr in lrs:
            xs = [table[lr, s] for s in seeds if s != exclude and (lr, s) in table]
            if xs:
                out[lr] = sum(xs) / len(xs)
        return out
    full = curve(None)
    _, edge = best_lr(full)
    chosen = {s: best_lr(curve(s) if len(seeds) > 1 else full)[0] for s in seeds}
    return chosen, edge, full


def reported_lrs(study: Study, runs: Iterable[Run], cell: Cell, arm: str) -> tuple[float, ...]:
    """The LRs a tuned study trains its reported seeds at, for one cell and arm: the choice
    and, unless the tuning separates it or the cell is context (:meth:`Study.is_context`: no
    verdict to check again), the runner-up (:func:`tuned_lrs`); () when the tuning measured
    nothing."""
    tune = [r for r in analysis.finished(runs) if in_cell(r, cell, arm)
            and r.seed in study.tune_seeds]
    try:
        lr, other, _, _ = tuned_lrs(tune)
    except ValueError:
        return ()
    return (lr,) if other is None or study.is_context(cell) else (lr, other)


def arm_values(
    study: Study,
    runs: Iterable[Run],
    cell: Cell,
    arm: str,
    value: Callable[[Run], float | None] | None = None,
) -> ArmValues:
    """Arm ``arm`` of ``cell`` at its chosen LR, one value per reported seed: ``value(run)``
    (default: the clipped loss), and the same seeds at the runner-up LR where it is not
    clearly worse (``alt``; a seed with no value there keeps its value at the choice, so a
    reading at the runner-up never has fewer seeds). The runner extends a tuned grid at an
    edge as far as the study allows (:mod:`attnscale.audit.running`), so a tuned choice
    still at an edge is censored."""
    mine = [r for r in analysis.finished(runs) if in_cell(r, cell, arm)]
    losses = clipped(mine)
    def read(run: Run) -> float | None:
        if value is not None:
            return value(run)
        return losses.get((run.lr, run.seed))
    reported = [r for r in mine if r.seed in study.seeds]
    if study.lr_choice == "tuned":
        try:
            lr, other, edge, curve = tuned_lrs(
                [r for r in mine if r.seed in study.tune_seeds])
        except ValueError:  # the tuning measured nothing: nothing to report
            return ArmValues({}, {}, False)
        chosen = {r.seed: lr for r in reported}
        # the reported seeds only: the tuning seeds picked the choice, so their gaps lean up
        keep = other is not None and not clearly_worse(losses, lr, other, chosen)
        seconds = dict.fromkeys(chosen, other) if keep else {}
        censored = edge
    else:
        chosen, censored, curve = loo_choice(reported)
        seconds = loo_runner_ups(reported, chosen)
    def at(lr_of: Mapping[int, float]) -> tuple[dict[int, float], dict[int, float]]:
        values, lrs = {}, {}
        for r in reported:
            s = r.seed
            if s in lr_of and r.lr == lr_of[s]:
                v = read(r)
                if v is not None:
                    values[s], lrs[s] = float(v), lr_of[s]
        return values, lrs
    values, lrs = at(chosen)
    alt, alt_lrs = at({**chosen, **seconds}) if seconds else ({}, {})
    if alt:
        alt, alt_lrs = {**values, **alt}, {**lrs, **alt_lrs}
    return ArmValues(values, lrs, censored, curve, alt, alt_lrs)
