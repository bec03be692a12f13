"""Paired comparisons over evidence arms: the numbers are scipy's paired t-test, Holm runs over
the comparisons that can be read, and a comparison that cannot be read (a missing arm, fewer
than three paired seeds, a censored LR choice) says inconclusive and why."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnscale.audit import compare as C

DELTA = 0.02


def arm(values, censored=False):
    """An evidence arm (:meth:`ArmValues.to_dict` shape) from a list or a seed -> value dict."""
    if not isinstance(values, dict):
        values = dict(enumerate(values))
    return {"values": {str(s): float(v) for s, v in values.items()},
            "lrs": {str(s): 0.01 for s in values}, "censored": censored, "curve": {}}


def pair(rng_seed, effect, noise=0.005, n=5, spread=0.3):
    """Two arms sharing a per-seed level (std ``spread``): b, and a = b + ``effect`` + noise."""
    rng = np.random.default_rng(rng_seed)
    level = 2.0 + rng.normal(0.0, spread, n)
    b = level + noise * rng.standard_normal(n)
    a = level + effect + noise * rng.standard_normal(n)
    return a, b


def one_sided(a, b, reading, delta=DELTA):
    """scipy's p-value of one reading of a − b against ±delta (paired t-test)."""
    a, b = np.asarray(a), np.asarray(b)
    if reading == "greater":  # H0: mean(a − b) ≤ δ
        return stats.ttest_rel(a, b + delta, alternative="greater").pvalue
    if reading == "less":  # H0: mean(a − b) ≥ −δ
        return stats.ttest_rel(a, b - delta, alternative="less").pvalue
    return max(stats.ttest_rel(a, b - delta, alternative="greater").pvalue,
               stats.ttest_rel(a, b + delta, alternative="less").pvalue)


def head_dim(rng_seed, gap, noise, dks=(16, 64, 128, 256)):
    """Head-dimension study evidence (C13's) with dot − scaled_dot = gap(d_k) in both inits."""
    table = {}
    for init in ("gpt2", "unit"):
        for d in dks:
            a, b = pair(rng_seed + d, gap(d), noise=noise)
            table[f"init={init} d_model={d}"] = {"dot": arm(a), "scaled_dot": arm(b)}
    return {"loss": table, "entropy_init": table, "entropy_end": table,
            "saturated_end": table, "inits": ["gpt2", "unit"],
            "head_dims": list(dks), "seeds": list(range(5))}


@pytest.mark.parametrize(("effect", "reading"), [(0.1, "greater"), (-0.1, "less"),
                                                 (0.0, "equal")])
@pytest.mark.parametrize("rng_seed", [0, 1, 2])
def test_one_comparison_is_scipys_paired_t_test(effect, reading, rng_seed):
    a, b = pair(rng_seed, effect)
    c = C.family({"x": (arm(a), arm(b))}, DELTA)["x"]
    ttest = stats.ttest_rel(a, b)
    ci = ttest.confidence_interval(0.95)
    assert c.reading == reading
    assert c.n == 5 and c.smallest == DELTA
    assert c.mean == pytest.approx(float(np.mean(a - b)), abs=1e-12)
    assert (c.lo, c.hi) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert c.p == pytest.approx(ttest.pvalue, rel=1e-9)
    # a family of one: Holm changes nothing, p_holm is the reading's one-sided p
    assert c.p_holm == pytest.approx(one_sided(a, b, reading), rel=1e-9)
    assert c.p_holm <= 0.025


def holm(ps):
    """Holm 1979, written out: sort, multiply the k-th smallest by (m − k + 1), running max."""
    order = sorted(range(len(ps)), key=ps.__getitem__)
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def test_holm_runs_over_the_family():
    draws = {"big": pair(3, 0.2), "edge": pair(4, 0.045, noise=0.01), "none": pair(5, 0.0)}
    fam = C.family({k: (arm(a), arm(b)) for k, (a, b) in draws.items()}, DELTA)
    best = {k: min(("greater", "less", "equal"), key=lambda r, a=a, b=b: one_sided(a, b, r))
            for k, (a, b) in draws.items()}
    ps = [one_sided(*draws[k], best[k]) for k in draws]
    for k, expected in zip(draws, holm(ps), strict=True):
        assert fam[k].p_holm == pytest.approx(expected, rel=1e-9)
        assert fam[k].reading == (best[k] if expected <= 0.025 else "inconclusive")
    assert fam["big"].reading == "greater"


