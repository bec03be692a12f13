"""The native attention-with-statistics kernel against the float64 Python reference and SDPA:
the attention's own statistics, the counterfactual variants of the same pass (dot, cosine), the
portable generic build, the one-line build log and the build command."""

from __future__ import annotations

import logging
import math
import types
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscale.measure import native
from attnscale.measure.rowstats import head_sums, hide
from attnscale.measure.stats import SUM_FIELDS, attention_with_sums
from attnscale.util import cppext, jitcache

JAC = SUM_FIELDS.index("jacobian_norm")
OTHER = [i for i in range(len(SUM_FIELDS)) if i != JAC]
# Variants checked with every case: dot at two scales; cosine at τ = 1 (the monitor's), at 8
# (the largest with a fixed shift) and at 30 (past kFixedShiftMax: a row-max pass first).
DOTS, TAUS = [1.0, 0.5], [1.0, 8.0, 30.0]


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


def visible(q, k, keep, causal):
    """(B, H, N, S) bool: the keys each query sees."""
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    vis = torch.ones(shape, dtype=torch.bool)
    if causal:
        vis &= torch.ones(shape[-2:], dtype=torch.bool).tril()
    return vis if keep is None else vis & keep.expand(shape)


def reference(q, k, v, keep, causal, scale, rows):
    """Python version in float64, key/value heads repeated for grouped queries."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1).double() for t in (k, v))
    return attention_with_sums(q.double(), k, v, keep, causal, scale, rows[:, None, :])


def reference_variants(q, k, keep, causal, rows, dots=DOTS, taus=TAUS):
    """rowstats.head_sums in float64 of s·q·k per dot scale and τ·cos(q, k) per τ."""
    qd = q.double()
    kd = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).double()
    raw = qd @ kd.transpose(-2, -1)
    cos = (torch.nn.functional.normalize(qd, dim=-1, eps=native.COSINE_EPS)
           @ torch.nn.functional.normalize(kd, dim=-1, eps=native.COSINE_EPS).transpose(-2, -1))
    vis = visible(q, k, keep, causal)
    return [head_sums(hide(z, vis), rows[:, None, :])
            for z in [s * raw for s in dots] + [t * cos for t in taus]]


def assert_sums_close(sums, head_max, want_sums, want_max):
    """Float32 sums against float64 ones, in the tolerance every path is held to."""
    assert sums.dtype == torch.float64 and sums.shape == want_sums.shape
    torch.testing.assert_close(sums[:, OTHER], want_sums[:, OTHER], rtol=2e-5, atol=1e-4)
    # ‖J‖_F = √(Σp² − 2Σp³ + (Σp²)²) subtracts terms of size 1: from float32 sums a near one-hot
    # row keeps about √(3e-7) ≈ 6e-4 absolute (the Python float32 path has the same limit).
    rows_per_head = want_sums[:, SUM_FIELDS.index("rows")]
    assert torch.all((sums[:, JAC] - want_sums[:, JAC]).abs() <= 1e-3 * rows_per_head + 1e-6)
    torch.testing.assert_close(head_max, want_max.double(), rtol=1e-5, atol=1e-5)


def check(kernel, q, k, v, keep, causal, rows, scale=0.35, sdpa_tol=1e-6):
    out, sums, head_max = kernel(q, k, v, keep, causal, scale, rows)
    want, want_sums, want_max = reference(q, k, v, keep, causal, scale, rows)
    assert out.shape == want.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6)
    assert sums.shape == (q.shape[1], len(SUM_FIELDS))
    assert_sums_close(sums, head_max, want_sums, want_max)
    if keep is None or not causal:  # SDPA takes one of the two
        mask = keep
        if causal:
            mask, causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(), False
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
            enable_gqa=k.shape[1] != q.shape[1])
        torch.testing.assert_close(out, sdpa, rtol=sdpa_tol, atol=sdpa_tol)


def check_variants(kernel, q, k, v, keep, causal, rows, scale=0.35, with_output=True):
    """One call with every variant: the output and the own statistics are those of the call
    without variants (bitwise), each variant's those of the float64 reference."""
    out0, sums0, max0 = kernel(q, k, v, keep, causal, scale, rows, with_output)
    out, sums, head_max = kernel(q, k, v, keep, causal, scale, rows, with_output, DOTS, TAUS)
    assert sums.shape == (1 + len(DOTS) + len(TAUS), q.shape[1], len(SUM_FIELDS))
    assert head_max.shape == sums.shape[:2]
    assert torch.equal(out, out0) and torch.equal(sums[0], sums0) and torch.equal(head_max[0], max0)
    for i, (want_sums, want_max) in enumerate(reference_variants(q, k, keep, causal, rows), 1):
        assert_sums_close(sums[i], head_max[i], want_sums, want_max)


SHAPES = [(2, 4, 4, 37, 37, 32, 32),  # rows not a multiple of the 4-row tile, keys of the vector
          (1, 6, 2, 5, 70, 8, 24),  # grouped queries, more keys than queries, dv ≠ d
          (2, 2, 1, 9, 3, 5, 3),  # tiny odd sizes: every tail path
          (1, 2, 2, 40, 64, 16, 16)]  # keys a multiple of every vector width: no partial vector


