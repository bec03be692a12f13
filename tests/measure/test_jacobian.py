"""attnscale.measure.jacobian: per-row softmax Jacobian norms and their distribution over rows.

References: an explicit float64 Jacobian from torch.autograd.functional.jacobian of softmax,
mpmath at 50 digits for near one-hot rows (where the textbook Σp² − 2Σp³ + (Σp²)² loses all
digits), the exact RMS of :func:`attnscale.measure.theory.rms_jacobian_norm` (within 4 SE, as in
tests/measure/test_theory.py), and scipy's quantiles.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import mstats

from attnscale.measure import jacobian as J
from attnscale.measure import theory as th

Z_TOL = 4.0


def explicit_norm(z: torch.Tensor) -> float:
    """‖∂softmax/∂z‖_F from autograd, float64."""
    jac = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), z.double())
    return float(jac.norm())


@given(n=st.integers(1, 40), s=st.floats(0.0, 6.0), seed=st.integers(0, 2**31))
def test_matches_autograd_jacobian(n, s, seed):
    z = s * torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = float(J.row_jacobian_norms(z))
    assert got == pytest.approx(explicit_norm(z), rel=1e-10, abs=1e-15)


def test_batches_and_types():
    z = torch.randn(3, 4, 9, dtype=torch.float32)
    out = J.row_jacobian_norms(z)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64 and out.shape == (3, 4)
    flat = [explicit_norm(row) for row in z.reshape(-1, 9)]
    np.testing.assert_allclose(out.reshape(-1).numpy(), flat, rtol=1e-10)
    arr = J.row_jacobian_norms(z.numpy().tolist())  # nested lists -> numpy
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float64
    np.testing.assert_allclose(arr, out.numpy(), rtol=1e-15)


def test_hidden_keys_are_dropped():
    z = torch.tensor([[0.3, -1.0, float("-inf"), 2.0, float("-inf")]], dtype=torch.float64)
    kept = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64)
    assert float(J.row_jacobian_norms(z)) == pytest.approx(float(J.row_jacobian_norms(kept)),
                                                           rel=1e-15)


def mp_norm(z: list[float]) -> float:
    """‖J‖_F at 50 digits from the explicit matrix."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    e = [mpmath.exp(mpmath.mpf(x)) for x in z]
    tot = sum(e)
    p = [x / tot for x in e]
    sq = sum(((p[i] if i == j else 0) - p[i] * p[j]) ** 2
             for i in range(len(p)) for j in range(len(p)))
    return float(mpmath.sqrt(sq))


@pytest.mark.parametrize("gap", [5.0, 20.0, 40.0, 300.0])
def test_near_one_hot_keeps_relative_accuracy(gap):
    z = [0.0, -gap, -gap - 1.5, -gap - 0.2, -2 * gap]
    ref = mp_norm(z)
    got = float(J.row_jacobian_norms(np.array(z)))
    assert got == pytest.approx(ref, rel=1e-12)
    if gap >= 20:  # the textbook formula has no correct digit left here
        p = np.exp(np.array(z)) / np.exp(np.array(z)).sum()
        y2, y3 = (p**2).sum(), (p**3).sum()
        naive = math.sqrt(max(y2 - 2 * y3 + y2 * y2, 0.0))
        assert abs(naive - ref) > 0.5 * ref


@pytest.mark.parametrize("bad", [[1.0, float("nan")], [float("inf"), 0.0],
                                 [float("-inf"), float("-inf")]])
def test_rejects_bad_rows(bad):
    with pytest.raises(ValueError, match="z"):
        J.row_jacobian_norms(torch.tensor(bad))


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="z"):
        J.row_jacobian_norms(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="z"):
        J.row_jacobian_norms(2.0)
    with pytest.raises(TypeError, match="z"):
        J.row_jacobian_norms(["a", "b"])


@pytest.mark.parametrize("n", [1, 2, 3, 64, 4096])
def test_uniform_limit_is_exact_at_s0(n):
    exact = math.sqrt(n - 1) / n
    assert J.uniform_jacobian_norm(n) == exact
    assert float(J.row_jacobian_norms(np.zeros(n))) == pytest.approx(exact, rel=1e-14, abs=0)
    if n <= 64:
        assert explicit_norm(torch.zeros(n)) == pytest.approx(exact, rel=1e-12, abs=1e-15)
    if n > 1:
        c = J.jacobian_distribution(n, [0.0], rows=5, seed=0)
        for key in ("median", "q1", "q3", "mean", "rms", "rms_exact"):
            assert getattr(c, key)[0] == pytest.approx(exact, rel=1e-12), key
        assert c.rms_z == [0.0] and c.frac_below == [0.0]


