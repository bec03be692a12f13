"""Sweep analysis: pure functions over runs, each a typed :class:`attnscale.lab.records.Run`
or a run dict from :meth:`attnscale.lab.store.Store.runs` (the ``attnscale results`` table reads
dicts; the audit reads records). :func:`column` and :func:`config_value` read either.

A run has at least ``status``, ``config`` (the resolved TrainConfig: ``score``, ``lr``,
``seed``, …), ``final_loss``, ``final_metric``, ``diverged_step``, optionally ``variant`` and,
for the loss at initialization and the logit curves, ``history`` (list of dicts with ``step``,
``loss`` and max-logit statistics). Only finished runs (``done`` / ``diverged``) are
measurements; queued, running and failed runs are ignored everywhere.

The learning-rate measures follow Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities" (arXiv 2309.14322, §3.2). For a run r trained at learning
rate η with seed s:

* L₀(r), the loss at initialization, is the run's own first logged loss (its first history
  row's ``loss``, else the store's ``initial_loss`` column); a run that recorded neither takes
  the mean L₀ of the runs it is analysed with;
* the *clipped loss* is c(r) = min(L_T(r), L₀(r)), and c(r) = L₀(r) when r diverged or has
  no finite final loss L_T(r);
* the loss at η is loss(η) = mean over seeds of c(r); the *best loss* is min_η loss(η);
* *LR sensitivity* = (1/|grid|) Σ_η [loss(η) − min_η' loss(η')];
* the *stable LRs* are those where no seed diverged and loss(η) < mean over seeds of L₀(r).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)

from attnscale.core.scores import SCORES
from attnscale.lab.store import FINISHED

if TYPE_CHECKING:
    from attnscale.lab.records import Run as Record

Run: TypeAlias = "Mapping[str, Any] | Record"
R = TypeVar("R", bound=Run)  # a record stays a record, a dict a dict


def column(run: Run, name: str) -> Any:
    """A run's column ``name`` (``status``, ``final_loss``, ``history``, …): a record's
    attribute, a dict's key (None when absent)."""
    return run.get(name) if isinstance(run, Mapping) else getattr(run, name)


def config_value(run: Run, key: str) -> Any:
    """Config field ``key`` by its flat name (``lr``, ``d_model``), as the stored dict holds it
    (None when absent)."""
    return (run.get("config") or {}).get(key) if isinstance(run, Mapping) else run.value(key)


def flat_config(run: Run) -> Mapping[str, Any]:
    """The run's config as the flat dict the store keeps."""
    return (run.get("config") or {}) if isinstance(run, Mapping) else run.flat_config


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

    def to_dict(self) -> dict[str, Any]:
        """``{"mean", "lo", "hi", "n"}``: the form the claim rules read."""
        return {"mean": self.mean, "lo": self.low, "hi": self.high, "n": self.n}

    def __str__(self) -> str:
        hw = self.half_width
        return f"{self.mean:.4g}" if hw is None else f"{self.mean:.4g} ± {hw:.2g}"


# ------------------------------------------------------------------------------ grouping


def finished(runs: Iterable[R]) -> list[R]:
    """The runs with status done or diverged."""
    return [r for r in runs if column(r, "status") in FINISHED]


def score_knobs(score: str) -> tuple[str, ...]:
    """The config fields that tell one variant of ``score`` from another: the registry's
    default parameters of the score, plus ``scale`` when the score uses it (none for a name
    the registry does not hold, such as a score registered only while its runs were made)."""
    sc = SCORES.get(score)
    if sc is None:
        return ()
    return (*sc.defaults, "scale") if sc.uses_scale else tuple(sc.defaults)


def score_label(config: Mapping[str, Any]) -> str:
    """The stable grouping key of a config's scoring: the score's name, its learned temperature
    mode (if any), then each knob of :func:`score_knobs` set to a value other than the
    registry's default, e.g. ``cosine tau=10``, ``cosine swin``, ``softcap cap=5 scale=0.5``.

    A knob is read from its config field, else from ``score_params``. The registry's ``label``
    is for display and never part of the key, so relabelling a score regroups nothing.
    """
    name = str(config.get("score", "?"))
    sc = SCORES.get(name)
    defaults = sc.defaults if sc is not None else {}
    extra = config.get("score_params") or {}
    parts = [name]
    if config.get("temperature") not in (None, "fixed"):
        parts.append(str(config["temperature"]))
    for knob in score_knobs(name):
        value = config.get(knob)
        value = extra.get(knob) if value is None else value
        if value is not None and value != defaults.get(knob):
            parts.append(f"{knob}={value:g}" if isinstance(value, float) else f"{knob}={value}")
    return " ".join(parts)


def group_key(run: Run) -> str:
    """The run's variant name if it has one, else :func:`score_label` of its config."""
    return column(run, "variant") or score_label(flat_config(run))


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
        k = (*(config_value(run, b) for b in by), key(run))
        out.setdefault(k, []).append(run)
    return out


# ------------------------------------------------------------------------------ statistics


