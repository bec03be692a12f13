"""The attention alarm: rules on levels and on growth rates of per-layer attention statistics,
each recorded every time it holds. Pure Python: no framework, no tensors; it reads the flat
``{"layer/statistic": float}`` dict of :meth:`attnscale.measure.monitor.Monitor.flat_stats` (or
the prefixed one of :func:`attnscale.integrations.health.health_scalars`) at sampled steps.

The rules, per layer, at a sampled step t (:class:`HealthThresholds` holds their parameters):

* ``nonfinite``: a logit is NaN or ±inf (``nonfinite_fraction`` > 0), always on.
* ``max_logit``: max |logit| x_t > ``max_logit`` (or not finite). Wortsman et al. 2023
  (arXiv:2309.14322) see it near 1e4 before attention-logit divergence; Dehghani et al. 2023
  (arXiv:2302.05442) report the same failure at scale.
* ``logit_growth``: x_t ≥ ``growth_floor`` and the least-squares slope r of ln x over the
  layer's samples in (t − ``growth_window``, t] (at least this one and the one before) is
  ≥ ``growth_rate`` per step: the logit grows
  exponentially, and at that rate crosses a level X after (ln X − ln x_t)/r more steps. A level
  rule only fires once the level is reached; a rate rule fires while the logit is still small.
* ``entropy_floor``: entropy / ln n < ``entropy_floor`` (the entropy collapse of Zhai et al.
  2023, arXiv:2303.06296).
* ``entropy_drop``: the least-squares slope of entropy / ln n over the same window is
  ≤ −``entropy_rate`` per step: attention sharpening fast, before it has collapsed.
* ``frozen``: a head's logit std s > ``frozen_factor``·s_c, s_c = √(2 ln n) (:func:`is_frozen`),
  the criterion ``attnscale check`` flags a head ``frozen`` by
  (:mod:`attnscale.integrations.checkup`, at 23·s_c, where i.i.d. Gaussian rows are one-hot in
  float32). A level rule on attention that is already frozen: the growth rule needs growth
  inside its window, which a run that froze before the first sample never shows. The alarm's
  factor is :data:`ALARM_FROZEN_FACTOR` (60), not check's 23: on the training batches of the
  alarm zoo's causal models, heads of healthy runs reach 23–56·s_c (their entropy / ln n still
  0.04–0.11: the std is pooled over rows, so it counts the spread of row means, which the
  softmax ignores; their rows' own std is well below it), and 60
  is the smallest factor of a grid that keeps the tuning seeds' false alarms within budget
  (docs/alarm.md). It reads each head's ``logit_std_head{h}`` (or, without them, the layer's
  ``logit_std``, the row-weighted mean over heads, which can only fire later) and the layer's
  ``entropy_uniform`` (mean ln n_i).

Every rule is checked at every update and every one that holds is an :class:`AlarmEvent`
(:attr:`AttentionAlarm.events`); the warning is issued once per (layer, rule). The defaults were
chosen on the tuning seeds of a zoo of byte-level GPTs (:mod:`attnscale.lab.runzoo`,
``benchmarks/alarm_zoo.py``), and reported on other seeds.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from attnscale.util.validate import check_float, check_int

__all__ = ["ALARM_FROZEN_FACTOR", "ALARM_STATISTICS", "ONE_HOT_FACTOR", "RULES", "AlarmEvent",
           "AttentionAlarm", "AttentionHealthWarning", "HealthThresholds", "critical_std",
           "frozen_limit", "is_frozen", "slope", "split_key"]

ALARM_STATISTICS = ("nonfinite_fraction", "max_abs_logit", "entropy_normalized", "logit_std",
                    "entropy_uniform")
RULES = ("nonfinite", "max_logit", "logit_growth", "entropy_floor", "entropy_drop", "frozen")
RULE_STATISTIC = {"nonfinite": "nonfinite_fraction", "max_logit": "max_abs_logit",
                  "logit_growth": "max_abs_logit", "entropy_floor": "entropy_normalized",
                  "entropy_drop": "entropy_normalized", "frozen": "logit_std"}
HEAD_STD = re.compile(r"logit_std_head([0-9]+)")  # a head's logit std, "layer/logit_std_head3"

# s/s_c at which the median row's top-two logit gap, ln 2 · s/s_c, reaches ln(1/ε) of float32
# (23 ln 2): the row is one-hot to machine precision (is_frozen)
ONE_HOT_FACTOR = 23.0
# the alarm's frozen factor: the smallest of benchmarks/alarm_zoo.py's FROZEN_FACTORS whose false
# alarms on the tuning seeds stay within the tuning's 2.5% budget (module docstring)
ALARM_FROZEN_FACTOR = 60.0


class AttentionHealthWarning(RuntimeWarning):
    """Issued once per (layer, rule) when :class:`AttentionAlarm` fires. A category of its own,
    so a run can ignore it or make it fatal:
    ``warnings.simplefilter("error", AttentionHealthWarning)``."""


def split_key(key: str) -> tuple[str, str]:
    """("layer", "statistic") of a flat key "layer/statistic" (layer names may hold "/")."""
    layer, sep, stat = key.rpartition("/")
    if not sep or not layer or not stat:
        raise ValueError(f"stats keys must look like 'layer/statistic', got {key!r}")
    return layer, stat


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope b of y ≈ a + b·x over ``points`` [(x, y), ...]:
    b = Σ(x − x̄)(y − ȳ) / Σ(x − x̄)²; NaN with fewer than 2 distinct x."""
    n = len(points)
    if n < 2:
        return math.nan
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return math.nan
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def critical_std(log_n: float | None) -> float:
    """s_c = √(2 ln n) for a head whose rows see on average ln n = ``log_n`` keys (in nats):
    the freezing point of the softmax of n i.i.d. Gaussian logits, Derrida's Random Energy
    Model (Derrida 1981; :func:`attnscale.measure.theory.rem_critical_scale`). ln n below 0
    counts as 0; None (a NaN after a JSON round trip) and NaN give NaN."""
    log_n = math.nan if log_n is None else float(log_n)
    return math.sqrt(2.0 * max(log_n, 0.0)) if not math.isnan(log_n) else math.nan


