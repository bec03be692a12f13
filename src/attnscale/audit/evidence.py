"""Evidence from the training studies: typed models, and the readers that build them.

The readers are pure functions of a study's runs (typed records,
:class:`attnscale.lab.records.Run`) and return plain dicts (what report.json
stores); each claim validates its evidence into a typed model before its rule reads it
(:class:`attnscale.audit.claim.Claim`), so a rule reads attributes, never string keys, and a
missing or mistyped number fails at that boundary with the field's name. Training evidence is
per seed: for each cell and arm, an :class:`Arm` (a value per reported seed at the arm's chosen
LR, and whether that choice is censored); the rules compute paired effects from these
(:mod:`attnscale.audit.compare`), so the statistics live in one place
(:mod:`attnscale.lab.paired`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from attnscale.audit.interval import Interval
from attnscale.audit.selection import (
    arm_values,
    cell_label,
    cells,
    clipped,
    in_cell,
    reported_lrs,
)
from attnscale.audit.studies import VARIANTS, Study
from attnscale.audit.verdicts import MissingEvidence
from attnscale.lab import analysis
from attnscale.lab.build import build_task
from attnscale.lab.config import TrainConfig
from attnscale.lab.records import Run
from attnscale.measure import theory

Runs = dict[str, list[Run]]  # study name -> its finished runs


class Model(BaseModel):
    """Typed evidence: immutable, and no field it does not declare."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Arm(Model):
    """One arm in one cell: a value per reported seed (keys are seeds as strings), the LR each
    was read at, whether that LR choice is censored (best LR at the grid's edge), the tuning
    curve LR -> mean clipped loss, the same seeds at the runner-up LR (``alt``, see
    :mod:`attnscale.audit.selection`) and which runs it reads (``source``)."""

    values: dict[str, float]
    lrs: dict[str, float] = {}
    censored: bool = False
    curve: dict[str, float] = {}
    # the same seeds read at the runner-up LR where it is not clearly worse than the
    # choice (:mod:`attnscale.audit.selection`); empty when no seed has one
    alt: dict[str, float] = {}
    alt_lrs: dict[str, float] = {}
    source: list[str] = []  # [study, cell, arm]: the runs it reads (tables of them share it)

    def at_runner_up(self) -> Arm:
        """This arm read at its runner-up LR (itself when it has none)."""
        if not self.alt:
            return self
        return self.model_copy(update={"values": self.alt, "lrs": self.alt_lrs, "alt": {},
                                       "alt_lrs": {}})

    def mean(self) -> float:
        """Mean over seeds (nan when there are none)."""
        return float(np.mean(list(self.values.values()))) if self.values else math.nan

    def interval(self) -> Interval:
        """Mean over seeds with its 95% Student-t interval."""
        return Interval.of(list(self.values.values()))


ArmTable = dict[str, dict[str, Arm]]  # cell label -> arm -> its per-seed values


class HeadDim(Model):
    """The head-dimension study (:func:`head_dim_evidence`): per (init, d_k) cell and arm the
    clipped loss, layer-1 entropy at init and at the end and the final saturated-row fraction."""

    loss: ArmTable
    entropy_init: ArmTable
    entropy_end: ArmTable
    saturated_end: ArmTable
    inits: list[str]
    head_dims: list[int]
    seeds: list[int]

    def arm(self, init: str, d: int | str, arm: str, table: str = "loss") -> Arm | None:
        """One arm of one cell of ``table`` (None when it has no runs)."""
        return getattr(self, table).get(f"init={init} d_model={d}", {}).get(arm)


class SweepArm(Model):
    """One arm at one width over the LR grid (:func:`lr_sweep_arm`)."""

    sensitivity: dict[str, float]
    unstable: dict[str, float]
    n_runs: int
    n_diverged: int
    n_past_logit_limit: int
    loss_by_lr: dict[str, float]
    final_logit_by_lr: dict[str, dict[str, float]]
    peak_logit_by_lr: dict[str, float | None]
    unstable_by_lr: dict[str, float]
    logit_curves: dict[str, list[tuple[int, float]]]
    clipped_by_lr: dict[str, float] = {}  # QK-Clip arms: share of runs the clip acted in


class LRText(Model):
    """The text LR study (:func:`lr_text_evidence`): LOO-chosen losses and the LR sweeps."""

    loss: ArmTable
    sweep: dict[str, dict[str, SweepArm]]
    lrs: list[float]
    n: int
    logit_limit: float
    loss_margin: float
    entropy_init: ArmTable = {}  # layer-1 attention entropy / ln n at step 0
    levels: dict[str, float] = {}  # bits/char of the corpus' unigram and bigram models

    def cells_of(self, init: str) -> dict[str, dict[str, Arm]]:
        """The loss table's cells in init regime ``init``, keyed by their width label
        (``d_model=128``); cells of a study without an init axis count as GPT-2 init."""
        out = {}
        for label, row in self.loss.items():
            parts = dict(x.split("=", 1) for x in label.split())
            if parts.pop("init", "gpt2") == init:
                out[" ".join(f"{k}={v}" for k, v in parts.items())] = row
        return out


