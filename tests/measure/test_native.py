"""The native attention-with-statistics kernel against the float64 Python reference and SDPA."""

from __future__ import annotations

import platform

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscale.measure import native
from attnscale.measure.stats import SUM_FIELDS, attention_with_sums


@pytest.fixture(scope="module")
def kernel():
    usable = platform.machine().lower() in ("x86_64", "amd64") and (
        torch.backends.cpu.get_cpu_capability() in native.FLAGS)
    fn = native.fused_kernel()
    if fn is None:
        if usable:  # where the kernel should work, a failed build is a failure, not a skip
            pytest.fail(f"native kernel unavailable: {native.unavailable_reason()}")
        pytest.skip(native.unavailable_reason())
    return fn


def case(seed, b, h, hkv, n, s, d, dv, mask, causal):
    """Inputs laid out as models pass them: heads transposed out of (B, N, H·d)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, h * d, generator=g).view(b, n, h, d).transpose(1, 2) * 1.5
    k = torch.randn(b, s, hkv * d, generator=g).view(b, s, hkv, d).transpose(1, 2)
    v = torch.randn(b, s, hkv * dv, generator=g).view(b, s, hkv, dv).transpose(1, 2)
    keep = None
    if mask == "padding":  # (B, 1, 1, S), as a key-padding mask broadcasts
        keep = torch.ones(b, 1, 1, s, dtype=torch.bool)
        keep[0, ..., s // 2:] = False
    elif mask == "full":  # (B, H, N, S), with one query that sees no key
        keep = torch.rand(b, h, n, s, generator=g) > 0.4
        keep[-1, -1, 0] = False
    rows = torch.rand(b, n, generator=g) > 0.2
    return q, k, v, keep, causal, rows


def reference(q, k, v, keep, causal, scale, rows):
    """Python version in float64, key/value heads repeated for grouped queries."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1).double() for t in (k, v))
    return attention_with_sums(q.double(), k, v, keep, causal, scale, rows[:, None, :])


def check(kernel, q, k, v, keep, causal, rows, scale=0.35, sdpa_tol=1e-6):
    out, sums, head_max = kernel(q, k, v, keep, causal, scale, rows)
    want, want_sums, want_max = reference(q, k, v, keep, causal, scale, rows)
    assert out.shape == want.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6)
    assert sums.shape == (q.shape[1], len(SUM_FIELDS)) and sums.dtype == torch.float64
    jac = SUM_FIELDS.index("jacobian_norm")
    other = [i for i in range(len(SUM_FIELDS)) if i != jac]
    torch.testing.assert_close(sums[:, other], want_sums[:, other], rtol=2e-5, atol=1e-4)
    # ‖J‖_F = √(Σp² − 2Σp³ + (Σp²)²) subtracts terms of size 1: from float32 sums a near one-hot
    # row keeps about √(3e-7) ≈ 6e-4 absolute (the Python float32 path has the same limit).
    rows_per_head = want_sums[:, SUM_FIELDS.index("rows")]
    assert torch.all((sums[:, jac] - want_sums[:, jac]).abs() <= 1e-3 * rows_per_head + 1e-6)
    torch.testing.assert_close(head_max, want_max.double(), rtol=1e-5, atol=1e-5)
    if keep is None or not causal:  # SDPA takes one of the two
        mask = keep
        if causal:
            mask, causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(), False
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
            enable_gqa=k.shape[1] != q.shape[1])
        torch.testing.assert_close(out, sdpa, rtol=sdpa_tol, atol=sdpa_tol)