def frozen_limit(log_n: float | None, factor: float = ONE_HOT_FACTOR) -> float:
    """factor · s_c, s_c = :func:`critical_std` (``log_n``): the logit std past which a head is
    frozen (:func:`is_frozen`)."""
    return factor * critical_std(log_n)


def is_frozen(std: float | None, log_n: float | None, factor: float = ONE_HOT_FACTOR) -> bool:
    """Whether a head of logit std ``std`` whose rows see on average ln n = ``log_n`` keys is
    frozen: ln n > 0 and s > factor·√(2 ln n). The one criterion of ``attnscale check``'s
    ``frozen`` flag and the alarm's ``frozen`` rule.

    Why 23 (:data:`ONE_HOT_FACTOR`): the gap between a row's two largest logits tends to
    (s/s_c) times a standard exponential (extreme-value theory: the top of n Gaussians has
    Gumbel scale s/√(2 ln n)), so the median row's gap is about ln 2 · s/s_c and reaches
    ln(2²³) = 23 ln 2 at s/s_c = 23: the top weight rounds to 1 in float32, and the softmax's
    gradient p(1 − p) through it is 0. At the n of short inputs (10–128 keys) a Monte Carlo
    puts the median row one-hot at 19–21·s_c (tests/integrations/test_check_calibration.py),
    so 23 errs towards passing. Rows that see one key (ln n = 0) have no freezing point; a NaN,
    None or infinite std is not judged here (a non-finite logit is its own rule)."""
    if std is None or log_n is None:
        return False
    std, log_n = float(std), float(log_n)
    return math.isfinite(std) and log_n > 0 and std > frozen_limit(log_n, factor)


