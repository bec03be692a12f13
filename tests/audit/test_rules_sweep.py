"""The LR-sweep rules (C11, C12, Q1) on synthetic per-seed evidence: each flips with opposite
data, reads inconclusive without an effect (or, for C12, without data) at 5 seeds, and its
numbers are scipy's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnscale.audit import rules_sweep as R
from attnscale.audit.verdicts import LOSS_DELTA

SEEDS = 5  # the standard preset's reported seeds (lr_text study)
WIDTHS = ("d_model=32", "d_model=128")
NULL_DRAWS = range(20)  # rng seeds of the no-effect tests: every one must read inconclusive


class Draw:
    """One synthetic study: every arm shares a per-seed level (same init and data order), so
    only the paired difference removes it."""

    def __init__(self, rng_seed, n=SEEDS, spread=0.1):
        self.rng = np.random.default_rng(rng_seed)
        self.level = self.rng.normal(0.0, spread, n)

    def values(self, mean, noise):
        x = mean + self.level + noise * self.rng.standard_normal(self.level.size)
        return {str(s): float(v) for s, v in enumerate(x)}

    def arm(self, mean, noise, censored=False):
        v = self.values(mean, noise)
        return {"values": v, "lrs": dict.fromkeys(v, 0.01), "censored": censored, "curve": {}}

    def unstable(self, p):
        """Per seed, the unstable fraction of a six-LR grid (each LR unstable w.p. ``p``)."""
        return {str(s): int(k) / 6 for s, k in enumerate(self.rng.binomial(6, p, self.level.size))}


def holm(ps):
    ps = np.asarray(ps, dtype=float)
    order = np.argsort(ps)
    adj = np.maximum.accumulate(np.minimum(1, (len(ps) - np.arange(len(ps))) * ps[order]))
    out = np.empty_like(ps)
    out[order] = adj
    return out


def one_sided(a, b, reading, delta):
    """scipy's one-sided paired p-value of a reading of a − b against ±delta."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if reading == "greater":
        return stats.ttest_rel(a, b + delta, alternative="greater").pvalue
    if reading == "less":
        return stats.ttest_rel(a, b - delta, alternative="less").pvalue
    return max(stats.ttest_rel(a, b - delta, alternative="greater").pvalue,
               stats.ttest_rel(a, b + delta, alternative="less").pvalue)


def best_p(a, b, delta):
    return min(one_sided(a, b, r, delta) for r in ("greater", "less", "equal"))


# ------------------------------------------------------------------------------ C11


def c11(draw, sens_gap, unstable=(0.0, 0.0), noise=0.002):
    """LR-sweep evidence: dot − scaled_dot sensitivity = sens_gap[i] at width i; unstable[i]
    is dot's chance per LR of being unstable at width i (scaled_dot: never, unless
    ``unstable`` is "same", when both arms share one chance)."""
    sweep = {}
    for w, gap, p in zip(WIDTHS, sens_gap, unstable, strict=True):
        same = p == "same"
        sweep[w] = {"scaled_dot": {"sensitivity": draw.values(0.3, noise),
                                   "unstable": draw.unstable(0.2 if same else 0.0)},
                    "dot": {"sensitivity": draw.values(0.3 + gap, noise),
                            "unstable": draw.unstable(0.2 if same else p),
                            "peak_logit_by_lr": {"0.001": 12.0, "0.3": 3e4 if gap else 40.0}}}
    return {"sweep": sweep}


