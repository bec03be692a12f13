"""The alarm's ``frozen`` level rule (one criterion with ``attnscale check``) and its messages."""

from __future__ import annotations

import math
import re
import warnings

import pytest

from attnscale.integrations import checkup as C
from attnscale.integrations.alarm import (
    ALARM_FROZEN_FACTOR,
    ONE_HOT_FACTOR,
    AttentionAlarm,
    AttentionHealthWarning,
    HealthThresholds,
    critical_std,
    frozen_limit,
    is_frozen,
)

LOG_N = math.log(64)  # s_c = √(2 ln 64) = 2.884; 23·s_c = 66.3, 60·s_c = 173
LIMIT = ONE_HOT_FACTOR * math.sqrt(2 * LOG_N)  # check's
ALARM_LIMIT = ALARM_FROZEN_FACTOR * math.sqrt(2 * LOG_N)  # the alarm's default
AT_23 = HealthThresholds(max_logit=1e9, frozen_factor=ONE_HOT_FACTOR)


def stats(*head_stds: float, log_n: float = LOG_N, layer: str = "L") -> dict[str, float]:
    """One layer at a plateau: a large but flat max |logit| (no growth), the given head stds."""
    out = {f"{layer}/max_abs_logit": 4000.0, f"{layer}/entropy_normalized": 0.01,
           f"{layer}/entropy_uniform": log_n,
           f"{layer}/logit_std": sum(head_stds) / len(head_stds)}
    out.update({f"{layer}/logit_std_head{h}": s for h, s in enumerate(head_stds)})
    return out


def test_the_criterion_is_check_s():
    assert critical_std(LOG_N) == pytest.approx(math.sqrt(2 * LOG_N))
    assert frozen_limit(LOG_N) == pytest.approx(LIMIT)
    assert C.critical_std is critical_std and C.ONE_HOT_FACTOR == ONE_HOT_FACTOR == 23.0
    assert is_frozen(LIMIT * 1.001, LOG_N) and not is_frozen(LIMIT * 0.999, LOG_N)
    # what it leaves alone: one key per row, missing or non-finite values
    assert not is_frozen(1e9, 0.0) and not is_frozen(None, LOG_N) and not is_frozen(1e9, None)
    assert not is_frozen(math.inf, LOG_N) and not is_frozen(math.nan, LOG_N)
    assert math.isnan(critical_std(None)) and math.isnan(critical_std(math.nan))
    # check's flags() decides by the same function, on both sides of the limit
    for std, frozen in ((LIMIT * 1.001, True), (LIMIT * 0.999, False)):
        head = {"head": 0, "logit_std": std, "max_abs_logit": 10 * std,
                "entropy_uniform": LOG_N, "entropy_normalized": 0.01, "saturated_fraction": 0.9}
        kinds = [f.kind for f in C.flags({"layers": [{"layer": 0, "heads": [head]}]})]
        assert ("frozen" in kinds) is frozen
        assert is_frozen(std, LOG_N) is frozen


def test_a_run_frozen_before_its_first_sample_fires_at_that_sample():
    """The growth rule needs growth inside its window; a layer already frozen at the first
    sample (flat max |logit| 4000, no slope) fires ``frozen`` there, naming the head."""
    alarm = AttentionAlarm(warn=False)
    for step in (10, 20, 30):
        alarm.update(step, stats(3.0, 400.0))
    assert alarm.first_step == 10 and alarm.rule_steps == {"frozen": 10}  # no growth, < 1e4
    event = next(e for e in alarm.events if e.rule == "frozen")
    assert event.statistic == "logit_std_head1" and event.value == 400.0
    assert event.threshold == pytest.approx(ALARM_LIMIT)
    assert HealthThresholds().frozen_factor == ALARM_FROZEN_FACTOR == 60.0


def test_the_default_factor_stays_quiet_where_check_s_would_fire():
    """Healthy heads of the alarm zoo reach 23–56·s_c on training batches (docs/alarm.md):
    between check's 23 and the alarm's 60 only the opt-in factor fires."""
    between = stats(3.0, 45 * math.sqrt(2 * LOG_N))
    default = AttentionAlarm(HealthThresholds(max_logit=1e9), warn=False)
    default.update(5, between)
    assert default.events == []
    strict = AttentionAlarm(AT_23, warn=False)
    strict.update(5, between)
    assert strict.rule_steps == {"frozen": 5}


def test_one_frozen_head_is_enough_and_the_layer_mean_is_the_fallback():
    alarm = AttentionAlarm(AT_23, warn=False)
    alarm.update(5, stats(1.0, LIMIT * 1.5))  # the mean (0.75·LIMIT) would not fire
    assert alarm.rule_steps == {"frozen": 5}
    bare = {k: v for k, v in stats(1.0, LIMIT * 1.5).items() if "_head" not in k}
    fallback = AttentionAlarm(AT_23, warn=False)
    fallback.update(5, bare)
    assert fallback.events == []  # the mean over heads hides the head
    fallback.update(10, {**bare, "L/logit_std": LIMIT * 1.2})
    assert fallback.rule_steps == {"frozen": 10}
    assert fallback.events[0].statistic == "logit_std"


def test_frozen_factor_zero_switches_it_off_and_below_the_limit_is_silent():
    off = AttentionAlarm(HealthThresholds(max_logit=1e9, frozen_factor=0.0), warn=False)
    off.update(5, stats(1e6))
    assert off.events == []
    calm = AttentionAlarm(AT_23, warn=False)
    calm.update(5, stats(LIMIT * 0.9, 2.0))
    calm.update(5, stats(1e6, log_n=0.0))  # rows of one key: no freezing point
    assert calm.events == []
    with pytest.raises(ValueError, match="frozen_factor"):
        HealthThresholds(frozen_factor=-1.0)


def test_the_frozen_warning_names_layer_head_and_step():
    alarm = AttentionAlarm(HealthThresholds(max_logit=1e9))
    with pytest.warns(AttentionHealthWarning) as caught:
        alarm.update(10, stats(3.0, 400.0, layer="blocks.0.attn"))
    text = str(caught[0].message)
    assert "step 10" in text and "blocks.0.attn" in text and "head 1" in text
    assert "rule frozen" in text and "400" in text


@pytest.mark.parametrize("rate,expected", [
    (0.15, r"growing ×1\.16 per step, doubling every 4\.6 steps"),
    (0.5, r"growing ×1\.65 per step, doubling every 1\.4 steps"),
    (0.69, r"doubling every 1\.0 steps"),
    (1.0, r"growing ×2\.72 per step \("),
    (3.2, r"growing ×24\.5 per step \("),
    (713.8, r"growing ×e\^714 per step \("),  # e^r overflows a float
])
def test_the_growth_message_reads_at_every_rate(rate, expected):
    """The slope r of ln max|logit| per step, in words: the factor per step, and the doubling
    time while it is over a step (never "every 0 steps")."""
    alarm = AttentionAlarm(HealthThresholds(growth_rate=0.1, growth_floor=1.0, max_logit=1e308))
    start = 1e-300 if rate > 700 else 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alarm.update(0, {"L/max_abs_logit": start})
        alarm.update(1, {"L/max_abs_logit": math.exp(math.log(start) + rate)})
    text = " ".join(str(w.message) for w in caught)
    assert re.search(expected, text), text
    assert "every 0 steps" not in text
