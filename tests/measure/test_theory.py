"""attnscale.measure.theory (exact integrals, closed forms) against attnscale.measure.montecarlo.

Agreement rule: theory and seeded Monte Carlo must agree within Z_TOL = 4 standard errors. A
test here makes ~100 comparisons; if the theory is right each |z| is ~N(0, 1), so the chance
that any exceeds 4 is ≈ 100 · 6.3e-5 ≈ 0.6% (Bonferroni) — and the seeds are fixed, so the
outcome is deterministic. A relative error ≤ 1e-9 also passes (SE at rounding level, e.g. n = 1).
Each test can fail: ``test_wrong_formulas_are_rejected`` shows the same rule rejecting
formulas that are wrong by as little as 2%.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special

from attnscale.measure import montecarlo as mc
from attnscale.measure import theory as th

Z_TOL = 4.0
REL_FLOOR = 1e-9


def assert_agrees(theory_value: float, est: mc.Estimate, label: str) -> None:
    assert est.agrees(theory_value, Z_TOL, REL_FLOOR), (
        f"{label}: theory {theory_value:.8g} vs MC {est.mean:.8g} ± {est.se:.3g} "
        f"(z = {est.z(theory_value):.2f})"
    )


def rem_value(quantity: str, n: int, s: float) -> float:
    funcs = {
        "entropy": th.expected_entropy,
        "max_weight": th.expected_max_weight,
        "participation": th.expected_participation,
        "effective_keys": th.expected_effective_keys,
        "rms_jacobian_norm": th.rms_jacobian_norm,
        "logit_std": lambda n, s: s,
    }
    return funcs[quantity](n, s)


# Both phases (s_c(8) = 2.04, s_c(64) = 2.88, s_c(1024) = 3.72), n = 2, s down to 0.1.
REM_GRID = [(2, 0.1), (2, 2.5), (8, 1.0), (8, 6.0), (64, 0.5), (64, 2.88), (64, 8.6),
            (1024, 1.86), (1024, 5.6)]


@pytest.mark.parametrize(("n", "s"), REM_GRID)
def test_rem_theory_matches_monte_carlo(n: int, s: float) -> None:
    est = mc.mc_softmax_stats(n, s, samples=max(1000, 200_000 // n), seed=n)
    for quantity in th.QUANTITIES:
        assert_agrees(rem_value(quantity, n, s), est[quantity], f"{quantity} n={n} s={s}")


SCORE_GRID = [  # (d, n, score, params, MC method): "vectors" samples q, k themselves
    (16, 64, "dot", {}, "vectors"),
    (64, 128, "scaled_dot", {}, "vectors"),
    (4, 32, "mup", {}, "rotation"),
    (16, 64, "cosine", {}, "vectors"),
    (3, 256, "cosine", {"tau": 10.0}, "rotation"),
    (2, 16, "cosine", {"tau": 10.0}, "vectors"),
    (16, 32, "qk_rmsnorm", {}, "vectors"),
    (8, 32, "qk_layernorm", {}, "vectors"),
    (16, 256, "log_length", {}, "rotation"),
    (16, 256, "log_length", {"s": 0.5}, "vectors"),
]


@pytest.mark.parametrize(("d", "n", "score", "params", "method"), SCORE_GRID)
def test_score_theory_matches_monte_carlo(d, n, score, params, method) -> None:
    est = mc.mc_score_stats(d, n, score, samples=3000, seed=d + n, method=method, **params)
    exact = th.score_moments(d, n, score, **params)
    for quantity in th.QUANTITIES:
        assert_agrees(exact.get(quantity), est[quantity], f"{quantity} {score} d={d} n={n}")


def test_wrong_formulas_are_rejected() -> None:
    # The REM asymptote ln n − s²/2 is badly wrong in the frozen phase ...
    n, s = 64, 3 * math.sqrt(2 * math.log(64))
    frozen = mc.mc_softmax_stats(n, s, samples=3000, seed=1)["entropy"]
    assert abs(frozen.z(math.log(n) - s * s / 2)) > 100
    assert abs(frozen.z(th.expected_entropy(n, s))) <= Z_TOL
    # ... and measurably wrong even in its own phase at n = 64 (finite-n correction).
    warm = mc.mc_softmax_stats(n, 1.0, samples=3000, seed=2)["entropy"]
    assert abs(warm.z(math.log(n) - 0.5)) > 10
    # A 2% error in the exact value is rejected too, for every quantity.
    est = mc.mc_softmax_stats(n, 1.0, samples=20_000, seed=3)
    for quantity in th.QUANTITIES:
        assert not est[quantity].agrees(1.02 * rem_value(quantity, n, 1.0), Z_TOL, REL_FLOOR)


@pytest.mark.parametrize("s", [0.1, 1.0, 4.0])
def test_two_keys_match_closed_forms(s: float) -> None:
    # n = 2: p = sigmoid(Δ) with Δ = ℓ₁ − ℓ₂ ~ N(0, 2s²); integrate the closed forms directly.
    sd = math.sqrt(2.0) * s

    def expect(f):
        return integrate.quad(lambda x: f(x) * math.exp(-x * x / (2 * sd * sd)),
                              -12 * sd, 12 * sd, epsabs=0, epsrel=1e-12, limit=200)[0] / (
            math.sqrt(2 * math.pi) * sd)

    closed = th.two_key_closed_form
    moments = th.softmax_moments(th.gaussian_logits(s, 2), 2)
    checks = {
        "entropy": expect(lambda x: closed(x)["entropy"]),
        "max_weight": expect(lambda x: closed(x)["max_weight"]),
        "participation": expect(lambda x: closed(x)["participation"]),
        "rms_jacobian_norm": math.sqrt(expect(lambda x: closed(x)["jacobian_norm"] ** 2)),
    }
    for quantity, value in checks.items():
        assert moments.get(quantity) == pytest.approx(value, rel=1e-7), quantity


def test_two_key_closed_form_is_the_softmax() -> None:
    for delta in (-3.0, 0.0, 0.7, 9.0):
        p = special.softmax([delta, 0.0])
        jac = np.diag(p) - np.outer(p, p)
        got = th.two_key_closed_form(delta)
        assert got["entropy"] == pytest.approx(-np.sum(p * np.log(p)), rel=1e-12)
        assert got["max_weight"] == pytest.approx(p.max(), rel=1e-12)
        assert got["participation"] == pytest.approx(np.sum(p * p), rel=1e-12)
        assert got["jacobian_norm"] == pytest.approx(np.linalg.norm(jac), rel=1e-12)


def test_quadrature_has_converged() -> None:
    # Halving the y step and doubling the panel count must not move any moment (exactness).
    for n, s in [(3, 0.2), (512, 3.5), (8192, 12.7)]:
        base = th.softmax_moments(th.gaussian_logits(s, n), n)
        dist = th.gaussian_logits(s, n)
        lo, hi = float(dist.nodes[0, 0]), float(dist.nodes[-1, -1])
        fine = th.panel_logits(
            lambda v: v, lambda v, s=s: np.exp(-v * v / (2 * s * s)) / (s * math.sqrt(2 * math.pi)),
            np.linspace(dist.atom, hi + (hi - lo) * 1e-3, 2 * dist.nodes.shape[0] + 1),
            atom=dist.atom, atom_mass=dist.atom_mass, order=18)
        ref = th.softmax_moments(fine, n, step=0.1)
        for field in ("entropy", "participation", "cube", "participation_sq", "max_weight"):
            assert getattr(base, field) == pytest.approx(getattr(ref, field), rel=1e-7), field


def test_limits_and_shape() -> None:
    n = 64
    assert th.expected_entropy(n, 0.0) == pytest.approx(math.log(n), rel=1e-14)
    assert th.expected_max_weight(n, 0.0) == pytest.approx(1 / n)
    assert th.rms_jacobian_norm(n, 0.0) == pytest.approx(math.sqrt(n - 1) / n)
    assert th.expected_entropy(1, 2.0) == 0.0 and th.expected_max_weight(1, 2.0) == 1.0
    # Small s: H ≈ ln n − s²/2·(1 − 1/n) to first order.
    assert th.expected_entropy(n, 0.05) == pytest.approx(math.log(n) - 0.05**2 / 2 * (1 - 1 / n),
                                                          abs=1e-5)
    # Entropy falls and max weight rises with s; the Jacobian norm rises from √(n−1)/n, peaks
    # near s_c and then falls towards 0 (one-hot): not monotone (C10).
    s = np.r_[np.linspace(0.0, 20.0, 41), 100.0, 1000.0]
    assert np.all(np.diff(th.expected_entropy(n, s)) < 0)
    assert np.all(np.diff(th.expected_max_weight(n, s)) > 0)
    jac = th.rms_jacobian_norm(n, s)
    peak = int(np.argmax(jac))
    assert 0 < peak < s.size - 1 and jac[0] < jac[peak]
    assert np.all(np.diff(jac[peak:]) < 0) and jac[-1] < jac[0] / 2
    # Broadcasting agrees with scalar calls.
    grid = th.expected_participation(np.array([[2], [64]]), np.array([0.5, 3.0]))
    assert grid.shape == (2, 2)
    assert grid[1, 0] == th.expected_participation(64, 0.5)


def test_asymptotics_loosely() -> None:
    n = 8192
    sc = th.rem_critical_scale(n)
    assert sc == pytest.approx(math.sqrt(2 * math.log(n)))
    for s in (0.5, 0.5 * sc):
        assert th.expected_entropy(n, s) == pytest.approx(th.rem_entropy_asymptotic(n, s), rel=0.02)
    for s in (2 * sc, 3 * sc):  # Poisson–Dirichlet limit; finite-n corrections are large here
        assert th.expected_entropy(n, s) == pytest.approx(th.rem_entropy_asymptotic(n, s), rel=0.3)
        assert th.expected_participation(n, s) == pytest.approx(
            th.rem_participation_asymptotic(n, s), rel=0.15)
    assert th.expected_participation(n, 1.0) == pytest.approx(
        th.rem_participation_asymptotic(n, 1.0), rel=0.05)


def test_bounded_logits() -> None:
    # e²/(e² + 511) = 0.014254: the "1.4%" of claim C4 (1.43% to three figures).
    assert th.max_weight_bound(512, 1.0) == pytest.approx(math.e**2 / (math.e**2 + 511), rel=1e-14)
    assert round(100 * th.max_weight_bound(512, 1.0), 1) == 1.4
    assert th.qknorm_g0(72) == pytest.approx(12.32, abs=5e-3)
    for n, p in [(512, 0.5), (2, 0.9), (4096, 1 / 4096 + 1e-6)]:
        assert th.max_weight_bound(n, th.tau_for_max_weight(n, p)) == pytest.approx(p, rel=1e-10)
    # The bound is attained by one logit at +τ and the rest at −τ, and never beaten.
    n, tau = 512, 1.0
    attained = special.softmax(np.r_[tau, -tau * np.ones(n - 1)])[0]
    assert attained == pytest.approx(th.max_weight_bound(n, tau), rel=1e-12)
    rng = np.random.default_rng(0)
    logits = rng.uniform(-tau, tau, size=(2000, n))
    logits[:, 0] = tau
    assert special.softmax(logits, axis=1).max() <= th.max_weight_bound(n, tau)


def test_cosine_law() -> None:
    for d in (2, 3, 16, 300):
        def pdf(x, d=d):
            return th.cosine_logit_pdf(x, d)

        mass = integrate.quad(pdf, -1, 1, limit=200)[0]
        var = integrate.quad(lambda x, f=pdf: x * x * f(x), -1, 1, limit=200)[0]
        assert mass == pytest.approx(1.0, rel=1e-7)
        assert var == pytest.approx(th.cosine_logit_variance(d), rel=1e-7)
    assert th.cosine_logit_pdf(1.5, 8) == 0.0
    # τ = √d gives τ·cos the std of q·k/√d.
    d = 64
    tau = th.tau_matching_scaled_dot(d)
    assert th.expected_stat("logit_std", d, 32, "cosine", tau=tau) == pytest.approx(1.0)
    assert th.expected_stat("logit_std", d, 32, "scaled_dot") == pytest.approx(1.0)


def test_logit_variance_and_mean() -> None:
    assert th.logit_variance(64) == 64.0
    for d, vq, vk in [(16, 1.0, 1.0), (256, 2.0, 0.5)]:
        assert_agrees(th.logit_variance(d, vq, vk), mc.mc_logit_variance(d, vq, vk, seed=d),
                      f"Var q·k d={d}")
    # C8: the mean of q·k is 0 at every d (it does not grow like d).
    rng = np.random.default_rng(5)
    for d in (16, 1024):
        dots = np.einsum("sd,sd->s", rng.standard_normal((4000, d)),
                         rng.standard_normal((4000, d)))
        assert abs(dots.mean()) < Z_TOL * dots.std() / math.sqrt(dots.size)


@pytest.mark.parametrize(
    ("score", "weight_std", "kwargs"),
    [
        ("dot", 0.1, {}),
        ("scaled_dot", 0.1, {}),
        ("mup", 0.1, {}),
        ("cosine", 0.1, {"tau": 10.0}),
        ("qk_layernorm", 0.1, {}),
        ("qk_rmsnorm", 0.1, {}),
        ("softcap", 0.5, {"cap": 5.0}),  # σ² = 16 ≫ cap: tanh saturates
        ("log_length", 0.1, {"n": 1024}),
    ],
)
def test_init_logit_std_matches_simulation(score, weight_std, kwargs) -> None:
    d_model, d_head = 64, 16
    exact = th.init_logit_std(d_model, d_head, weight_std, score, **kwargs)
    est = mc.mc_init_logit_std(d_model, d_head, weight_std, score, draws=300, seed=7, **kwargs)
    assert_agrees(exact, est, f"init {score}")


def test_init_logit_std_values() -> None:
    # σ² = d_model·w² = 1 for w = 1/√d_model: dot gives √d_head, scaled gives 1.
    assert th.init_logit_std(256, 64, 1 / 16, "dot") == pytest.approx(8.0)
    assert th.init_logit_std(256, 64, 1 / 16, "scaled_dot") == pytest.approx(1.0)
    assert th.init_logit_std(256, 64, 1 / 16, "mup") == pytest.approx(1.0)  # c/d = 1/√d at 64
    soft = th.init_logit_std(256, 64, 1 / 16, "softcap", cap=50.0)
    assert soft == pytest.approx(1.0, rel=1e-3) and soft < 1.0


def test_theory_table_rows() -> None:
    # 2000 queries: at 300 the skewed max weight's SE is itself too noisy for a 4-SE test
    rows = mc.theory_table(seed=0, samples=2000, ds=(16,), ns=(64,))
    labels = {"dot", "scaled_dot", "mup", "cosine_tau1", "cosine_tau10", "qk_layernorm",
              "qk_rmsnorm", "log_length"}
    assert len(rows) == len(labels) * len(mc.TABLE_QUANTITIES)
    assert {r["score"] for r in rows} == labels
    assert mc.table_scores()["cosine_tau10"] == ("cosine", {"tau": 10.0})
    for r in rows:
        assert set(r) == {"score", "d", "n", "quantity", "theory", "mc_mean", "mc_se"}
        est = mc.Estimate(r["mc_mean"], r["mc_se"])
        assert_agrees(r["theory"], est, f"table {r['score']} {r['quantity']}")


def test_theory_follows_the_registry_hooks() -> None:
    # Every score with a hook is covered; soft-capping (not Gaussian given q) is not.
    assert set(th.stat_scores()) == {"dot", "scaled_dot", "mup", "cosine", "qk_layernorm",
                                     "qk_rmsnorm", "log_length"}
    assert "softcap" in th.init_scores()
    with pytest.raises(ValueError, match=r"^score 'softcap' has no exact"):
        th.score_moments(16, 8, "softcap")
    # The hook's parameters are the registry's: µP at the default c = 8 equals 1/√d at d = 64.
    assert th.expected_stat("entropy", 64, 32, "mup") == pytest.approx(
        th.expected_stat("entropy", 64, 32, "scaled_dot"), rel=1e-12)
    assert th.expected_stat("entropy", 64, 32, "mup", c=16.0) < th.expected_stat(
        "entropy", 64, 32, "mup")
    with pytest.raises(ValueError, match="unknown parameter"):
        th.score_moments(16, 8, "dot", tau=2.0)


NAN = float("nan")


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: th.expected_entropy(0, 1.0), "n"),
        (lambda: th.expected_entropy(2.5, 1.0), "n"),
        (lambda: th.expected_max_weight(8, -0.1), "s"),
        (lambda: th.expected_participation(8, NAN), "s"),
        (lambda: th.rms_jacobian_norm(NAN, 1.0), "n"),
        (lambda: th.logit_variance(0), "d"),
        (lambda: th.logit_variance(8, var_q=-1.0), "var_q"),
        (lambda: th.expected_stat("entropy", 0, 8, "dot"), "d"),
        (lambda: th.expected_stat("entropy", 1, 8, "cosine"), "d"),
        (lambda: th.expected_stat("bogus", 8, 8, "dot"), "quantity"),
        (lambda: th.expected_stat("entropy", 8, 8, "bogus"), "score"),
        (lambda: th.expected_stat("entropy", 8, 8, "cosine", tau=NAN), "tau"),
        (lambda: th.init_logit_std(64, 16, -0.1, "dot"), "weight_std"),
        (lambda: th.init_logit_std(64, 0, 0.1, "dot"), "d_head"),
        (lambda: th.init_logit_std(64, 16, 0.1, "log_length"), "n"),
        (lambda: th.max_weight_bound(0, 1.0), "n"),
        (lambda: th.max_weight_bound(8, NAN), "tau"),
        (lambda: th.tau_for_max_weight(8, 1.0), "p"),
        (lambda: th.tau_for_max_weight(8, 0.0), "p"),
        (lambda: th.tau_for_max_weight(8, 0.01), "p"),
        (lambda: th.qknorm_g0(1.0), "L"),
        (lambda: th.cosine_logit_pdf(0.5, 1), "d"),
        (lambda: th.rem_critical_scale(0), "n"),
        (lambda: th.rem_entropy_asymptotic(8, -1.0), "s"),
        (lambda: mc.mc_softmax_stats(0, 1.0), "n"),
        (lambda: mc.mc_softmax_stats(8, -1.0), "s"),
        (lambda: mc.mc_score_stats(0, 8, "dot"), "d"),
    ],
)
def test_bad_input_names_the_argument(call, name) -> None:
    with pytest.raises(ValueError, match=rf"^{name} "):
        call()