def test_c11_flips_between_growing_instability_and_none():
    yes = R.judge_c11(c11(Draw(0), (0.05, 0.3), unstable=(0.0, 0.5)))
    assert yes.verdict == "supported"
    # neither arm ever unstable: a zero difference on every seed is read by the exact sign
    # test, p = 2⁻ⁿ, Holm-corrected over C11's 5 comparisons: 8 seeds decide, 5 cannot
    no = R.judge_c11(c11(Draw(0, n=8), (0.0, 0.0)))
    assert no.verdict == "refuted"
    assert R.judge_c11(c11(Draw(0, n=5), (0.0, 0.0))).verdict == "inconclusive"
    assert R.judge_c11(c11(Draw(0, n=8), (-0.2, -0.2))).verdict == "refuted"  # less sensitive
    flat = R.judge_c11(c11(Draw(0), (0.3, 0.3)))  # worse at both widths, not growing
    assert flat.verdict == "depends" and flat.numbers["growth"]["reading"] == "equal"
    assert yes.headline != no.headline and yes.plain != no.plain
    big = yes.numbers["d_model=128 sensitivity"]["mean"]
    assert f"{big:+.3f} nats" in yes.headline and "3e+04 (width d_model=128)" in yes.plain[1]


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_c11_no_effect_is_inconclusive(rng_seed):
    ev = c11(Draw(rng_seed), (0.0, 0.0), unstable=("same", "same"), noise=LOSS_DELTA)
    assert R.judge_c11(ev).verdict == "inconclusive"


def test_c11_few_seeds_is_inconclusive():
    ev = c11(Draw(1, n=2), (0.05, 0.3), unstable=(0.0, 0.5))
    v = R.judge_c11(ev)
    assert v.verdict == "inconclusive"
    assert all(c["reading"] == "inconclusive" for c in v.numbers.values())


def test_c11_statistics_are_scipys():
    ev = c11(Draw(2), (0.02, 0.08), unstable=(0.1, 0.3), noise=0.02)
    v = R.judge_c11(ev)
    sw = ev["sweep"]
    def arms(key, w):
        return [list(sw[w][a][key].values()) for a in ("dot", "scaled_dot")]
    pairs, deltas = {}, {}
    for w in WIDTHS:
        pairs[f"{w} sensitivity"], deltas[f"{w} sensitivity"] = arms("sensitivity", w), 0.02
        pairs[f"{w} unstable"], deltas[f"{w} unstable"] = arms("unstable", w), R.unstable_delta(ev)
    large, small = (np.subtract(*arms("sensitivity", w)) for w in WIDTHS[::-1])
    pairs["growth"], deltas["growth"] = (large, small), 0.02  # (large − small) of the excess
    g = v.numbers["growth"]
    ci = stats.ttest_rel(large, small).confidence_interval(0.95)
    assert (g["mean"], g["lo"], g["hi"]) == pytest.approx(
        (np.mean(large - small), ci.low, ci.high), rel=1e-9)
    # Holm over the per-width comparisons (read through 'or' / 'somewhere'); growth alone
    per_width = [k for k in v.numbers if k != "growth"]
    expected = holm([best_p(*pairs[k], deltas[k]) for k in per_width])
    assert [v.numbers[k]["p_holm"] for k in per_width] == pytest.approx(expected, rel=1e-9)
    assert g["p_holm"] == pytest.approx(best_p(*pairs["growth"], 0.02), rel=1e-9)
    assert [c["smallest"] for c in v.numbers.values()] == [deltas[k] for k in v.numbers]


@pytest.mark.filterwarnings("ignore:Precision loss occurred")
def test_c11_one_more_unstable_lr_on_every_seed_reads_one_way():
    """Dot unstable at exactly one more LR than scaled_dot on every seed: d = 1/6 > δ on every
    seed whatever the seeds' own counts k (float rounding of k/6 − (k−1)/6 must not matter),
    and one more unstable LR of six is a real effect once the exact sign test can see it
    through Holm's correction (8 seeds; with 5, p = 2⁻⁵ cannot pass)."""
    got = set()
    for ks in ((1,) * 8, (1, 1, 3, 3, 3, 3, 3, 3), (1, 1, 4, 4, 4, 4, 4, 4)):
        ev = c11(Draw(0, n=8), (0.0, 0.0))
        ev["sweep"][WIDTHS[0]]["dot"]["unstable"] = {str(s): k / 6 for s, k in enumerate(ks)}
        ev["sweep"][WIDTHS[0]]["scaled_dot"]["unstable"] = {str(s): (k - 1) / 6
                                                            for s, k in enumerate(ks)}
        got.add(R.judge_c11(ev).numbers[f"{WIDTHS[0]} unstable"]["reading"])
    assert got == {"greater"}, got
    ev = c11(Draw(0, n=5), (0.0, 0.0))
    ev["sweep"][WIDTHS[0]]["dot"]["unstable"] = {str(s): 2 / 6 for s in range(5)}
    ev["sweep"][WIDTHS[0]]["scaled_dot"]["unstable"] = {str(s): 1 / 6 for s in range(5)}
    assert R.judge_c11(ev).numbers[f"{WIDTHS[0]} unstable"]["reading"] == "inconclusive"