class Tau(Model):
    """The retrieval study of cosine's temperature (:func:`tau_evidence`)."""

    accuracy: ArmTable
    loss: ArmTable
    bound: dict[str, float]
    n: int
    chance: float


class Accuracy(Model):
    """Accuracy per arm, with the study's control arms and chance level."""

    accuracy: ArmTable
    controls: list[str] = []
    chance: float


class Length(Model):
    """Trained at n, evaluated at longer lengths (:func:`length_evidence`): per length key
    ("n=64") the eval loss, accuracy and attention weight on the answer."""

    loss: dict[str, ArmTable]
    accuracy: dict[str, ArmTable]
    answer_weight: dict[str, ArmTable]
    lengths: list[str]
    chance: float

# Wortsman et al. 2023's marker of logit growth (reported beside instability, not counted as
# it: a run can pass it and train on), and how far a loss must climb above its own lowest
# logged value, and stay there, to count as a blow-up.
LOGIT_LIMIT = 1e4
LOSS_MARGIN = 1.0


def metric(run: Run) -> float:
    """The run's final task metric (accuracy); 0 for a run without one (diverged)."""
    v = run.final_metric
    return float(v) if v is not None and math.isfinite(v) else 0.0


def layer_stat(run: Run, name: str, row: int, layer: int = 0) -> float | None:
    """Statistic ``name`` of attention layer ``layer`` in history row ``row`` (0: at init,
    −1: the last logged step)."""
    history = run.history
    if not history:
        return None
    layers = history[row].get("layers") or []
    v = layers[layer].get(name) if len(layers) > layer else None
    return float(v) if v is not None else None


def spread_stat(run: Run, name: str, row: int, layer: int | None = None) -> float:
    """A row-spread statistic (``row_logit_std``, ``row_freeze_ratio``) of history row ``row``:
    of attention layer ``layer``, or the largest over layers (None). +inf where the run
    diverged (at the last row) or logged None (a layer that blew up is not a small one);
    :class:`MissingEvidence` naming the run when it logged no such statistic (a run stored
    before the statistic was logged: train again into a new results database)."""
    if row == -1 and run.status == "diverged":
        return math.inf
    history = run.history
    layers = (history[row].get("layers") or []) if history else []
    if not layers or any(name not in layer_row for layer_row in layers):
        raise MissingEvidence(f"run {run.id} logged no {name!r} (stored before it was "
                              "logged: train again into a new results database)")
    values = [x[name] for x in (layers if layer is None else [layers[layer]])]
    return math.inf if any(v is None for v in values) else float(max(values))


def arms_table(study: Study, runs: list[Run],
               value: Callable[[Run], float | None] | None = None) -> dict[str, Any]:
    """cell label -> arm -> :meth:`ArmValues.to_dict` (arms with no runs left out)."""
    out: dict[str, Any] = {}
    for cell in cells(study):
        row = {}
        for arm in study.arms:
            if any(in_cell(r, cell, arm) for r in runs):
                row[arm] = {**arm_values(study, runs, cell, arm, value).to_dict(),
                            "source": [study.name, cell_label(cell), arm]}
        out[cell_label(cell)] = row
    return out


def head_dim_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """C7, C13: clipped loss per (init, d_k) cell and arm; layer-1 entropy at init and at the
    end; the final saturated-row fraction (C10)."""
    def stat(name: str, row: int) -> Callable[[Run], float | None]:
        return lambda r: layer_stat(r, name, row)
    return {"loss": arms_table(study, runs),
            "entropy_init": arms_table(study, runs, stat("entropy_normalized", 0)),
            "entropy_end": arms_table(study, runs, stat("entropy_normalized", -1)),
            "saturated_end": arms_table(study, runs, stat("saturated_fraction", -1)),
            "inits": list(study.cells.get("init", ())),
            "head_dims": list(study.cells.get("d_model", ())), "seeds": list(study.seeds)}


def seed_curves(runs: list[Run]) -> dict[int, dict[float, float]]:
    """seed -> LR -> clipped loss."""
    out: dict[int, dict[float, float]] = {}
    for (lr, seed), c in clipped(runs).items():
        out.setdefault(seed, {})[lr] = c
    return out