@pytest.mark.parametrize("n", [64, 512])
def test_mc_rms_agrees_with_exact(n):
    c = J.jacobian_distribution(n, rows=1500, seed=3)
    z = np.abs(c.rms_z)
    assert z.max() < Z_TOL, list(zip(c.s, c.rms, c.rms_exact, c.rms_z, strict=True))
    for s, exact in zip(c.s, c.rms_exact, strict=True):
        assert exact == float(th.rms_jacobian_norm(n, s))


def test_mc_rms_rejects_a_wrong_theory():
    """The 4-SE rule can fail: 3% off the exact RMS is caught at a mid scale."""
    c = J.jacobian_distribution(64, [3.0], rows=2000, seed=1)
    assert abs((1.03 * c.rms_exact[0] - c.rms[0]) / c.rms_se[0]) > Z_TOL


def test_statistics_agree_with_scipy():
    n, rows, seed, s = 96, 700, 5, [0.5, 4.0, 30.0]
    c = J.jacobian_distribution(n, s, rows=rows, seed=seed, threshold=1e-3)
    g = np.random.default_rng(seed).standard_normal((rows, n))
    for i, x in enumerate(s):
        norms = J.row_jacobian_norms(x * g)
        q1, med, q3 = mstats.mquantiles(norms, [0.25, 0.5, 0.75], alphap=1, betap=1)
        assert (c.q1[i], c.median[i], c.q3[i]) == pytest.approx((q1, med, q3), rel=1e-12)
        assert c.frac_below[i] == np.count_nonzero(norms < 1e-3) / rows
        assert c.mean[i] == pytest.approx(norms.mean(), rel=1e-12)
        assert c.rms[i] == pytest.approx(math.sqrt(np.mean(norms**2)), rel=1e-12)
        se = np.std(norms**2, ddof=1) / math.sqrt(rows) / (2 * c.rms[i])
        assert c.rms_se[i] == pytest.approx(se, rel=1e-10)


def test_seeded_and_json_ready():
    a = J.jacobian_distribution(64, [1.0, 30.0], rows=50, seed=2).to_dict()
    b = J.jacobian_distribution(64, [1.0, 30.0], rows=50, seed=2).to_dict()
    c = J.jacobian_distribution(64, [1.0, 30.0], rows=50, seed=3).to_dict()
    assert a == b and a["median"] != c["median"]
    assert json.loads(json.dumps(a)) == a
    assert a["frac_below_1e-3"] == a["frac_below"] and a["rows"] == 50
    assert a["s_c"] == pytest.approx(math.sqrt(2 * math.log(64)))
    assert a["s_over_sc"] == pytest.approx([1.0 / a["s_c"], 30.0 / a["s_c"]])


def test_standard_scales_and_measurement():
    sc = math.sqrt(2 * math.log(512))
    s = J.standard_scales(512)
    assert len(s) == 20 and s == sorted(s) and s[0] == pytest.approx(0.1)
    assert s[-1] == pytest.approx(10 * sc) and sc in s and 3 * sc in s
    m = J.standard_measurement(ns=(16, 32), rows=20, points=8)
    assert [c["n"] for c in m["curves"]] == [16, 32]
    assert all(len(c["median"]) == 8 for c in m["curves"])
    for c, law in zip(m["curves"], m["law"], strict=True):
        assert law["n"] == c["n"] and law["k"] == [10.0, 30.0, 100.0]
        assert [f is None for f in law["check_frac"]] == [s < 3 * c["s_c"] * (1 - 1e-9)
                                                          for s in c["s"]]
    assert J.frac_key(1e-3) == "frac_below_1e-3" and J.frac_key(2.5e-4) == "frac_below_2.5e-4"


def test_deep_saturation_median_falls_and_rms_does_not():
    """The point of the module: at 10·s_c the RMS stays near 0.16, the median is ~1e-3."""
    c = J.jacobian_distribution(64, [10 * math.sqrt(2 * math.log(64))], rows=800, seed=0)
    assert c.rms[0] > 0.1 and c.median[0] < 5e-3 and c.q1[0] < 1e-5


@pytest.mark.parametrize(("kwargs", "err", "name"), [
    ({"n": 0}, ValueError, "n"), ({"n": 8, "rows": 1}, ValueError, "rows"),
    ({"n": 8, "seed": -1}, ValueError, "seed"), ({"n": 8, "threshold": 0.0}, ValueError,
                                                  "threshold"),
    ({"n": 8, "s_values": [-1.0]}, ValueError, "s_values"),
    ({"n": 8, "s_values": []}, ValueError, "s_values"),
    ({"n": 1}, ValueError, "s_values"), ({"n": 8.0}, TypeError, "n"),
])
def test_bad_arguments(kwargs, err, name):
    with pytest.raises(err, match=name):
        J.jacobian_distribution(**kwargs)
