"""attnscale.lab.probe: the answer weight equals the model's own softmax entry, a uniform
attention gives 1/(visible keys), the output is unchanged, hooks chain and are restored, and
``evaluate`` reports "answer_weight" for tasks that expose answer positions only."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.lab.models import GPT, GPTConfig
from attnscale.lab.probe import (
    answer_attention,
    forward_with_answer_weights,
    has_answer_positions,
    query_positions,
    summarize,
    watch_answer,
)
from attnscale.lab.tasks import IGNORE_INDEX, Batch, LengthTask, make_task
from attnscale.lab.train import TrainConfig, build_model, build_task, evaluate

pytestmark = pytest.mark.usefixtures("one_thread")


class TinyAttention(nn.Module):
    """Embedding -> one causal MultiheadSelfAttention (residual) -> readout."""

    def __init__(self, vocab: int, d: int = 16, heads: int = 2, **attn) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.attn = MultiheadSelfAttention(d, heads, causal=True, **attn)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens, scale=None):
        x = self.wte(tokens)
        return self.head(x + self.attn(x))


def manual_weights(model: TinyAttention, batch: Batch, answer, score: str) -> torch.Tensor:
    """(B, H) softmax entry [query, answer] written out: logits q·k/√d (times ln(i+1) for
    log_length, whose s starts at 1), causal mask, softmax."""
    with torch.no_grad():
        q, k, _ = model.attn.split_heads(model.wte(batch.tokens))  # (B, H, N, d)
        n, d = q.shape[-2], q.shape[-1]
        logits = q @ k.transpose(-1, -2) / math.sqrt(d)
        if score == "log_length":
            logits = logits * torch.log(torch.arange(1, n + 1, dtype=q.dtype))[:, None]
        logits = logits.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        p = logits.softmax(dim=-1)
    rows = torch.arange(q.shape[0])
    return p[rows, :, query_positions(batch), answer]


@pytest.mark.parametrize("score", ["scaled_dot", "log_length"])
@pytest.mark.parametrize("rotary", [False, True])
def test_weights_are_the_models_softmax_entry(score, rotary):
    task = LengthTask(seq_len=12, num_pairs=2, num_keys=4, num_values=4, num_fillers=8)
    torch.manual_seed(0)
    model = TinyAttention(task.vocab_size, score=score, rotary=rotary)
    with torch.no_grad():  # large q/k so that the pattern is far from uniform
        model.attn.q_proj.weight.mul_(8.0)
    batch = task.sample(24, 8, step=2)
    answer = task.answer_positions(batch)
    plain = model(batch.tokens)
    logits, weights = forward_with_answer_weights(model, batch, answer)
    assert torch.equal(logits, plain)  # the probe does not change the output
    assert weights.shape == (1, 8, 2)
    expected = manual_weights(model, batch, answer, score)
    torch.testing.assert_close(weights[0], expected, atol=1e-5, rtol=1e-4)
    assert float(expected.max()) > 0.2 and float(expected.std()) > 0.02  # a non-trivial check
    last, again = forward_with_answer_weights(model, batch, answer,
                                              forward=lambda m, b: m(b.tokens)[:, -1])
    assert torch.equal(last, plain[:, -1]) and torch.equal(again, weights)  # a given forward


class MaskedTiny(TinyAttention):
    """TinyAttention whose attention call carries an all-True mask: the probe then computes
    every row (its path with a mask) instead of the query rows alone."""

    def forward(self, tokens, scale=None):
        x = self.wte(tokens)
        keep = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool)
        return self.head(x + self.attn(x, attn_mask=keep))


@pytest.mark.parametrize("attn", [
    {"score": "scaled_dot"}, {"score": "log_length"}, {"score": "cosine"},
    {"score": "softcap", "cap": 2.0},  # not fused: the chunked path with the row mask
    {"score": "scaled_dot", "rotary": True}, {"score": "scaled_dot", "n_kv_heads": 1},
    {"score": "cosine", "temperature": "qknorm", "seq_len": 24}])  # a learned per-head g
@pytest.mark.parametrize("causal", [True, False])
def test_the_query_rows_alone_give_the_every_row_weights(attn, causal):
    """Rows in the middle of the sequence (so a causal row sees only part of the keys, and
    log_length's ln n is that row's count): the query-row path equals the every-row path."""
    task = LengthTask(seq_len=12, num_pairs=2, num_keys=4, num_values=4, num_fillers=8)
    batch = task.sample(24, 8, step=3)
    query = torch.tensor([3, 7, 10, 23, 0, 15, 19, 5])
    targets = torch.full_like(batch.targets, IGNORE_INDEX)
    targets[torch.arange(8), query] = 1
    batch = Batch(batch.tokens, targets)
    answer = torch.tensor([9, 7, 4, 20, 0, 2, 18, 11])  # rows 0 and 7: past the query
    torch.manual_seed(0)
    rows = TinyAttention(task.vocab_size, **attn)
    rows.attn.causal = causal
    every = MaskedTiny(task.vocab_size, **attn)
    every.load_state_dict(rows.state_dict())
    every.attn.causal = causal
    with torch.no_grad():
        rows.attn.q_proj.weight.mul_(8.0)
        every.attn.q_proj.weight.mul_(8.0)
    _, fast = forward_with_answer_weights(rows, batch, answer)
    _, slow = forward_with_answer_weights(every, batch, answer)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
    assert float(slow.std()) > 0.01  # weights that differ across rows: a non-trivial check
    if causal:
        assert float(fast[0][answer > query].abs().max()) == 0.0  # a key past the query: unseen


@pytest.mark.parametrize("score", ["scaled_dot", "log_length"])
def test_uniform_attention_gives_one_over_visible_keys(score):
    task = LengthTask(seq_len=8, num_pairs=2, eval_size=32, eval_multipliers=(1, 3))
    model = GPT(GPTConfig(vocab_size=task.vocab_size, seq_len=8, d_model=16, n_heads=2,
                          n_layers=2, score=score, pos="rope", mlp=False))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MultiheadSelfAttention):
                m.q_proj.weight.zero_()  # q = 0: every logit 0, attention uniform
    model.train()
    out = answer_attention(model, task)
    assert model.training  # left as it was
    assert set(out) == {"n=8", "n=24"}
    for name, length in (("n=8", 8), ("n=24", 24)):
        # the query is the last position: it sees all `length` keys
        assert out[name]["layers"] == pytest.approx([1 / length] * 2, rel=1e-5)
        assert out[name]["max"] == pytest.approx(1 / length, rel=1e-5)
        assert len(out[name]["heads"]) == 2 and len(out[name]["heads"][0]) == 2


def test_summarize_pools_sequences_then_takes_max_over_heads_and_layers():
    w = torch.tensor([[[0.1, 0.9], [0.3, 0.5]],    # layer 0: head means 0.2, 0.7
                      [[0.4, 0.0], [0.8, 0.2]]])   # layer 1: head means 0.6, 0.1
    s = summarize(w)
    assert [x for row in s["heads"] for x in row] == pytest.approx([0.2, 0.7, 0.6, 0.1])
    assert s["layers"] == pytest.approx([0.7, 0.6])
    assert s["max"] == pytest.approx(0.7)
    assert summarize(torch.zeros(0, 4, 0))["max"] is None
    with pytest.raises(ValueError, match="weights"):
        summarize(torch.zeros(3, 4))


def test_previous_capture_hooks_chain_and_are_restored():
    task = LengthTask(seq_len=10, num_pairs=2)
    model = TinyAttention(task.vocab_size)
    seen = []
    hook = lambda mod, q, k, call: seen.append(q.shape)  # noqa: E731
    model.attn.capture = hook
    batch = task.sample(10, 4)
    with watch_answer(model, query_positions(batch), task.answer_positions(batch)) as found:
        model(batch.tokens)
    assert len(found) == 1 and len(seen) == 1
    assert model.attn.capture is hook


def test_input_errors():
    task = LengthTask(seq_len=10, num_pairs=2)
    model = TinyAttention(task.vocab_size)
    batch = task.sample(10, 4)
    answer = task.answer_positions(batch)
    two = batch.targets.clone()
    two[:, 0] = 1
    with pytest.raises(ValueError, match="exactly one labelled"):
        query_positions(Batch(batch.tokens, two))
    none = torch.full_like(batch.targets, IGNORE_INDEX)
    with pytest.raises(ValueError, match="exactly one labelled"):
        query_positions(Batch(batch.tokens, none))
    with pytest.raises(ValueError, match="answer"):
        forward_with_answer_weights(model, batch, answer[:2])
    with pytest.raises(ValueError, match="answer"):
        forward_with_answer_weights(model, batch, answer + 10)
    with pytest.raises(ValueError, match="answer"):
        forward_with_answer_weights(model, batch, answer.float())
    mqar = make_task("mqar", vocab_size=64, num_kv_pairs=2, seq_len=16)
    assert not has_answer_positions(mqar) and has_answer_positions(task)
    with pytest.raises(ValueError, match="answer_positions"):
        answer_attention(model, mqar)


LENGTH = {"task": "length", "seq_len": 12, "num_pairs": 2, "pos": "rope", "d_model": 16,
          "n_heads": 2, "n_layers": 2, "mlp": False, "eval_size": 32, "steps": 1,
          "warmup_steps": 0}


def test_evaluate_adds_answer_weight_for_the_length_task_only():
    cfg = TrainConfig(**LENGTH)
    task = build_task(cfg)
    model = build_model(cfg, task)
    results = evaluate(model, task)
    probe = answer_attention(model, task)
    assert set(results) == {"n=12", "n=24", "n=48"}
    for name, row in results.items():
        assert set(row) == {"loss", "metric", "answer_weight"}
        assert row["answer_weight"] == pytest.approx(probe[name]["max"], rel=1e-6)
        assert 0.0 < row["answer_weight"] < 1.0
    mqar = TrainConfig(task="mqar", vocab_size=64, num_kv_pairs=2, seq_len=16, d_model=16,
                       n_heads=2, eval_size=32, steps=1, warmup_steps=0)
    mqar_task = build_task(mqar)
    for row in evaluate(build_model(mqar, mqar_task), mqar_task).values():
        assert set(row) == {"loss", "metric"}
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    broken = evaluate(model, task)
    assert all(row == {"loss": None, "metric": None, "answer_weight": None}
               for row in broken.values())
