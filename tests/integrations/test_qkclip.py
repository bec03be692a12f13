"""QK-Clip (Kimi Team 2025, arXiv:2507.20534): after a clip at τ, re-measuring the same batch
gives every head a max |logit| ≤ τ -- exactly τ for the clipped heads, since √γ on W_q and W_k
multiplies the logits by γ -- and the heads under τ keep their weights and logits bitwise; for
the lab GPT, torch's MultiheadAttention, HF BERT (query/key), GPT-2 (c_attn columns) and LLaMA
(GQA: q only). Unsupported modules raise before any weight changes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.integrations.qkclip import (
    HeadClip,
    QKClip,
    clip_factors,
    per_head_max_logit,
    qk_clip_,
)
from attnscale.lab.models import GPT, GPTConfig
from attnscale.measure.monitor import Monitor

VOCAB, SEQ, WIDTH, HEADS = 50, 12, 32, 4
# One attention layer: a clip of layer l changes the inputs of the layers after it, so only the
# layer(s) whose inputs stay as measured re-measure at exactly τ (the docs say so).
LAYERS = 1


def maxima(model: nn.Module, forward) -> dict[str, np.ndarray]:
    """{layer: max |logit| per head} of one monitored forward."""
    with torch.no_grad(), Monitor(model) as mon:
        forward()
    return per_head_max_logit(mon.stats())


def randomize_biases(model: nn.Module) -> None:
    """Non-zero biases, so that a clip that forgot to scale them would show."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("bias_k"):
                p.normal_(std=0.5)


def check_clip(model: nn.Module, forward, changed: set[str]) -> list[HeadClip]:
    """Clip at the median head max and check the module docstring's promises; ``changed``: the
    only parameters (by name suffix) the clip may touch."""
    model.eval()
    before = maxima(model, forward)
    values = np.concatenate(list(before.values()))
    tau = float(np.median(values))
    assert (values > tau).any() and (values < tau).any()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    clips = qk_clip_(model, before, tau)
    after = maxima(model, forward)
    assert {(c.layer, c.head) for c in clips} == {
        (layer, h) for layer, s in before.items() for h in np.flatnonzero(s > tau)}
    for c in clips:
        assert c.gamma == pytest.approx(tau / c.max_logit, rel=1e-12)
    for layer, s in before.items():
        over = s > tau
        np.testing.assert_allclose(after[layer][over], tau, rtol=2e-5)
        assert np.array_equal(after[layer][~over], s[~over])  # bitwise: weights untouched
        assert (after[layer] <= tau * (1 + 2e-5)).all()
    touched = {n for n, p in model.named_parameters() if not torch.equal(p, params[n])}
    assert touched and all(n.endswith(tuple(changed)) for n in touched), touched
    return clips


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(0))


# -- attnscale's own attention ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "bias_rope", "gqa", "log_length"])
def test_lab_gpt(kind):
    extra = {"plain": {}, "bias_rope": {"bias": True, "pos": "rope"}, "gqa": {"n_kv_heads": 2},
             "log_length": {"score": "log_length"}}[kind]
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, seq_len=SEQ, d_model=WIDTH, n_heads=HEADS,
                          n_layers=LAYERS, init="unit", **extra))
    randomize_biases(model)
    x = tokens()
    q_before = [b.attn.q_proj.weight.detach().clone() for b in model.blocks]
    k_before = [b.attn.k_proj.weight.detach().clone() for b in model.blocks]
    changed = {"q_proj.weight", "q_proj.bias"}
    if kind != "gqa":  # under GQA the shared key heads stay as they are
        changed |= {"k_proj.weight", "k_proj.bias"}
    clips = check_clip(model, lambda: model(x), changed)
    d = WIDTH // HEADS
    for i, block in enumerate(model.blocks):
        heads = {c.head: c.gamma for c in clips if c.layer == f"blocks.{i}.attn"}
        q = block.attn.q_proj.weight.detach()
        for h in range(HEADS):
            rows = slice(h * d, (h + 1) * d)
            factor = heads.get(h, 1.0) if kind == "gqa" else math.sqrt(heads.get(h, 1.0))
            if h in heads:
                torch.testing.assert_close(q[rows], q_before[i][rows] * factor)
            else:
                assert torch.equal(q[rows], q_before[i][rows])
        if kind == "gqa":
            assert torch.equal(block.attn.k_proj.weight, k_before[i])


