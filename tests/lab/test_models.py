"""attnscale.lab.models.GPT: shapes for every score and position option, causality, gradients of the
learnable score parameters, the salience scale, and the two initializations."""

from __future__ import annotations

import math

import pytest
import torch

from attnscale import SCORES
from attnscale.lab.models import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = {"vocab_size": 23, "seq_len": 12, "d_model": 16, "n_heads": 4, "n_layers": 2}


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **overrides}))


def tokens(b: int = 2, t: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (b, t), generator=g)


VARIANTS = [{"score": s} for s in sorted(SCORES)] + [
    {"score": "cosine", "temperature": "swin"},
    {"score": "cosine", "temperature": "qknorm"},
    {"score": "cosine", "score_params": {"tau": 10.0}},
    {"score": "softcap", "score_params": {"cap": 5.0}},
    {"score": "scaled_dot", "n_kv_heads": 2},
    {"score": "scaled_dot", "init": "mup"},
    {"score": "cosine", "init": "mup"},
    {"score": "scaled_dot", "tie_embeddings": False},
    {"score": "scaled_dot", "mlp": False},
]


def variant_id(v: dict) -> str:
    return "-".join(f"{k}={x}" for k, x in v.items())


@pytest.mark.parametrize("pos", ["learned", "rope", "none"])
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_forward_shape_and_finite(variant, pos):
    model = tiny(pos=pos, **variant)
    logits = model(tokens(3, 9))
    assert logits.shape == (3, 9, TINY["vocab_size"])
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("pos", ["learned", "rope", "none"])
@pytest.mark.parametrize("score", ["scaled_dot", "cosine", "softcap", "log_length"])
def test_causal_output_ignores_later_tokens(score, pos):
    model = tiny(score=score, pos=pos)
    x = tokens()
    changed = x.clone()
    t = 5
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % TINY["vocab_size"]
    a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])  # later positions do see the change


def test_encoder_sees_the_whole_sequence():
    model = tiny(causal=False)
    x = tokens()
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % TINY["vocab_size"]
    assert not torch.allclose(model(x)[:, 0], model(changed)[:, 0])


@pytest.mark.parametrize(
    "variant,names",
    [
        ({"score": "cosine", "temperature": "swin"}, ["logit_scale"]),
        ({"score": "cosine", "temperature": "qknorm"}, ["gain"]),
        ({"score": "qk_layernorm"}, ["q_weight", "k_weight"]),
        ({"score": "qk_rmsnorm"}, ["q_weight", "k_weight"]),
        ({"score": "log_length"}, ["s"]),
    ],
    ids=lambda v: variant_id(v) if isinstance(v, dict) else "",
)
def test_learnable_score_parameters_get_gradients(variant, names):
    model = tiny(**variant)
    model(tokens()).logsumexp(-1).pow(2).mean().backward()
    for block in model.blocks:
        for name in names:
            grad = getattr(block.attn, name).grad
            assert grad is not None and grad.abs().sum() > 0, name


def test_qknorm_gain_starts_at_log2_of_block_size():
    model = tiny(score="cosine", temperature="qknorm")
    g0 = math.log2(TINY["seq_len"] ** 2 - TINY["seq_len"])
    assert model.blocks[0].attn.gain.item() == pytest.approx(g0)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_salience_scale_changes_the_output(pos):
    model = tiny(pos=pos)
    x = tokens()
    ones = torch.ones(x.shape)
    scaled = ones.clone()
    scaled[:, 3] = 3.0
    torch.testing.assert_close(model(x, ones), model(x))
    assert not torch.allclose(model(x, scaled)[:, 3:], model(x)[:, 3:])


def test_learned_positions_reject_longer_sequences():
    with pytest.raises(ValueError, match="seq_len"):
        tiny()(tokens(1, TINY["seq_len"] + 1))
    assert tiny(pos="rope")(tokens(1, 2 * TINY["seq_len"])).shape[1] == 2 * TINY["seq_len"]


def test_gpt2_init_stds():
    model = tiny(d_model=64, n_layers=4, vocab_size=512, seq_len=64)
    std = 0.02
    assert model.wte.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(std, rel=0.05)
    resid = std / math.sqrt(2 * 4)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(resid, rel=0.05)
    assert model.blocks[0].attn.out_proj.weight.std().item() == pytest.approx(resid, rel=0.1)
    assert model.lm_head.weight is model.wte.weight
    assert model.lr_scales() == {} and model.readout_mult == 1.0
    attention_only = tiny(d_model=64, n_layers=4, mlp=False)
    assert attention_only.blocks[0].mlp is None
    out_std = attention_only.blocks[0].attn.out_proj.weight.std().item()
    assert out_std == pytest.approx(std / math.sqrt(4), rel=0.1)  # one residual branch per block


