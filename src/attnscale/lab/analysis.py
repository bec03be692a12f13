"""Sweep analysis: pure functions over run dicts from :meth:`attnscale.lab.store.Store.runs`.

A run dict has at least ``status``, ``config`` (the resolved TrainConfig: ``score``, ``lr``,
``seed``, …), ``final_loss``, ``final_metric``, ``diverged_step``, optionally ``variant`` and,
for the loss at initialization and the logit curves, ``history`` (list of dicts with ``step``,
``loss`` and max-logit statistics). Only finished runs (``done`` / ``diverged``) are
measurements; queued, running and failed runs are ignored everywhere.

The learning-rate measures follow Wortsman et al. 2023 (arXiv 2309.14322, §3.2):

* loss₀ is the loss at initialization: the first history row's ``loss`` (the store's
  ``initial_loss`` column when the run dict has no history);
* a run's *clipped loss* is min(final loss, loss₀), and loss₀ if it diverged (or has no
  finite final loss);
* the loss at a learning rate η is the mean clipped loss over seeds; the *best loss* is its
  minimum over the grid;
* *LR sensitivity* = mean over the LR grid of [loss(η) − best loss];
* the *stable LRs* are those where no seed diverged and loss(η) < loss₀.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Run = Mapping[str, Any]
FINISHED = ("done", "diverged")

# Score parameters that distinguish one variant of a score from another.
SCORE_PARAMS: dict[str, tuple[str, ...]] = {
    "scaled_dot": ("scale",),
    "dot": (),
    "mup": ("c",),
    "cosine": ("tau",),
    "qk_layernorm": ("scale",),
    "qk_rmsnorm": ("scale",),
    "softcap": ("cap", "scale"),
    "log_length": ("s", "scale"),
}


@dataclass(frozen=True)
class MeanCI:
    """Mean of ``n`` values with a two-sided t-interval (``low``/``high`` None when n < 2)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    @property
    def half_width(self) -> float | None:
        """high − mean, or None."""
        return None if self.high is None else self.high - self.mean

    def __str__(self) -> str:
        hw = self.half_width
        return f"{self.mean:.4g}" if hw is None else f"{self.mean:.4g} ± {hw:.2g}"


# ------------------------------------------------------------------------------ grouping


def finished(runs: Iterable[Run]) -> list[Run]:
    """The runs with status done or diverged."""
    return [r for r in runs if r.get("status") in FINISHED]


def score_label(config: Mapping[str, Any]) -> str:
    """A readable name for a config's scoring, e.g. ``cosine tau=10`` or ``cosine swin``."""
    score = str(config.get("score", "?"))
    if score == "cosine" and config.get("temperature") not in (None, "fixed"):
        return f"cosine {config['temperature']}"
    parts = [score]
    for name in SCORE_PARAMS.get(score, ()):
        value = config.get(name)
        if value is not None:
            parts.append(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}")
    return " ".join(parts)


def group_key(run: Run) -> str:
    """The run's variant name if it has one, else :func:`score_label` of its config."""
    return run.get("variant") or score_label(run["config"])


def group_runs(
    runs: Iterable[Run],
    by: Sequence[str] = (),
    key: Callable[[Run], str] = group_key,
) -> dict[tuple[Any, ...], list[Run]]:
    """Finished runs grouped by the config fields ``by`` and then ``key`` (in first-seen order).

    >>> runs = [{"status": "done", "config": {"score": "dot", "d_model": 64}}]
    >>> list(group_runs(runs, by=["d_model"]))
    [(64, 'dot')]
    """
    out: dict[tuple[Any, ...], list[Run]] = {}
    for run in finished(runs):
        k = (*(run["config"].get(b) for b in by), key(run))
        out.setdefault(k, []).append(run)
    return out


# ------------------------------------------------------------------------------ statistics


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> MeanCI:
    """Mean and Student-t confidence interval of ``values`` (non-finite values dropped)."""
    from scipy import stats

    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return MeanCI(math.nan, None, None, 0)
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return MeanCI(mean, None, None, len(xs))
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    hw = float(stats.t.ppf(0.5 + confidence / 2, len(xs) - 1)) * sd / math.sqrt(len(xs))
    return MeanCI(mean, mean - hw, mean + hw, len(xs))


