"""AttentionHealthCallback with a real transformers Trainer on tiny random-weight models."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from transformers import TrainerCallback

from attnscale.integrations import AttentionHealthCallback
from attnscale.integrations.health import (
    HEALTH_STATISTICS,
    AttentionHealthWarning,
    HealthThresholds,
)
from attnscale.measure.monitor import Monitor


class Snapshot(TrainerCallback):
    """Runs BEFORE the health callback: at each step, the weights the step starts from, the
    batch of its forward, and whether the model carries the monitor (hooks, implementation)."""

    def __init__(self) -> None:
        self.weights: dict[int, dict] = {}
        self.batches: dict[int, dict] = {}
        self.watched: dict[int, tuple[str, int]] = {}
        self.seen_by: dict[int, tuple[str, int]] = {}
        self._hook = None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        step = state.global_step + 1
        self.weights[step] = copy.deepcopy(model.state_dict())

        def grab(module, a, kw):
            self.batches.setdefault(step, {k: v.clone() for k, v in kw.items()})
            self.seen_by[step] = (module.config._attn_implementation,
                                  len(module._forward_pre_hooks))

        self._hook = model.register_forward_pre_hook(grab, with_kwargs=True)

    def on_step_end(self, args, state, control, **kwargs):
        self._hook.remove()


def monitor_stats(model: nn.Module, batch: dict) -> dict[str, float]:
    """What Monitor.flat_stats() says about ``batch`` on ``model``, padding rows left out."""
    with torch.no_grad(), Monitor(model) as monitor:
        monitor.query_mask = batch["attention_mask"].bool()
        model(**batch)
    return monitor.flat_stats()


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_tensorboard_receives_the_monitor_statistics(name, hf_kit, tmp_path):
    """report_to=["tensorboard"]: the event file holds every layer's statistics at the sampled
    steps, equal to Monitor.flat_stats() of the same batch on the same weights; the Trainer's
    own loss log of those steps is still there; no hook outside the sampled steps."""
    model = hf_kit.MODELS[name](dropout=0.0)
    snap = Snapshot()
    trainer = hf_kit.make_trainer(model, tmp_path, steps=6, report_to=["tensorboard"],
                                  callbacks=[snap])
    health = AttentionHealthCallback(trainer, every_n_steps=3)
    trainer.train()
    scalars = hf_kit.read_scalars(tmp_path)
    assert [step for step, _ in health.history] == [3, 6]
    for step in (3, 6):
        ref = hf_kit.MODELS[name](dropout=0.0)
        ref.load_state_dict(snap.weights[step])
        expected = monitor_stats(ref, snap.batches[step])
        logged = {key: value for (key, s), value in scalars.items()
                  if s == step and key.startswith("train/attention/")}
        layers = {key.split("/")[2] for key in logged if key != "train/attention/alarms"}
        assert len(layers) == 2
        for layer in layers:
            for stat in HEALTH_STATISTICS:
                got = logged[f"train/attention/{layer}/{stat}"]
                assert got == pytest.approx(expected[f"{layer}/{stat}"], rel=1e-5, abs=1e-6)
            heads = [logged[f"train/attention/{layer}/max_abs_logit_head{h}"] for h in (0, 1)]
            assert max(heads) == logged[f"train/attention/{layer}/max_abs_logit"]  # per head
            assert f"train/attention/{layer}/max_abs_logit_head2" not in logged
        assert logged["train/attention/alarms"] == 0.0
        assert ("train/loss", step) in scalars  # should_log was kept
    for step in range(1, 7):
        implementation, hooks = snap.seen_by[step]
        if step % 3:
            assert (implementation, hooks) == ("sdpa", 1)  # Snapshot's own hook only
        else:
            assert implementation.startswith("attnscale_monitor") and hooks == 2


def test_training_is_unchanged_by_the_callback(hf_kit, tmp_path):
    """Monitoring every step of a run with dropout gives bitwise the same weights and losses."""
    runs = []
    for monitored in (False, True):
        model = hf_kit.tiny_bert(dropout=0.1)
        trainer = hf_kit.make_trainer(model, tmp_path / str(monitored), steps=4)
        if monitored:
            AttentionHealthCallback(trainer, every_n_steps=1)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        runs.append((losses, {k: v.clone() for k, v in model.state_dict().items()}))
    (plain_loss, plain_w), (mon_loss, mon_w) = runs
    assert plain_loss == mon_loss and len(plain_loss) == 4
    assert all(torch.equal(plain_w[k], mon_w[k]) for k in plain_w)


def test_alarm_fires_on_forced_divergence(hf_kit, tmp_path):
    trainer = hf_kit.make_trainer(hf_kit.tiny_bert(), tmp_path, steps=8, lr=1.0)
    health = AttentionHealthCallback(trainer, every_n_steps=1)
    with pytest.warns(AttentionHealthWarning, match="attention health alarm"):
        trainer.train()
    assert trainer.state.global_step == 8  # stop=False: training went on
    assert health.alarm_step is not None and len(health.alarm.fired) == 2
    assert health.diverged_step is not None
    assert health.lead_time == health.diverged_step - health.alarm_step
    record = health.record()
    assert record["alarm_step"] == health.alarm_step and record["events"]
    assert sum(record["rule_counts"].values()) == len(record["events"])
    assert min(record["rule_steps"].values()) == health.alarm_step
    alarms = [h["attention/alarms"] for h in trainer.state.log_history if "attention/alarms" in h]
    assert alarms[-1] == 2.0 and alarms[0] <= alarms[-1]


def test_alarm_stays_silent_on_a_healthy_run(hf_kit, tmp_path):
    trainer = hf_kit.make_trainer(hf_kit.tiny_bert(), tmp_path, steps=8, lr=1e-3)
    health = AttentionHealthCallback(trainer, every_n_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttentionHealthWarning)
        trainer.train()
    assert health.alarm.fired == {} and health.alarm_step is None
    assert health.diverged_step is None and health.lead_time is None
    assert len(health.history) == 4


def test_stop_ends_training_at_the_alarm(hf_kit, tmp_path):
    trainer = hf_kit.make_trainer(hf_kit.tiny_bert(), tmp_path, steps=20, lr=1.0)
    health = AttentionHealthCallback(trainer, every_n_steps=2, stop=True, warn=False,
                                     thresholds=HealthThresholds(max_logit=1e3))
    trainer.train()
    assert health.stopped_at == health.alarm_step == trainer.state.global_step < 20


def test_callback_needs_the_trainer(hf_kit, tmp_path):
    health = AttentionHealthCallback(every_n_steps=1)
    trainer = hf_kit.make_trainer(hf_kit.tiny_bert(), tmp_path, steps=1, callbacks=[health])
    with pytest.raises(RuntimeError, match="attach"):
        trainer.train()
    assert health.attach(trainer) is health
    assert sum(cb is health for cb in trainer.callback_handler.callbacks) == 1
    trainer.train()
    assert [step for step, _ in health.history] == [1]


class NoAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        return {"loss": self.linear(torch.ones(4)).sum()}


def test_a_model_without_attention_is_rejected_at_train_begin(hf_kit, tmp_path):
    trainer = hf_kit.make_trainer(NoAttention(), tmp_path, steps=1)
    AttentionHealthCallback(trainer)
    with pytest.raises(ValueError, match="no attention"):
        trainer.train()


@pytest.mark.parametrize("kwargs, error, name", [
    ({"every_n_steps": 0}, ValueError, "every_n_steps"),
    ({"every_n_steps": 2.0}, TypeError, "every_n_steps"),
    ({"stop": 1}, TypeError, "stop"),
    ({"prefix": ""}, ValueError, "prefix"),
    ({"prefix": None}, TypeError, "prefix"),
    ({"thresholds": {"max_logit": 1.0}}, TypeError, "thresholds"),
    ({"loss_jump": 0.5}, ValueError, "jump"),
    ({"warn": "yes"}, TypeError, "warn"),
    ({"trainer": object()}, TypeError, "trainer"),
])
def test_callback_validates_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        AttentionHealthCallback(**kwargs)


def test_lead_time_from_the_loss_log():
    """on_log feeds the divergence test: a NaN gradient norm after the alarm counts."""
    health = AttentionHealthCallback(warn=False)
    state = type("State", (), {"global_step": 0})()
    for step, loss, grad in [(1, 4.0, 1.0), (2, 3.9, 1.0), (3, 3.8, math.nan)]:
        state.global_step = step
        health.on_log(None, state, None, logs={"loss": loss, "grad_norm": grad})
        if step == 1:
            health.alarm.update(1, {"layer/max_abs_logit": 2e4})
    health.on_log(None, state, None, logs={"attention/layer/z_loss": 1.0})  # not a loss log
    assert health.diverged_step == 3 and health.lead_time == 2


def test_non_finite_logits_fire_the_alarm(hf_kit, tmp_path):
    """NaN weights: the first sampled step logs nonfinite_fraction > 0 and max |logit| inf, and
    the alarm fires on the non-finite logits at once."""
    model = hf_kit.tiny_bert()
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.query.weight[0, 0] = math.nan
    trainer = hf_kit.make_trainer(model, tmp_path, steps=2)
    health = AttentionHealthCallback(trainer, every_n_steps=1)
    with pytest.warns(AttentionHealthWarning, match="not finite"):
        trainer.train()
    layer = "bert.encoder.layer.0.attention.self"
    first = health.alarm.events[0]
    assert (first.step, first.layer, first.statistic) == (1, layer, "nonfinite_fraction")
    assert 0 < first.value <= 1
    step, values = health.history[0]
    assert step == 1 and values[f"attention/{layer}/nonfinite_fraction"] == first.value
    assert values[f"attention/{layer}/max_abs_logit"] == math.inf
    assert health.diverged_step == 1 and health.lead_time == 0  # the loss is NaN at once
