"""attnscale.lab.evaluation: the evaluation-time log-n factor is exact (factor 1 is the plain
evaluation bit for bit, a factor multiplies every logit, a factor > 1 changes the loss), the
model's ``scale`` is restored after it (also when the block raises), only scaled scores take it,
β = max(1, ln L / ln n), and a length-task run stores the log-n metrics past n only for a
scaled model."""

from __future__ import annotations

import math

import pytest
import torch

from attnscale.audit.studies import LENGTH, TAU, VARIANTS, schedule
from attnscale.core.nn import MultiheadSelfAttention
from attnscale.lab.evaluation import (
    LOG_N,
    SCALED,
    evaluate,
    evaluate_log_n,
    log_n_factor,
    log_n_key,
    logit_factor,
    scalable,
)
from attnscale.lab.train import TrainConfig, build_model, build_task, run

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"task": "length", "seq_len": 12, "num_pairs": 2, "pos": "rope", "d_model": 16,
        "n_heads": 2, "n_layers": 2, "mlp": False, "eval_size": 32, "steps": 2,
        "warmup_steps": 0, "init": "unit"}


def built(**kw):
    cfg = TrainConfig(**{**TINY, **kw})
    task = build_task(cfg)
    model = build_model(cfg, task)
    with torch.no_grad():  # sharper attention than at init, so a factor matters
        for m in model.modules():
            if isinstance(m, MultiheadSelfAttention):
                m.q_proj.weight.mul_(4.0)
    return model, task


def scales(model):
    return [m.scale for m in model.modules() if isinstance(m, MultiheadSelfAttention)]


# ------------------------------------------------------------------------------ the factor


def test_factor_one_is_the_plain_evaluation_bit_for_bit():
    model, task = built()
    plain = evaluate(model, task)
    one = evaluate(model, task, dict.fromkeys(plain, 1.0))
    assert one == plain  # floats compared exactly: 1.0·(1/√d) is 1/√d
    tokens = task.sample(24, 4).tokens
    with torch.no_grad():
        ref = model(tokens)
        with logit_factor(model, 1.0):
            assert torch.equal(model(tokens), ref)


def test_factor_multiplies_every_logit():
    """β through ``scale`` is β times the logits: the same as multiplying q by β."""
    model, task = built(n_layers=1)
    batch = task.sample(24, 4)
    attn = model.blocks[0].attn
    seen = []
    attn.capture = lambda mod, q, k, call: seen.append(call["scale"])
    with torch.no_grad(), logit_factor(model, 1.7):
        sharp = model(batch.tokens)
    assert seen == [1.7 / math.sqrt(attn.head_dim)]
    attn.capture = None
    with torch.no_grad():
        attn.q_proj.weight.mul_(1.7)  # no RoPE-dependent change: RoPE is linear in q
        by_q = model(batch.tokens)
    torch.testing.assert_close(sharp, by_q, rtol=1e-5, atol=1e-5)


def test_factor_above_one_changes_the_loss_and_restores_the_scale():
    model, task = built()
    before = scales(model)
    plain = evaluate(model, task)
    sharp = evaluate(model, task, {"n=24": 2.0})
    assert set(sharp) == {"n=24"}
    assert sharp["n=24"]["loss"] != plain["n=24"]["loss"]
    assert sharp["n=24"]["answer_weight"] != plain["n=24"]["answer_weight"]
    assert scales(model) == before == [None, None]
    assert evaluate(model, task) == plain  # nothing left behind
    with pytest.raises(RuntimeError), logit_factor(model, 3.0):
        assert scales(model) == [3.0 / math.sqrt(8)] * 2
        raise RuntimeError("inside the block")
    assert scales(model) == before


def test_a_fixed_scale_is_multiplied_and_restored():
    model, _ = built(scale=0.5)
    with logit_factor(model, 2.0):
        assert scales(model) == [1.0, 1.0]
    assert scales(model) == [0.5, 0.5]


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_factor_must_be_finite_and_positive(bad):
    model, _ = built()
    with pytest.raises(ValueError, match="finite and > 0"), logit_factor(model, bad):
        pass


def test_only_scaled_scores_take_the_factor():
    model, task = built(score="log_length")
    assert not scalable(model) and "scaled_dot" in SCALED and "log_length" not in SCALED
    with pytest.raises(ValueError, match="log_length"), logit_factor(model, 2.0):
        pass
    assert evaluate_log_n(model, task) == {}
    assert scalable(built(score="qk_layernorm")[0])


def test_the_log_n_factor():
    assert log_n_factor(64, 32) == pytest.approx(1.2)
    assert log_n_factor(128, 32) == pytest.approx(1.4)
    assert log_n_factor(32, 32) == 1.0 and log_n_factor(16, 32) == 1.0
    with pytest.raises(ValueError):
        log_n_factor(64, 1)
    assert log_n_key("n=64") == f"{LOG_N}:n=64" == "log_n:n=64"


def test_evaluate_log_n_is_every_length_past_n_with_its_factor():
    model, task = built()
    got = evaluate_log_n(model, task)
    assert set(got) == {"log_n:n=24", "log_n:n=48"}
    for name, factor in (("n=24", math.log(24) / math.log(12)),
                         ("n=48", math.log(48) / math.log(12))):
        row = got[log_n_key(name)]
        assert row["factor"] == pytest.approx(factor)
        assert {k: v for k, v in row.items() if k != "factor"} == evaluate(
            model, task, {name: factor})[name]
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    broken = evaluate_log_n(model, task)
    assert all(row["loss"] is None and row["factor"] > 1 for row in broken.values())


