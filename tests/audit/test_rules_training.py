"""The head-dimension and scaled-vs-rivals rules (C6, C7, C13) on synthetic per-seed evidence:
each flips with opposite data, reads inconclusive when there is no effect at 5 seeds, and its
numbers are scipy's paired t-test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from attnscale.audit import rules_training as T
from attnscale.audit import verdicts as V
from attnscale.audit.verdicts import LOSS_DELTA

SEEDS = 5  # the standard preset's reported seeds (head_dim and lr_text studies)
DKS = (16, 64, 128, 256)
NULL_DRAWS = range(20)  # rng seeds of the no-effect tests: every one must read inconclusive


class Draw:
    """One synthetic study: every arm shares a per-seed level (same init and data order), so
    only the paired difference removes it."""

    def __init__(self, rng_seed, n=SEEDS, spread=0.2):
        self.rng = np.random.default_rng(rng_seed)
        self.level = self.rng.normal(0.0, spread, n)

    def arm(self, mean, noise, censored=False):
        x = mean + self.level + noise * self.rng.standard_normal(self.level.size)
        seeds = [str(s) for s in range(x.size)]
        return {"values": dict(zip(seeds, map(float, x), strict=True)),
                "lrs": dict.fromkeys(seeds, 0.01), "censored": censored, "curve": {}}


def vals(arm):
    return np.array(list(arm["values"].values()))


def one_sided(a, b, reading, delta=LOSS_DELTA):
    """scipy's one-sided paired p-value of a reading of a − b against ±delta."""
    if reading == "greater":
        return stats.ttest_rel(a, b + delta, alternative="greater").pvalue
    if reading == "less":
        return stats.ttest_rel(a, b - delta, alternative="less").pvalue
    return max(stats.ttest_rel(a, b - delta, alternative="greater").pvalue,
               stats.ttest_rel(a, b + delta, alternative="less").pvalue)


