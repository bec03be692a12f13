"""The per-row distribution of the softmax Jacobian norm, not just its root mean square.

For one attention row p = softmax(z) over n keys the Jacobian is J = diag(p) − ppᵀ, and

    ‖J‖_F² = Σ_i p_i²(1 − p_i)² + Σ_{i≠j} p_i² p_j² = Σp² − 2Σp³ + (Σp²)².

:func:`attnscale.measure.theory.rms_jacobian_norm` gives √(E‖J‖_F²) exactly for i.i.d.
N(0, s²) logits (the Random Energy Model softmax, Derrida 1981). Deep in saturation the RMS is a
poor summary: the mean of ‖J‖² is carried by rare rows whose two largest logits nearly tie
(‖J‖ ≈ 1/2 there), while the typical row is one-hot with ‖J‖ ≈ e^{−gap}. At s = 10·s_c,
s_c = √(2 ln n), the RMS is ≈ 0.16 for every n while the median is below 1e-3. This module
measures the whole distribution by Monte Carlo: median, quartiles, the fraction of rows below
a threshold, mean and RMS (checked against the exact RMS).

Uniform limit (s = 0): p_i = 1/n, so ‖J‖_F² = n·(1/n²)(1 − 1/n)² + n(n − 1)/n⁴ = (n − 1)/n²,
i.e. ‖J‖_F = √(n − 1)/n = (1/√n)·√(1 − 1/n), exactly, for every row. Toward uniform the norm
levels off there; it does not go to 0.

Precision: the textbook form Σp² − 2Σp³ + (Σp²)² cancels terms of size 1 when one weight is
near 1, so even in float64 it keeps ‖J‖ only to ~1e-8 absolute. :func:`row_jacobian_norms`
instead splits off the largest key t (1 − p_t = Σ_{j≠t} e_j / Σ_j e_j, summed without
subtraction) and keeps full float64 relative accuracy down to underflow.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from attnscale.measure import theory
from attnscale.util.validate import check_array, check_float, check_int

__all__ = [
    "STANDARD_NS",
    "VANISH",
    "JacobianCurve",
    "frac_key",
    "jacobian_distribution",
    "row_jacobian_norms",
    "standard_measurement",
    "standard_scales",
    "uniform_jacobian_norm",
]

VANISH = 1e-3  # the "vanishing" threshold on ‖J‖_F (why: audit.claims.c10_vanishing_gradients)
STANDARD_NS = (64, 512, 4096)
_CHUNK = 1 << 19  # logits per Monte Carlo chunk (4 MiB of float64 per temporary)


def row_jacobian_norms(z: Tensor | ArrayLike) -> Tensor | np.ndarray:
    """‖diag(p) − ppᵀ‖_F for p = softmax(z) along the last axis, in float64.

    With t the row's argmax, e = exp(z − z_t) (so e_t = 1), R = Σ_{j≠t} e_j, p_t = 1/(1 + R),
    1 − p_t = R/(1 + R), r_j = e_j/(1 + R) for j ≠ t, R₂ = Σ r², R₄ = Σ r⁴:

        ‖J‖_F² = p_t²(1 − p_t)² + Σ_j r_j²(1 − r_j)² + 2p_t²R₂ + (R₂² − R₄).

    Every term is a sum of non-negatives except R₂² − R₄ ≥ 0, which is below R₂·max r² and so
    never carries the result: full float64 relative accuracy even for near one-hot rows.
    A torch tensor gives a float64 tensor on its device; anything else a numpy array. −inf
    entries are hidden keys; NaN, +inf or a row with no finite entry raise ValueError.
    """
    as_numpy = not isinstance(z, Tensor)
    try:
        t = torch.as_tensor(np.asarray(z, dtype=np.float64)) if as_numpy else z.to(torch.float64)
    except (TypeError, ValueError):
        raise TypeError(f"z must be a real array or tensor; got {type(z).__name__}") from None
    if t.ndim == 0 or t.shape[-1] == 0:
        raise ValueError(f"z must have at least one key on its last axis; got shape "
                         f"{tuple(t.shape)}")
    if t.numel() and (torch.isnan(t).any() or (t == math.inf).any()):
        raise ValueError("z must not contain NaN or +inf (use -inf for a hidden key)")
    top, idx = t.max(-1, keepdim=True)
    if t.numel() and (top == -math.inf).any():
        raise ValueError("z has a row with no finite entry (every key hidden)")
    e = torch.exp(t - top).scatter_(-1, idx, 0.0)  # the other keys; the argmax's e_t = 1
    rest = e.sum(-1)
    total = 1.0 + rest
    pt = 1.0 / total
    r = e / total.unsqueeze(-1)
    r2 = r * r
    s2 = r2.sum(-1)
    s4 = (r2 * r2).sum(-1)
    sq = ((pt * rest / total) ** 2 + (r2 * (1.0 - r) ** 2).sum(-1) + 2.0 * pt * pt * s2
          + (s2 * s2 - s4).clamp_min(0.0))
    out = sq.sqrt()
    return out.numpy() if as_numpy else out


def frac_key(threshold: float) -> str:
    """The evidence key for the fraction of rows below ``threshold``: 1e-3 -> "frac_below_1e-3"."""
    threshold = check_float("threshold", threshold, low=0.0)
    exp = math.floor(math.log10(threshold))
    return f"frac_below_{round(threshold / 10.0**exp, 6):g}e{exp}"


def uniform_jacobian_norm(n: int) -> float:
    """‖J‖_F of the uniform softmax over n keys (s = 0), exactly √(n − 1)/n."""
    n = check_int("n", n)
    return math.sqrt(n - 1) / n


def standard_scales(n: int, points: int = 20) -> list[float]:
    """``points`` logit scales from 0.1 to 10·s_c, geometric, with s_c and 3·s_c included.

    s_c = √(2 ln n) (:func:`attnscale.measure.theory.rem_critical_scale`); 10·s_c is the last.
    """
    n = check_int("n", n, 2)
    points = check_int("points", points, 4)
    sc = float(theory.rem_critical_scale(n))
    grid = np.geomspace(0.1, 10.0 * sc, points - 2)
    return sorted({*(float(x) for x in grid), sc, 3.0 * sc})


@dataclass
class JacobianCurve:
    """Per-row ‖J‖_F statistics for n i.i.d. N(0, s²) logits, one entry per scale in ``s``.

    ``median``, ``q1``, ``q3``: the 50/25/75% quantiles (numpy's default linear rule);
    ``frac_below``: the fraction of rows with ‖J‖_F < ``threshold``; ``mean``: E‖J‖_F;
    ``rms``: √mean(‖J‖²) with its delta-method SE ``rms_se``; ``rms_exact``: the exact
    :func:`theory.rms_jacobian_norm`; ``rms_z`` = (exact − MC)/SE (0 when they agree to 1e-12
    relative). ``uniform_limit`` = √(n − 1)/n, the value at s = 0.
    """

    n: int
    s_c: float
    rows: int
    seed: int
    threshold: float
    uniform_limit: float
    s: list[float] = field(default_factory=list)
    s_over_sc: list[float] = field(default_factory=list)
    median: list[float] = field(default_factory=list)
    q1: list[float] = field(default_factory=list)
    q3: list[float] = field(default_factory=list)
    frac_below: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    rms: list[float] = field(default_factory=list)
    rms_se: list[float] = field(default_factory=list)
    rms_exact: list[float] = field(default_factory=list)
    rms_z: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the fraction below the threshold is also stored under the key
        ``frac_key(threshold)`` (``frac_below_1e-3`` by default), which the C10 rule reads."""
        out = asdict(self)
        out[frac_key(self.threshold)] = out["frac_below"]
        return out

    def add(self, s: float, norms: np.ndarray) -> None:
        """Append the statistics of one scale's per-row norms."""
        rows = norms.size
        q1, med, q3 = np.quantile(norms, [0.25, 0.5, 0.75])
        sq = norms * norms
        rms = math.sqrt(float(sq.mean()))
        se = float(sq.std(ddof=1)) / math.sqrt(rows) / (2.0 * rms) if rms > 0 and rows > 1 else 0.0
        exact = float(theory.rms_jacobian_norm(self.n, s))
        diff = exact - rms
        if abs(diff) <= 1e-12 * exact:  # agreement at rounding level (s = 0: every row equal)
            z = 0.0
        else:
            z = diff / se if se > 0 else math.copysign(math.inf, diff)
        self.s.append(float(s))
        self.s_over_sc.append(float(s) / self.s_c)
        for name, value in (("median", med), ("q1", q1), ("q3", q3),
                            ("frac_below", np.mean(norms < self.threshold)),
                            ("mean", norms.mean()), ("rms", rms), ("rms_se", se),
                            ("rms_exact", exact), ("rms_z", z)):
            getattr(self, name).append(float(value))


def jacobian_distribution(
    n: int,
    s_values: ArrayLike | None = None,
    rows: int = 2000,
    seed: int = 0,
    threshold: float = VANISH,
) -> JacobianCurve:
    """Monte Carlo distribution of the per-row ‖J‖_F for ``rows`` rows of n i.i.d. N(0, s²) logits.

    The same standard normals g (seeded ``numpy.random.default_rng(seed)``) serve every s
    (z = s·g, common random numbers), so the curves are smooth in s; at each s the rows are
    i.i.d. ``s_values`` defaults to :func:`standard_scales` (0.1 … 10·s_c).
    """
    n = check_int("n", n)
    rows = check_int("rows", rows, 2)
    seed = check_int("seed", seed, 0)
    threshold = check_float("threshold", threshold, low=0.0)
    scales = standard_scales(n) if s_values is None and n >= 2 else s_values
    if scales is None:
        raise ValueError("s_values is required when n = 1 (s_c = 0)")
    s_arr = check_array("s_values", scales, minimum=0.0).reshape(-1)
    if s_arr.size == 0:
        raise ValueError("s_values must hold at least one scale")
    curve = JacobianCurve(n, float(theory.rem_critical_scale(n)), rows, seed, threshold,
                          uniform_jacobian_norm(n))
    rng = np.random.default_rng(seed)
    per = max(1, _CHUNK // n)
    parts: list[list[np.ndarray]] = [[] for _ in s_arr]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small elementwise chunks: extra threads only contend (6x slower)
    try:
        for start in range(0, rows, per):
            g = torch.from_numpy(rng.standard_normal((min(per, rows - start), n)))
            for i, s in enumerate(s_arr):
                parts[i].append(row_jacobian_norms(float(s) * g).numpy())
    finally:
        torch.set_num_threads(threads)
    for s, chunks in zip(s_arr, parts, strict=True):
        curve.add(float(s), np.concatenate(chunks))
    return curve


def standard_measurement(
    ns: tuple[int, ...] = STANDARD_NS, rows: int = 2000, seed: int = 0, points: int = 20
) -> dict[str, Any]:
    """The C10 evidence's theory part: ``{"curves": [JacobianCurve.to_dict() per n], "law":
    [per n: :func:`attnscale.measure.jacobian_law.law_curve`, with "check_frac", the law's
    fraction below :data:`VANISH` at each of the curve's s from 3·s_c on (None below)]}``
    over :func:`standard_scales` (``points`` scales, 0.1 … 10·s_c) for each n in ``ns``."""
    from attnscale.measure import jacobian_law  # scipy's quadrature: loaded on use

    curves = [jacobian_distribution(n, standard_scales(n, points), rows, seed + i).to_dict()
              for i, n in enumerate(ns)]
    laws = []
    for c in curves:
        law = jacobian_law.law_curve(c["n"], threshold=VANISH)
        law["check_frac"] = [
            jacobian_law.gap_survival(c["n"], law["gap_theta"] / s)
            if s >= 3.0 * c["s_c"] * (1 - 1e-9) else None for s in c["s"]]
        laws.append(law)
    return {"curves": curves, "law": laws}