@dataclass(frozen=True)
class HealthThresholds:
    """When :class:`AttentionAlarm` fires for a layer (the module docstring gives each rule).
    It always fires when a logit is NaN or ±inf, whatever the thresholds.

    Args:
        max_logit: level rule on max |logit|. 1e4 is where Wortsman et al. 2023
            (arXiv:2309.14322, Fig. 1) find attention logits before the loss diverges.
        entropy_floor: level rule on entropy / ln n; 0 switches it off. At H = 0.1·ln n a row
            spreads its weight over e^H = n^0.1 keys, under 2 for n up to 1024.
        growth_rate: the slope of ln max|logit| per step that fires ``logit_growth``; 0 off.
            0.02 per step is a factor e every 50 steps, 1e4 reached from 100 in 230 steps.
        growth_floor: ``logit_growth`` needs max |logit| at least this (at initialisation
            logits near 0 grow fast in relative terms without harm).
        growth_window: the steps over which both slopes are fitted (the samples in
            (t − window, t]; when sampling is sparser, the last two samples).
        entropy_rate: fire ``entropy_drop`` when entropy / ln n falls faster than this per step
            (slope ≤ −entropy_rate); 0 off.
        frozen_factor: fire ``frozen`` when a head's logit std exceeds this many times
            s_c = √(2 ln n) (:func:`is_frozen`); 0 off. 60 (:data:`ALARM_FROZEN_FACTOR`),
            chosen on the tuning seeds; ``attnscale check`` flags a finished checkpoint's head
            at 23 (:data:`ONE_HOT_FACTOR`), which healthy training batches cross
            (docs/alarm.md has the record).

    The defaults come from the tuning seeds of the zoo of ``benchmarks/alarm_zoo.py``.
    """

    max_logit: float = 1e4
    entropy_floor: float = 0.0
    growth_rate: float = 0.15
    growth_floor: float = 20.0
    growth_window: int = 25
    entropy_rate: float = 0.0
    frozen_factor: float = ALARM_FROZEN_FACTOR

    def __post_init__(self) -> None:
        check_float("max_logit", self.max_logit, low=0.0)
        check_float("entropy_floor", self.entropy_floor, low=0.0, high=1.0, low_inclusive=True)
        check_float("growth_rate", self.growth_rate, low=0.0, low_inclusive=True)
        check_float("growth_floor", self.growth_floor, low=0.0, low_inclusive=True)
        check_int("growth_window", self.growth_window, minimum=1)
        check_float("entropy_rate", self.entropy_rate, low=0.0, low_inclusive=True)
        check_float("frozen_factor", self.frozen_factor, low=0.0, low_inclusive=True)


@dataclass(frozen=True)
class AlarmEvent:
    """One rule holding for one layer at ``step``: ``statistic`` is the statistic the rule reads,
    ``value`` the level (or, for a rate rule, the slope per step) that broke ``threshold``
    (0 for nonfinite). ``rule`` is one of :data:`RULES`."""

    step: int
    layer: str
    statistic: str
    value: float
    threshold: float
    rule: str = ""

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


