"""Whether a training run diverged, from its loss alone (never from attention statistics): the
label the alarm is scored against (``benchmarks/alarm_zoo.py``).

Inputs: the per-step training losses L_0 … L_{T−1} of the run and, optionally, those of a
*reference* run: the same model, data order and schedule at a learning rate known to train
healthily (in the zoo, the lowest LR of the grid, same seed, so both see the same batches).
With m_t the trailing mean of L over the ``window`` steps ending at t, a run diverged if any of:

1. **non-finite**: some L_t is NaN or ±inf. Onset: the first such t.
2. **blow-up**: L_t and the median of L over [t, t + ``confirm``) exceed b_t + ``jump``, b_t
   the lowest m_s with s < t (a sustained spike of ``jump`` nats above the best smoothed loss so
   far; one bad batch moves the median not at all). Onset: the first such t.
3. **stall**: the run ends well above the reference: the mean of its last ``tail`` losses is
   ≥ ``gap`` nats above the reference's over the same steps (a spike that plateaus, or a run
   that got stuck -- e.g. near the unigram loss once attention collapsed -- where a healthy run
   goes on learning). Onset: the first t with m_t − m_t(ref) ≥ ``gap``: the earliest step the
   run is that far behind, which makes lead times conservative (short).

The divergence step is the earliest onset among the criteria that hold. Criterion 3 reads
"worse than a healthy run on the same batches" as divergence, so it is meant for runs at LRs
at or above the reference's: a run at a lower LR can trail the reference by being slow.
Defaults: ``window`` 10, ``confirm`` 5, ``jump`` 0.5 nats, ``gap`` 0.25 nats, ``tail`` 30
steps. On the zoo's byte-level GPTs (``docs/alarm.md``) most stuck runs trail their reference
by 0.4–1.0 nats, but the two groups touch: the closest diverged runs trail by 0.26–0.29 and a
healthy one by 0.21, so labels near the cut depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from attnscale.util.validate import check_float, check_int

__all__ = ["Outcome", "label_run", "trailing_mean"]


@dataclass(frozen=True)
class Outcome:
    """The label of one run: ``diverged``, at ``step`` (the onset; None when healthy), and the
    criteria that held (``reasons``: "nonfinite", "blowup", "stall"), with ``final_gap`` the
    tail-mean loss minus the reference's (None without a reference or a finite tail)."""

    diverged: bool
    step: int | None
    reasons: tuple[str, ...]
    final_gap: float | None

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        return out


def trailing_mean(losses: Sequence[float], window: int) -> list[float]:
    """m_t = mean(L_{max(0, t−window+1)} … L_t) for every t (shorter windows at the start)."""
    window = check_int("window", window, minimum=1)
    out, total = [], 0.0
    for t, value in enumerate(losses):
        total += value
        if t >= window:
            total -= losses[t - window]
        out.append(total / min(t + 1, window))
    return out


def _floats(name: str, values: Sequence[float] | None) -> list[float] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of floats, got {type(values).__name__}")
    return [float(v) for v in values]


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def _blowup(losses: list[float], window: int, confirm: int, jump: float) -> int | None:
    smooth = trailing_mean(losses, window)
    best = math.inf
    for t in range(window, len(losses) - confirm + 1):
        best = min(best, smooth[t - 1])
        ahead = sorted(losses[t:t + confirm])
        if losses[t] > best + jump and _median(ahead) > best + jump:
            return t
    return None


def _stall(losses: list[float], reference: list[float], window: int, gap: float,
           tail: int) -> tuple[int | None, float | None]:
    n = min(len(losses), len(reference))
    if n < tail:
        return None, None
    final_gap = sum(losses[n - tail:n]) / tail - sum(reference[n - tail:n]) / tail
    if not final_gap >= gap:
        return None, final_gap
    run_m, ref_m = trailing_mean(losses[:n], window), trailing_mean(reference[:n], window)
    onset = next((t for t in range(n) if run_m[t] - ref_m[t] >= gap), n - 1)
    return onset, final_gap


def label_run(losses: Sequence[float], reference: Sequence[float] | None = None, *,
              window: int = 10, confirm: int = 5, jump: float = 0.5, gap: float = 0.25,
              tail: int = 30) -> Outcome:
    """Label a run by its per-step training ``losses`` (module docstring for the criteria);
    ``reference`` the per-step losses of a healthy run on the same batches (None: the stall
    criterion is not checked)."""
    run, ref = _floats("losses", losses), _floats("reference", reference)
    if not run:
        raise ValueError("losses must hold at least one loss")
    window = check_int("window", window, minimum=1)
    confirm = check_int("confirm", confirm, minimum=1)
    tail = check_int("tail", tail, minimum=1)
    jump = check_float("jump", jump, low=0.0)
    gap = check_float("gap", gap, low=0.0)
    onsets: dict[str, int] = {}
    bad = next((t for t, v in enumerate(run) if not math.isfinite(v)), None)
    if bad is not None:
        onsets["nonfinite"] = bad
    finite = run[:bad] if bad is not None else run
    blow = _blowup(finite, window, confirm, jump)
    if blow is not None:
        onsets["blowup"] = blow
    final_gap = None
    if ref is not None and bad is None and all(math.isfinite(v) for v in ref):
        stall, final_gap = _stall(run, ref, window, gap, tail)
        if stall is not None:
            onsets["stall"] = stall
    if not onsets:
        return Outcome(False, None, (), final_gap)
    return Outcome(True, min(onsets.values()), tuple(sorted(onsets, key=onsets.get)), final_gap)