def test_holm_can_undo_a_reading_that_stands_alone():
    a, b = pair(6, 0.045, noise=0.01)  # one-sided p ≈ 0.018: under 0.025, over 0.025 / 3
    alone = C.family({"x": (arm(a), arm(b))}, DELTA)["x"]
    assert alone.reading == "greater"
    fam = C.family({k: (arm(a), arm(b)) for k in ("x", "y", "z")}, DELTA)
    assert fam["x"].p_holm == pytest.approx(3 * alone.p_holm, rel=1e-9)
    assert C.readings(fam) == ["inconclusive"] * 3


def test_holm_runs_only_over_the_named_families():
    """holm_over=[["x", "y"]]: x and y share a family of two, z is read alone; [] reads every
    comparison alone (an intersection-union rule), None one family of all."""
    a, b = pair(6, 0.045, noise=0.01)
    pairs = {k: (arm(a), arm(b)) for k in ("x", "y", "z")}
    alone = C.family({"x": pairs["x"]}, DELTA)["x"].p_holm
    fam = C.family(pairs, DELTA, holm_over=[["x", "y"]])
    assert fam["x"].p_holm == pytest.approx(2 * alone, rel=1e-9)
    assert fam["z"].p_holm == pytest.approx(alone, rel=1e-9)
    assert list(fam) == ["x", "y", "z"]
    assert C.readings(C.family(pairs, DELTA, holm_over=[])) == ["greater"] * 3
    assert C.readings(C.family(pairs, DELTA)) == ["inconclusive"] * 3
    with pytest.raises(ValueError, match="holm_over"):
        C.family(pairs, DELTA, holm_over=[["x", "w"]])


def test_no_worse_is_non_inferiority_not_equality():
    """An arm better by an uncertain amount is 'no worse' though its reading is not equal;
    a worse one is not; no_better mirrors it."""
    a, b = pair(7, -0.05, noise=0.03)
    c = C.family({"x": (arm(a), arm(b))}, DELTA)["x"]
    hi = stats.ttest_rel(a, b).confidence_interval(0.95).high
    assert c.not_greater == (hi < DELTA) and C.no_worse(c)
    assert c.reading != "equal"
    a, b = pair(8, 0.1)
    worse = C.family({"x": (arm(a), arm(b))}, DELTA)["x"]
    assert not C.no_worse(worse) and C.no_better(worse)


def test_pairing_removes_the_shared_per_seed_level():
    a, b = pair(6, 0.1, noise=0.01, spread=0.5)
    c = C.family({"x": (arm(a), arm(b))}, DELTA)["x"]
    assert c.reading == "greater" and c.lo > DELTA
    unpaired = stats.ttest_ind(a, b).confidence_interval(0.95)
    assert unpaired.low < 0 < unpaired.high  # an unpaired reading could not tell


def test_only_the_seeds_both_arms_have_are_paired():
    a = {s: 1.0 + 0.1 * s + 0.3 for s in range(0, 6)}
    b = {s: 1.0 + 0.1 * s + 0.01 * (s % 2) for s in range(2, 8)}
    c = C.family({"x": (arm(a), arm(b))}, DELTA)["x"]
    shared = [2, 3, 4, 5]
    ci = stats.ttest_rel([a[s] for s in shared], [b[s] for s in shared]).confidence_interval()
    assert c.n == 4 and C.paired_seeds(arm(a), arm(b)) == 4
    assert (c.lo, c.hi) == pytest.approx((ci.low, ci.high), rel=1e-9)