class AttentionAlarm:
    """Watches per-layer statistics at sampled steps and records every rule each time it holds
    (the module docstring lists the rules).

    Each (layer, rule) warns once through :func:`warnings.warn` with
    :class:`AttentionHealthWarning`: the caller can filter it or make it an error
    (``warnings.simplefilter``), pytest captures it, and it shows in a script by default.

    Args:
        thresholds: a :class:`HealthThresholds` (default: its defaults).
        warn: issue the warnings (False: record only).
        max_events: how many events to keep per (layer, rule), the first ones: a rule that
            holds for the rest of a long run costs no more memory; :meth:`counts` still counts
            every firing, and :attr:`dropped` how many events were not kept.

    State: :attr:`events` (every firing, up to ``max_events`` per (layer, rule)), :attr:`fired`
    ({layer: first step any rule fired}),
    :attr:`rule_steps` ({rule: first step it fired}), :attr:`first_step`.
    """

    def __init__(self, thresholds: HealthThresholds | None = None, warn: bool = True,
                 max_events: int = 1000) -> None:
        if thresholds is None:
            thresholds = HealthThresholds()
        if not isinstance(thresholds, HealthThresholds):
            raise TypeError(f"thresholds must be a HealthThresholds, got "
                            f"{type(thresholds).__name__}")
        if not isinstance(warn, bool):
            raise TypeError(f"warn must be a bool, got {type(warn).__name__}")
        self.thresholds = thresholds
        self.warn = warn
        self.max_events = check_int("max_events", max_events, minimum=1)
        self.dropped = 0
        self._counts: Counter[tuple[str, str]] = Counter()
        self.fired: dict[str, int] = {}
        self.rule_steps: dict[str, int] = {}
        self.events: list[AlarmEvent] = []
        self._warned: set[tuple[str, str]] = set()
        self._history: dict[str, list[tuple[int, float, float]]] = {}

    def update(self, step: int, stats: Mapping[str, float]) -> list[AlarmEvent]:
        """Check one measurement at ``step``; ``stats`` is ``{"layer/statistic": float}``
        (:meth:`Monitor.flat_stats`, or :func:`health_scalars` keys, whose prefix is part of
        the layer name). Returns every event of this step: each rule that holds, per layer."""
        step = check_int("step", step, minimum=0)
        if not isinstance(stats, Mapping):
            raise TypeError(f"stats must be a mapping 'layer/statistic' -> float, got "
                            f"{type(stats).__name__}")
        layers: dict[str, dict[str, float]] = {}
        heads: dict[str, dict[int, float]] = {}
        for key, value in stats.items():
            layer, stat = split_key(key)
            if stat in ALARM_STATISTICS:
                layers.setdefault(layer, {})[stat] = float(value)
            elif stat.startswith("logit_std_head") and (head := HEAD_STD.fullmatch(stat)):
                layers.setdefault(layer, {})
                heads.setdefault(layer, {})[int(head[1])] = float(value)
        new = []
        for layer, values in layers.items():
            events = self._check(step, layer, values)
            events += self._frozen(step, layer, values, heads.get(layer, {}))
            for event in events:
                self._record(event)
                new.append(event)
        return new

    def _record(self, event: AlarmEvent) -> None:
        self.fired.setdefault(event.layer, event.step)
        self.rule_steps.setdefault(event.rule, event.step)
        key = (event.layer, event.rule)
        self._counts[key] += 1
        if self._counts[key] <= self.max_events:
            self.events.append(event)
        else:
            self.dropped += 1
        if self.warn and (event.layer, event.rule) not in self._warned:
            self._warned.add((event.layer, event.rule))
            warnings.warn(_message(event), AttentionHealthWarning, stacklevel=3)

    def _window(self, step: int, layer: str, values: Mapping[str, float]
                ) -> list[tuple[int, float, float]]:
        """The layer's samples in (step − growth_window, step], this one included, or this one
        and the one before it when the window holds no other (sampling sparser than the
        window): (step, ln max|logit| or NaN, entropy / ln n or NaN)."""
        logit = values.get("max_abs_logit", math.nan)
        log_x = math.log(logit) if math.isfinite(logit) and logit > 0 else math.nan
        start = step - self.thresholds.growth_window
        earlier = [s for s in self._history.get(layer, []) if s[0] < step]
        kept = [s for s in earlier if s[0] > start] or earlier[-1:]
        kept.append((step, log_x, values.get("entropy_normalized", math.nan)))
        self._history[layer] = kept
        return kept

    def _check(self, step: int, layer: str, values: Mapping[str, float]) -> list[AlarmEvent]:
        """Every rule that holds for this layer's values now."""
        t, out = self.thresholds, []
        window = self._window(step, layer, values)
        nonfinite = values.get("nonfinite_fraction")
        if nonfinite is not None and nonfinite > 0:  # NaN (nothing scored) is not > 0
            out.append(AlarmEvent(step, layer, "nonfinite_fraction", nonfinite, 0.0, "nonfinite"))
        logit = values.get("max_abs_logit")
        if logit is not None and (not math.isfinite(logit) or logit > t.max_logit):
            out.append(AlarmEvent(step, layer, "max_abs_logit", logit, t.max_logit, "max_logit"))
        if t.growth_rate > 0 and logit is not None and math.isfinite(logit) \
                and logit >= t.growth_floor:
            rate = slope([(s, y) for s, y, _ in window if math.isfinite(y)])
            if rate >= t.growth_rate:  # NaN (too few samples) is not
                out.append(AlarmEvent(step, layer, "max_abs_logit", rate, t.growth_rate,
                                      "logit_growth"))
        entropy = values.get("entropy_normalized")
        if entropy is not None and entropy < t.entropy_floor:
            out.append(AlarmEvent(step, layer, "entropy_normalized", entropy, t.entropy_floor,
                                  "entropy_floor"))
        if t.entropy_rate > 0 and entropy is not None and math.isfinite(entropy):
            rate = slope([(s, e) for s, _, e in window if math.isfinite(e)])
            if rate <= -t.entropy_rate:
                out.append(AlarmEvent(step, layer, "entropy_normalized", rate, -t.entropy_rate,
                                      "entropy_drop"))
        return out

    def _frozen(self, step: int, layer: str, values: Mapping[str, float],
                heads: Mapping[int, float]) -> list[AlarmEvent]:
        """The ``frozen`` rule: the layer's stiffest head past ``frozen_factor``·s_c
        (:func:`is_frozen`); without per-head stds, the layer's mean ``logit_std``."""
        factor, log_n = self.thresholds.frozen_factor, values.get("entropy_uniform")
        if factor <= 0 or log_n is None:
            return []
        stds = {f"logit_std_head{h}": v for h, v in sorted(heads.items())}
        if not stds and "logit_std" in values:
            stds = {"logit_std": values["logit_std"]}
        frozen = {k: v for k, v in stds.items() if is_frozen(v, log_n, factor)}
        if not frozen:
            return []
        statistic = max(frozen, key=lambda k: frozen[k])
        return [AlarmEvent(step, layer, statistic, frozen[statistic],
                           frozen_limit(log_n, factor), "frozen")]

    @property
    def first_step(self) -> int | None:
        """The step of the first alarm, None if none fired."""
        return min(self.fired.values()) if self.fired else None

    def lead_time(self, diverged_step: int) -> int | None:
        """Steps from the first alarm to ``diverged_step`` (the step the loss diverged):
        ``diverged_step − first_step``; negative when the alarm came late, None when it never
        fired."""
        diverged_step = check_int("diverged_step", diverged_step, minimum=0)
        first = self.first_step
        return None if first is None else diverged_step - first

    def counts(self) -> dict[str, int]:
        """{rule: how many (step, layer) events it produced}, every rule of :data:`RULES`
        (kept in :attr:`events` or not)."""
        out = dict.fromkeys(RULES, 0)
        for (_, rule), n in self._counts.items():
            out[rule] += n
        return out

    def reset(self) -> None:
        """Forget every alarm and every sample (a new run)."""
        self.fired.clear()
        self.rule_steps.clear()
        self.events.clear()
        self._counts.clear()
        self.dropped = 0
        self._warned.clear()
        self._history.clear()