def assert_scipy(c, a, b, delta=LOSS_DELTA, p_holm=None):
    """A comparison's numbers against scipy.stats.ttest_rel (``p_holm``: the expected adjusted
    p-value when the comparison is one of a family; else its own one-sided p)."""
    a, b = vals(a), vals(b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert c["mean"] == pytest.approx(float(np.mean(a - b)), abs=1e-12)
    assert (c["lo"], c["hi"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    want = one_sided(a, b, c["reading"], delta) if p_holm is None else p_holm
    assert c["p_holm"] == pytest.approx(want, rel=1e-9)


def best_p(a, b, delta=LOSS_DELTA):
    """The smallest one-sided p over the three readings (the one a family keeps)."""
    return min(one_sided(vals(a), vals(b), r, delta) for r in ("greater", "less", "equal"))


def holm_by_hand(ps):
    """Holm's step-down adjustment, written out: sort, multiply the k-th smallest by m − k + 1,
    keep the running maximum, cap at 1."""
    order, m, out, run = np.argsort(ps), len(ps), [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        run = max(run, min(1.0, (m - k) * ps[i]))
        out[i] = run
    return out


# ------------------------------------------------------------------------------ C7, C13


def head_dim(draw, gap, absorbed=0.0, noise=0.002, gpt2_gap=0.0, dks=DKS):
    """Head-dimension evidence: dot − scaled_dot = gap(d_k) in the unit regime."""
    gap_at = gap if callable(gap) else (lambda d: gap)
    loss = {}
    for init in ("gpt2", "unit"):
        for d in dks:
            g = gap_at(d) if init == "unit" else gpt2_gap
            loss[T.cell(init, d)] = {"scaled_dot": draw.arm(2.0, noise),
                                     "dot": draw.arm(2.0 + g, noise),
                                     "dot_absorbed": draw.arm(2.0 + absorbed, noise)}
    entropy = {k: {"dot": draw.arm(0.5, 0.01), "scaled_dot": draw.arm(0.9, 0.01)}
               for k in loss}
    identity = {"exact": [{"d_k": d, "steps": 20, "max_loss_diff": 1e-12 * d,
                           "clipped_steps": 5} for d in dks],
                "partial": [{"d_k": dks[-1], "steps": 20, "max_loss_diff": 0.15}]}
    return {"loss": loss, "entropy_init": entropy, "entropy_end": entropy,
            "inits": ["gpt2", "unit"], "head_dims": list(dks),
            "seeds": list(range(draw.level.size)), "identity": identity}


def test_c7_flips_between_absorbed_by_the_lr_and_not():
    ok = T.judge_c7(head_dim(Draw(0), 0.0))
    assert ok.verdict == "supported"
    dep = T.judge_c7(head_dim(Draw(0), 0.2))
    assert dep.verdict == "depends"
    # the sentences carry the numbers, so they change with the evidence
    assert ok.plain != dep.plain and ok.headline != dep.headline
    assert f"{dep.numbers['dot']['256']['mean']:+.3f}" in dep.headline
    assert dep.plain[0].startswith("Partly right") and ok.plain[0].startswith("Right")
    assert "identity held to 3e-10 nats over 20 float64 steps" in dep.plain[1]
    assert "differ by 0.15 nats" in dep.plain[1]


def test_c7_a_broken_identity_is_a_bug_and_a_missing_one_is_named():
    ev = head_dim(Draw(0), 0.0)
    ev["identity"]["exact"][1]["max_loss_diff"] = 0.01
    with pytest.raises(ValueError, match="identity broke at d_k=64"):
        T.judge_c7(ev)
    ev["identity"] = {}
    with pytest.raises(V.MissingEvidence, match="identity"):
        T.judge_c7(ev)


def test_c7_the_identity_holds_in_the_lab():
    """The reparametrization of lab.build is exact: in float64 the absorbed arm trains like
    scaled_dot to rounding, clipping active; without the ε and clip corrections it drifts."""
    from attnscale.lab.identity import absorbed_identity
    cfg = {"task": "text", "seq_len": 16, "batch_size": 8, "n_layers": 1, "mlp": False,
           "n_heads": 1, "d_model": 64, "init": "unit", "lr": 1e-2, "seed": 3, "steps": 12,
           "warmup_steps": 1, "grad_clip": 0.3}
    exact = absorbed_identity(cfg, steps=12)
    assert exact["clipped_steps"] >= 3 and exact["max_loss_diff"] < T.IDENTITY_TOL
    assert exact["max_weight_rel_diff"] < 1e-9
    drift = absorbed_identity(cfg, steps=12, partial=True)
    assert drift["max_loss_diff"] > 100 * T.IDENTITY_TOL


def test_c7_dot_better_than_scaled_still_supports():
    assert T.judge_c7(head_dim(Draw(1), -0.2)).verdict == "supported"


def test_c7_no_effect_is_mostly_undecided_and_never_a_gap():
    """No effect, coarse (noise 5δ): never depends (a false gap), undecided in most draws, the
    rest supported (plain dot truly is no worse)."""
    coarse = [T.judge_c7(head_dim(Draw(r), 0.0, noise=5 * LOSS_DELTA)).verdict
              for r in NULL_DRAWS]
    assert set(coarse) <= {"inconclusive", "supported"}
    assert coarse.count("inconclusive") >= 0.75 * len(coarse), coarse


def test_c7_censored_or_few_seeds_is_inconclusive():
    ev = head_dim(Draw(2), 0.0)
    ev["loss"][T.cell("unit", 256)]["dot"]["censored"] = True
    v = T.judge_c7(ev)
    assert v.verdict == "inconclusive" and "censored" in v.numbers["dot"]["256"]["why"]
    assert T.judge_c7(head_dim(Draw(2, n=2), 0.0)).verdict == "inconclusive"
    assert T.judge_c7(head_dim(Draw(2, n=3), 0.0)).verdict == "supported"


def test_c7_statistics_are_scipys():
    ev = head_dim(Draw(3), 0.1, absorbed=0.0, noise=0.01, dks=(64,))
    v = T.judge_c7(ev)
    row = ev["loss"][T.cell("unit", 64)]
    assert v.numbers["dot"]["64"]["reading"] == "greater"
    # Holm over the dot comparisons (one d_k here); each absorbed comparison alone
    want = [best_p(row["dot"], row["scaled_dot"]),
            best_p(row["dot_absorbed"], row["scaled_dot"])]
    assert_scipy(v.numbers["dot"]["64"], row["dot"], row["scaled_dot"], p_holm=want[0])
    assert_scipy(v.numbers["absorbed"]["64"], row["dot_absorbed"], row["scaled_dot"],
                 p_holm=want[1])


def growing(d):
    return 0.05 + 0.05 * np.log2(d / 16)  # +0.05 nats per doubling of d_k


def test_c13_flips_between_a_growing_gap_and_none():
    yes = T.judge_c13(head_dim(Draw(4), growing))
    assert yes.verdict == "supported"
    no = T.judge_c13(head_dim(Draw(4), 0.0))
    assert no.verdict == "refuted"
    assert T.judge_c13(head_dim(Draw(4), -0.2)).verdict == "refuted"  # dot better
    flat = T.judge_c13(head_dim(Draw(4), 0.2))  # there, but not growing
    assert flat.verdict == "depends" and flat.numbers["slope"]["reading"] == "equal"
    assert yes.headline != no.headline and yes.plain != no.plain
    assert f"{yes.numbers['slope']['mean']:+.3f}" in yes.headline


def test_c13_shows_the_gpt2_regime_beside_it():
    v = T.judge_c13(head_dim(Draw(5), growing, gpt2_gap=0.3))
    gpt2 = v.numbers["context"]["gpt2"]["256"]
    assert gpt2["reading"] == "greater"
    assert any(f"With gpt2 init the gap at d_k=256 is {gpt2['mean']:+.3f}" in p for p in v.plain)


def test_c13_no_effect_is_mostly_undecided_and_never_a_gap():
    """No effect measured coarsely (noise 5δ per arm): never supported or depends, undecided in
    most draws; the rest read refuted, which is right (no effect is non-inferior: the true gap
    is under δ). Measured finely (noise 0.002) it reads refuted every time."""
    coarse = [T.judge_c13(head_dim(Draw(r), 0.0, noise=5 * LOSS_DELTA)).verdict
              for r in NULL_DRAWS]
    assert set(coarse) <= {"inconclusive", "refuted"}
    assert coarse.count("inconclusive") >= 0.75 * len(coarse), coarse
    for r in NULL_DRAWS:
        assert T.judge_c13(head_dim(Draw(r), 0.0, noise=LOSS_DELTA)).verdict in (
            "inconclusive", "refuted")
        assert T.judge_c13(head_dim(Draw(r), 0.0, noise=0.002)).verdict == "refuted"


def test_c13_censored_or_few_seeds_is_inconclusive():
    ev = head_dim(Draw(6), growing)
    ev["loss"][T.cell("unit", 256)]["scaled_dot"]["censored"] = True
    assert T.judge_c13(ev).verdict == "inconclusive"
    assert T.judge_c13(head_dim(Draw(6, n=2), growing)).verdict == "inconclusive"


def test_c13_slope_is_scipys_regression_and_t_test():
    ev = head_dim(Draw(7), growing, noise=0.01)
    v = T.judge_c13(ev)
    x = np.log2(DKS)
    slopes = []
    for s in map(str, range(SEEDS)):
        gap = [ev["loss"][T.cell("unit", d)]["dot"]["values"][s]
               - ev["loss"][T.cell("unit", d)]["scaled_dot"]["values"][s] for d in DKS]
        slopes.append(stats.linregress(x, gap).slope)
    slope = v.numbers["slope"]
    ci = stats.ttest_1samp(slopes, 0.0).confidence_interval(0.95)
    assert slope["mean"] == pytest.approx(np.mean(slopes), rel=1e-9)
    assert (slope["lo"], slope["hi"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # the rule reads the slope and the largest gap only through 'and': each alone (an
    # intersection-union test); the smaller d_k's gaps, context, share one family
    assert slope["reading"] == "greater"
    p = stats.ttest_1samp(slopes, T.SLOPE_DELTA, alternative="greater").pvalue
    assert slope["p_holm"] == pytest.approx(p, rel=1e-9)
    big = str(DKS[-1])
    cells = [ev["loss"][T.cell("unit", d)] for d in DKS]
    assert v.numbers["gaps"][big]["p_holm"] == pytest.approx(
        best_p(cells[-1]["dot"], cells[-1]["scaled_dot"]), rel=1e-9)
    context = holm_by_hand([best_p(c["dot"], c["scaled_dot"]) for c in cells[:-1]])
    assert [v.numbers["gaps"][str(d)]["p_holm"] for d in DKS[:-1]] == pytest.approx(context,
                                                                                  rel=1e-9)


# ------------------------------------------------------------------------------ C6


WIDTHS = ("d_model=32", "d_model=128")


def c6(draw, text_gap, retrieval_gap=None, noise=0.002, arms=("dot", "cosine_tau1")):
    """rival − scaled_dot = gap[rival] on text (each width) and on retrieval."""
    def row(gap):
        return {"scaled_dot": draw.arm(2.0, noise),
                **{r: draw.arm(2.0 + gap[r], noise) for r in arms}}
    retrieval_gap = text_gap if retrieval_gap is None else retrieval_gap
    return {"text": {"loss": {w: row(text_gap) for w in WIDTHS}},
            "retrieval": {"loss": {"all": row(retrieval_gap)}}}


def test_c6_flips_between_scaled_best_and_not():
    yes = T.judge_c6(c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3}))
    assert yes.verdict == "supported" and yes.headline == "supported: scaled better in 6/6"
    no = T.judge_c6(c6(Draw(8), {"dot": -0.2, "cosine_tau1": 0.0}))
    assert no.verdict == "refuted" and no.headline == "refuted: scaled better in 0/6"
    mixed = T.judge_c6(c6(Draw(8), {"dot": 0.2, "cosine_tau1": -0.2}))
    assert mixed.verdict == "depends"
    assert "d_model=32: dot" in mixed.plain[0] and "retrieval: cosine_tau1" in mixed.plain[1]
    assert yes.plain != no.plain != mixed.plain


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_c6_no_effect_is_inconclusive(rng_seed):
    ev = c6(Draw(rng_seed), {"dot": 0.0, "cosine_tau1": 0.0}, noise=LOSS_DELTA)
    assert T.judge_c6(ev).verdict == "inconclusive"


def test_c6_missing_censored_or_few_seeds_is_inconclusive():
    ev = c6(Draw(9), {"dot": 0.2, "cosine_tau1": 0.3})
    del ev["retrieval"]["loss"]["all"]["cosine_tau1"]
    v = T.judge_c6(ev)
    assert v.numbers["retrieval: cosine_tau1"]["why"] == "an arm has no runs"
    assert v.verdict == "inconclusive"
    ev = c6(Draw(9), {"dot": 0.2, "cosine_tau1": 0.3})
    ev["text"]["loss"]["d_model=32"]["dot"]["censored"] = True
    assert T.judge_c6(ev).verdict == "inconclusive"
    ev = c6(Draw(9, n=2), {"dot": 0.2, "cosine_tau1": 0.3})
    assert T.judge_c6(ev).verdict == "inconclusive"


def test_c6_holm_over_its_six_comparisons_is_scipys():
    ev = c6(Draw(10), {"dot": 0.06, "cosine_tau1": 0.0}, noise=0.015)
    v = T.judge_c6(ev)
    keys = list(v.numbers)
    assert len(keys) == 6
    def arms(k):
        where, rival = k.split(": ")
        row = ev["retrieval"]["loss"]["all"] if where == "retrieval" else ev["text"]["loss"][where]
        return vals(row[rival]), vals(row["scaled_dot"])
    best = {k: min(("greater", "less", "equal"), key=lambda r, k=k: one_sided(*arms(k), r))
            for k in keys}
    ps = np.array([one_sided(*arms(k), best[k]) for k in keys])
    order = np.argsort(ps)
    holm = np.maximum.accumulate(np.minimum(1, (len(ps) - np.arange(len(ps))) * ps[order]))
    for k, p in zip((keys[i] for i in order), holm, strict=True):
        assert v.numbers[k]["p_holm"] == pytest.approx(p, rel=1e-9)
        assert v.numbers[k]["reading"] == (best[k] if p <= 0.025 else "inconclusive")
