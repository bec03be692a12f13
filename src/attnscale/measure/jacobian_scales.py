"""The softmax Jacobian and the gradient reaching q and k at given logit scales: what unscaled
attention sees at init at a given head dimension and sequence length.

With unit-variance q and k, unscaled logits q·k have std s = √d_k and scaled ones std 1. For
n i.i.d. N(0, s²) logits per row (the Random Energy Model softmax; freezing scale
s_c = √(2 ln n), Derrida 1981), :func:`at_scales` gives, at s = 1 and at every s = √d_k: the
exact E[max weight] (:func:`attnscale.measure.theory.expected_max_weight`); the per-row
Frobenius norm ‖J‖_F of J = diag(p) − ppᵀ over rows of n keys (median and fraction below
:data:`attnscale.measure.jacobian.VANISH` by Monte Carlo, the RMS exactly) and over causal rows
of 2…n keys (one row per length, as a causal sequence has: :func:`causal_norms`); and the
measured ‖∂q‖ + ‖∂k‖ through causal attention, unscaled over scaled (:func:`qk_grad_ratio`).
Where the median row's ‖J‖_F reaches 1e-3: by the top-two law over n keys
(``k_half`` of :func:`attnscale.measure.jacobian_law.law_curve`) and on a grid over causal rows
(:func:`crossing`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from attnscale.core.attention import attention
from attnscale.measure import jacobian, theory
from attnscale.measure.jacobian import VANISH, row_jacobian_norms
from attnscale.measure.jacobian_law import gap_quantile, two_key_gap
from attnscale.util.validate import check_int

__all__ = ["at_scales", "causal_norms", "crossing", "qk_grad_ratio"]


def causal_norms(n: int, ss: list[float], rows: int, seed: int = 0) -> list[np.ndarray]:
    """Per s in ``ss``, ‖J‖_F of ``rows`` rows of each length 2…n (a causal sequence has one
    row per length; a row with one key has J = 0 and is left out), i.i.d. N(0, s²) logits from
    ``numpy.random.default_rng(seed)``, the same normals at every s."""
    n, rows = check_int("n", n, 2), check_int("rows", rows, 1)
    g = torch.from_numpy(np.random.default_rng(seed).standard_normal(((n - 1) * rows, n)))
    length = torch.arange(2, n + 1).repeat_interleave(rows)[:, None]  # keys each row sees
    seen = torch.arange(n)[None, :] < length
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # elementwise work on a shared machine: extra threads contend
    try:
        return [row_jacobian_norms(torch.where(seen, float(s) * g, -math.inf)).numpy()
                for s in ss]
    finally:
        torch.set_num_threads(threads)


def crossing(ss: list[float], values: list[float], level: float = VANISH) -> float | None:
    """The first s where ``values`` falls through ``level`` (interpolated on log-log axes),
    None when it never does on ``ss``."""
    for i in range(1, len(ss)):
        if values[i - 1] >= level > values[i]:
            t = math.log(values[i - 1] / level) / math.log(values[i - 1] / values[i])
            return math.exp(math.log(ss[i - 1]) + t * math.log(ss[i] / ss[i - 1]))
    return None


def qk_grad_ratio(n: int, d: int, seed: int = 0) -> float:
    """‖∂q‖ + ‖∂k‖ through causal attention over n keys at head dimension d (unit-variance
    q, k, v, a random upstream gradient, batch 8 × 4 heads), unscaled over scaled on the same
    draws."""
    norms = {}
    for score in ("dot", "scaled_dot"):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(8, 4, n, d, generator=g, requires_grad=True) for _ in range(3))
        out = attention(q, k, v, is_causal=True, score=score)
        out.backward(torch.randn(out.shape, generator=g))
        norms[score] = float(q.grad.norm() + k.grad.norm())
    return norms["dot"] / norms["scaled_dot"]


def point(n: int, d: int | None, s: float, sc: float, full: Any, i: int,
          causal: np.ndarray) -> dict[str, Any]:
    """One scale's statistics (module docstring); ``full`` the n-key Monte Carlo curve, ``i``
    this scale's index in it, ``causal`` its causal rows' norms."""
    return {"d_k": d, "s": s, "s_over_sc": s / sc,
            "max_weight": float(theory.expected_max_weight(n, s)),
            "median": full.median[i], "frac": full.frac_below[i], "rms": full.rms_exact[i],
            "causal_median": float(np.median(causal)),
            "causal_frac": float(np.mean(causal < VANISH)),
            "causal_rms": float(np.sqrt(np.mean(causal * causal))),
            "grad_ratio": 1.0 if d is None else qk_grad_ratio(n, d)}


def at_scales(n: int, dks: list[int], rows: int = 2000) -> dict[str, Any]:
    """At s = 1 (``scaled``) and s = √d_k for each d in ``dks`` (``points``), over n keys:
    :func:`point`'s statistics (``rows`` Monte Carlo rows per s, and per length for causal
    rows); where the median row reaches 1e-3, as s/s_c and the d_k = s² it means, over n keys
    (``vanish_k``, ``vanish_d_k``: the top-two law) and over causal rows (``causal_vanish_k``,
    ``causal_vanish_d_k``: 200 rows per length on 40 scales from s_c to 20·s_c; None beyond)."""
    n = check_int("n", n, 2)
    sc = float(theory.rem_critical_scale(n))
    ss = [1.0] + [math.sqrt(d) for d in dks]
    full = jacobian.jacobian_distribution(n, ss, rows, seed=11)
    causal = causal_norms(n, ss, rows, seed=12)
    points = [point(n, d, s, sc, full, i, causal[i])
              for i, (d, s) in enumerate(zip([None, *dks], ss, strict=True))]
    grid = [float(x) for x in sc * np.geomspace(1.0, 20.0, 40)]
    cross = crossing(grid, [float(np.median(c)) for c in causal_norms(n, grid, 200, seed=13)])
    k_half = two_key_gap(VANISH) / (gap_quantile(n, 0.5) * sc)  # as law_curve's k_half
    return {"n": n, "s_c": sc, "rows": rows, "scaled": points[0], "points": points[1:],
            "vanish_k": k_half, "vanish_d_k": (k_half * sc) ** 2,
            "causal_vanish_k": None if cross is None else cross / sc,
            "causal_vanish_d_k": None if cross is None else cross ** 2}