@pytest.mark.parametrize("mask", [None, "padding", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "b, h, hkv, n, s, d, dv",
    [(2, 4, 4, 37, 37, 32, 32),  # rows not a multiple of the 4-row tile, keys of the vector
     (1, 6, 2, 5, 70, 8, 24),  # grouped queries, more keys than queries, dv ≠ d
     (2, 2, 1, 9, 3, 5, 3)],  # tiny odd sizes: every tail path
)
def test_matches_reference_and_sdpa(kernel, b, h, hkv, n, s, d, dv, mask, causal):
    check(kernel, *case(0, b, h, hkv, n, s, d, dv, mask, causal))


def test_row_with_no_visible_key_gives_zero_and_is_skipped(kernel):
    q, k, v, keep, _, rows = case(1, 1, 2, 2, 4, 6, 8, 8, "full", False)
    keep[0, 1, 2] = False
    out, sums, _ = kernel(q, k, v, keep, False, 0.5, rows)
    assert torch.all(out[0, 1, 2] == 0)
    visible_rows = (keep.any(-1) & rows[:, None, :]).sum(dim=(0, 2)).double()
    torch.testing.assert_close(sums[:, SUM_FIELDS.index("rows")], visible_rows)


def test_output_layout_is_sdpas(kernel):
    """(B, H, N, Dv) stored as (B, N, H, Dv): transpose(1, 2) is contiguous, as for SDPA."""
    q, k, v, keep, causal, rows = case(2, 2, 3, 3, 6, 6, 8, 8, None, False)
    out, _, _ = kernel(q, k, v, keep, causal, 0.3, rows)
    assert out.transpose(1, 2).is_contiguous()


@settings(deadline=None)  # examples: the hypothesis profile (tests/conftest.py)
@given(
    b=st.integers(1, 2), hkv=st.integers(1, 2), group=st.integers(1, 3),
    n=st.integers(1, 20), s=st.integers(1, 40), d=st.integers(1, 40), dv=st.integers(1, 40),
    mask=st.sampled_from([None, "padding", "full"]), causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_any_shape(kernel, b, hkv, group, n, s, d, dv, mask, causal, seed):
    # Against SDPA at 1e-5: for some small shapes SDPA takes its math backend with the exact
    # exp, while the kernel uses the fast exp of SDPA's flash kernel (about 1e-6 relative), so
    # the two can differ by a few 1e-6; both are held to the float64 answer.
    check(kernel, *case(seed, b, hkv * group, hkv, n, s, d, dv, mask, causal), sdpa_tol=1e-5)


def test_bad_shapes_are_refused(kernel):
    q, k, v, keep, causal, rows = case(3, 2, 2, 2, 4, 4, 8, 8, None, False)
    with pytest.raises(RuntimeError, match="k and v"):
        kernel(q, k[:1], v[:1], keep, causal, 0.3, rows)  # one batch entry of keys
    with pytest.raises(RuntimeError, match="float32"):
        kernel(q.double(), k, v, keep, causal, 0.3, rows)
    with pytest.raises(RuntimeError, match="rows_kept"):
        kernel(q, k, v, keep, causal, 0.3, rows[:, :2])


def _native_records(caplog):
    return [r for r in caplog.records if r.name == native.__name__]


@pytest.mark.parametrize("cached", [False, True])
def test_first_call_logs_one_line_before_building_then_is_silent(
        cached, monkeypatch, tmp_path, caplog, capsys, recwarn):
    """One log line, emitted before the build blocks; WARNING (shown without any logging set up)
    when no cached build exists, INFO when one does; nothing on stdout, no warnings, and later
    calls log nothing."""
    import logging
    import types

    from torch.utils import cpp_extension

    caplog.set_level(logging.INFO, logger=native.__name__)
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = "attnscale_attention_with_sums_avx2"
    if cached:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.so").write_bytes(b"")
    builds = []

    def load(name, **kwargs):  # stands in for the ~30 s compile
        builds.append((name, len(_native_records(caplog))))
        return types.SimpleNamespace(attention_with_sums=lambda *a: a)

    monkeypatch.setattr(cpp_extension, "load", load)
    assert native.fused_kernel() is not None
    assert builds == [(name, 1)]  # the line came before the build started
    (record,) = _native_records(caplog)
    assert record.levelno == (logging.INFO if cached else logging.WARNING)
    assert name in record.getMessage()
    assert ("loading" if cached else "building") in record.getMessage()
    assert native.fused_kernel() is not None and native.unavailable_reason() is None
    assert len(builds) == 1 and len(_native_records(caplog)) == 1  # later calls: silent
    assert capsys.readouterr().out == ""
    assert not [w for w in recwarn if "attnscale" in str(w.message)]