def _message(event: AlarmEvent) -> str:
    if event.rule == "nonfinite":
        what = f"attention logits not finite ({event.value:.3g} of them NaN or ±inf)"
    elif event.rule == "max_logit" and not math.isfinite(event.value):
        what = f"attention logits not finite (max |logit| {event.value})"
    elif event.rule == "max_logit":
        what = f"max |attention logit| {event.value:.4g} > {event.threshold:.4g}"
    elif event.rule == "logit_growth":
        what = (f"max |attention logit| {_growth_text(event.value)} "
                f"(slope of ln {event.value:.3g}/step ≥ {event.threshold:.3g})")
    elif event.rule == "frozen":
        where = event.statistic.removeprefix("logit_std")
        which = f"head {where.removeprefix('_head')}" if where else "mean over heads"
        what = (f"attention frozen: logit std {event.value:.4g} ({which}) > {event.threshold:.4g}"
                f" (frozen_factor × s_c, s_c = √(2 ln n) the softmax's freezing scale): the "
                f"head's weight sits on one key per row, whose softmax passes almost no gradient")
    elif event.rule == "entropy_drop":
        what = f"attention entropy / ln n falling {-event.value:.3g}/step (sharpening fast)"
    else:
        what = f"attention entropy / ln n {event.value:.3g} < {event.threshold:.3g} (collapse)"
    return (f"attention health alarm at step {event.step}, layer {event.layer}: {what}; "
            f"rule {event.rule}, warned once per layer and rule")


def _growth_text(rate: float) -> str:
    """How fast a logit growing at ``rate`` (slope of ln x per step) grows, for a message: the
    factor e^r per step, and the doubling time ln 2 / r with one decimal while it is over one
    step (a rate ≥ ln 2 doubles within a step, and 1/r rounded to whole steps reads 0)."""
    try:
        factor = f"×{math.exp(rate):.3g} per step"
    except OverflowError:
        factor = f"×e^{rate:.3g} per step"
    if 0 < rate < math.log(2):
        return f"growing {factor}, doubling every {math.log(2) / rate:.1f} steps"
    return f"growing {factor}"