# ------------------------------------------------------------------------------ C12


SEEDS5 = [str(i) for i in range(5)]


def c12(unit=1.0, gpt2=0.01, trained=(3.0, 5.0), n=32, outlier=None):
    """Init logit std per regime, d_k and seed; scaled_dot's final max |logit| per width, LR and
    seed (``outlier``: one seed's value at width 0, LR 0.3)."""
    def seeds(v):
        return {s: v * (1 + 0.01 * i) for i, s in enumerate(SEEDS5)}
    final = {w: {"0.001": seeds(2.0), "0.3": seeds(t)} for w, t in zip(WIDTHS, trained,
                                                                       strict=True)}
    if outlier is not None:
        final[WIDTHS[0]]["0.3"]["0"] = outlier
    return {"init_std": {"gpt2": {d: seeds(gpt2) for d in ("16", "64")},
                         "unit": {"16": seeds(unit), "64": seeds(unit * 1.05)}},
            "final_logit": final, "n": n}


LIMIT = 4 * math.sqrt(2 * math.log(32))  # 4·s_c(n), s_c = √(2 ln n): 10.5 at n = 32


def test_c12_flips_with_the_init_and_trained_logits():
    ok = R.judge_c12(c12())
    assert ok.verdict == "supported" and ok.numbers["limit"] == pytest.approx(LIMIT)
    bad = R.judge_c12(c12(unit=8.0))
    assert bad.verdict == "refuted" and bad.headline == "refuted: not O(1) at init"
    assert R.judge_c12(c12(unit=0.1)).verdict == "refuted"
    past = R.judge_c12(c12(trained=(3.0, 50.0)))
    assert past.verdict == "depends" and past.numbers["past"] == [0.3]
    assert "0.3" in past.headline and ok.headline == "supported: O(1) at init and after training"
    assert ok.plain != bad.plain != past.plain
    assert "1–1.09" in ok.plain[0] and "O(1)" in ok.plain[0] and "not O(1)" in bad.plain[0]
    assert "largest final logit is 52" in past.plain[-1]


def test_c12_one_seed_past_the_limit_counts_and_a_blow_up_is_past():
    """Every seed is checked: one seed past 4·s_c, or one diverged (inf), is not averaged away."""
    assert R.judge_c12(c12(outlier=40.0)).numbers["past"] == [0.3]
    blown = R.judge_c12(c12(outlier=math.inf))
    assert blown.verdict == "depends" and blown.numbers["past"] == [0.3]


def test_c12_a_logit_past_the_limit_at_any_width_counts():
    """Every LR at every width: width 32 passing 4·s_c at LR 0.3 is not hidden by width 128
    staying below it at the same LR."""
    v = R.judge_c12(c12(trained=(50.0, 3.0)))
    assert v.verdict == "depends" and v.numbers["past"] == [0.3]


def test_c12_without_data_is_inconclusive():
    ev = c12()
    ev["init_std"]["unit"] = {"16": {}, "64": {}}
    assert R.judge_c12(ev).verdict == "inconclusive"
    ev = c12()
    ev["final_logit"] = {w: {} for w in WIDTHS}
    assert R.judge_c12(ev).verdict == "inconclusive"
    assert R.judge_c12({**c12(), "init_std": {}}).verdict == "inconclusive"


