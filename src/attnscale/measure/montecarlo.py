"""Monte Carlo estimates of the softmax statistics that :mod:`attnscale.measure.theory` computes exactly.

Everything is seeded (``numpy.random.Generator`` from ``seed``), vectorised and chunked so that
no array holds more than ~1M logits. Each quantity comes back as an :class:`Estimate`
(mean, standard error). The per-sample statistics are i.i.d. across samples, so the SE is the
sample std / √samples; quantities that are smooth functions of a mean use the delta method:

* effective_keys = 1/mean(Σp²),           SE = SE(Σp²)/mean(Σp²)²;
* jacobian_norm  = √mean(‖J‖_F²),          SE = SE(‖J‖_F²)/(2·jacobian_norm);
* logit_std      = √mean(ℓ²) (per sample, the mean of ℓ² over its n keys), same rule.

These are exactly the quantities the theory defines (1/E Σp², √E‖J‖², √E ℓ²).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from attnscale.measure import theory

__all__ = [
    "MC_SCORES",
    "TABLE_DS",
    "TABLE_NS",
    "TABLE_QUANTITIES",
    "TABLE_SCORES",
    "Estimate",
    "mc_init_logit_std",
    "mc_logit_variance",
    "mc_score_stats",
    "mc_softmax_stats",
    "softmax_sample_stats",
    "theory_table",
    "vector_logits",
]

_CHUNK = 1 << 20  # logits per chunk
_STATS = ("entropy", "max_weight", "participation", "jacobian_sq", "logit_sq")


class Estimate(NamedTuple):
    """A Monte Carlo mean and its standard error."""

    mean: float
    se: float

    def z(self, theory_value: float) -> float:
        """(theory − mean)/SE; ±inf if SE is 0 and they differ, 0 if they agree exactly."""
        diff = theory_value - self.mean
        if self.se > 0:
            return diff / self.se
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)

    def rel(self, theory_value: float) -> float:
        """Relative error |mean − theory|/|theory| (inf if theory is 0 and they differ)."""
        diff = abs(self.mean - theory_value)
        if theory_value == 0:
            return 0.0 if diff == 0 else math.inf
        return diff / abs(theory_value)

    def agrees(self, theory_value: float, z_tol: float = 3.0, rel_tol: float = 1e-9) -> bool:
        """|z| ≤ z_tol, or relative error ≤ rel_tol (for SE at floating-point noise level)."""
        return abs(self.z(theory_value)) <= z_tol or self.rel(theory_value) <= rel_tol


def softmax_sample_stats(logits: np.ndarray) -> np.ndarray:
    """Per-row statistics of softmax(logits) for a (rows, n) array.

    Returns shape (5, rows): entropy −Σp ln p, max p, Σp², ‖J‖_F² = Σp² − 2Σp³ + (Σp²)²
    (J = diag(p) − ppᵀ), and the row mean of ℓ².
    """
    top = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - top)
    z = e.sum(axis=1, keepdims=True)
    p = e / z
    lse = np.log(z) + top
    entropy = np.sum(p * (lse - logits), axis=1)  # each term ≥ 0: no cancellation
    p2 = p * p
    y2 = p2.sum(axis=1)
    y3 = np.sum(p2 * p, axis=1)
    return np.stack([entropy, p.max(axis=1), y2, y2 - 2.0 * y3 + y2 * y2,
                     np.mean(logits * logits, axis=1)])


def _summarise(per_sample: np.ndarray) -> dict[str, Estimate]:
    """Turn the (5, samples) output of :func:`softmax_sample_stats` into estimates."""
    count = per_sample.shape[1]
    means = per_sample.mean(axis=1)
    ses = per_sample.std(axis=1, ddof=1) / math.sqrt(count) if count > 1 else np.zeros(5)
    m = dict(zip(_STATS, zip(means, ses, strict=True), strict=True))

    def root(key: str) -> Estimate:
        mean, se = m[key]
        value = math.sqrt(max(float(mean), 0.0))
        return Estimate(value, float(se) / (2.0 * value) if value > 0 else 0.0)

    y_mean, y_se = m["participation"]
    return {
        "entropy": Estimate(*map(float, m["entropy"])),
        "max_weight": Estimate(*map(float, m["max_weight"])),
        "participation": Estimate(float(y_mean), float(y_se)),
        "effective_keys": Estimate(float(1.0 / y_mean), float(y_se / y_mean**2)),
        "jacobian_norm": root("jacobian_sq"),
        "logit_std": root("logit_sq"),
    }


def _rows_per_chunk(n: int) -> int:
    return max(1, _CHUNK // n)


def mc_softmax_stats(n: int, s: float, samples: int = 4000, seed: int = 0) -> dict[str, Estimate]:
    """Monte Carlo over ``samples`` draws of n i.i.d. N(0, s²) logits (the REM softmax).

    Keys: entropy, max_weight, participation, effective_keys, jacobian_norm, logit_std — the
    same definitions as :func:`attnscale.measure.theory.expected_entropy` and friends.
    """
    n = int(theory._integer("n", n, 1))
    s = float(theory._nonneg("s", s))
    samples = int(theory._integer("samples", samples, 2))
    rng = np.random.default_rng(seed)
    parts = []
    for start in range(0, samples, _rows_per_chunk(n)):
        rows = min(_rows_per_chunk(n), samples - start)
        parts.append(softmax_sample_stats(s * rng.standard_normal((rows, n))))
    return _summarise(np.concatenate(parts, axis=1))


# --------------------------------------------------------------------------------------------
# Scores with random q, k ~ N(0, I_d)
# --------------------------------------------------------------------------------------------

MC_SCORES = (*theory.STAT_SCORES, "softcap")


def vector_logits(
    q: np.ndarray,
    k: np.ndarray,
    score: str,
    *,
    tau: float = 1.0,
    mup_c: float = theory.MUP_C,
    log_scale: float = 1.0,
    cap: float = 50.0,
    qk_scale: float | None = None,
) -> np.ndarray:
    """Logits of queries q (B, d) against keys k (B, n, d) for one score, shape (B, n).

    dot q·k; scaled_dot q·k/√d (Vaswani et al. 2017); mup c·q·k/d (Yang et al. 2022);
    log_length s·ln(n)·q·k/√d (Nakanishi 2025); cosine τ·cos; qk_rmsnorm RMS(q)·RMS(k)·scale
    (scale 1/√d by default); qk_layernorm LN(q)·LN(k)/√d (no affine, no ε);
    softcap c·tanh(q·k/√d/c) (Gemma Team 2024).
    """
    d, n = q.shape[-1], k.shape[-2]
    if score == "qk_rmsnorm":
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True))
        k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True))
    elif score == "qk_layernorm":
        q = q - q.mean(axis=-1, keepdims=True)
        k = k - k.mean(axis=-1, keepdims=True)
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True))
        k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True))
    dots = np.einsum("bd,bnd->bn", q, k)
    if score == "dot":
        return dots
    if score in ("scaled_dot", "qk_layernorm"):
        return dots / math.sqrt(d)
    if score == "qk_rmsnorm":
        return dots * (1.0 / math.sqrt(d) if qk_scale is None else qk_scale)
    if score == "mup":
        return dots * (mup_c / d)
    if score == "log_length":
        return dots * (log_scale * math.log(n) / math.sqrt(d))
    if score == "softcap":
        return cap * np.tanh(dots / math.sqrt(d) / cap)
    if score == "cosine":
        norms = np.linalg.norm(q, axis=-1)[:, None] * np.linalg.norm(k, axis=-1)
        return tau * dots / norms
    raise ValueError(f"score must be one of {', '.join(MC_SCORES)}; got {score!r}")


def _rotation_draws(rng: np.random.Generator, d: int, n: int, rows: int):
    """Draw (‖q‖, q̂·k_j, ‖k_j‖) for q, k_j ~ N(0, I_d) without forming the vectors.

    By rotational invariance put q along e₁: then q·k_j = ‖q‖·g_j with g_j = k_{j1} ~ N(0, 1),
    ‖k_j‖² = g_j² + χ²_{d−1}, and ‖q‖² ~ χ²_d independent of everything else — the same joint
    law as the vectors, at O(n) instead of O(n·d) cost per sample.
    """
    r = np.sqrt(rng.chisquare(d, size=(rows, 1)))
    g = rng.standard_normal((rows, n))
    rest = rng.chisquare(d - 1, size=(rows, n)) if d > 1 else 0.0
    return r, g, np.sqrt(g * g + rest)


def _rotation_logits(score: str, d: int, n: int, r, g, knorm, tau, mup_c, log_scale):
    if score == "cosine":
        return tau * g / knorm
    if score == "qk_rmsnorm":
        return math.sqrt(d) * g / knorm
    scale = {"dot": 1.0, "scaled_dot": 1.0 / math.sqrt(d), "mup": mup_c / d,
             "log_length": log_scale * math.log(n) / math.sqrt(d)}[score]
    return (scale * r) * g


def mc_score_stats(
    d: int,
    n: int,
    score: str,
    tau: float = 1.0,
    samples: int = 2000,
    seed: int = 0,
    *,
    method: str = "rotation",
    mup_c: float = theory.MUP_C,
    log_scale: float = 1.0,
    cap: float = 50.0,
) -> dict[str, Estimate]:
    """Monte Carlo statistics of softmax(score(q, k_1..k_n)), q, k_j i.i.d. N(0, I_d).

    ``method="vectors"`` samples the d-dim vectors and applies :func:`vector_logits`
    (O(samples·n·d)); ``"rotation"`` samples the same joint law through
    :func:`_rotation_draws` (O(samples·n)). qk_layernorm and softcap always use vectors.
    """
    d = int(theory._integer("d", d, 1))
    n = int(theory._integer("n", n, 1))
    samples = int(theory._integer("samples", samples, 2))
    theory._choice("score", score, MC_SCORES)
    theory._choice("method", method, ("rotation", "vectors"))
    if score in ("cosine", "qk_rmsnorm", "qk_layernorm") and d < 2:
        raise ValueError(f"d must be an integer >= 2 for {score}, got {d}")
    rng = np.random.default_rng(seed)
    use_vectors = method == "vectors" or score in ("qk_layernorm", "softcap")
    per_chunk = max(1, _CHUNK // (n * d)) if use_vectors else _rows_per_chunk(n)
    parts = []
    for start in range(0, samples, per_chunk):
        rows = min(per_chunk, samples - start)
        if use_vectors:
            q = rng.standard_normal((rows, d))
            k = rng.standard_normal((rows, n, d))
            logits = vector_logits(q, k, score, tau=tau, mup_c=mup_c, log_scale=log_scale,
                                   cap=cap)
        else:
            logits = _rotation_logits(score, d, n, *_rotation_draws(rng, d, n, rows), tau, mup_c,
                                      log_scale)
        parts.append(softmax_sample_stats(logits))
    return _summarise(np.concatenate(parts, axis=1))


def mc_logit_variance(d: int, var_q: float = 1.0, var_k: float = 1.0, samples: int = 20000,
                      seed: int = 0) -> Estimate:
    """Sample variance of q·k for q, k with i.i.d. N(0, var) components (E[q·k] = 0 known).

    Estimates E[(q·k)²]; the SE is the sample std of (q·k)² over √samples.
    """
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((samples, d)) * math.sqrt(var_q)
    k = rng.standard_normal((samples, d)) * math.sqrt(var_k)
    sq = np.einsum("sd,sd->s", q, k) ** 2
    return Estimate(float(sq.mean()), float(sq.std(ddof=1) / math.sqrt(samples)))


def mc_init_logit_std(
    d_model: int,
    d_head: int,
    weight_std: float,
    score: str,
    *,
    draws: int = 200,
    tokens: int = 32,
    seed: int = 0,
    tau: float = 1.0,
    n: int | None = None,
    mup_c: float = theory.MUP_C,
    cap: float = 50.0,
    log_scale: float = 1.0,
) -> Estimate:
    """Simulated logit std in a pre-LN block at init (compare :func:`theory.init_logit_std`).

    Per draw: ``tokens`` random tokens go through LayerNorm (no affine), fresh W_q, W_k with
    i.i.d. N(0, weight_std²) entries project them to q, k (d_head), and the logits of every pair
    of *different* tokens are scored. The per-draw mean of ℓ² is i.i.d. across draws; the result
    is √mean with a delta-method SE.
    """
    theory._integer("d_model", d_model, 1)
    theory._integer("d_head", d_head, 2 if score == "qk_layernorm" else 1)
    theory._positive("weight_std", weight_std)
    theory._choice("score", score, theory.INIT_SCORES)
    rng = np.random.default_rng(seed)
    if score == "log_length" and n is None:
        raise ValueError("n (number of keys, integer >= 1) is required for log_length")
    off_diag = ~np.eye(tokens, dtype=bool)
    ms = np.empty(draws)
    for i in range(draws):
        x = rng.standard_normal((tokens, d_model))
        x = (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True)
        q = x @ (weight_std * rng.standard_normal((d_model, d_head)))
        k = x @ (weight_std * rng.standard_normal((d_model, d_head)))
        keys = np.broadcast_to(k, (tokens, tokens, d_head))
        logits = vector_logits(q, keys, score, tau=tau, mup_c=mup_c, cap=cap, log_scale=1.0)
        if score == "log_length":  # the scale uses the number of keys n, not the token count
            logits = logits / math.log(tokens) * log_scale * math.log(n)
        ms[i] = np.mean(logits[off_diag] ** 2)
    mean, se = float(ms.mean()), float(ms.std(ddof=1)) / math.sqrt(draws)
    return Estimate(math.sqrt(mean), se / (2.0 * math.sqrt(mean)))


# --------------------------------------------------------------------------------------------
# The theory-vs-Monte-Carlo table
# --------------------------------------------------------------------------------------------

TABLE_DS = (16, 64, 256, 1024)
TABLE_NS = (64, 512, 4096)
TABLE_SCORES = {  # label -> (score, tau)
    "dot": ("dot", 1.0),
    "scaled_dot": ("scaled_dot", 1.0),
    "cosine_tau1": ("cosine", 1.0),
    "cosine_tau10": ("cosine", 10.0),
}
TABLE_QUANTITIES = ("logit_std", "entropy", "max_weight", "effective_keys", "jacobian_norm")


def theory_table(
    seed: int = 0,
    samples: int = 600,
    ds: tuple[int, ...] = TABLE_DS,
    ns: tuple[int, ...] = TABLE_NS,
    quantities: tuple[str, ...] = TABLE_QUANTITIES,
) -> list[dict]:
    """Exact theory next to Monte Carlo for every (score, d, n, quantity).

    Rows: {"score", "d", "n", "quantity", "theory", "mc_mean", "mc_se"} with score labels
    dot, scaled_dot, cosine_tau1, cosine_tau10. For each (d, n) one set of rotation draws
    (:func:`_rotation_draws`, ``samples`` queries of n keys) serves all four scores.
    Runs in a few seconds on 2 cores at the default size.
    """
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for d in ds:
        for n in ns:
            per = {label: [] for label in TABLE_SCORES}
            for start in range(0, samples, _rows_per_chunk(n)):
                draws = _rotation_draws(rng, d, n, min(_rows_per_chunk(n), samples - start))
                for label, (score, tau) in TABLE_SCORES.items():
                    logits = _rotation_logits(score, d, n, *draws, tau, theory.MUP_C, 1.0)
                    per[label].append(softmax_sample_stats(logits))
            for label, (score, tau) in TABLE_SCORES.items():
                est = _summarise(np.concatenate(per[label], axis=1))
                exact = theory.score_moments(d, n, score, tau)
                for quantity in quantities:
                    rows.append({
                        "score": label, "d": d, "n": n, "quantity": quantity,
                        "theory": exact.get(quantity),
                        "mc_mean": est[quantity].mean, "mc_se": est[quantity].se,
                    })
    return rows