def initial_loss(run: Run) -> float | None:
    """loss₀: the ``loss`` of the run's first history row, else the run's ``initial_loss``."""
    history = run.get("history") or []
    loss = history[0].get("loss") if history else run.get("initial_loss")
    return float(loss) if loss is not None and math.isfinite(loss) else None


def clipped_loss(run: Run, loss0: float) -> float:
    """min(final loss, loss₀); loss₀ for a diverged run or one without a finite final loss."""
    loss = run.get("final_loss")
    if run.get("status") == "diverged" or loss is None or not math.isfinite(loss):
        return loss0
    return min(float(loss), loss0)


def _loss0(runs: Sequence[Run]) -> float:
    values = [v for v in (initial_loss(r) for r in runs) if v is not None]
    if not values:
        raise ValueError("no run has a loss at initialization (no history, no initial_loss)")
    return sum(values) / len(values)


def _by_lr(runs: Iterable[Run]) -> dict[float, list[Run]]:
    out: dict[float, list[Run]] = defaultdict(list)
    for run in finished(runs):
        out[float(run["config"]["lr"])].append(run)
    return dict(sorted(out.items()))


def loss_by_lr(runs: Sequence[Run]) -> dict[float, float]:
    """Mean clipped loss over seeds at each learning rate, LRs ascending.

    A run without history uses the group's mean loss₀.
    """
    group0 = _loss0(finished(runs))
    out = {}
    for lr, rs in _by_lr(runs).items():
        out[lr] = sum(clipped_loss(r, initial_loss(r) or group0) for r in rs) / len(rs)
    return out


def best_loss(runs: Sequence[Run]) -> tuple[float, float]:
    """(best loss, the LR that gives it): the minimum of :func:`loss_by_lr`."""
    curve = loss_by_lr(runs)
    lr = min(curve, key=curve.__getitem__)
    return curve[lr], lr


def lr_sensitivity(runs: Sequence[Run]) -> float:
    """Wortsman et al.'s LR sensitivity: mean over the LR grid of loss(η) − best loss."""
    curve = loss_by_lr(runs)
    best = min(curve.values())
    return sum(v - best for v in curve.values()) / len(curve)


def lr_sensitivity_by_seed(runs: Sequence[Run]) -> list[float]:
    """LR sensitivity computed separately for each seed (for a CI over seeds)."""
    seeds: dict[Any, list[Run]] = defaultdict(list)
    for run in finished(runs):
        seeds[run["config"].get("seed")].append(run)
    return [lr_sensitivity(rs) for _, rs in sorted(seeds.items(), key=lambda kv: str(kv[0]))]


def stable_lrs(runs: Sequence[Run]) -> list[float]:
    """LRs where no seed diverged and the mean clipped loss is below the mean loss₀."""
    curve = loss_by_lr(runs)
    out = []
    for lr, rs in _by_lr(runs).items():
        loss0 = _loss0(rs) if any(initial_loss(r) is not None for r in rs) else _loss0(runs)
        if not any(r["status"] == "diverged" for r in rs) and curve[lr] < loss0:
            out.append(lr)
    return out


def stable_lr_range(runs: Sequence[Run]) -> tuple[float, float] | None:
    """(smallest, largest) stable LR, or None when no LR is stable."""
    lrs = stable_lrs(runs)
    return (lrs[0], lrs[-1]) if lrs else None


def divergence_rate(runs: Iterable[Run]) -> float | None:
    """Fraction of finished runs that diverged (None when there are none)."""
    done = finished(runs)
    if not done:
        return None
    return sum(r["status"] == "diverged" for r in done) / len(done)


def divergence_by_lr(runs: Sequence[Run]) -> dict[float, float]:
    """Divergence rate at each learning rate."""
    return {lr: divergence_rate(rs) or 0.0 for lr, rs in _by_lr(runs).items()}


def metric_by_lr(runs: Sequence[Run], confidence: float = 0.95) -> dict[float, MeanCI]:
    """Final metric mean ± CI over the seeds that did not diverge, at each learning rate."""
    out = {}
    for lr, rs in _by_lr(runs).items():
        values = [r.get("final_metric") for r in rs if r["status"] == "done"]
        out[lr] = mean_ci([v for v in values if v is not None], confidence)
    return out


