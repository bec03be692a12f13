"""MultiheadSelfAttention: the module against the functional reference, and its parameters."""

from __future__ import annotations

import math

import pytest
import torch

from attnscale import SCORES, reference_attention
from attnscale.core.learned import qknorm_g0
from attnscale.core.nn import SWIN_INIT, MultiheadSelfAttention, check_sizes, temperatures


def test_rope_keeps_norms_and_makes_scores_relative():
    from attnscale.core.nn import apply_rope

    x = torch.randn(1, 2, 9, 8, dtype=torch.float64)
    r = apply_rope(x)
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(r[:, :, 0], x[:, :, 0])  # position 0 is not rotated
    # q·k depends only on the offset: shifting both by one position leaves the score unchanged
    q = torch.randn(8, dtype=torch.float64)
    k = torch.randn(8, dtype=torch.float64)
    seq = torch.zeros(1, 1, 6, 8, dtype=torch.float64)
    seq[0, 0, 1], seq[0, 0, 3] = q, k
    seq2 = torch.zeros_like(seq)
    seq2[0, 0, 2], seq2[0, 0, 4] = q, k
    a, b = apply_rope(seq), apply_rope(seq2)
    torch.testing.assert_close(a[0, 0, 1] @ a[0, 0, 3], b[0, 0, 2] @ b[0, 0, 4])
    assert not torch.allclose(a[0, 0, 1] @ a[0, 0, 3], q @ k)


def test_rope_tables_are_the_rotation_angles_and_are_reused():
    from attnscale.core.nn import apply_rope, rope_tables

    cos, sin = rope_tables(7, 8, 100.0, torch.float32, torch.device("cpu"))
    pos = torch.arange(7.0, dtype=torch.float64)[:, None]
    i = torch.arange(4.0, dtype=torch.float64)
    angles = pos * 100.0 ** (-2 * i / 8)  # pos·base^(−2i/d)
    assert cos.dtype == torch.float32 and not cos.requires_grad
    torch.testing.assert_close(cos, angles.cos().float(), rtol=0, atol=0)
    torch.testing.assert_close(sin, angles.sin().float(), rtol=0, atol=0)
    assert rope_tables(7, 8, 100.0, torch.float32, torch.device("cpu"))[0] is cos  # cached
    x = torch.randn(2, 3, 7, 8, requires_grad=True)
    y = apply_rope(x, base=100.0)
    y.sum().backward()  # a graph through the cached tables leaves them untouched
    assert x.grad is not None and not cos.requires_grad and cos.grad is None
    torch.testing.assert_close(cos, angles.cos().float(), rtol=0, atol=0)


def test_rope_tables_first_made_under_inference_mode_still_train():
    from attnscale.core.nn import apply_rope, rope_tables

    rope_tables.cache_clear()
    with torch.inference_mode():
        apply_rope(torch.randn(1, 1, 5, 6), base=77.0)  # the tables are made here first
    x = torch.randn(1, 1, 5, 6, requires_grad=True)
    apply_rope(x, base=77.0).sum().backward()  # an inference tensor could not be saved
    assert x.grad is not None


def test_capture_hook_sees_q_k_and_the_call():
    m = MultiheadSelfAttention(16, 4, score="cosine", tau=10.0, causal=True, rotary=True)
    seen = {}
    m.capture = lambda mod, q, k, call: seen.update(q=q, k=k, call=call)
    m(torch.randn(2, 5, 16))
    assert seen["q"].shape == (2, 4, 5, 4) and seen["call"]["score"] == "cosine"
    assert seen["call"]["tau"] == 10.0 and seen["call"]["is_causal"] is True


def reference_forward(m: MultiheadSelfAttention, x, is_causal):
    q, k, v = m.split_heads(x)
    kw = m._attention_kwargs()
    y = reference_attention(
        q,
        k,
        v,
        is_causal=is_causal,
        enable_gqa=m.n_kv_heads != m.n_heads,
        score=kw["score"],
        scale=kw["scale"],
        **kw["params"],
    )
    return m.out_proj(y.transpose(1, 2).reshape(x.shape))


CONFIGS = [{"score": s} for s in sorted(SCORES)] + [
    {"score": "cosine", "temperature": "swin"},
    {"score": "cosine", "temperature": "qknorm", "seq_len": 72},
    {"score": "cosine", "tau": 10.0},
    {"score": "softcap", "cap": 2.0},
    {"score": "qk_rmsnorm", "learn": False, "scale": 0.12},
    {"score": "log_length", "rotary": True},
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_module_matches_reference(cfg, n_kv_heads):
    torch.manual_seed(0)
    m = MultiheadSelfAttention(16, 4, n_kv_heads, causal=True, **cfg).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    torch.testing.assert_close(m(x), reference_forward(m, x, True), rtol=1e-10, atol=1e-10)


LEARNED = [
    ({"score": "cosine", "temperature": "swin"}, "logit_scale"),
    ({"score": "cosine", "temperature": "qknorm", "seq_len": 8}, "gain"),
    ({"score": "qk_layernorm"}, "q_weight"),
    ({"score": "qk_rmsnorm"}, "k_weight"),
    ({"score": "log_length"}, "s"),
]


@pytest.mark.parametrize("cfg,param", LEARNED, ids=lambda c: str(c))
def test_gradcheck_learnable_score_parameters(cfg, param):
    torch.manual_seed(0)
    m = MultiheadSelfAttention(8, 2, 1, causal=True, **cfg).double()
    with torch.no_grad():  # move away from the symmetric init so every entry matters
        p = getattr(m, param)
        p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)

    def f(x, p):
        return torch.func.functional_call(m, {param: p}, (x,))

    assert torch.autograd.gradcheck(f, (x, getattr(m, param).detach().clone().requires_grad_()))
    # the parameter really receives a gradient during training
    m(x).square().sum().backward()
    assert getattr(m, param).grad is not None and getattr(m, param).grad.abs().sum() > 0