def test_mup_init_zero_query_readout_and_width_scaling():
    base = 32
    model = tiny(d_model=128, init="mup", mup_base_width=base, tie_embeddings=False)
    fc = model.blocks[0].mlp.fc.weight  # fan_in = d_model
    assert fc.std().item() == pytest.approx(0.02 * math.sqrt(base / 128), rel=0.05)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.blocks[0].attn.q_proj.weight.abs().sum() == 0
    assert model.lm_head.weight.abs().sum() == 0
    assert model.readout_mult == pytest.approx(base / 128)
    scales = model.lr_scales()
    assert scales["blocks.0.mlp.fc.weight"] == pytest.approx(base / 128)
    assert scales["blocks.0.mlp.proj.weight"] == pytest.approx(base / 512)  # fan_in 4·d
    assert "wte.weight" not in scales


def test_mup_keeps_query_init_for_normalized_scores():
    model = tiny(init="mup", score="qk_rmsnorm")
    assert model.blocks[0].attn.q_proj.weight.abs().sum() > 0


@pytest.mark.parametrize(
    "overrides,words",
    [
        ({"pos": "sinusoid"}, "pos must be one of"),
        ({"init": "xavier"}, "init must be one of"),
        ({"score": "cosinus"}, "score must be one of"),
        ({"d_model": 15}, "divisible"),
        ({"init_std": 0.0}, "init_std"),
        ({"n_layers": 0}, "n_layers"),
    ],
)
def test_bad_config(overrides, words):
    with pytest.raises(ValueError, match=words):
        tiny(**overrides)


@pytest.mark.parametrize("d_model", [32, 128])
def test_unit_init_gives_q_and_k_components_of_unit_variance(d_model):
    """init="unit" is the regime of Vaswani et al.'s footnote: q and k components of variance 1
    at init, measured through the model's own first layer; GPT-2's std 0.02 gives d_model·4e-4."""
    captured = {}
    for init, want in (("unit", 1.0), ("gpt2", d_model * 0.02**2)):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=64, seq_len=32, d_model=d_model, n_heads=2,
                              n_layers=1, init=init, pos="none"))
        attn = model.blocks[0].attn
        hook = attn.q_proj.register_forward_hook(lambda m, i, o: captured.update(q=o))
        hook_k = attn.k_proj.register_forward_hook(lambda m, i, o: captured.update(k=o))
        with torch.no_grad():
            model(torch.randint(0, 64, (16, 32), generator=torch.Generator().manual_seed(1)))
        hook.remove()
        hook_k.remove()
        for name in ("q", "k"):
            var = float(captured[name].var())
            # d_model² weights and 512 rows: the sample variance is within 20% of its mean
            assert var == pytest.approx(want, rel=0.2), (init, name, var)


# ------------------------------------------------------------------------------------------
# Where the salience scale acts (cue_at)
# ------------------------------------------------------------------------------------------


def cue(x: torch.Tensor, seed: int = 2) -> torch.Tensor:
    """A salience-like scale: ~1 everywhere, one position per row at ~3."""
    g = torch.Generator().manual_seed(seed)
    scale = 1.0 + 0.1 * (2 * torch.rand(x.shape, generator=g) - 1)
    scale[torch.arange(x.shape[0]), torch.randint(0, x.shape[1], (x.shape[0],), generator=g)] = 3.0
    return scale


def first_layer_tensors(model: GPT, x: torch.Tensor, scale: torch.Tensor | None) -> dict:
    """The residual stream entering block 0, its q and v projections, the k entering the score
    (after the key scale), and the output logits."""
    got: dict = {}
    attn = model.blocks[0].attn
    hooks = [
        model.blocks[0].ln_1.register_forward_hook(lambda m, i, o: got.update(resid=i[0])),
        attn.q_proj.register_forward_hook(lambda m, i, o: got.update(q=o)),
        attn.v_proj.register_forward_hook(lambda m, i, o: got.update(v=o)),
    ]
    attn.capture = lambda mod, q, k, call: got.setdefault("k", k)
    try:
        with torch.no_grad():
            got["logits"] = model(x, scale)
    finally:
        attn.capture = None
        for h in hooks:
            h.remove()
    return got


@pytest.mark.parametrize("pos", ["learned", "rope", "none"])
def test_key_cue_reaches_only_the_keys(pos):
    """cue_at="key": embedding/residual, q and v are the same with and without the cue; k is
    multiplied by exactly the scale, per token; the output changes (a dot score reads |k|)."""
    model = tiny(pos=pos, cue_at="key", init="unit")  # unit q, k: logits of order 1
    x = tokens()
    scale = cue(x)
    plain, cued = first_layer_tensors(model, x, None), first_layer_tensors(model, x, scale)
    for name in ("resid", "q", "v"):
        assert torch.equal(plain[name], cued[name]), name
    want = plain["k"] * scale[:, None, :, None]  # (B, Hkv, T, d) times (B, 1, T, 1)
    assert torch.equal(cued["k"], want)
    assert not torch.equal(cued["k"], plain["k"])
    assert not torch.allclose(cued["logits"], plain["logits"], atol=1e-4)
    torch.testing.assert_close(model(x, torch.ones(x.shape)), model(x))


