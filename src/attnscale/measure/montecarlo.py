"""Monte Carlo estimates of the softmax statistics :mod:`attnscale.measure.theory` computes exactly.

Everything is seeded (``numpy.random.Generator`` from ``seed``), vectorised and chunked so that
no array holds more than ~1M logits. Each quantity comes back as an :class:`Estimate`
(mean, standard error). The per-sample statistics are i.i.d. across samples, so the SE is the
sample std / √samples; quantities that are smooth functions of a mean use the delta method:

* effective_keys = 1/mean(Σp²),           SE = SE(Σp²)/mean(Σp²)²;
* rms_jacobian_norm = √mean(‖J‖_F²),       SE = SE(‖J‖_F²)/(2·rms_jacobian_norm);
* logit_std      = √mean(ℓ²) (per sample, the mean of ℓ² over its n keys), same rule.

These are exactly the quantities the theory defines (1/E Σp², √E‖J‖², √E ℓ²).

Scores with random q, k ~ N(0, I_d) are sampled two ways: ``"vectors"`` draws q and k and
scores them with the registry's own reference formula (every registered score), and
``"rotation"`` draws the same joint law at O(n) per query from the score's theory hook
(``dot_factor`` or ``cosine_law`` in d dims, see :class:`attnscale.core.scores.Score`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from attnscale.core.scores import SCORES, Context, Score, get_score, resolve_params
from attnscale.measure import theory
from attnscale.util.validate import check_choice, check_float, check_int

__all__ = [
    "TABLE_DS",
    "TABLE_NS",
    "TABLE_QUANTITIES",
    "Estimate",
    "mc_init_logit_std",
    "mc_logit_variance",
    "mc_score_stats",
    "mc_softmax_stats",
    "softmax_sample_stats",
    "table_scores",
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
        "rms_jacobian_norm": root("jacobian_sq"),
        "logit_std": root("logit_sq"),
    }


def _rows_per_chunk(n: int) -> int:
    return max(1, _CHUNK // n)


def mc_softmax_stats(n: int, s: float, samples: int = 4000, seed: int = 0) -> dict[str, Estimate]:
    """Monte Carlo over ``samples`` draws of n i.i.d. N(0, s²) logits (the REM softmax).

    Keys: entropy, max_weight, participation, effective_keys, rms_jacobian_norm, logit_std —
    the same definitions as :func:`attnscale.measure.theory.expected_entropy` and friends.
    """
    n = check_int("n", n)
    s = check_float("s", s, low=0.0, low_inclusive=True)
    samples = check_int("samples", samples, 2)
    rng = np.random.default_rng(seed)
    parts = []
    for start in range(0, samples, _rows_per_chunk(n)):
        rows = min(_rows_per_chunk(n), samples - start)
        parts.append(softmax_sample_stats(s * rng.standard_normal((rows, n))))
    return _summarise(np.concatenate(parts, axis=1))


# --------------------------------------------------------------------------------------------
# Scores with random q, k ~ N(0, I_d)
# --------------------------------------------------------------------------------------------


def vector_logits(
    q: np.ndarray, k: np.ndarray, score: str | Score, *, n: int | None = None, **params: Any
) -> np.ndarray:
    """Logits of queries q (B, d) against keys k (B, n, d) for one score, shape (B, n).

    The score's reference ``formula`` in float64 (``params`` over its defaults); a score that
    depends on the number of keys sees ``n`` (default: k's n).
    """
    sc = get_score(score)
    p = resolve_params(sc, params, None)
    qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float64))[:, None, :]  # (B, 1, d)
    kt = torch.from_numpy(np.ascontiguousarray(k, dtype=np.float64))  # (B, n, d)
    keys = torch.tensor(float(kt.shape[-2] if n is None else n), dtype=torch.float64)
    ctx = Context(head_dim=qt.shape[-1], n_visible=lambda: keys)
    with torch.no_grad():
        return sc.formula(qt, kt, None, p, ctx)[:, 0, :].numpy()


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


def _rotates(sc: Score, d: int, params: dict[str, Any]) -> bool:
    """Whether the rotation draws in d dims give this score's logits (see the module doc)."""
    if sc.cosine_law is not None:
        return sc.cosine_law(d, params)[0] == d
    return sc.dot_factor is not None and sc.fused


def _rotation_logits(sc: Score, params: dict[str, Any], d: int, n: int, r, g, knorm):
    """Logits from the rotation draws: t·g/‖k‖ (cosine law) or c·‖q‖·g (dot factor)."""
    if sc.cosine_law is not None:
        return sc.cosine_law(d, params)[1] * g / knorm
    return (sc.dot_factor(d, n, params) * r) * g


def _sample(rng, sc: Score, p: dict[str, Any], d: int, n: int, rows: int, rotation: bool):
    """(rows, n) logits of one query against n keys, q, k ~ N(0, I_d)."""
    if rotation:
        return _rotation_logits(sc, p, d, n, *_rotation_draws(rng, d, n, rows))
    q = rng.standard_normal((rows, d))
    k = rng.standard_normal((rows, n, d))
    return vector_logits(q, k, sc, **p)


def mc_score_stats(
    d: int,
    n: int,
    score: str | Score,
    samples: int = 2000,
    seed: int = 0,
    *,
    method: str = "rotation",
    **params: Any,
) -> dict[str, Estimate]:
    """Monte Carlo statistics of softmax(score(q, k_1..k_n)), q, k_j i.i.d. N(0, I_d).

    ``params`` are the score's parameters. ``method="vectors"`` samples the d-dim vectors and
    applies :func:`vector_logits` (O(samples·n·d)); ``"rotation"`` samples the same joint law
    through :func:`_rotation_draws` (O(samples·n)) where the score's theory hook allows it
    (otherwise vectors: soft-capping, QK-LayerNorm, scores without a hook).
    """
    d = check_int("d", d)
    n = check_int("n", n)
    samples = check_int("samples", samples, 2)
    sc = get_score(score)
    check_choice("method", method, ("rotation", "vectors"))
    if sc.normalizes_q and d < 2:
        raise ValueError(f"d must be an integer >= 2 for {sc.name}, got {d}")
    p = resolve_params(sc, params, None)
    rng = np.random.default_rng(seed)
    rotation = method == "rotation" and _rotates(sc, d, p)
    per_chunk = _rows_per_chunk(n) if rotation else max(1, _CHUNK // (n * d))
    parts = []
    for start in range(0, samples, per_chunk):
        rows = min(per_chunk, samples - start)
        parts.append(softmax_sample_stats(_sample(rng, sc, p, d, n, rows, rotation)))
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
    score: str | Score,
    *,
    draws: int = 200,
    tokens: int = 32,
    seed: int = 0,
    n: int | None = None,
    **params: Any,
) -> Estimate:
    """Simulated logit std in a pre-LN block at init (compare :func:`theory.init_logit_std`).

    Per draw: ``tokens`` random tokens go through LayerNorm (no affine), fresh W_q, W_k with
    i.i.d. N(0, weight_std²) entries project them to q, k (d_head), and the logits of every pair
    of *different* tokens are scored (a score that depends on the number of keys sees ``n``).
    The per-draw mean of ℓ² is i.i.d. across draws; the result is √mean with a delta-method SE.
    """
    check_int("d_model", d_model)
    sc = get_score(score)
    check_int("d_head", d_head, 2 if sc.normalizes_q else 1)
    check_float("weight_std", weight_std, low=0.0)
    p = resolve_params(sc, params, None)
    if sc.dot_factor is not None:
        sc.dot_factor(d_head, n, p)  # the score's own check of n (log_length needs it)
    rng = np.random.default_rng(seed)
    off_diag = ~np.eye(tokens, dtype=bool)
    ms = np.empty(draws)
    for i in range(draws):
        x = rng.standard_normal((tokens, d_model))
        x = (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True)
        q = x @ (weight_std * rng.standard_normal((d_model, d_head)))
        k = x @ (weight_std * rng.standard_normal((d_model, d_head)))
        keys = np.broadcast_to(k, (tokens, tokens, d_head))
        logits = vector_logits(q, keys, sc, n=n, **p)
        ms[i] = np.mean(logits[off_diag] ** 2)
    mean, se = float(ms.mean()), float(ms.std(ddof=1)) / math.sqrt(draws)
    return Estimate(math.sqrt(mean), se / (2.0 * math.sqrt(mean)))


# --------------------------------------------------------------------------------------------
# The theory-vs-Monte-Carlo table
# --------------------------------------------------------------------------------------------

TABLE_DS = (16, 64, 256, 1024)
TABLE_NS = (64, 512, 4096)
TABLE_QUANTITIES = ("logit_std", "entropy", "max_weight", "effective_keys", "rms_jacobian_norm")


def table_scores() -> dict[str, tuple[str, dict[str, Any]]]:
    """The default scores of :func:`theory_table`: label -> (registered score, parameters).

    Every registered score with exact theory (``Score.has_theory``) at its defaults, labelled
    by its name; a score whose benchmark parameters differ from its defaults (the values
    practice uses) also at those, and then each label names the parameters that differ:
    cosine gives ``cosine_tau1`` (the default τ = 1) and ``cosine_tau10`` (x-transformers' τ).
    """
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in theory.stat_scores():
        sc = SCORES[name]
        practice = {k: v for k, v in sc.bench_params.items() if sc.defaults.get(k) != v}
        if not practice:
            out[name] = (name, {})
            continue
        for params in ({k: sc.defaults[k] for k in practice}, practice):
            out["_".join([name, *(f"{k}{v:g}" for k, v in params.items())])] = (name, params)
    return out


def theory_table(
    seed: int = 0,
    samples: int = 600,
    ds: tuple[int, ...] = TABLE_DS,
    ns: tuple[int, ...] = TABLE_NS,
    quantities: tuple[str, ...] = TABLE_QUANTITIES,
    scores: dict[str, tuple[str, dict[str, Any]]] | None = None,
) -> list[dict]:
    """Exact theory next to Monte Carlo for every (score, d, n, quantity).

    Rows: {"score", "d", "n", "quantity", "theory", "mc_mean", "mc_se"}. ``scores`` maps a
    label to (registered score, its parameters); default :func:`table_scores`. For each (d, n)
    one set of rotation draws (:func:`_rotation_draws`, ``samples`` queries of n keys) serves
    every score the rotation in d dims can sample; a score whose ``cosine_law`` lives in m ≠ d
    dims (QK-LayerNorm: m = d − 1) gets its own rotation draws in m dims, which sample the same
    law; the others draw q and k vectors. Runs in a few seconds on 2 cores at the default size.
    """
    table = table_scores() if scores is None else scores
    specs = {label: (get_score(name), resolve_params(get_score(name), params, None))
             for label, (name, params) in table.items()}
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for d in ds:
        for n in ns:
            per = _table_samples(rng, specs, d, n, samples)
            for label, (sc, _) in specs.items():
                est = _summarise(np.concatenate(per[label], axis=1))
                exact = theory.score_moments(d, n, sc, **table[label][1])
                rows += [{"score": label, "d": d, "n": n, "quantity": quantity,
                          "theory": exact.get(quantity), "mc_mean": est[quantity].mean,
                          "mc_se": est[quantity].se} for quantity in quantities]
    return rows


def _table_samples(rng, specs, d: int, n: int, samples: int) -> dict[str, list[np.ndarray]]:
    """Per label, the (5, rows) statistics chunks of ``samples`` queries at (d, n)."""
    per: dict[str, list[np.ndarray]] = {label: [] for label in specs}
    shared = [label for label, (sc, p) in specs.items() if _rotates(sc, d, p)]
    for start in range(0, samples, _rows_per_chunk(n)):
        draws = _rotation_draws(rng, d, n, min(_rows_per_chunk(n), samples - start))
        for label in shared:
            sc, p = specs[label]
            per[label].append(softmax_sample_stats(_rotation_logits(sc, p, d, n, *draws)))
    per_chunk = max(1, _CHUNK // (n * d))
    for label in [label for label in specs if label not in shared]:
        sc, p = specs[label]
        if sc.cosine_law is not None:  # O(n) per query: vectors at d = 1024 would take minutes
            dims = sc.cosine_law(d, p)[0]
            for start in range(0, samples, _rows_per_chunk(n)):
                draws = _rotation_draws(rng, dims, n, min(_rows_per_chunk(n), samples - start))
                per[label].append(softmax_sample_stats(_rotation_logits(sc, p, d, n, *draws)))
            continue
        for start in range(0, samples, per_chunk):
            rows = min(per_chunk, samples - start)
            per[label].append(softmax_sample_stats(_sample(rng, sc, p, d, n, rows, False)))
    return per