@pytest.mark.parametrize("n", [8, 32, 512])
def test_c12_limit_is_four_saturation_scales(n):
    """s_c = √(2 ln n): the logit std at which the largest of n unit-variance logits stands out
    (the Gaussian maximum's scale); just under and just over 4·s_c decide the verdict."""
    limit = 4 * math.sqrt(2 * math.log(n))
    assert R.judge_c12(c12(trained=(3.0, limit * 0.95), n=n)).verdict == "supported"
    assert R.judge_c12(c12(trained=(3.0, limit * 1.01), n=n)).verdict == "depends"


# ------------------------------------------------------------------------------ Q1


def q1(draw, gaps, noise=0.002):
    """gaps: width -> modern score -> (loss gap, sensitivity gap) against scaled_dot."""
    loss, sweep = {}, {}
    for w, by in gaps.items():
        loss[w] = {"scaled_dot": draw.arm(2.0, noise)}
        sweep[w] = {"scaled_dot": {"sensitivity": draw.values(0.3, noise)}}
        for m, (dl, ds) in by.items():
            loss[w][m] = draw.arm(2.0 + dl, noise)
            sweep[w][m] = {"sensitivity": draw.values(0.3 + ds, noise)}
    return {"loss": loss, "sweep": sweep}


MATCHES = {"qk_layernorm": (0.0, -0.1), "softcap": (0.2, 0.0)}  # qk_layernorm matches
NONE = {"qk_layernorm": (0.2, -0.1), "softcap": (0.0, 0.1)}  # each fails one half


def test_q1_flips_between_a_match_and_none():
    yes = R.judge_q1(q1(Draw(3), dict.fromkeys(WIDTHS, MATCHES)))
    assert yes.verdict == "supported"
    assert yes.headline == "supported: d_model=32: qk_layernorm; d_model=128: qk_layernorm"
    no = R.judge_q1(q1(Draw(3), dict.fromkeys(WIDTHS, NONE)))
    assert no.verdict == "refuted" and no.headline == "refuted: d_model=32: —; d_model=128: —"
    some = R.judge_q1(q1(Draw(3), {WIDTHS[0]: MATCHES, WIDTHS[1]: NONE}))
    assert some.verdict == "depends"
    assert some.plain[0].startswith("d_model=32: qk_layernorm matches")
    assert some.plain[1].startswith("d_model=128: no modern score matches")
    assert yes.plain != no.plain


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_q1_no_effect_is_inconclusive(rng_seed):
    null = {"qk_layernorm": (0.0, 0.0), "softcap": (0.0, 0.0)}
    ev = q1(Draw(rng_seed), dict.fromkeys(WIDTHS, null), noise=LOSS_DELTA)
    assert R.judge_q1(ev).verdict == "inconclusive"


def test_q1_censored_or_few_seeds_is_inconclusive():
    ev = q1(Draw(4), dict.fromkeys(WIDTHS, MATCHES))
    for w in WIDTHS:
        ev["loss"][w]["scaled_dot"]["censored"] = True
    v = R.judge_q1(ev)
    assert v.verdict == "inconclusive" and "undecided" in v.plain[0]
    assert R.judge_q1(q1(Draw(4, n=2), dict.fromkeys(WIDTHS, MATCHES))).verdict == \
        "inconclusive"


def test_q1_statistics_are_scipys():
    ev = q1(Draw(5), {WIDTHS[0]: {"qk_layernorm": (0.005, -0.06)}}, noise=0.015)
    v = R.judge_q1(ev)
    w = WIDTHS[0]
    loss = [list(ev["loss"][w][a]["values"].values()) for a in ("qk_layernorm", "scaled_dot")]
    sens = [list(ev["sweep"][w][a]["sensitivity"].values())
            for a in ("qk_layernorm", "scaled_dot")]
    # one score at this width: its sensitivity family has one member, its loss is alone
    expected = [best_p(*loss, LOSS_DELTA), best_p(*sens, LOSS_DELTA)]
    got = v.numbers[f"{w} qk_layernorm loss"], v.numbers[f"{w} qk_layernorm sensitivity"]
    assert [c["p_holm"] for c in got] == pytest.approx(list(expected), rel=1e-9)
    ci = stats.ttest_rel(*sens).confidence_interval(0.95)
    assert (got[1]["lo"], got[1]["hi"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert got[1]["reading"] == "less"