def mean_ci(values: Iterable[float | None], confidence: float = 0.95) -> MeanCI:
    """Mean and Student-t confidence interval of ``values`` (None and non-finite dropped)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return MeanCI(math.nan, None, None, 0)
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return MeanCI(mean, None, None, len(xs))
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    hw = float(scipy.stats.t.ppf(0.5 + confidence / 2, len(xs) - 1)) * sd / math.sqrt(len(xs))
    return MeanCI(mean, mean - hw, mean + hw, len(xs))


def metric_ci(runs: Iterable[Run], missing: float = 0.0, confidence: float = 0.95) -> MeanCI:
    """Final metric mean ± CI over the finished runs; a run without one counts as ``missing``."""
    values = [column(r, "final_metric") for r in finished(runs)]
    return mean_ci([missing if v is None else v for v in values], confidence)


def initial_loss(run: Run) -> float | None:
    """L₀: the ``loss`` of the run's first history row, else the run's ``initial_loss``."""
    history = column(run, "history") or []
    loss = history[0].get("loss") if history else column(run, "initial_loss")
    return float(loss) if loss is not None and math.isfinite(loss) else None


def clipped_loss(run: Run, loss0: float) -> float:
    """min(L_T, L₀); L₀ for a diverged run or one without a finite final loss L_T."""
    loss = column(run, "final_loss")
    if column(run, "status") == "diverged" or loss is None or not math.isfinite(loss):
        return loss0
    return min(float(loss), loss0)


def _mean_loss0(runs: Sequence[Run]) -> float:
    values = [v for v in (initial_loss(r) for r in runs) if v is not None]
    if not values:
        raise ValueError("runs: no run has a loss at initialization (no history, no initial_loss)")
    return sum(values) / len(values)


def _loss0s(runs: Sequence[Run]) -> list[float]:
    """L₀ of each run, the group's mean L₀ for a run that recorded none."""
    own = [initial_loss(r) for r in runs]
    if all(v is not None for v in own):
        return own  # type: ignore[return-value]
    fallback = _mean_loss0(runs)
    return [fallback if v is None else v for v in own]


def _by_lr(runs: Iterable[Run]) -> dict[float, list[Run]]:
    out: dict[float, list[Run]] = defaultdict(list)
    for run in finished(runs):
        out[float(config_value(run, "lr"))].append(run)
    return dict(sorted(out.items()))


def clipped_losses_by_lr(runs: Sequence[Run]) -> dict[float, list[float]]:
    """Each finished run's clipped loss c(r), grouped by learning rate, LRs ascending."""
    done = finished(runs)
    loss0 = dict(zip(map(id, done), _loss0s(done), strict=True))
    return {lr: [clipped_loss(r, loss0[id(r)]) for r in rs] for lr, rs in _by_lr(done).items()}


def loss_by_lr(runs: Sequence[Run]) -> dict[float, float]:
    """loss(η): the mean clipped loss over seeds at each learning rate, LRs ascending."""
    return {lr: sum(cs) / len(cs) for lr, cs in clipped_losses_by_lr(runs).items()}


def loss_ci_by_lr(runs: Sequence[Run], confidence: float = 0.95) -> dict[float, MeanCI]:
    """Clipped loss mean ± CI over seeds, at each learning rate."""
    return {lr: mean_ci(cs, confidence) for lr, cs in clipped_losses_by_lr(runs).items()}


def best_loss(runs: Sequence[Run]) -> tuple[float, float]:
    """(best loss, the LR that gives it): the minimum of :func:`loss_by_lr`."""
    curve = loss_by_lr(runs)
    lr = min(curve, key=curve.__getitem__)
    return curve[lr], lr


def best_loss_ci(runs: Sequence[Run], confidence: float = 0.95) -> tuple[MeanCI, float]:
    """(clipped loss mean ± CI over seeds at the best LR, the best LR)."""
    _, lr = best_loss(runs)
    return loss_ci_by_lr(runs, confidence)[lr], lr


def lr_sensitivity(runs: Sequence[Run]) -> float:
    """Wortsman et al.'s LR sensitivity: mean over the LR grid of loss(η) − best loss."""
    curve = loss_by_lr(runs)
    best = min(curve.values())
    return sum(v - best for v in curve.values()) / len(curve)


def stable_lrs(runs: Sequence[Run]) -> list[float]:
    """LRs where no seed diverged and loss(η) is below the seeds' mean L₀."""
    done = finished(runs)
    loss0 = dict(zip(map(id, done), _loss0s(done), strict=True))
    curve = loss_by_lr(done)
    out = []
    for lr, rs in _by_lr(done).items():
        mean0 = sum(loss0[id(r)] for r in rs) / len(rs)
        if not any(column(r, "status") == "diverged" for r in rs) and curve[lr] < mean0:
            out.append(lr)
    return out


def divergence_rate(runs: Iterable[Run]) -> float | None:
    """Fraction of finished runs that diverged (None when there are none)."""
    done = finished(runs)
    if not done:
        return None
    return sum(column(r, "status") == "diverged" for r in done) / len(done)


def divergence_by_lr(runs: Sequence[Run]) -> dict[float, float]:
    """Divergence rate at each learning rate."""
    return {lr: divergence_rate(rs) or 0.0 for lr, rs in _by_lr(runs).items()}


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
    for row in column(run, "history") or []:
        value = row_max_logit(row)
        if value is not None and row.get("step") is not None:
            out.append((int(row["step"]), value))
    return out


def peak_max_logit(run: Run) -> float | None:
    """The largest max-logit value the run logged (None if it logged none)."""
    curve = max_logit_curve(run)
    return max(v for _, v in curve) if curve else None
