"""attnscale.lab.runzoo_hf: a GPT-2 through transformers' Trainer with the health callback;
what it records, and where its steps sit against the lab zoo's."""

from __future__ import annotations

import pytest

from attnscale.integrations.alarm import HealthThresholds
from attnscale.integrations.alarm_score import replay
from attnscale.integrations.outcome import label_run
from attnscale.lab import runzoo, runzoo_hf

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hot_run():
    """Unscaled attention at LR 1e-1 without warmup: its logits pass 1e4 within 20 steps."""
    return runzoo_hf.train_hf_member(runzoo.Member("dot", 1e-1, 0, 0), every=5, steps=20)


def test_a_trainer_run_records_every_loss_and_every_sampled_step(hot_run):
    assert len(hot_run["losses"]) == 20 and all(x > 0 for x in hot_run["losses"])
    assert [s for s, _ in hot_run["samples"]] == [5, 10, 15, 20]
    stats = hot_run["samples"][-1][1]
    layers = {k.rsplit("/", 1)[0] for k in stats}
    assert len(layers) == 2
    for layer in layers:  # per-head max |logit| beside the layer's
        heads = [stats[f"{layer}/max_abs_logit_head{h}"] for h in (0, 1)]
        assert max(heads) == pytest.approx(stats[f"{layer}/max_abs_logit"], rel=1e-6)


def test_the_callbacks_alarm_is_the_replay_of_its_record(hot_run):
    live = hot_run["callback"]["alarm_step"]
    assert live in {s for s, _ in hot_run["samples"]}  # it fired, at a sampled step
    assert replay(hot_run["samples"], HealthThresholds(), every=5).first_step == live


class ForwardLosses(transformers.TrainerCallback):
    """Records the loss of every training forward, in order, through a forward hook."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.register_forward_hook(lambda m, i, out: self.losses.append(out.loss.item()))


def test_losses_sit_at_their_steps():
    """losses[s - 1] is the loss of the s-th forward: the Trainer's step s."""
    seen = ForwardLosses()
    run = runzoo_hf.train_hf_member(runzoo.Member("dot", 1e-2, 0, 0), every=5, steps=6,
                                    callbacks=[seen])
    assert len(seen.losses) == 6 and len(set(seen.losses)) == 6
    assert run["losses"] == pytest.approx(seen.losses, rel=1e-6)


def test_scaling_reaches_the_model():
    """scale_attn_weights=False is unscaled dot: the first layer's logits (same init, same
    input) are √d_k = √32 times larger; later layers see different inputs."""
    tops = {}
    for score in ("scaled_dot", "dot"):
        run = runzoo_hf.train_hf_member(runzoo.Member(score, 1e-9, 0, 0), every=1, steps=1)
        tops[score] = run["samples"][0][1]["attention/transformer.h.0.attn/max_abs_logit"]
    assert tops["dot"] / tops["scaled_dot"] == pytest.approx(32 ** 0.5, rel=1e-3)


def test_onsets_are_moved_to_global_steps():
    ref = [3.0 - 0.01 * t for t in range(120)]
    stalled = ref[:40] + [ref[40] + 0.02 * (t - 40) for t in range(40, 120)]
    runs = [{"member": {"score": "dot", "lr": lr, "warmup": 0, "seed": 0}, "losses": losses}
            for lr, losses in ((runzoo.REFERENCE_LR, ref), (1e-1, stalled))]
    labelled = runzoo_hf.label_hf_zoo(runs, runzoo.REFERENCE_LR)
    onset = label_run(stalled, ref).step
    assert onset is not None and labelled[1]["outcome"]["step"] == onset + 1
    assert labelled[0]["outcome"]["step"] is None


def test_the_issues_run_is_caught_at_its_first_sample():
    """The user report behind the frozen rule: a tiny GPT-2 at LR 1e-1 without warmup,
    sampled every 10 steps, froze its attention before the first sample (entropy / ln n
    about 0.01, most rows saturated, head logit stds ~250 against 23·s_c ≈ 58): the growth
    rule sees no growth inside its window, and the rules shipped before the frozen rule
    stayed silent through step 30. The frozen rule fires at the first sample."""
    run = runzoo_hf.train_hf_member(runzoo.Member("scaled_dot", 1e-1, 0, 0), every=10, steps=30)
    first = run["samples"][0][1]
    layer = "attention/transformer.h.0.attn"
    assert first[f"{layer}/entropy_normalized"] < 0.02
    assert first[f"{layer}/saturated_fraction"] > 0.9
    assert run["callback"]["alarm_step"] == 10 and run["callback"]["rule_steps"]["frozen"] == 10
    before = replay(run["samples"], HealthThresholds(frozen_factor=0.0), every=10)
    assert before.first_step is None  # what the issue saw
    assert replay(run["samples"], HealthThresholds(), every=10).first_step == 10
