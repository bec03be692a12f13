"""attnscale.integrations.alarm: the rate rules on synthetic histories, every rule recorded."""

from __future__ import annotations

import math

import pytest

from attnscale.integrations.alarm import RULES, AttentionAlarm, HealthThresholds, slope
from attnscale.integrations.health import head_scalars

RATES = HealthThresholds(max_logit=1e4, entropy_floor=0.0, growth_rate=0.02, growth_floor=20.0,
                         growth_window=50, entropy_rate=0.0)


def feed(alarm: AttentionAlarm, history, every: int = 5) -> None:
    """history(step) -> (max |logit|, entropy / ln n) of one layer "L", sampled every ``every``."""
    for step in range(0, 2000, every):
        logit, entropy = history(step)
        alarm.update(step, {"L/max_abs_logit": logit, "L/entropy_normalized": entropy})


def test_slope_is_least_squares():
    assert slope([(0, 1.0), (1, 3.0), (2, 5.0)]) == pytest.approx(2.0)
    assert slope([(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)]) == pytest.approx(0.2)
    assert math.isnan(slope([(3, 1.0)])) and math.isnan(slope([(3, 1.0), (3, 2.0)]))


@pytest.mark.parametrize("rate", [0.03, 0.05, 0.1])
def test_an_exponentially_growing_logit_fires_long_before_it_crosses_1e4(rate):
    """x_t = 20·e^{r t}: the growth rule fires once x reaches its floor and the slope is
    measured (2 samples), i.e. ln(1e4/20)/r − 5 steps before the crossing of 1e4; the level
    rule fires at the crossing."""
    alarm = AttentionAlarm(RATES, warn=False)
    feed(alarm, lambda t: (20.0 * math.exp(rate * t), 0.5))
    cross = min(t for t in range(0, 2000, 5) if 20.0 * math.exp(rate * t) > 1e4)
    assert alarm.rule_steps["logit_growth"] == 5  # the first step with a slope
    assert alarm.rule_steps["max_logit"] == cross
    assert cross - alarm.first_step == cross - 5 >= math.log(500) / rate - 10
    # every sampled step from the first firing on is recorded, for both rules
    growth = [e.step for e in alarm.events if e.rule == "logit_growth"]
    assert growth == list(range(5, 2000, 5))
    assert all(e.value == pytest.approx(rate) for e in alarm.events if e.rule == "logit_growth")


def test_growth_below_the_rate_or_the_floor_does_not_fire():
    slow = AttentionAlarm(RATES, warn=False)
    feed(slow, lambda t: (20.0 * math.exp(0.01 * t), 0.5))  # half the rate
    assert "logit_growth" not in slow.rule_steps
    small = AttentionAlarm(RATES, warn=False)
    feed(small, lambda t: (min(19.0, 0.01 * math.exp(0.1 * t)), 0.5))  # fast, under the floor
    assert small.events == []


def test_a_flat_healthy_history_never_fires_with_the_defaults():
    alarm = AttentionAlarm(warn=False)
    feed(alarm, lambda t: (12.0 + 3.0 * math.sin(t / 7.0), 0.6 + 0.05 * math.cos(t / 11.0)))
    assert alarm.events == [] and alarm.first_step is None


def test_the_default_growth_rule_leads_the_1e4_crossing():
    """With the shipped defaults (rate 0.15/step from max |logit| 20) a logit growing e-fold
    every 5 steps (0.2/step) raises the alarm at the first sample past 20 (step 15), 35 steps
    before it passes 1e4; one growing at 0.1/step is left to the 1e4 level rule."""
    fast = AttentionAlarm(warn=False)
    feed(fast, lambda t: (math.exp(0.2 * t), 0.5))
    cross = min(t for t in range(0, 2000, 5) if math.exp(0.2 * t) > 1e4)
    assert fast.first_step == 15 and cross - fast.first_step == 35
    slow = AttentionAlarm(warn=False)
    feed(slow, lambda t: (math.exp(0.1 * t), 0.5))
    assert slow.rule_steps == {"max_logit": min(t for t in range(0, 2000, 5)
                                                if math.exp(0.1 * t) > 1e4)}


def test_entropy_drop_fires_on_a_fast_fall_only():
    t = HealthThresholds(entropy_floor=0.0, growth_rate=0.0, entropy_rate=0.01, growth_window=25)
    fast = AttentionAlarm(t, warn=False)
    feed(fast, lambda s: (5.0, max(0.02, 1.0 - 0.02 * s)))
    assert fast.rule_steps == {"entropy_drop": 5}
    slow = AttentionAlarm(t, warn=False)
    feed(slow, lambda s: (5.0, max(0.02, 1.0 - 0.002 * s)))
    assert slow.events == []


def test_rate_rules_use_only_the_window():
    """A burst of growth long ago does not keep firing: only samples in (t − window, t]."""
    alarm = AttentionAlarm(RATES, warn=False)
    feed(alarm, lambda t: (20.0 * math.exp(0.1 * min(t, 100)), 0.5))  # flat after step 100
    growth = [e.step for e in alarm.events if e.rule == "logit_growth"]
    assert growth and max(growth) < 150


def test_counts_and_reset_cover_every_rule():
    alarm = AttentionAlarm(RATES, warn=False)
    feed(alarm, lambda t: (20.0 * math.exp(0.05 * t), 0.5))
    counts = alarm.counts()
    assert set(counts) == set(RULES) and counts["logit_growth"] > counts["max_logit"] > 0
    alarm.reset()
    assert alarm.events == [] and alarm.counts() == dict.fromkeys(RULES, 0)
    alarm.update(0, {"L/max_abs_logit": 50.0})
    assert alarm.events == []  # no slope from the forgotten samples


def test_head_scalars():
    assert head_scalars({"enc.0": [1.0, 7.5]}, prefix="a") == {
        "a/enc.0/max_abs_logit_head0": 1.0, "a/enc.0/max_abs_logit_head1": 7.5}
    with pytest.raises(TypeError, match="per_head"):
        head_scalars([1.0])
    with pytest.raises(ValueError, match="prefix"):
        head_scalars({}, prefix="")
    alarm = AttentionAlarm(RATES, warn=False)  # per-head keys are not read twice
    assert alarm.update(3, {"L/max_abs_logit_head0": 1e9}) == []


def test_sampling_sparser_than_the_window_uses_the_last_two_samples():
    """every_n_steps 50 with a 25-step window: the slope comes from consecutive samples, so
    the rate rule still works at the callback's default sampling."""
    alarm = AttentionAlarm(HealthThresholds(growth_rate=0.02, growth_floor=20.0,
                                            growth_window=25, entropy_floor=0.0), warn=False)
    feed(alarm, lambda t: (20.0 * math.exp(0.05 * t), 0.5), every=50)
    assert alarm.rule_steps["logit_growth"] == 50
    assert alarm.events[0].value == pytest.approx(0.05)