@pytest.mark.parametrize("seeds_b", [(), (0,), (0, 1), (3, 4)])
def test_fewer_than_three_paired_seeds_is_inconclusive(seeds_b):
    a = arm([1.0, 1.1, 1.2, 1.3, 1.4])
    b = arm({s: 0.0 for s in seeds_b})  # a − b ≈ +1.2: huge, but too few seeds to say so
    c = C.family({"x": (a, b), "ok": (a, arm([0.0, 0.1, 0.2, 0.3, 0.41]))}, DELTA)
    assert c["x"].reading == "inconclusive" and "paired seeds" in c["x"].why
    assert math.isnan(c["x"].mean) and c["x"].smallest == DELTA
    assert c["ok"].reading == "greater"  # the family's other comparison is still read


def test_a_missing_arm_is_inconclusive():
    c = C.family({"x": (None, arm([1, 2, 3])), "y": (arm([1, 2, 3]), None)}, DELTA)
    assert [v.reading for v in c.values()] == ["inconclusive"] * 2
    assert all(v.why == "an arm has no runs" for v in c.values())


@pytest.mark.parametrize("side", [0, 1])
def test_a_censored_arm_makes_its_comparison_inconclusive(side):
    a, b = pair(7, 0.3)
    arms = [arm(a), arm(b)]
    assert C.family({"x": tuple(arms)}, DELTA)["x"].reading == "greater"
    arms[side] = {**arms[side], "censored": True}
    c = C.family({"x": tuple(arms), "y": (arm(a), arm(b))}, DELTA)
    assert c["x"].reading == "inconclusive" and "censored" in c["x"].why
    assert c["x"].mean == pytest.approx(float(np.mean(a - b)))  # the numbers stay shown
    assert c["y"].reading == "greater"


def test_per_comparison_smallest_effects_and_order():
    a, b = pair(8, 0.1)
    fam = C.family({"z": (arm(a), arm(b)), "a": (arm(a), arm(b))}, {"z": 0.02, "a": 0.5})
    assert list(fam) == ["z", "a"]
    assert fam["z"].reading == "greater" and fam["a"].reading == "equal"
    assert fam["a"].smallest == 0.5
    assert C.readings(fam) == ["greater", "equal"]


def test_mean_and_values_of_an_arm():
    assert C.mean(arm([1.0, 2.0, 6.0])) == pytest.approx(3.0)
    assert math.isnan(C.mean(None)) and math.isnan(C.mean(arm([])))
    assert C.values(None) == {} and C.values(arm([4.0])) == {"0": 4.0}


def test_an_inconclusive_verdict_says_how_many_seeds_would_decide():
    """The nearest undecided comparison, however nested in a verdict's numbers, names its
    planning figure; a decided family has none; the page's sentences carry it."""
    import dataclasses

    from attnscale.audit import render
    from attnscale.audit.claim import Sources, get_claim
    from attnscale.audit.studies import PRESETS
    from attnscale.audit.verdicts import seeds_sentence
    from attnscale.util.jsonio import jsonable

    near, far = pair(9, 0.06, noise=0.03), pair(11, 0.03, noise=0.3)
    fam = C.family({"near": (arm(near[0]), arm(near[1])), "far": (arm(far[0]), arm(far[1]))},
                   DELTA)
    assert C.readings(fam) == ["inconclusive"] * 2
    need = fam["near"].seeds_to_decide
    assert need and need < (fam["far"].seeds_to_decide or 10**6)
    text = seeds_sentence(jsonable({"width 128": fam}))
    assert f"about {need} paired seeds (here 5)" in text and "(width 128 near)" in text
    assert seeds_sentence(jsonable(C.family({"x": (arm(pair(3, 0.2)[0]), arm(pair(3, 0.2)[1]))},
                                            DELTA))) is None

    def judged(ev):
        ev = {k: v for k, v in ev.items() if k != "identity"}
        c13 = dataclasses.replace(get_claim("C13"), gather=lambda src: ev, studies=())
        return render.judge(c13, Sources(PRESETS["tiny"], {}, {}, {}))[0]
    entry = judged(head_dim(1, lambda d: 0.0, noise=5 * DELTA))
    assert entry["verdict"] == "inconclusive" and "paired seeds (here 5)" in entry["plain"][-1]
    decided = judged(head_dim(1, lambda d: 0.05 + 0.05 * np.log2(d / 16), noise=0.002))
    assert not any("paired seeds" in p for p in decided["plain"])