@pytest.mark.parametrize("variant", [
    {"score": "cosine"},
    {"score": "cosine", "score_params": {"tau": 10.0}},
    {"score": "cosine", "temperature": "swin"},
    {"score": "cosine", "temperature": "swin", "pos": "rope", "mlp": False},
], ids=variant_id)
def test_cosine_is_blind_to_the_key_cue(variant):
    """τ·cos(q, s·k) = τ·cos(q, k) for s > 0, so under cue_at="key" the whole cosine model (every
    layer, MLPs, learned τ) gives the same output with and without the cue; a dot score does not."""
    x = tokens(4)
    scale = cue(x)
    for n_layers in (1, 2):
        model = tiny(cue_at="key", n_layers=n_layers, init="unit", **variant)
        with torch.no_grad():
            torch.testing.assert_close(model(x, scale), model(x), rtol=0, atol=1e-5)
    dot = tiny(cue_at="key", score="scaled_dot", init="unit")
    with torch.no_grad():
        assert (dot(x, scale) - dot(x)).abs().max() > 1e-2


def test_embedding_cue_is_the_default_and_scales_the_embedding():
    """Default (cue_at="embedding"): block 0 reads scale·E[x] + P[pos], and k is not rescaled."""
    assert GPTConfig().cue_at == "embedding"
    model = tiny()
    x = tokens()
    scale = cue(x)
    got = first_layer_tensors(model, x, scale)
    want = model.wte(x) * scale[..., None] + model.wpe(torch.arange(x.shape[1]))
    torch.testing.assert_close(got["resid"], want, rtol=0, atol=0)
    k = model.blocks[0].attn.k_proj(model.blocks[0].ln_1(want))  # (B, T, C), heads not split
    b, t, _ = k.shape
    torch.testing.assert_close(got["k"], k.view(b, t, 4, -1).transpose(1, 2))


def test_uniform_attention_control_ignores_q_and_k():
    """The uniform-attention control (scaled_dot with scale=1e-20, see the report) makes every
    logit round to 0: the output does not depend on W_K, nor on the key cue."""
    x = tokens()
    model = tiny(cue_at="key", score_params={"scale": 1e-20})
    with torch.no_grad():
        before = model(x, cue(x))
        for block in model.blocks:
            block.attn.k_proj.weight.normal_(std=10.0)
        assert torch.equal(model(x, cue(x)), before)
        assert torch.equal(model(x), before)


def test_cue_errors():
    with pytest.raises(ValueError, match="cue_at"):
        tiny(cue_at="value")
    model = tiny(cue_at="key")
    x = tokens()
    with pytest.raises(ValueError, match="scale"):
        model(x, torch.ones(2, 5))
    with pytest.raises(ValueError, match="key_scale"):
        model.blocks[0].attn(torch.zeros(2, 12, 16), key_scale=torch.ones(2, 5))


def test_training_builds_the_model_the_task_cue_asks_for():
    """TrainConfig(cue_at=...) must reach both the task and the model: with the task alone the
    key cue would silently be applied to the embedding. Needs attnscale.lab.train.build_model
    to pass ``cue_at=getattr(task, "cue_at", "embedding")`` to GPTConfig."""
    from attnscale.lab.train import TrainConfig, build_model, build_task

    for cue_at in ("embedding", "key"):
        config = TrainConfig(task="salience", cue_at=cue_at, d_model=16, n_heads=2, steps=1)
        task = build_task(config)
        assert task.cue_at == cue_at
        assert build_model(config, task).config.cue_at == cue_at, "train.build_model drops cue_at"
    assert build_model(TrainConfig(steps=1), build_task(TrainConfig(steps=1))).config.cue_at == \
        "embedding"


@pytest.mark.parametrize("variant", [{"score": "scaled_dot"}, {"score": "cosine"},
                                     {"score": "scaled_dot", "init": "mup"},
                                     {"score": "scaled_dot", "tie_embeddings": False}],
                         ids=variant_id)
def test_readout_at_some_positions_is_the_full_readout_there(variant):
    model = tiny(**variant)
    x = tokens(3, 12)
    at = torch.zeros(3, 12, dtype=torch.bool)
    at[0, 11], at[1, 3], at[2, 0], at[2, 7] = True, True, True, True
    full = model(x)  # (B, T, V)
    picked = model(x, at=at)  # (N, V), row-major
    assert picked.shape == (4, TINY["vocab_size"])
    # rows of one matmul against rows of another: float32 rounding only
    torch.testing.assert_close(picked, full[at], rtol=1e-5, atol=1e-5)
    everywhere = model(x, at=torch.ones(3, 12, dtype=torch.bool))
    torch.testing.assert_close(everywhere, full.reshape(-1, TINY["vocab_size"]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("at", [torch.ones(3, 12), torch.ones(2, 12, dtype=torch.bool)],
                         ids=["float", "shape"])
def test_readout_positions_must_be_a_bool_mask_of_the_tokens_shape(at):
    with pytest.raises(ValueError, match="at must be a bool"):
        tiny()(tokens(3, 12), at=at)
