"""attnscale.integrations.health: the logged statistics, the alarm, the divergence test."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnscale.integrations.health import (
    HEALTH_STATISTICS,
    AttentionAlarm,
    AttentionHealthWarning,
    HealthThresholds,
    LossDivergence,
    health_scalars,
    split_key,
)
from attnscale.measure.stats import STATISTICS


def layer_stats(layer: str, logit: float = 5.0, entropy: float = 0.6) -> dict[str, float]:
    return {f"{layer}/max_abs_logit": logit, f"{layer}/entropy_normalized": entropy,
            f"{layer}/logit_std": 1.0, f"{layer}/rows": 10.0}


def test_health_statistics_are_monitor_statistics():
    """Every logged statistic is one the monitor computes (z-loss included)."""
    assert set(HEALTH_STATISTICS) <= set(STATISTICS)
    assert "z_loss" in HEALTH_STATISTICS and "nonfinite_fraction" in HEALTH_STATISTICS


def test_health_scalars_select_and_prefix():
    flat = {**layer_stats("enc.0"), "enc.0/z_loss": 3.0, "enc.1/saturated_fraction": 0.5}
    out = health_scalars(flat, prefix="attn")
    assert out == {"attn/enc.0/max_abs_logit": 5.0, "attn/enc.0/entropy_normalized": 0.6,
                   "attn/enc.0/logit_std": 1.0, "attn/enc.0/z_loss": 3.0,
                   "attn/enc.1/saturated_fraction": 0.5}
    assert "attn/enc.0/rows" not in out


@pytest.mark.parametrize("prefix, error", [("", ValueError), ("/a", ValueError),
                                           ("a/", ValueError), (3, TypeError)])
def test_health_scalars_validate_prefix(prefix, error):
    with pytest.raises(error, match="prefix"):
        health_scalars({}, prefix=prefix)


def test_health_scalars_validate_flat():
    with pytest.raises(TypeError, match="flat"):
        health_scalars([("a/b", 1.0)])
    with pytest.raises(ValueError, match="layer/statistic"):
        health_scalars({"no_slash": 1.0})


def test_split_key_keeps_slashes_in_layer_names():
    assert split_key("attention/enc.0/max_abs_logit") == ("attention/enc.0", "max_abs_logit")


LEVELS = HealthThresholds(max_logit=1e4, entropy_floor=0.1, growth_rate=0.0, entropy_rate=0.0)


def test_thresholds_validate():
    with pytest.raises(ValueError, match="max_logit"):
        HealthThresholds(max_logit=0.0)
    with pytest.raises(ValueError, match="max_logit"):
        HealthThresholds(max_logit=math.inf)
    with pytest.raises(TypeError, match="max_logit"):
        HealthThresholds(max_logit="1e4")
    with pytest.raises(ValueError, match="entropy_floor"):
        HealthThresholds(entropy_floor=1.5)
    for name in ("growth_rate", "growth_floor", "entropy_rate"):
        with pytest.raises(ValueError, match=name):
            HealthThresholds(**{name: -0.1})
    with pytest.raises(ValueError, match="growth_window"):
        HealthThresholds(growth_window=0)
    HealthThresholds(entropy_floor=0.0, growth_rate=0.0, entropy_rate=0.0)  # 0 switches off


def test_level_rule_warns_once_per_layer_and_rule_but_records_every_step():
    alarm = AttentionAlarm(LEVELS)
    assert alarm.update(10, {**layer_stats("a"), **layer_stats("b")}) == []
    with pytest.warns(AttentionHealthWarning, match=r"step 20, layer a: max \|attention logit"):
        events = alarm.update(20, {**layer_stats("a", logit=2e4), **layer_stats("b")})
    assert [(e.step, e.layer, e.statistic, e.value, e.rule) for e in events] == [
        (20, "a", "max_abs_logit", 2e4, "max_logit")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning for (a, max_logit) would raise here
        again = alarm.update(30, {**layer_stats("a", logit=3e4), **layer_stats("b")})
    assert [(e.step, e.rule) for e in again] == [(30, "max_logit")]  # recorded again
    assert alarm.fired == {"a": 20} and alarm.rule_steps == {"max_logit": 20}
    assert alarm.first_step == 20 and alarm.counts()["max_logit"] == 2


def test_alarm_fires_on_entropy_collapse_and_on_non_finite_logits():
    alarm = AttentionAlarm(HealthThresholds(entropy_floor=0.2, growth_rate=0.0), warn=False)
    events = alarm.update(5, {**layer_stats("a", entropy=0.15), **layer_stats("b", logit=math.nan),
                              **layer_stats("c", entropy=0.25)})
    assert {(e.layer, e.rule) for e in events} == {("a", "entropy_floor"), ("b", "max_logit")}
    assert alarm.fired == {"a": 5, "b": 5}


def test_every_rule_that_holds_is_recorded():
    """A non-finite logit fires whatever the thresholds, and the other rules that hold at the
    same step are recorded beside it (no first-rule-wins); 0 and NaN fractions do not fire."""
    alarm = AttentionAlarm(HealthThresholds(max_logit=1e30, entropy_floor=0.0), warn=False)
    stats = {**layer_stats("a", logit=math.inf, entropy=0.5), "a/nonfinite_fraction": 0.01,
             **layer_stats("b"), "b/nonfinite_fraction": 0.0,
             **layer_stats("c"), "c/nonfinite_fraction": math.nan}
    events = alarm.update(4, stats)
    assert [(e.layer, e.rule, e.value, e.threshold) for e in events] == [
        ("a", "nonfinite", 0.01, 0.0), ("a", "max_logit", math.inf, 1e30)]
    with pytest.warns(AttentionHealthWarning, match=r"layer d: attention logits not finite"):
        AttentionAlarm().update(5, {**layer_stats("d"), "d/nonfinite_fraction": 0.5})


def test_alarm_entropy_floor_zero_never_fires_on_entropy():
    alarm = AttentionAlarm(HealthThresholds(entropy_floor=0.0, entropy_rate=0.0), warn=False)
    assert alarm.update(1, layer_stats("a", entropy=0.0)) == []


def test_alarm_reads_prefixed_health_scalars():
    alarm = AttentionAlarm(LEVELS, warn=False)
    alarm.update(3, health_scalars(layer_stats("enc.0", logit=1e5)))
    assert alarm.fired == {"attention/enc.0": 3}


@given(st.dictionaries(st.sampled_from("abcd"),
                       st.tuples(st.floats(0, 3e4), st.floats(0, 1)), min_size=1))
def test_alarm_fires_exactly_for_the_layers_past_a_threshold(values):
    alarm = AttentionAlarm(LEVELS, warn=False)
    stats = {}
    for layer, (logit, entropy) in values.items():
        stats |= layer_stats(layer, logit, entropy)
    alarm.update(7, stats)
    expected = {layer for layer, (logit, entropy) in values.items()
                if logit > 1e4 or entropy < 0.1}
    assert set(alarm.fired) == expected


def test_lead_time():
    alarm = AttentionAlarm(LEVELS, warn=False)
    assert alarm.lead_time(50) is None  # never fired
    alarm.update(12, layer_stats("a", logit=1e5))
    alarm.update(30, layer_stats("b", entropy=0.01))
    assert alarm.lead_time(50) == 38  # from the first alarm
    assert alarm.lead_time(10) == -2  # the alarm came late
    alarm.reset()
    assert alarm.fired == {} and alarm.events == [] and alarm.lead_time(50) is None
    assert alarm.rule_steps == {}


def test_alarm_validates_arguments():
    with pytest.raises(TypeError, match="thresholds"):
        AttentionAlarm(thresholds={"max_logit": 1.0})
    with pytest.raises(TypeError, match="warn"):
        AttentionAlarm(warn=1)
    alarm = AttentionAlarm()
    with pytest.raises(ValueError, match="step"):
        alarm.update(-1, {})
    with pytest.raises(TypeError, match="step"):
        alarm.update(1.5, {})
    with pytest.raises(TypeError, match="stats"):
        alarm.update(1, [1.0])
    with pytest.raises(ValueError, match="layer/statistic"):
        alarm.update(1, {"max_abs_logit": 1.0})
    with pytest.raises(ValueError, match="diverged_step"):
        alarm.lead_time(-3)


def test_loss_divergence_on_a_jump():
    watch = LossDivergence(jump=2.0)
    for step, loss in enumerate([4.6, 4.0, 3.0, 5.9, 4.0], start=1):
        assert not watch.update(step, loss)
    assert watch.update(6, 6.1)  # > 2 × 3.0
    assert watch.diverged_step == 6
    assert watch.update(7, 1.0)  # stays diverged, at the first step
    assert watch.diverged_step == 6


def test_loss_divergence_on_non_finite_loss_or_gradient():
    for loss, grad in [(math.nan, 1.0), (math.inf, None), (1.0, math.inf), (1.0, math.nan)]:
        watch = LossDivergence(jump=None)
        assert watch.update(3, 2.0, 1.0) is False
        assert watch.update(4, loss, grad) is True
        assert watch.diverged_step == 4


def test_loss_divergence_without_a_loss_or_jump():
    watch = LossDivergence(jump=None)
    assert not watch.update(1, None)
    assert not watch.update(2, 1.0)
    assert not watch.update(3, 1e6)  # finiteness only
    zero = LossDivergence()
    zero.update(1, 0.0)
    assert not zero.update(2, 0.5)  # no ratio to a best loss of 0


def test_loss_divergence_validates():
    with pytest.raises(ValueError, match="jump"):
        LossDivergence(jump=1.0)
    with pytest.raises(TypeError, match="jump"):
        LossDivergence(jump="2")
    with pytest.raises(ValueError, match="step"):
        LossDivergence().update(-1, 1.0)


def test_alarm_keeps_the_first_events_of_a_rule_and_counts_every_one():
    alarm = AttentionAlarm(LEVELS, warn=False, max_events=3)
    for step in range(10):
        alarm.update(step, layer_stats("a", logit=1e5) | layer_stats("b", logit=1e5))
    kept = [(e.step, e.layer) for e in alarm.events if e.rule == "max_logit"]
    assert kept == [(s, layer) for s in range(3) for layer in ("a", "b")]
    assert alarm.counts()["max_logit"] == 20 and alarm.dropped == 14
    assert alarm.fired == {"a": 0, "b": 0}
    alarm.reset()
    assert alarm.counts()["max_logit"] == 0 and alarm.dropped == 0
    with pytest.raises(ValueError, match="max_events"):
        AttentionAlarm(max_events=0)