def loss_ci_by_lr(runs: Sequence[Run], confidence: float = 0.95) -> dict[float, MeanCI]:
    """Clipped loss mean ± CI over seeds, at each learning rate."""
    group0 = _loss0(finished(runs))
    return {
        lr: mean_ci([clipped_loss(r, initial_loss(r) or group0) for r in rs], confidence)
        for lr, rs in _by_lr(runs).items()
    }


# ------------------------------------------------------------------------------ max logits


def row_max_logit(row: Mapping[str, Any]) -> float | None:
    """The largest |logit| in a history row, over every ``*max*logit*`` entry and layer.

    Values may be numbers, or lists / dicts of per-layer (or per-head) numbers.
    """
    found = [
        x for key, value in row.items() if "max" in key and "logit" in key for x in _numbers(value)
    ]
    return max(found) if found else None


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [abs(float(value))] if math.isfinite(value) else []
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


def max_logit_curve(run: Run) -> list[tuple[int, float]]:
    """(step, max |logit| over layers) for every history row that has the statistic."""
    out = []
    for row in run.get("history") or []:
        value = row_max_logit(row)
        if value is not None and row.get("step") is not None:
            out.append((int(row["step"]), value))
    return out


def max_logit_curves(runs: Sequence[Run]) -> dict[float, list[tuple[int, float]]]:
    """Per LR: the mean over seeds of the max-logit curve, at the steps every seed logged.

    A diverged run's curve stops where its history stops, so late steps of a diverging LR
    show the seeds that survived; use :func:`max_logit_curve` for single runs.
    """
    out = {}
    for lr, rs in _by_lr(runs).items():
        curves = [dict(max_logit_curve(r)) for r in rs]
        curves = [c for c in curves if c]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        out[lr] = [(s, sum(c[s] for c in curves) / len(curves)) for s in steps]
    return out


def layer_curves(run: Run, stat: str = "max_abs_logit") -> dict[int, list[tuple[int, float]]]:
    """Per layer: (step, value) of a per-layer statistic from the rows' ``layers`` lists."""
    out: dict[int, list[tuple[int, float]]] = {}
    for row in run.get("history") or []:
        for i, layer in enumerate(row.get("layers") or []):
            value = layer.get(stat)
            if value is not None and math.isfinite(value):
                out.setdefault(i, []).append((int(row["step"]), float(value)))
    return out


def peak_max_logit(run: Run) -> float | None:
    """The largest max-logit value the run logged (None if it logged none)."""
    curve = max_logit_curve(run)
    return max(v for _, v in curve) if curve else None


# ------------------------------------------------------------------------------ summary


@dataclass
class GroupSummary:
    """The per-score numbers for one group of runs (one score × the other ``by`` fields)."""

    key: tuple[Any, ...]
    group: str
    runs: int
    lrs: list[float]
    best_loss: float
    best_lr: float
    lr_sensitivity: float
    lr_sensitivity_ci: MeanCI
    stable_lrs: list[float]
    stable_lr_range: tuple[float, float] | None
    divergence_rate: float
    best_lr_metric: MeanCI
    max_logit: float | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (MeanCI as dicts)."""
        return asdict(self)


def summarize_group(key: tuple[Any, ...], runs: Sequence[Run]) -> GroupSummary:
    """Every per-score number for one group of finished runs."""
    best, best_lr = best_loss(runs)
    logits = [v for v in (peak_max_logit(r) for r in runs) if v is not None]
    return GroupSummary(
        key=key,
        group=str(key[-1]),
        runs=len(runs),
        lrs=list(_by_lr(runs)),
        best_loss=best,
        best_lr=best_lr,
        lr_sensitivity=lr_sensitivity(runs),
        lr_sensitivity_ci=mean_ci(lr_sensitivity_by_seed(runs)),
        stable_lrs=stable_lrs(runs),
        stable_lr_range=stable_lr_range(runs),
        divergence_rate=divergence_rate(runs) or 0.0,
        best_lr_metric=metric_by_lr(runs)[best_lr],
        max_logit=max(logits) if logits else None,
    )


def summarize(runs: Iterable[Run], by: Sequence[str] = ("task", "d_model")) -> list[GroupSummary]:
    """One :class:`GroupSummary` per group of :func:`group_runs` (by config fields, then score)."""
    return [summarize_group(k, rs) for k, rs in group_runs(runs, by).items()]
