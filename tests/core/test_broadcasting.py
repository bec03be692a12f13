"""SDPA's broadcasting, for every score: any leading dimensions, batch or head dimensions of 1,
3-D queries with 4-D keys, masks that broadcast. The broadcast call must equal the same call on
inputs expanded to the full shape by hand, and the statistics must follow the same contract."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attnscale import SCORES, attention, attention_stats, reference_attention

PARAMS = {"cosine": {"tau": 4.0}, "softcap": {"cap": 2.0}}


@st.composite
def broadcast_case(draw):
    """Leading dims (…, H) and, for each of q, k, v and the mask, a version of them with some
    dims set to 1 and some leading 1s dropped (how SDPA callers broadcast)."""
    full = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))  # (…lead, H)
    nq, nk, d, dv = draw(st.integers(1, 5)), draw(st.integers(1, 5)), 4, draw(st.integers(1, 3))

    def trim(shape):  # dropping is only allowed for leading 1s: keep what SDPA can broadcast
        while shape and shape[0] == 1 and draw(st.booleans()):
            shape = shape[1:]
        return shape

    shapes = {n: trim(tuple(1 if draw(st.booleans()) else s for s in full))
              for n in ("q", "k", "v")}
    # The mask may broadcast but not add dimensions to the logits q·kᵀ (SDPA rejects that too).
    out = torch.broadcast_shapes(shapes["q"], shapes["k"])
    shapes["mask"] = trim(tuple(1 if draw(st.booleans()) else s for s in out))
    return full, nq, nk, d, dv, shapes, draw(st.booleans()), draw(st.integers(0, 2**16))


def tensors(case, dtype=torch.float64):
    _, nq, nk, d, dv, shapes, causal, seed = case
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shapes["q"], nq, d, generator=g, dtype=dtype)
    k = torch.randn(*shapes["k"], nk, d, generator=g, dtype=dtype)
    v = torch.randn(*shapes["v"], nk, dv, generator=g, dtype=dtype)
    mask = torch.rand(*shapes["mask"], nq, nk, generator=g) > 0.3
    return q, k, v, mask, causal


@pytest.mark.parametrize("score", sorted(SCORES))
@given(case=broadcast_case())
def test_broadcast_equals_explicit_expansion(score, case):
    q, k, v, mask, causal = tensors(case)
    out = attention(q, k, v, attn_mask=mask, is_causal=causal, score=score,
                    **PARAMS.get(score, {}))
    full = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], mask.shape[:-2])
    qe, ke, ve = (t.expand(*full, *t.shape[-2:]).contiguous() for t in (q, k, v))
    me = mask.expand(*full, *mask.shape[-2:]).contiguous()
    flat = [t.reshape(-1, *t.shape[-2:]).unsqueeze(0) for t in (qe, ke, ve, me)]  # (1, X, N, D)
    want = attention(*flat[:3], attn_mask=flat[3], is_causal=causal, score=score,
                     **PARAMS.get(score, {})).reshape(*full, *out.shape[-2:])
    assert out.shape == want.shape
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    ref = reference_attention(q, k, v, attn_mask=mask, is_causal=causal, score=score,
                              **PARAMS.get(score, {}))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    if score == "scaled_dot":
        # SDPA refuses a mask with is_causal on its math kernel: give it the folded mask
        keep = mask & torch.ones(mask.shape[-2:], dtype=torch.bool).tril() if causal else mask
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        torch.testing.assert_close(out, sdpa, rtol=0, atol=1e-12)


@given(case=broadcast_case())
def test_stats_follow_the_same_contract(case):
    """Statistics of a broadcast call equal those of the explicitly expanded call."""
    q, k, _, mask, causal = tensors(case)
    full = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], mask.shape[:-2])
    got = attention_stats(q, k, attn_mask=mask, is_causal=causal)
    qe, ke, me = (t.expand(*full, *t.shape[-2:]) for t in (q, k, mask))
    h = full[-1] if full else 1  # 2-D inputs: one head
    flat = [t.reshape(-1, h, *t.shape[-2:]) for t in (qe, ke, me)]  # (B, H, N, ·)
    want = attention_stats(flat[0], flat[1], attn_mask=flat[2], is_causal=causal)
    for name in ("entropy", "max_weight", "logit_std", "rows"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.shape == (h,)
        torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), equal_nan=True,
                                   rtol=1e-9, atol=1e-12)


def test_per_head_parameters_index_dimension_minus_3():
    """A per-head τ of length H applies along dimension −3 of the broadcast shape, also when
    the query is 3-D and the keys are 4-D."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)  # (H, N, D), broadcast over B
    k, v = (torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64) for _ in range(2))
    tau = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64)
    out = attention(q, k, v, score="cosine", tau=tau)
    assert out.shape == (2, 3, 5, 8)
    for h in range(3):
        one = attention(q[h], k[:, h], v[:, h], score="cosine", tau=float(tau[h]))
        torch.testing.assert_close(out[:, h], one, rtol=0, atol=1e-12)
    ref = reference_attention(q, k, v, score="cosine", tau=tau)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_gqa_with_fewer_value_heads_than_key_heads():
    """SDPA accepts key and value head counts that differ, each dividing the query's."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 1, 6, 8, generator=g, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(attention(q, k, v, enable_gqa=True), want, rtol=0, atol=1e-12)
    for score in SCORES:
        out = attention(q, k, v, enable_gqa=True, score=score, **PARAMS.get(score, {}))
        ref = reference_attention(q, k, v, enable_gqa=True, score=score, **PARAMS.get(score, {}))
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


@st.composite
def any_shapes(draw):
    """Arbitrary (mostly mismatched) non-empty shapes for q, k, v and a mask."""
    def shape(last):
        lead = draw(st.lists(st.integers(1, 3), max_size=3))
        return (*lead, draw(st.integers(1, 3)), last)

    d = draw(st.integers(1, 3))
    q, k = shape(d), shape(d if draw(st.integers(0, 9)) else d + 1)
    v = (*draw(st.sampled_from([k[:-1], shape(2)[:-1]])), draw(st.integers(1, 3)))
    mask = None
    if draw(st.booleans()):
        m = draw(st.lists(st.integers(1, 3), max_size=4))
        mask = (*m, q[-2], k[-2]) if draw(st.booleans()) else (*m, draw(st.integers(1, 3)), 2)
    return q, k, v, mask, draw(st.booleans())


@given(case=any_shapes())
def test_accepts_exactly_what_sdpa_accepts(case):
    """Random shapes, most of them invalid: attnscale raises exactly when SDPA raises, and
    otherwise returns SDPA's shape and values. (Outside this contract on purpose: empty inputs,
    which SDPA answers with zeros before any check, and a mask combined with is_causal.)"""
    q_shape, k_shape, v_shape, mask_shape, gqa = case
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64)
               for s in (q_shape, k_shape, v_shape))
    mask = None if mask_shape is None else torch.rand(mask_shape, generator=g) > 0.2
    try:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    except (RuntimeError, ValueError, IndexError):
        want = None
    for score in ("scaled_dot", "softcap", "qk_rmsnorm"):
        try:
            got = attention(q, k, v, attn_mask=mask, enable_gqa=gqa, score=score,
                            **PARAMS.get(score, {}))
        except (ValueError, TypeError):
            got = None
        assert (got is None) == (want is None), (score, case)
        if want is not None:
            assert got.shape == want.shape
    if want is not None:
        got = attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("k_weight_shape", [(8,), (2, 8)])
def test_key_weights_under_gqa(k_weight_shape):
    """A shared (D,) key weight stays shared; an (Hk, D) one follows its key head, also when
    key and value head counts differ."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64)
    w = torch.rand(k_weight_shape, generator=g, dtype=torch.float64) + 0.5
    for v_heads in (2, 1):
        v = torch.randn(2, v_heads, 6, 3, generator=g, dtype=torch.float64)
        out = attention(q, k, v, enable_gqa=True, score="qk_layernorm", k_weight=w)
        ref = reference_attention(q, k, v, enable_gqa=True, score="qk_layernorm", k_weight=w)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        stats = attention_stats(q, k, enable_gqa=True, score="qk_layernorm", k_weight=w)
        assert stats.entropy.shape == (4,)
    # by hand: normalize each key head with its own weight, then serve two query heads each
    wk = w if w.dim() == 1 else w.repeat_interleave(2, dim=0)[:, None, :]
    kk = F.layer_norm(k.repeat_interleave(2, dim=1), (8,)) * wk
    qq = F.layer_norm(q, (8,))
    v = torch.randn(2, 2, 6, 3, generator=g, dtype=torch.float64)
    want = torch.softmax(qq @ kk.transpose(-2, -1) / 8**0.5, -1) @ v.repeat_interleave(2, dim=1)
    got = attention(q, k, v, enable_gqa=True, score="qk_layernorm", k_weight=w)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("score", sorted(SCORES))
def test_no_keys_gives_zeros_like_sdpa(score):
    q = torch.randn(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(2, 2, 0, 4, dtype=torch.float64), torch.randn(2, 2, 0, 5,
                                                                     dtype=torch.float64)
    out = attention(q, k, v, score=score, **PARAMS.get(score, {}))
    assert out.shape == (2, 2, 3, 5) and not out.any()
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))


def test_numpy_and_tensor_numbers_like_sdpa():
    import numpy as np

    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, dropout_p=np.float32(0), scale=0.5)
    got = attention(q, k, v, dropout_p=np.float32(0), scale=torch.tensor(0.5))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with pytest.raises(TypeError, match="dropout_p"):
        attention(q, k, v, dropout_p="0")
