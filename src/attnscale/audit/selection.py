"""Choosing each arm's learning rate on data that is not reported, and reading an arm's
per-seed values at it. Pure functions of stored run dicts (see :mod:`attnscale.lab.analysis`).

* **tuned** studies: the tuning seeds' mean clipped loss per LR picks the LR
  (:func:`tuned_choice`); a best LR at an edge of the grid that cannot be extended further is
  *censored*: the true optimum may lie beyond it.
* **grid** studies: seed s is read at the LR whose mean clipped loss over the *other* seeds is
  lowest (:func:`loo_choice`, leave-one-seed-out); the arm is censored when the optimum over all
  seeds sits at an edge of the grid.

The clipped loss is Wortsman et al. 2023's (arXiv 2309.14322): min(L_T, L₀), L₀ for a diverged
run (:func:`attnscale.lab.analysis.clipped_loss`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnscale.audit.studies import Study
from attnscale.lab import analysis

Run = Mapping[str, Any]
Cell = tuple[tuple[str, Any], ...]  # ((field, value), ...) in the study's cell order


@dataclass(frozen=True)
class ArmValues:
    """One arm in one cell: a value per reported seed, the LR each was read at, and whether the
    LR choice is censored (best LR at an edge of the grid)."""

    values: dict[int, float]
    lrs: dict[int, float]
    censored: bool
    curve: dict[float, float] = field(default_factory=dict)  # LR -> mean clipped loss

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers (seed and LR keys as strings), for evidence and JSON."""
        return {"values": {str(k): v for k, v in self.values.items()},
                "lrs": {str(k): v for k, v in self.lrs.items()}, "censored": self.censored,
                "curve": {str(k): v for k, v in self.curve.items()}}


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
    """The run is arm ``arm`` of ``cell``."""
    return run.get("variant") == arm and all(run["config"].get(k) == v for k, v in cell)


def clipped(runs: Iterable[Run]) -> dict[tuple[float, int], float]:
    """(LR, seed) -> clipped loss of each finished run that has a finite loss at init (a run
    whose very first loss is not finite measured nothing)."""
    done = [r for r in analysis.finished(runs) if analysis.initial_loss(r) is not None]
    if not done:
        return {}
    out = {}
    for lr, losses in analysis.clipped_losses_by_lr(done).items():
        seeds = [r["config"]["seed"] for r in done if float(r["config"]["lr"]) == lr]
        out.update({(lr, s): c for s, c in zip(seeds, losses, strict=True)})
    return out


def best_lr(curve: Mapping[float, float]) -> tuple[float, bool]:
    """(the LR of the lowest mean loss, whether it sits at an edge of the grid); a one-point
    grid is not an edge (nothing was chosen)."""
    lr = min(curve, key=curve.__getitem__)
    return lr, len(curve) > 1 and lr in (min(curve), max(curve))


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


def arm_values(
    study: Study,
    runs: Iterable[Run],
    cell: Cell,
    arm: str,
    value: Callable[[Run], float | None] | None = None,
) -> ArmValues:
    """Arm ``arm`` of ``cell`` at its chosen LR, one value per reported seed: ``value(run)``
    (default: the clipped loss). The runner extends a tuned grid at an edge as far as the study
    allows (:mod:`attnscale.audit.running`), so a tuned choice still at an edge is censored."""
    mine = [r for r in analysis.finished(runs) if in_cell(r, cell, arm)]
    losses = clipped(mine)
    def read(run: Run) -> float | None:
        if value is not None:
            return value(run)
        return losses.get((float(run["config"]["lr"]), run["config"]["seed"]))
    reported = [r for r in mine if r["config"]["seed"] in study.seeds]
    if study.lr_choice == "tuned":
        try:
            lr, edge, curve = tuned_choice(
                [r for r in mine if r["config"]["seed"] in study.tune_seeds])
        except ValueError:  # the tuning measured nothing: nothing to report
            return ArmValues({}, {}, False)
        chosen = {r["config"]["seed"]: lr for r in reported}
        censored = edge
    else:
        chosen, censored, curve = loo_choice(reported)
    values, lrs = {}, {}
    for r in reported:
        s = r["config"]["seed"]
        if float(r["config"]["lr"]) == chosen.get(s):
            v = read(r)
            if v is not None:
                values[s], lrs[s] = float(v), chosen[s]
    return ArmValues(values, lrs, censored, curve)