def test_a_censored_comparison_plans_no_seeds_and_a_family_names_each_once():
    a, b = pair(9, 0.06, noise=0.03)
    c = C.family({"x": (arm(a, censored=True), arm(b))}, DELTA)["x"]
    assert c.reading == "inconclusive" and c.seeds_to_decide is None
    assert not C.no_worse(c) and not C.no_better(c)
    with pytest.raises(ValueError, match="two families"):
        C.family({"x": (arm(a), arm(b)), "y": (arm(a), arm(b))}, DELTA,
                 holm_over=[["x", "y"], ["x"]])


def test_identical_arms_are_not_measurable_and_leave_the_family():
    """Arms equal seed by seed (QK-Clip that never acted): every difference is 0, so the
    comparison is not measurable: undecided, no seeds to plan, no Holm share, and says why."""
    from attnscale.audit.verdicts import aggregate, seeds_sentence
    from attnscale.util.jsonio import jsonable

    a, b = pair(6, 0.045, noise=0.01)
    same = arm(b)
    alone = C.family({"x": (arm(a), arm(b))}, DELTA)["x"]
    fam = C.family({"x": (arm(a), arm(b)), "idle": (same, same)}, DELTA)
    idle = fam["idle"]
    assert C.readings(fam) == [alone.reading, "not measurable"]
    assert fam["x"].p_holm == pytest.approx(alone.p_holm, rel=1e-12)
    assert not idle.decided() and not idle.measurable() and idle.seeds_to_decide is None
    assert not C.no_worse(idle) and not C.no_better(idle) and not idle.past_delta()
    assert math.isnan(idle.p_holm) and idle.lo == idle.hi == idle.mean == 0.0
    assert idle.effect("nats") == ("+0 nats: not measurable — every seed's difference is +0 "
                                   "(the arms are identical)")
    dumped = jsonable(fam)
    assert dumped["idle"]["reading"] == "not measurable" and dumped["idle"]["p_holm"] is None
    assert seeds_sentence(jsonable({"idle": idle})) is None
    assert aggregate([idle.reading], {"greater"}, {"less"}) == "inconclusive"
    assert aggregate([idle.reading, "greater"], {"greater"}, {"less"}) == "inconclusive"


def test_a_constant_shift_is_not_measurable_even_when_censored():
    b = [2.0, 2.3, 1.7, 2.1, 1.9]
    a = arm([v + 0.25 for v in b], censored=True)
    c = C.family({"x": (a, arm(b))}, DELTA)["x"]
    assert c.reading == "not measurable" and c.mean == pytest.approx(0.25)
    assert c.why == ("every seed's difference is +0.25; best LR at the edge of the grid "
                     "(censored)")
    assert c.effect() == f"+0.25: not measurable — {c.why}"


def test_the_audit_interval_types_are_the_labs():
    from attnscale.audit import interval as audit_interval
    from attnscale.lab import interval as lab_interval

    assert audit_interval.Comparison is lab_interval.Comparison
    assert audit_interval.Interval is lab_interval.Interval
    a, b = pair(3, 0.2)
    assert type(C.family({"x": (arm(a), arm(b))}, DELTA)["x"]) is lab_interval.Comparison


def test_a_context_comparison_never_advises_seeds():
    """An undecided comparison shown as context (its name holds "(context)") decides no
    verdict, so the seeds sentence plans only the deciding ones."""
    from attnscale.audit.verdicts import seeds_sentence

    undecided = {"mean": 0.01, "smallest": 0.02, "n": 6, "reading": "inconclusive",
                 "seeds_to_decide": 9}
    assert seeds_sentence({"GPT-2 init (context) d_model=128: dot": undecided}) is None
    line = seeds_sentence({"GPT-2 init (context) d_model=128: dot": {**undecided,
                                                                     "seeds_to_decide": 4},
                           "unit init d_model=128: dot": undecided})
    assert "about 9 paired seeds" in line and "(unit init d_model=128: dot)" in line