@pytest.mark.parametrize("mask", [None, "padding", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, hkv, n, s, d, dv", SHAPES)
def test_matches_reference_and_sdpa(kernel, b, h, hkv, n, s, d, dv, mask, causal):
    check(kernel, *case(0, b, h, hkv, n, s, d, dv, mask, causal))


@pytest.mark.parametrize("mask", [None, "padding", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, hkv, n, s, d, dv", SHAPES)
def test_counterfactual_variants_match_rowstats(kernel, b, h, hkv, n, s, d, dv, mask, causal):
    """Dot and cosine statistics from the same pass, with masks, causal, grouped queries and
    dropped query rows, equal rowstats.head_sums of the float64 logits; the output and the
    attention's own statistics do not change."""
    check_variants(kernel, *case(1, b, h, hkv, n, s, d, dv, mask, causal))


@pytest.mark.parametrize("with_output", [True, False])
def test_variants_without_output_and_zero_vectors(kernel, with_output):
    """Statistics-only calls give the same sums; a zero query or key (‖·‖ clamped at eps, as
    F.normalize) has cosine 0 with everything."""
    q, k, v, keep, causal, rows = case(2, 2, 3, 3, 11, 13, 8, 8, "padding", True)
    q[0, 1, 3], k[1, 2, 5] = 0.0, 0.0
    check_variants(kernel, q, k, v, keep, causal, rows, with_output=with_output)


def test_variants_need_a_positive_scale(kernel):
    q, k, v, keep, causal, rows = case(3, 1, 2, 2, 4, 4, 8, 8, None, False)
    with pytest.raises(RuntimeError, match="positive"):
        kernel(q, k, v, keep, causal, -0.3, rows, True, [1.0], [])
    with pytest.raises(RuntimeError, match="positive"):
        kernel(q, k, v, keep, causal, 0.3, rows, True, [], [0.0])
    out, sums, _ = kernel(q, k, v, keep, causal, -0.3, rows)  # no variants: any scale
    assert sums.shape == (2, len(SUM_FIELDS)) and torch.isfinite(out).all()


def test_row_with_no_visible_key_gives_zero_and_is_skipped(kernel):
    q, k, v, keep, _, rows = case(1, 1, 2, 2, 4, 6, 8, 8, "full", False)
    keep[0, 1, 2] = False
    out, sums, _ = kernel(q, k, v, keep, False, 0.5, rows, True, [1.0], [1.0])
    assert torch.all(out[0, 1, 2] == 0)
    visible_rows = (keep.any(-1) & rows[:, None, :]).sum(dim=(0, 2)).double()
    for variant in sums:  # every variant skips the row too
        torch.testing.assert_close(variant[:, SUM_FIELDS.index("rows")], visible_rows)


@pytest.mark.parametrize("inject", ["q_nan", "q_inf", "k_inf", "k_nan"])
@pytest.mark.parametrize("mask", [None, "padding", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_output", [True, False])
def test_non_finite_logits_follow_the_rowstats_rule(kernel, inject, mask, causal, with_output):
    """NaN and ±inf in q or k: the own statistics and every variant's equal rowstats.head_sums
    of the float64 logits -- a row with a non-finite visible logit counted in "scored" and
    "nonfinite" only, max |logit| +inf -- and the finite rows' outputs are untouched."""
    q, k, v, keep, causal, rows = case(6, 2, 4, 2, 9, 13, 8, 8, mask, causal)
    rows[0, 2] = rows[1, 4] = True  # the rows given a NaN or inf query are kept
    clean = kernel(q, k, v, keep, causal, 0.35, rows)[0]
    bad = {"q_nan": (q, (0, 1, 2, 3), math.nan), "q_inf": (q, (1, 0, 4, 0), math.inf),
           "k_inf": (k, (0, 1, 5, 1), -math.inf), "k_nan": (k, (1, 0, 7, 2), math.nan)}[inject]
    bad[0][bad[1]] = bad[2]
    out, sums, head_max = kernel(q, k, v, keep, causal, 0.35, rows, with_output, DOTS, TAUS)
    _, want_sums, want_max = reference(q, k, v, keep, causal, 0.35, rows)
    nonfinite = want_sums[:, SUM_FIELDS.index("nonfinite")]
    assert nonfinite.sum() > 0 and torch.isinf(want_max).any()
    assert_sums_close(sums[0], head_max[0], want_sums, want_max)
    for i, (variant, vmax) in enumerate(reference_variants(q, k, keep, causal, rows), 1):
        assert_sums_close(sums[i], head_max[i], variant, vmax)
    if with_output:  # rows whose logits are all finite keep their output
        kr = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).double()
        z = q.double() @ kr.transpose(-2, -1)
        finite = (z.isfinite() | ~visible(q, k, keep, causal)).all(-1)
        assert 0.5 < finite.double().mean() < 1
        assert torch.equal(out[finite], clean[finite])


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
    inputs = case(seed, b, hkv * group, hkv, n, s, d, dv, mask, causal)
    check(kernel, *inputs, sdpa_tol=1e-5)
    check_variants(kernel, *inputs)


def test_bad_shapes_are_refused(kernel):
    q, k, v, keep, causal, rows = case(3, 2, 2, 2, 4, 4, 8, 8, None, False)
    with pytest.raises(RuntimeError, match="k and v"):
        kernel(q, k[:1], v[:1], keep, causal, 0.3, rows)  # one batch entry of keys
    with pytest.raises(RuntimeError, match="float32"):
        kernel(q.double(), k, v, keep, causal, 0.3, rows)
    with pytest.raises(RuntimeError, match="rows_kept"):
        kernel(q, k, v, keep, causal, 0.3, rows[:, :2])


def test_generic_isa_build_matches_the_reference(generic_kernel, record_property, capsys):
    """The portable build (CPU_CAPABILITY=DEFAULT: ATen's plain C++ vectors, what ARM and
    CPUs without AVX get) computes the same output and statistics; the test says which path
    ran."""
    assert native.isa("generic") == "generic"
    for mask, causal in [(None, True), ("full", False)]:
        inputs = case(4, 2, 4, 2, 13, 21, 8, 8, mask, causal)
        check(generic_kernel, *inputs, sdpa_tol=1e-5)
        check_variants(generic_kernel, *inputs)
    record_property("native_path", f"generic build; this machine's default: {native.isa()}")
    with capsys.disabled():
        print(f"\n[native path: generic build checked; default build here: {native.isa()}]")


def _native_records(caplog):
    return [r for r in caplog.records if r.name == native.__name__]


@pytest.mark.parametrize("cached", [False, True])
def test_first_call_logs_one_line_before_building_then_is_silent(
        cached, monkeypatch, tmp_path, caplog, capsys, recwarn):
    """One log line, emitted before the build blocks; WARNING (shown without any logging set up)
    when no cached build exists, INFO when one does; nothing on stdout, no warnings, and later
    calls log nothing."""
    from torch.utils import cpp_extension

    caplog.set_level(logging.INFO, logger=native.__name__)
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.delenv(cppext.ENV, raising=False)
    monkeypatch.setenv(cppext.PREBUILT_ENV, "off")  # the just-in-time path
    monkeypatch.setattr(cppext.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv("ATTNSCALE_KERNEL_CACHE", str(tmp_path))
    name = cppext.jit_name(native.STEM, "AVX2", native.SOURCE)
    stand_in = types.SimpleNamespace(attention_with_sums=lambda *a: a)
    if cached:
        (jitcache.library(name).parent).mkdir(parents=True)
        jitcache.library(name).write_bytes(b"")
    monkeypatch.setattr(jitcache, "import_library", lambda name, path: stand_in)
    builds = []

    def load(name, build_directory, **kwargs):  # stands in for the ~30 s compile
        builds.append((name, len(_native_records(caplog))))
        (Path(build_directory) / f"{name}.so").write_bytes(b"")
        return stand_in

    monkeypatch.setattr(cpp_extension, "load", load)
    assert native.fused_kernel() is not None
    assert builds == ([] if cached else [(name, 1)])  # the line came before the build
    (record,) = _native_records(caplog)
    assert record.levelno == (logging.INFO if cached else logging.WARNING)
    assert name in record.getMessage()
    assert ("loading" if cached else "building") in record.getMessage()
    assert native.fused_kernel() is not None and native.unavailable_reason() is None
    assert native.isa() == "AVX2"
    assert len(builds) == (0 if cached else 1)
    assert len(_native_records(caplog)) == 1  # later calls: silent
    assert capsys.readouterr().out == ""
    assert not [w for w in recwarn if "attnscale" in str(w.message)]


def test_build_command_prints_one_line(kernel, capsys):
    """``python -m attnscale.measure.native --build``: one line naming the build in use."""
    assert native.main(["--build"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and native.isa() in out and "ready" in out
    assert native.ensure_built() == out.strip()
    with pytest.raises(SystemExit):  # --build is the one thing it does
        native.main([])


def test_switched_off_or_failed_build_falls_back(monkeypatch, recwarn, tmp_path):
    """``$ATTNSCALE_NATIVE_ISA=off``: no build is tried, and the reason says so; a failed
    build warns once and reports why."""
    from torch.utils import cpp_extension

    tried = []

    def fail():
        raise RuntimeError("Error building extension 'attention_with_sums'")

    monkeypatch.setattr(cpp_extension, "load", lambda **kw: tried.append(1) or fail())
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv(cppext.PREBUILT_ENV, "off")  # no installed build: the builder runs
    monkeypatch.setenv("ATTNSCALE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv(cppext.ENV, "off")
    assert native.fused_kernel() is None and native.isa() is None and not tried
    assert "off" in native.unavailable_reason() and "no native" in native.ensure_built()
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv(cppext.ENV, "generic")
    assert native.fused_kernel() is None and tried == [1]
    assert "RuntimeError: Error building extension" in native.unavailable_reason()
    assert native.fused_kernel() is None and tried == [1]  # tried once per process
    assert len([w for w in recwarn if "did not build" in str(w.message)]) == 1
