"""attnscale.lab.train: every score trains, divergence is caught, runs are deterministic, bad
configs are clear errors, defaults fit every task and step count, and ``attnscale train``."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from attnscale import SCORES
from attnscale.lab.sections import ModelSection
from attnscale.lab.train import (
    DIVERGENCE_GRACE_STEPS,
    TrainConfig,
    build_optimizer,
    lr_at,
    run,
)

# A tiny MQAR model, for everything but learning speed.
TINY = {
    "d_model": 16,
    "n_heads": 2,
    "n_layers": 1,
    "batch_size": 8,
    "seq_len": 32,
    "eval_size": 64,
    "steps": 20,
    "warmup_steps": 2,
    "lr": 1e-2,
    "log_every": 1,
}


pytestmark = pytest.mark.usefixtures("one_thread")


def losses(result) -> list[float]:
    return [row["loss"] for row in result.history]


VARIANTS = [{"score": s} for s in sorted(SCORES)] + [
    {"score": "cosine", "temperature": "swin"},
    {"score": "cosine", "temperature": "qknorm"},
    {"score": "cosine", "tau": 10.0},
    {"score": "mup", "init": "mup"},
    {"score": "scaled_dot", "pos": "rope", "mlp": False},
]


# Character-level text labels every position, so 20 steps show a clear drop (about 1 nat from
# ln 100; the character frequencies alone are worth more than that).
TEXT = {**TINY, "task": "text", "eval_size": None, "eval_windows": 8}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_twenty_steps_of_every_score_decrease_the_loss(variant):
    result = run({**TEXT, **variant, "stats": False})
    curve = losses(result)
    assert result.status == "done" and result.steps == 20 and len(curve) == 20
    assert sum(curve[-5:]) / 5 < curve[0] - 0.5, curve


def test_huge_learning_rate_is_caught_as_divergence():
    result = run({**TINY, "lr": 30.0, "warmup_steps": 0, "steps": 40})
    assert result.status == "diverged"
    assert result.diverged_step is not None and result.steps == result.diverged_step
    assert result.history[-1]["step"] == result.diverged_step and result.history[-1]["diverged"]
    row = result.history[-1]
    assert not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])) or (
        result.diverged_step >= DIVERGENCE_GRACE_STEPS and row["loss"] > 3 * result.initial_loss
    )
    json.dumps(result.to_dict(), allow_nan=False)  # NaN/inf become None


def test_a_normal_run_is_not_flagged():
    result = run({**TINY, "lr": 3e-3, "steps": 30})
    assert result.status == "done" and result.diverged_step is None


def test_same_config_same_numbers_and_seed_matters():
    cfg = {**TINY, "steps": 12, "log_every": 4, "eval_every": 6}

    def strip(d):
        return {k: v for k, v in d.items() if k != "elapsed_s"}

    a, b = run(cfg).to_dict(), run(cfg).to_dict()
    assert strip(a) == strip(b)
    c = run({**cfg, "seed": 1}).to_dict()
    assert c["history"][0]["loss"] != a["history"][0]["loss"]


def test_history_rows_hold_stats_and_evals():
    cfg = {**TINY, "n_layers": 2, "steps": 12, "log_every": 5, "eval_every": 10}
    result = run(cfg)
    assert [r["step"] for r in result.history] == [0, 5, 10, 11]
    row = result.history[0]
    assert len(row["layers"]) == 2
    for key in ("max_abs_logit", "entropy", "max_weight", "q_rms", "k_rms"):
        assert all(math.isfinite(layer[key]) for layer in row["layers"]), key
    # at init the logits are tiny, so attention is nearly uniform over the visible keys
    assert row["layers"][0]["entropy_normalized"] > 0.99
    assert row["max_abs_logit"] == max(layer["max_abs_logit"] for layer in row["layers"])
    assert "eval_metric" in result.history[2] and "eval_metric" not in result.history[1]
    assert 0.0 <= result.final_metric <= 1.0 and result.metric_name == "accuracy"


def test_z_loss_shrinks_the_log_partition_function():
    plain = run({**TEXT, "stats": False})
    with_z = run({**TEXT, "stats": False, "z_loss": 0.1})
    assert with_z.history[-1]["log_z_sq"] < 0.9 * plain.history[-1]["log_z_sq"]


def test_learned_temperature_is_logged():
    result = run({**TINY, "score": "cosine", "temperature": "swin", "steps": 2})
    assert result.history[0]["layers"][0]["tau"] == pytest.approx(10.0)


def test_result_record_and_progress():
    seen = []
    result = run({**TINY, "steps": 3}, progress=lambda done, loss: seen.append(done))
    assert seen == [1, 2, 3]
    d = result.to_dict()
    for key in ("status", "final_loss", "final_metric", "diverged_step", "steps", "history",
                "config", "versions", "git_rev", "seed", "elapsed_s"):
        assert key in d
    assert TrainConfig(**d["config"]) == TrainConfig(**{**TINY, "steps": 3})
    assert "torch" in d["versions"]


def test_threads_are_restored():
    torch.set_num_threads(2)
    run({**TINY, "steps": 1, "warmup_steps": 0, "threads": 1})
    assert torch.get_num_threads() == 2


def test_length_task_reports_every_eval_length():
    cfg = {**TINY, "task": "length", "pos": "rope", "seq_len": 16, "steps": 2, "eval_size": 64}
    result = run(cfg)
    plain = {"n=16", "n=32", "n=64"}
    # a scaled_dot model is evaluated again past n with the log-n factor (lab.evaluation)
    assert set(result.final_metrics) == plain | {"log_n:n=32", "log_n:n=64"}
    assert result.final_metric == result.final_metrics["n=16"]["metric"]


def test_salience_and_text_tasks(tmp_path):
    assert run({**TINY, "task": "salience", "seq_len": None, "steps": 2}).status == "done"
    path = tmp_path / "t.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    result = run({**TEXT, "text": str(path), "steps": 2})
    assert result.metric_name == "bits_per_char" and result.final_metric > 0


def test_schedule_warmup_then_cosine_to_floor():
    cfg = TrainConfig(lr=1.0, steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_weight_decay_is_independent_and_skips_norms():
    from attnscale.lab.train import build_model, build_task

    cfg = TrainConfig(**{**TINY, "lr": 1e-2, "weight_decay": 1e-4, "score": "qk_rmsnorm"})
    model = build_model(cfg, build_task(cfg))
    groups = build_optimizer(model, cfg).param_groups
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert all(g["weight_decay"] == pytest.approx(1e-2) for g in groups if g["weight_decay"])
    assert id(model.wte.weight) in decayed and id(model.blocks[0].attn.q_proj.weight) in decayed
    assert id(model.ln_f.weight) not in decayed
    assert id(model.blocks[0].attn.q_weight) not in decayed


@pytest.mark.parametrize(
    "overrides,words",
    [
        ({"task": "nope"}, "task"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -1e-3}, "lr"),
        ({"d_model": 30, "n_heads": 4}, "divisible by n_heads"),
        ({"task": "text", "text": "/no/such/file.txt"}, "text"),
        ({"bogus": 1}, "bogus"),
        ({"score": "cosinus"}, "score must be one of"),
        ({"tau": 2.0}, "tau is not a parameter of score 'scaled_dot'"),
        ({"score": "mup", "scale": 0.1}, "scale is not a parameter"),
        ({"score": "cosine", "tau": -1.0}, "tau"),
        ({"temperature": "swin"}, "needs score='cosine'"),
        ({"num_items": 4}, "num_items is not an option of task 'mqar'"),
        ({"task": "length", "pos": "learned"}, "pos='learned'"),
        ({"warmup_steps": 5000}, "warmup_steps"),
        ({"steps": 40, "warmup_steps": 41}, "warmup_steps"),
        ({"score_params": "zz=1"}, "zz is not a parameter of score 'scaled_dot'"),
        ({"score_params": "zz"}, "name=value"),
        ({"score": "softcap", "score_params": "cap=3"}, "cap has its own option"),
        ({"score": "cosine", "temperature": "swin", "tau": 2.0}, "tau is learned"),
    ],
)
def test_bad_configs_are_clear_errors(overrides, words):
    with pytest.raises(ValueError, match=words):
        TrainConfig(**overrides)


def test_mqar_quick_config_defaults():
    from attnscale.lab.train import build_model, build_task

    cfg = TrainConfig()
    task = build_task(cfg)
    assert (task.name, task.seq_len, task.vocab_size, task.num_kv_pairs) == ("mqar", 64, 256, 4)
    model = build_model(cfg, task)
    assert model.blocks[0].mlp is None and model.config.n_heads == 1
    assert TrainConfig(task="text").model.mlp and not TrainConfig(mlp=False, task="text").model.mlp
    assert not hasattr(TrainConfig(), "use_mlp")  # one name for one setting
    assert build_task(TrainConfig(num_kv_pairs=8)).num_kv_pairs == 8


def test_config_help_takes_defaults_from_the_registry():
    for name in ("tau", "cap", "c", "s", "eps"):
        text = ModelSection.model_fields[name].description
        for sc in SCORES.values():
            if name in sc.scalar_params():
                assert f"{sc.name}: {sc.defaults[name]:g}" in text, (name, text)


def test_config_round_trips():
    cfg = TrainConfig(score="softcap", cap=30.0, lr=1e-3)
    assert TrainConfig(**cfg.model_dump()) == cfg


@pytest.mark.parametrize(("steps", "warmup"), [(1, 0), (9, 0), (40, 4), (999, 99), (5000, 100)])
def test_warmup_default_scales_with_steps(steps, warmup):
    assert TrainConfig(steps=steps).optim.warmup_steps == warmup
    assert TrainConfig(steps=steps, warmup_steps=steps).optim.warmup_steps == steps  # explicit


def test_tasks_bring_their_model_defaults():
    from attnscale.lab.config import model_defaults
    from attnscale.lab.tasks import TASKS

    for name, cls in TASKS.items():
        cfg = TrainConfig(task=name)
        for field, value in getattr(cls, "model_defaults", {}).items():
            assert getattr(cfg.model, field) == value, (name, field)
            assert field not in cfg.model.model_fields_set  # a default, not a user choice
    assert not TrainConfig().model.mlp and TrainConfig(mlp=True).model.mlp  # the user's wins
    assert model_defaults("mqar")["mlp"] is False


@pytest.mark.parametrize("task", ["mqar", "text", "salience", "length"])
def test_every_task_runs_one_step_with_its_defaults(task):
    from attnscale.lab.tasks import TASKS

    assert task in TASKS
    small = {"d_model": 16, "n_heads": 2, "n_layers": 1, "batch_size": 4, "stats": False}
    result = run(TrainConfig(task=task, steps=1, **small))
    assert result.status == "done" and result.steps == 1
    assert result.config["warmup_steps"] == 0


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------

CLI_TINY = ["--d-model", "16", "--heads", "2", "--layers", "1", "--batch-size", "4",
            "--seq-len", "32", "--eval-size", "64", "--steps", "3", "--warmup-steps", "1"]


def test_cli_train_json():
    out = subprocess.run(
        [sys.executable, "-m", "attnscale.cli", "train", *CLI_TINY, "--score", "cosine",
         "--tau", "10", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for key in ("status", "final_loss", "final_metric", "diverged_step", "steps", "history",
                "config", "versions"):
        assert key in d
    assert d["config"]["score"] == "cosine" and d["config"]["tau"] == 10.0 and d["steps"] == 3


@pytest.mark.parametrize(
    "args,words",
    [
        (["--lr", "0"], "lr"),
        (["--d-model", "30", "--heads", "4"], "divisible by n_heads"),
        (["--task", "nope"], "task"),
        (["--bogus", "1"], "No such option"),
        (["--steps", "x"], "--steps"),
        (["--task", "text", "--text", "/no/such/file.txt"], "no file at"),
    ],
)
def test_cli_bad_option_is_one_line_exit_2(args, words, monkeypatch, capsys):
    from attnscale import cli

    monkeypatch.setattr(sys, "argv", ["attnscale", "train", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_training_statistics_come_from_the_monitor(monkeypatch):
    """The training lab logs the statistics through attnscale.measure.monitor."""
    from attnscale.measure.monitor import Monitor

    recorded = []
    original = Monitor.record

    def spy(self, module, q, k, call):
        recorded.append(module)
        return original(self, module, q, k, call)

    monkeypatch.setattr(Monitor, "record", spy)
    result = run({**TINY, "n_layers": 2, "steps": 3, "log_every": 10})
    assert len(recorded) == 2 * 2  # two layers, logged at steps 0 and 2
    assert len(result.history[0]["layers"]) == 2


def test_absorb_scale_reproduces_scaled_dot_under_adam():
    """dot with q, k init and LR × d_k^(−1/4) follows scaled_dot's trajectory (no clipping, no
    decay, ε → 0: Adam's update is then invariant to the gradient's scale); plain dot does not."""
    base = dict(task="text", seq_len=32, n_heads=1, n_layers=2, batch_size=8, d_model=64,
                steps=21, lr=1e-2, log_every=10, mlp=False, init="unit", grad_clip=0.0,
                adam_eps=1e-12, weight_decay=0.0, stats=False)
    losses = {name: [h["loss"] for h in run({**base, **kw}).history]
              for name, kw in (("scaled", {"score": "scaled_dot"}),
                               ("absorbed", {"score": "dot", "absorb_scale": True}),
                               ("dot", {"score": "dot"}))}
    assert losses["absorbed"] == pytest.approx(losses["scaled"], abs=2e-3)
    assert abs(losses["dot"][1] - losses["scaled"][1]) > 0.02


def test_absorb_scale_needs_an_unscaled_score():
    with pytest.raises(ValueError, match="absorb_scale"):
        TrainConfig(score="scaled_dot", absorb_scale=True)
    assert TrainConfig(score="dot", absorb_scale=True).model.absorb_scale


def test_absorbed_clip_spreads_a_nan_norm_as_torch_does():
    """clip_gradients under absorb_scale: a NaN gradient norm makes every gradient NaN, as
    torch.nn.utils.clip_grad_norm_ does, so both arms of the identity fail alike."""
    from attnscale.lab.build import clip_gradients

    cfg = TrainConfig(task="text", d_model=16, n_heads=1, n_layers=1, mlp=False, seq_len=8,
                      absorb_scale=True, score="dot")
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.tensor([[float("nan"), 1.0], [1.0, 1.0]])
    model.bias.grad = torch.ones(2)
    assert math.isnan(clip_gradients(model, cfg))
    assert torch.isnan(model.bias.grad).all()


def test_a_run_whose_attention_blew_up_does_not_end_silently():
    """LR 1 on the tiny model: the loss stays finite (status "done") while max |logit| passes
    1e4; the alarm fed by the history rows fires, run() ends with one AttentionHealthWarning
    naming layer, rule and step, and the record keeps the alarm steps."""
    from attnscale.integrations.alarm import AttentionHealthWarning

    cfg = {**TINY, "lr": 1.0, "warmup_steps": 0, "steps": 40, "log_every": 5}
    with pytest.warns(AttentionHealthWarning) as caught:
        result = run(cfg)
    assert result.status == "done" and max(r["max_abs_logit"] for r in result.history) > 1e4
    alarm = result.to_dict()["alarm"]
    assert alarm["alarm_step"] == 5 and alarm["rule_steps"]["max_logit"] == 10
    assert {"logit_growth", "frozen", "max_logit"} <= set(alarm["rule_steps"])
    assert alarm["fired"] == {"blocks.0.attn": 5} and alarm["rule_counts"]["max_logit"] >= 6
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "run done, first at step 5" in text and "blocks.0.attn: max_logit from step 10" in text
    assert "frozen from step" in text and "logit_growth from step 5" in text
    json.dumps(result.to_dict(), allow_nan=False)


def test_a_healthy_run_has_no_alarm(recwarn):
    result = run({**TINY, "steps": 10, "log_every": 5})
    assert result.alarm["alarm_step"] is None and result.alarm["first"] == []
    assert not [w for w in recwarn if "attention health alarm" in str(w.message)]
    layer = result.history[0]["layers"][0]  # what the frozen rule reads
    assert layer["entropy_uniform"] > 0 and len(layer["logit_std_heads"]) == 2


def test_labelled_logits_read_out_only_where_there_is_a_label():
    from attnscale.lab.train import build_model, build_task, labelled_logits

    cfg = TrainConfig(**TINY)
    task = build_task(cfg)
    model = build_model(cfg, task)
    batch = task.train_batch(0, 8)
    keep = batch.targets != -100
    assert 0 < int(keep.sum()) < keep.numel()  # MQAR labels some positions, not all
    logits, labels = labelled_logits(model, batch)
    full = model(batch.tokens, batch.scale)
    torch.testing.assert_close(logits, full[keep], rtol=1e-5, atol=1e-5)
    assert torch.equal(labels, batch.targets[keep])

    class Plain(torch.nn.Module):  # any model mapping (tokens, scale) to (B, T, V) logits
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, tokens, scale=None):
            return self.inner(tokens, scale)

    plain, plain_labels = labelled_logits(Plain(), batch)
    assert torch.equal(plain, full[keep]) and torch.equal(plain_labels, labels)


def test_subnormals_are_flushed_during_the_block_only():
    from attnscale.lab.train import flush_denormals

    tiny_value = torch.tensor([1e-39])  # subnormal in float32 (< 1.18e-38)
    assert float(tiny_value * 2) > 0
    with flush_denormals():
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU cannot flush subnormals")
        assert float(tiny_value * 2) == 0.0
    assert float(tiny_value * 2) > 0


def test_adamw_is_torchs_fused_kernel_on_cpu():
    from attnscale.lab.train import build_model, build_task

    cfg = TrainConfig(**TINY)
    model = build_model(cfg, build_task(cfg))
    assert build_optimizer(model, cfg).defaults["fused"] is True