def unstable(run: Run) -> bool:
    """Real instability: the run diverged, ended without a finite loss, or its loss blew up and
    did not come back (the final loss more than :data:`LOSS_MARGIN` above the lowest loss it
    logged). An under-trained run, slow at a small LR, is not unstable however high its loss,
    and neither is a large logit alone (:data:`LOGIT_LIMIT` is reported on its own)."""
    loss = run.final_loss
    if run.status == "diverged" or loss is None or not math.isfinite(loss):
        return True
    logged = [float(row["loss"]) for row in run.history
              if row.get("loss") is not None and math.isfinite(row["loss"])]
    return float(loss) > min([*logged, float(loss)]) + LOSS_MARGIN


def final_logit(run: Run) -> float:
    """The run's max |logit| at its last logged step; +inf for a run that diverged or logged
    none (it blew up, so it is past any limit)."""
    curve = analysis.max_logit_curve(run)
    if run.status == "diverged" or not curve or not math.isfinite(curve[-1][1]):
        return math.inf
    return float(curve[-1][1])


def lr_sweep_arm(runs: list[Run], reference: Mapping[int, float]) -> dict[str, Any]:
    """One arm at one width over the LR grid. Per seed s, LR sensitivity against the shared
    reference: mean over the grid of the clipped loss c(η) minus ``reference[s]``, the lowest
    clipped loss any arm reached on seed s at this width, so a difference of two arms'
    sensitivities is exactly the difference of their mean clipped losses over the grid (each
    arm's own best would reward an arm for a deep minimum at one LR); and the fraction of LRs
    that were :func:`unstable`. Per LR: the mean clipped loss, every seed's final max |logit|
    (inf when diverged), the mean peak max |logit| and the unstable fraction; the counts of
    runs, divergences and runs past :data:`LOGIT_LIMIT`; max |logit| against step; for a QK-Clip
    arm, per LR the share of runs in which the clip acted (:func:`clip_acted`)."""
    curves = seed_curves(runs)
    sens = {str(s): sum(c.values()) / len(c) - reference[s] for s, c in curves.items()}
    by_seed: dict[str, list[bool]] = {}
    by_lr: dict[float, list[Run]] = {}
    for r in runs:
        by_seed.setdefault(str(r.seed), []).append(unstable(r))
        by_lr.setdefault(r.lr, []).append(r)
    def peak(rs: list[Run]) -> float | None:
        xs = [max(v for _, v in c) for c in map(analysis.max_logit_curve, rs) if c]
        return float(np.mean(xs)) if xs else None
    peaks = [analysis.peak_max_logit(r) for r in runs]
    return {"sensitivity": sens,
            "unstable": {s: sum(u) / len(u) for s, u in by_seed.items()},
            "n_runs": len(runs),
            "n_diverged": sum(r.status == "diverged" for r in runs),
            "n_past_logit_limit": sum(p is not None and p > LOGIT_LIMIT for p in peaks),
            "loss_by_lr": {str(k): v for k, v in analysis.loss_by_lr(runs).items()},
            "final_logit_by_lr": {str(k): {str(r.seed): final_logit(r) for r in v}
                                  for k, v in sorted(by_lr.items())},
            "peak_logit_by_lr": {str(k): peak(v) for k, v in sorted(by_lr.items())},
            "unstable_by_lr": {str(k): float(np.mean([unstable(r) for r in v]))
                               for k, v in sorted(by_lr.items())},
            "logit_curves": {str(k): analysis.max_logit_curve(v[0]) for k, v in
                             sorted(by_lr.items())},
            "clipped_by_lr": {str(k): float(np.mean([clip_acted(r) for r in v]))
                              for k, v in sorted(by_lr.items())
                              if any(r.config.optim.qk_clip for r in v)}}


def clip_acted(run: Run) -> bool:
    """Whether QK-Clip rescaled any head in the run (its history rows' ``qk_clipped``)."""
    return any((row.get("qk_clipped") or 0) > 0 for row in run.history)


def lr_text_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """C6, C11, C12, Q1: per width, each arm's LOO-chosen clipped loss per seed and its LR
    sweep (:func:`lr_sweep_arm`, against the width's shared per-seed reference)."""
    sweep: dict[str, Any] = {}
    for cell in cells(study):
        mine = [r for r in runs if r.seed in study.seeds
                and all(r.value(k) == v for k, v in cell)]
        reference: dict[int, float] = {}  # per seed, the lowest clipped loss of any arm
        for arm in study.arms:
            for (_, seed), c in clipped(r for r in mine if r.variant == arm).items():
                reference[seed] = min(c, reference.get(seed, math.inf))
        if not reference:  # nothing measured in this cell
            continue
        sweep[cell_label(cell)] = {
            arm: lr_sweep_arm([r for r in mine if r.variant == arm], reference)
            for arm in study.arms if any(r.variant == arm for r in mine)}
    task = build_task(TrainConfig(**study.base))
    levels = {k: float(getattr(task, f"{k}_bits")) for k in ("unigram", "bigram")
              if hasattr(task, f"{k}_bits")}
    return {"loss": arms_table(study, runs), "sweep": sweep, "lrs": list(study.lrs),
            "n": study.base["seq_len"], "logit_limit": LOGIT_LIMIT, "loss_margin": LOSS_MARGIN,
            "entropy_init": arms_table(study, runs,
                                       lambda r: layer_stat(r, "entropy_normalized", 0)),
            "levels": levels}