def test_core_module_alone():
    torch.manual_seed(0)
    model = MultiheadSelfAttention(WIDTH, HEADS, causal=True, bias=True)
    randomize_biases(model)
    x = torch.randn(2, SEQ, WIDTH) * 3
    check_clip(model, lambda: model(x), {"q_proj.weight", "q_proj.bias", "k_proj.weight",
                                         "k_proj.bias"})


@pytest.mark.parametrize("score", ["cosine", "qk_rmsnorm", "softcap"])
def test_scores_the_weights_do_not_scale_are_refused(score):
    model = nn.Sequential(MultiheadSelfAttention(WIDTH, HEADS, score=score))
    with pytest.raises(ValueError, match=rf"module '0'.*{score}"):
        QKClip(model, tau=10.0)


# -- torch.nn.MultiheadAttention ----------------------------------------------------------------


class TorchMHA(nn.Module):
    def __init__(self, kdim: int | None = None) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, kdim=kdim, vdim=kdim, batch_first=True)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.attn(x, y, y, need_weights=False)[0]


@pytest.mark.parametrize("kdim", [None, 24])
def test_torch_multihead_attention(kdim):
    torch.manual_seed(0)
    model = TorchMHA(kdim)
    randomize_biases(model)
    x, y = torch.randn(2, SEQ, WIDTH) * 3, torch.randn(2, SEQ + 3, kdim or WIDTH) * 3
    names = {"in_proj_bias"} | ({"in_proj_weight"} if kdim is None else
                                {"q_proj_weight", "k_proj_weight"})
    weight = model.attn.in_proj_weight
    values = None if weight is None else weight[2 * WIDTH:].detach().clone()
    check_clip(model, lambda: model(x, y), names)
    if values is not None:  # the value rows [2E, 3E) of the fused weight are never touched
        assert torch.equal(model.attn.in_proj_weight[2 * WIDTH:], values)


# -- Hugging Face -------------------------------------------------------------------------------


def hf(kind: str, impl: str = "eager"):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, intermediate_size=64,
                                      max_position_embeddings=32)
        model = transformers.BertModel(cfg, add_pooling_layer=False)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
                                      n_positions=32)
        model = transformers.GPT2Model(cfg)
    else:
        cls = {"llama": "LlamaConfig", "qwen3": "Qwen3Config"}[kind]
        cfg = getattr(transformers, cls)(
            vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=64, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=32,
            attention_bias=True)
        model = transformers.AutoModel.from_config(cfg)
    model.set_attn_implementation(impl)
    with torch.no_grad():  # weights larger than the 0.02-std init: logits far from 0
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name and "wte" not in name:
                p.mul_(20.0)
    randomize_biases(model)
    return model


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_bert_separate_query_key(impl):
    model = hf("bert", impl)
    x = tokens()
    check_clip(model, lambda: model(input_ids=x), {"query.weight", "query.bias", "key.weight",
                                                   "key.bias"})


def test_hf_gpt2_fused_c_attn_columns():
    model = hf("gpt2", "sdpa")
    x = tokens()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "c_attn" in n}
    clips = check_clip(model, lambda: model(input_ids=x), {"c_attn.weight", "c_attn.bias"})
    for name, w in before.items():  # the value columns [2E, 3E) stay as they were
        now = dict(model.named_parameters())[name]
        assert torch.equal(now[..., 2 * WIDTH:], w[..., 2 * WIDTH:])
    assert clips


