"""Invariants of attention that hold for every score, checked with hypothesis."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscale import SCORES, attention

SCORE_PARAMS = {
    "scaled_dot": {},
    "dot": {},
    "mup": {"c": 8.0},
    "cosine": {"tau": 5.0},
    "qk_layernorm": {},
    "qk_rmsnorm": {},
    "softcap": {"cap": 2.0},
    "log_length": {"s": 1.0},
}

shapes = st.tuples(
    st.integers(1, 2),  # B
    st.integers(1, 3),  # H
    st.integers(1, 9),  # Nq
    st.integers(1, 9),  # Nk
    st.sampled_from([2, 4, 8]),  # D
)


def make(shape, seed, scale=1.0):
    b, h, nq, nk, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64) * scale
    return q, k


@settings(max_examples=40, deadline=None)
@given(
    shape=shapes,
    seed=st.integers(0, 2**31),
    score=st.sampled_from(sorted(SCORES)),
    causal=st.booleans(),
    scale=st.sampled_from([0.1, 1.0, 10.0]),
)
def test_rows_sum_to_one(shape, seed, score, causal, scale):
    """With V = identity the output rows are the attention weights, which sum to 1."""
    q, k = make(shape, seed, scale)
    b, h, nq, nk, _ = shape
    v = torch.eye(nk, dtype=torch.float64).expand(b, h, nk, nk)
    w = attention(q, k, v, is_causal=causal, score=score, **SCORE_PARAMS[score])
    assert torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(b, h, nq, dtype=torch.float64))
    if causal:  # no weight above the diagonal
        assert torch.all(w.triu(diagonal=1) == 0)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31), score=st.sampled_from(sorted(SCORES)))
def test_permuting_keys_and_values_together_changes_nothing(shape, seed, score):
    q, k = make(shape, seed)
    v = torch.randn_like(k)
    perm = torch.randperm(k.shape[-2], generator=torch.Generator().manual_seed(seed))
    a = attention(q, k, v, score=score, **SCORE_PARAMS[score])
    b = attention(q, k[:, :, perm], v[:, :, perm], score=score, **SCORE_PARAMS[score])
    torch.testing.assert_close(a, b)


@settings(max_examples=40, deadline=None)
@given(
    shape=shapes, seed=st.integers(0, 2**31), aq=st.floats(0.01, 100.0), ak=st.floats(0.01, 100.0)
)
def test_cosine_ignores_the_size_of_q_and_k(shape, seed, aq, ak):
    q, k = make(shape, seed)
    v = torch.randn_like(k)
    a = attention(q, k, v, score="cosine", tau=3.0)
    b = attention(q * aq, k * ak, v, score="cosine", tau=3.0)
    torch.testing.assert_close(a, b)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31), causal=st.booleans())
def test_dot_is_scaled_dot_with_scale_one(shape, seed, causal):
    q, k = make(shape, seed)
    v = torch.randn_like(k)
    torch.testing.assert_close(
        attention(q, k, v, is_causal=causal, score="dot"),
        attention(q, k, v, is_causal=causal, score="scaled_dot", scale=1.0),
    )


@settings(max_examples=30, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31), a=st.floats(0.01, 100.0))
def test_qk_norms_ignore_the_size_of_q(shape, seed, a):
    q, k = make(shape, seed)
    v = torch.randn_like(k)
    for score in ("qk_layernorm", "qk_rmsnorm"):
        torch.testing.assert_close(
            attention(q, k, v, score=score, eps=1e-12),
            attention(q * a, k, v, score=score, eps=1e-12),
        )