# ------------------------------------------------------------------------------ in a run


def test_a_length_run_stores_the_log_n_metrics_past_n():
    result = run({**LENGTH, **schedule(3), "lr": 0.01, "eval_size": 64})
    fm = result.final_metrics
    assert set(fm) == {"n=32", "n=64", "n=128", "log_n:n=64", "log_n:n=128"}
    for k in ("n=64", "n=128"):
        assert set(fm[f"log_n:{k}"]) == {*fm[k], "factor"}
        assert fm[f"log_n:{k}"]["loss"] != fm[k]["loss"]
    assert fm["log_n:n=128"]["factor"] == pytest.approx(1.4)
    assert result.final_loss == fm["n=32"]["loss"]


@pytest.mark.parametrize(("base", "variant"), [(LENGTH, "log_length_matched"),
                                               (TAU, "scaled_dot")])
def test_no_log_n_metrics_without_a_scaled_score_or_a_longer_length(base, variant):
    cfg = {**base, **schedule(2), **VARIANTS[variant], "lr": 0.01, "eval_size": 64}
    result = run({"seq_len": 32, **cfg})
    assert not [k for k in result.final_metrics if k.startswith(LOG_N)]


def test_the_matched_arm_starts_equal_to_scaled_dot_at_the_training_length():
    """log_length_matched's s₀ = 1/ln 32: at the last position of a 32-token sequence its logits
    are scaled_dot's, so the two models (same init stream) give the same last-position output."""
    assert VARIANTS["log_length_matched"]["s"] == pytest.approx(1 / math.log(32), rel=1e-15)
    outs = []
    for variant in ("scaled_dot", "log_length_matched"):
        cfg = TrainConfig(**{**LENGTH, **schedule(2), **VARIANTS[variant]})
        task = build_task(cfg)
        torch.manual_seed(0)
        model = build_model(cfg, task)
        with torch.no_grad():
            outs.append(model(task.sample(32, 4).tokens)[:, -1])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- labelled readout

def manual_answer_weights(model, batch, answer):
    """(L, B, H) answer weights written out, independent of the probe: every attention call's
    q, k (seen through its capture hook) give softmax(q·kᵀ·scale + causal mask), read at
    [query, answer]. Only for scaled dot, the score of these models."""
    from attnscale.lab.probe import query_positions
    mods = [m for m in model.modules() if isinstance(m, MultiheadSelfAttention)]
    found, query, rows = [], query_positions(batch), torch.arange(len(answer))

    def capture(mod, q, k, call):
        assert call["score"] == "scaled_dot" and call["attn_mask"] is None
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, N, d)
        scale = call["scale"] if call["scale"] is not None else q.shape[-1] ** -0.5
        logits = (q @ k.transpose(-1, -2)).double() * scale
        n = logits.shape[-1]
        if call["is_causal"]:
            logits = logits.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        found.append(logits.softmax(-1)[rows, :, query, answer].float())  # (B, H)

    for m in mods:
        m.capture = capture
    try:
        model(batch.tokens, batch.scale)
    finally:
        for m in mods:
            m.capture = None
    return torch.stack(found)


def full_readout(model, task):
    """The evaluation as it was before the readout at labelled positions, written out: (B, T, V)
    logits of every position, cross-entropy ignoring the unlabelled ones, the metric from them
    (bits per character, or argmax hits), and the answer weight from :func:`manual_answer_weights`.
    """
    from attnscale.lab.probe import has_answer_positions, summarize
    from attnscale.lab.tasks import IGNORE_INDEX
    out = {}
    with torch.no_grad():
        for name, batches in task.eval_batches().items():
            nats, total, count, weights = 0.0, 0.0, 0, []
            for b in batches:
                logits = model(b.tokens, b.scale)  # (B, T, V)
                if has_answer_positions(task):
                    weights.append(manual_answer_weights(model, b, task.answer_positions(b)))
                ce = float(torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), b.targets.reshape(-1), reduction="sum"))
                keep = b.targets != IGNORE_INDEX
                nats += ce
                total += (ce / math.log(2.0) if task.name == "text" else
                          float(((logits.argmax(-1) == b.targets) & keep).sum()))
                count += int(keep.sum())
            out[name] = {"loss": nats / count, "metric": total / count}
            if weights:
                out[name]["answer_weight"] = summarize(torch.cat(weights, dim=1))["max"]
    return out


MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 2, "eval_size": 32, "steps": 2,
         "warmup_steps": 0, "init": "unit"}


@pytest.mark.parametrize("task", [
    TINY,
    {**MODEL, "task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 64},
    {**MODEL, "task": "salience", "num_items": 3},
    {**{k: v for k, v in MODEL.items() if k != "eval_size"}, "task": "text", "seq_len": 16},
])
def test_the_readout_at_labelled_positions_is_the_full_evaluation(task):
    """evaluate() reads out only at the labelled positions; its loss, metric and answer weight
    equal those of the full (B, T, V) readout to float32 rounding (metric exactly for accuracy:
    one argmax in 10⁴ could flip only on a tie closer than the rounding)."""
    cfg = TrainConfig(**task)
    t = build_task(cfg)
    model = build_model(cfg, t)
    with torch.no_grad():  # sharper attention than at init
        for m in model.modules():
            if isinstance(m, MultiheadSelfAttention):
                m.q_proj.weight.mul_(4.0)
    new, old = evaluate(model, t), full_readout(model, t)
    assert new.keys() == old.keys()
    for name in old:
        assert new[name].keys() == old[name].keys()
        for key, value in old[name].items():
            assert new[name][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, key)