def test_hf_llama_grouped_query_scales_queries_only():
    model = hf("llama", "sdpa")
    x = tokens()
    check_clip(model, lambda: model(input_ids=x), {"q_proj.weight", "q_proj.bias"})


def test_hf_qk_norm_is_refused_naming_the_module():
    model = hf("qwen3")
    layer = "layers.0.self_attn"
    with pytest.raises(ValueError, match=rf"{layer}.*q_norm"):
        qk_clip_(model, {layer: [1e3] * HEADS}, tau=1.0)


# -- the training-loop object and bad input -----------------------------------------------------


def test_qkclip_in_a_training_step():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, seq_len=SEQ, d_model=WIDTH, n_heads=HEADS,
                          n_layers=LAYERS, init="unit"))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # a step that changes nothing
    clip = QKClip(model, tau=0.5)
    x = tokens()
    assert clip.apply() == []  # nothing measured yet
    with clip.measure():
        model(x).sum().backward()
    opt.step()
    measured = clip.max_logit()
    clips = clip.apply()
    assert clips and all(0 < c.gamma < 1 and c.max_logit > 0.5 for c in clips)
    assert clip.max_logit() == {}  # apply forgets the recording
    after = maxima(model, lambda: model(x))
    for layer, s in measured.items():
        assert (after[layer] <= 0.5 * (1 + 2e-5)).all()
        np.testing.assert_allclose(after[layer][s > 0.5], 0.5, rtol=2e-5)


def test_unsupported_and_unknown_modules_raise_and_change_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(MultiheadSelfAttention(WIDTH, HEADS), nn.Linear(WIDTH, WIDTH))
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    big = [1e3] * HEADS
    with pytest.raises(ValueError, match=r"module '1' \(Linear\): cannot find its query and key"):
        qk_clip_(model, {"0": big, "1": big}, tau=1.0)
    with pytest.raises(ValueError, match="no module named 'nope'"):
        qk_clip_(model, {"0": big, "nope": big}, tau=1.0)
    with pytest.raises(ValueError, match=r"max_logit\['0'\] has 3 heads"):
        qk_clip_(model, {"0": [1e3] * 3}, tau=1.0)
    with pytest.raises(ValueError, match=r"layer '0'.*finite.*\[2\]"):
        qk_clip_(model, {"0": [1e3, 1e3, math.inf, 1.0]}, tau=1.0)
    assert all(torch.equal(p, state[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("tau, err", [(0.0, ValueError), (math.nan, ValueError),
                                      (-1.0, ValueError), (True, TypeError), ("1", TypeError)])
def test_bad_tau_names_tau(tau, err):
    with pytest.raises(err, match="tau"):
        clip_factors([1.0, 2.0], tau)
    with pytest.raises(err, match="tau"):
        QKClip(MultiheadSelfAttention(WIDTH, HEADS), tau=tau)


def test_clip_factors():
    np.testing.assert_array_equal(clip_factors([50.0, 100.0, 400.0, -7.0], 100.0),
                                  [1.0, 1.0, 0.25, 1.0])
    with pytest.raises(ValueError, match="max_logit must be 1-D"):
        clip_factors([[1.0]], 1.0)


@pytest.mark.parametrize("attribute,value,words", [
    ("attn_logit_softcapping", 50.0, "soft-caps"),
    ("position_embedding_type", "relative_key", "relative position"),
])
def test_attention_that_is_not_bilinear_is_refused(attribute, value, words):
    """Gemma 2's soft-capped logits and BERT's relative position scores do not scale by γ."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32)
    model = transformers.BertModel(cfg)
    attention = model.encoder.layer[0].attention.self
    setattr(attention, attribute, value)
    name = "encoder.layer.0.attention.self"
    with pytest.raises(ValueError, match=words):
        qk_clip_(model, {name: [1e3, 1e3]}, tau=1.0)
