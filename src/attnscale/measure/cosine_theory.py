"""Bounded logits and cosine similarity: closed forms for τ·cos(q, k) attention.

:func:`max_weight_bound` is the most weight one of n keys can get when every logit lies in
[−τ, τ] (so cosine attention at τ = 1 can never focus), :func:`tau_for_max_weight` inverts it,
:func:`cosine_logit_pdf` and :func:`cosine_logit_variance` give the law of the cosine of two
random vectors, and :func:`tau_matching_scaled_dot` the τ at which τ·cos has the size of
q·k/√d (Vaswani et al. 2017). QKNorm's initial gain :func:`qknorm_g0` lives next to the learned
temperature it initializes (:mod:`attnscale.core.learned`).
"""

from __future__ import annotations

import numpy as np
import scipy  # its submodules load on first use (scipy.stats alone takes ~2 s to import)
from numpy.typing import ArrayLike

from attnscale.core.learned import qknorm_g0
from attnscale.util.validate import check_array, check_int

__all__ = [
    "cosine_logit_pdf",
    "cosine_logit_variance",
    "max_weight_bound",
    "qknorm_g0",
    "tau_for_max_weight",
    "tau_matching_scaled_dot",
]


def _out(arr: np.ndarray) -> float | np.ndarray:
    """A Python float for 0-d results, the array otherwise."""
    return float(arr) if np.ndim(arr) == 0 else arr


def max_weight_bound(n: ArrayLike, tau: ArrayLike):
    """Largest softmax weight possible when all n logits lie in [−τ, τ]: e^{2τ}/(e^{2τ}+n−1).

    The maximum is reached with one logit at +τ and the other n−1 at −τ. For n = 512 and τ = 1
    (cosine attention without a temperature) it is ≈ 1.42%: no key can take more.
    Source: direct maximisation.
    """
    n = check_array("n", n, minimum=1, integer=True)
    tau = check_array("tau", tau, minimum=0)
    # e^{2τ}/(e^{2τ}+n−1) = 1/(1 + (n−1)e^{−2τ}); this form cannot overflow.
    return _out(1.0 / (1.0 + (n - 1.0) * np.exp(-2.0 * tau)))


def tau_for_max_weight(n: ArrayLike, p: ArrayLike):
    """Smallest logit half-range τ that lets one of n keys reach weight p: ½·ln(p(n−1)/(1−p)).

    Inverse of :func:`max_weight_bound`. Needs n ≥ 2 and 1/n ≤ p < 1 (a weight below 1/n needs
    no range at all; weight 1 needs infinite range).
    """
    n = check_array("n", n, minimum=2, integer=True)
    p = check_array("p", p)
    if ((p <= 0) | (p >= 1)).any():
        raise ValueError(f"p must lie in the open interval (0, 1), got {p!r}")
    if (p < 1.0 / n).any():
        raise ValueError(f"p must be >= 1/n (the uniform weight), got p={p!r} for n={n!r}")
    return _out(0.5 * np.log(p * (n - 1.0) / (1.0 - p)))


def cosine_logit_pdf(x: ArrayLike, d: int):
    """Density of cos(q, k) for independent isotropic q, k in d ≥ 2 dimensions.

    f(x) = (1 − x²)^{(d−3)/2} / B(½, (d−1)/2) on [−1, 1], 0 outside. It is the law of one
    coordinate of a uniform point on the sphere S^{d−1} (a Beta((d−1)/2, (d−1)/2) variable
    on [−1, 1]); its variance is 1/d. For d = 2 it is the arcsine law, for d = 3 uniform.
    """
    d = float(check_int("d", d, 2))
    x = check_array("x", x)
    inside = np.abs(x) < 1.0
    xs = np.where(inside, x, 0.0)
    log_f = 0.5 * (d - 3.0) * np.log1p(-xs * xs) - scipy.special.betaln(0.5, 0.5 * (d - 1.0))
    return _out(np.where(inside, np.exp(log_f), 0.0))


def cosine_logit_variance(d: ArrayLike):
    """Var cos(q, k) = 1/d for independent isotropic q, k: E[cos²] = E[u₁²] = 1/d on S^{d−1}."""
    return _out(1.0 / check_array("d", d, minimum=1, integer=True))


def tau_matching_scaled_dot(d: ArrayLike):
    """Temperature τ with std(τ·cos) = std(q·k/√d) = 1 for unit-variance random q, k: τ = √d.

    std(q·k/√d) = 1 (Vaswani et al. 2017, footnote 4) and std(cos) = 1/√d, so τ = √d. At d = 64
    this is 8, the flash-cosine-sim-attention default; x-transformers uses 10.
    """
    return _out(np.sqrt(check_array("d", d, minimum=1, integer=True)))