def test_swin_temperature_init_and_clamp():
    m = MultiheadSelfAttention(16, 4, score="cosine", temperature="swin")
    torch.testing.assert_close(m.learned_params()["tau"], torch.full((4,), 10.0))
    assert m.logit_scale.shape == (4,) and math.isclose(SWIN_INIT, math.log(10))
    with torch.no_grad():
        m.logit_scale.fill_(10.0)
    torch.testing.assert_close(m.learned_params()["tau"], torch.full((4,), 100.0))  # ln 100 cap


def test_qknorm_gain_init():
    m = MultiheadSelfAttention(16, 4, score="cosine", temperature="qknorm", seq_len=72)
    assert math.isclose(m.gain.item(), qknorm_g0(72), rel_tol=1e-6)
    assert math.isclose(qknorm_g0(72), 12.32, abs_tol=0.005)


def test_log_length_s_is_per_head():
    m = MultiheadSelfAttention(16, 4, score="log_length", s=0.5)
    torch.testing.assert_close(m.s.detach(), torch.full((4,), 0.5))


def test_learned_parameters_come_from_the_registry():
    assert temperatures("cosine") == ("fixed", "swin", "qknorm")
    assert temperatures("scaled_dot") == ("fixed",)
    # learn=False keeps the fixed values: no parameter beyond the four projections
    for score in ("qk_layernorm", "qk_rmsnorm", "log_length"):
        learned = MultiheadSelfAttention(16, 4, score=score)
        fixed = MultiheadSelfAttention(16, 4, score=score, learn=False)
        assert learned.learned and not fixed.learned
        assert len(list(fixed.parameters())) == 4 < len(list(learned.parameters()))


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"d_model": 10, "n_heads": 4}, "divisible by n_heads"),
        ({"d_model": 16, "n_heads": 4, "n_kv_heads": 3}, "multiple of n_kv_heads"),
        ({"d_model": 16, "n_heads": 0}, r"n_heads must be an int in \[1, None\]; got 0"),
        ({"d_model": 16, "n_heads": 4, "score": "nope"}, "score must be one of"),
        ({"d_model": 16, "n_heads": 4, "score": "cosine", "tau": -1.0}, "tau must be > 0"),
        ({"d_model": 16, "n_heads": 4, "temperature": "swin"}, "needs score='cosine'"),
        (
            {"d_model": 16, "n_heads": 4, "score": "cosine", "temperature": "qknorm"},
            "seq_len",
        ),
        (
            {"d_model": 16, "n_heads": 4, "score": "cosine", "temperature": "hot"},
            "temperature must",
        ),
    ],
)
def test_bad_module_config(kwargs, words):
    with pytest.raises(ValueError, match=words):
        MultiheadSelfAttention(**kwargs)


@pytest.mark.parametrize(
    "kwargs,new",
    [
        ({"score": "qk_layernorm", "norm_affine": False}, "learn="),
        ({"score": "log_length", "learn_s": False}, "learn="),
        ({"score": "cosine", "temperature": "qknorm", "qknorm_length": 72}, "seq_len="),
    ],
)
def test_old_keywords_name_their_replacement(kwargs, new):
    old = next(k for k in kwargs if k not in ("score", "temperature"))
    with pytest.raises(TypeError, match=rf"no longer takes {old}=; use {new} instead"):
        MultiheadSelfAttention(16, 4, **kwargs)


@pytest.mark.parametrize("value", [True, 2.0, "2"])
def test_sizes_must_be_ints(value):
    with pytest.raises(TypeError, match="n_kv_heads must be an int"):
        check_sizes(16, 4, value)
    check_sizes(16, 4, 2)  # a valid layout passes


def test_bad_module_input():
    m = MultiheadSelfAttention(16, 4)
    with pytest.raises(ValueError, match=r"x must be \(B, N, 16\)"):
        m(torch.randn(2, 5, 12))


def test_repr_shows_the_score_and_its_settings() -> None:
    text = repr(MultiheadSelfAttention(64, 4, 2, score="softcap", cap=30.0, causal=True))
    assert "score='softcap'" in text and "cap=30.0" in text and "n_kv_heads=2" in text
    assert "causal=True" in text
    plain = repr(MultiheadSelfAttention(64, 4))
    assert "score='scaled_dot'" in plain and "n_kv_heads" not in plain and "causal" not in plain