def tau_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """C6: accuracy and clipped loss per arm (one table, "all") at the study's training length,
    its smallest ``seq_len`` cell (C4 reads every length: ``c04_bounded_range.tau_by_length``);
    the max-weight bound at each τ."""
    lengths = study.cells.get("seq_len")
    n = min(lengths) if lengths else study.base["seq_len"]
    label = cell_label((("seq_len", n),)) if lengths else "all"
    taus = {a: VARIANTS[a]["tau"] for a in study.arms if "tau" in VARIANTS[a]}
    return {"accuracy": {"all": arms_table(study, runs, metric).get(label, {})},
            "loss": {"all": arms_table(study, runs).get(label, {})},
            "bound": {arm: float(theory.max_weight_bound(n, t)) for arm, t in taus.items()},
            "n": n, "chance": chance(study)}


def chance(study: Study) -> float:
    """The chance accuracy of the study's task with its options."""
    return float(build_task(TrainConfig(**study.base)).chance_level)


def accuracy_evidence(study: Study, runs: list[Run], **context: Any) -> dict[str, Any]:
    """Accuracy per arm (C3)."""
    return {"accuracy": arms_table(study, runs, metric), **context}


def length_evidence(study: Study, runs: list[Run]) -> dict[str, Any]:
    """Q3: eval loss, accuracy and attention weight on the answer at each evaluation length,
    per arm."""
    def at(key: str, field: str) -> Callable[[Run], float | None]:
        def read(r: Run) -> float | None:
            v = r.final_metrics.get(key)
            v = v.get(field) if isinstance(v, dict) else None
            return float(v) if v is not None and math.isfinite(v) else None
        return read
    keys = sorted({k for r in runs for k in r.final_metrics
                   if k.startswith("n=")}, key=lambda k: int(k.split("=")[1]))
    return {"loss": {k: arms_table(study, runs, at(k, "loss")) for k in keys},
            "accuracy": {k: arms_table(study, runs, at(k, "metric")) for k in keys},
            "answer_weight": {k: arms_table(study, runs, at(k, "answer_weight")) for k in keys},
            "lengths": keys, "chance": chance(study)}


def row_spread_evidence(study: Study, runs: list[Run], row: int, name: str,
                        layer: int | None = None) -> dict[str, dict[str, Any]]:
    """C12: cell label -> scaled_dot's :func:`spread_stat` per seed at its chosen LR (an
    :class:`Arm` as a dict: values, LRs, censoring)."""
    table = arms_table(study, [r for r in runs if r.variant == "scaled_dot"],
                       lambda r: spread_stat(r, name, row, layer))
    return {label: arms["scaled_dot"] for label, arms in table.items() if "scaled_dot" in arms}


def trained_saturation(head_dim: dict[str, Any]) -> dict[str, Any] | None:
    """C10: fraction of attention rows with max weight > 0.9 at the end of training, per arm,
    in the unit-variance regime at the largest d_k (mean ± CI over seeds)."""
    if not head_dim["head_dims"]:
        return None
    row = head_dim["saturated_end"].get(f"init=unit d_model={head_dim['head_dims'][-1]}", {})
    out = {arm: {"saturated_fraction": analysis.mean_ci(list(v["values"].values())).to_dict()}
           for arm, v in row.items() if arm in ("dot", "scaled_dot") and v["values"]}
    return out or None


def missing_runs(study: Study, runs: list[Run]) -> list[str]:
    """Each (cell, arm, seed) of ``study``'s reported seeds with no finished run (done or
    diverged), and for a tuned study each one missing at an LR it reports
    (:func:`attnscale.audit.selection.reported_lrs`: the choice and the runner-up): an arm
    missing there would silently leave a comparison out of its rule's family, so the claims it
    feeds are reported as errors instead (``MissingEvidence``)."""
    finished = analysis.finished(runs)
    out = []
    for cell in cells(study):
        for arm in study.arms:
            mine = [r for r in finished if in_cell(r, cell, arm)]
            lrs = reported_lrs(study, mine, cell, arm) if study.lr_choice == "tuned" else ()
            for seed in study.seeds:
                at = {r.lr if lrs else None for r in mine if r.seed == seed}
                where = f"{study.name}: {cell_label(cell)} {arm} seed {seed}"
                if not at:
                    out.append(where)
                out += [f"{where} at LR {lr:g}" for lr in lrs if at and lr not in at]
    return out


