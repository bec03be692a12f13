"""A verdict must survive the LR choice (:mod:`attnscale.audit.lr_choice`): evidence without a
runner-up is judged as before; a verdict the runner-up LR changes reads inconclusive and names
the arm and LR (Q3: the log-n factor on scaled_dot's runs at 0.01 against those at 0.03); one
that holds at every reading is kept; tables of the same runs switch together (Q3's plain and
log-n tables of scaled_dot); beyond MAX_PRODUCT arms each is switched alone and all together; a
rule that raises on a reading raises."""

from __future__ import annotations

import pytest
from support import assert_reads_as

from attnscale.audit import lr_choice as L
from attnscale.audit import render
from attnscale.audit import verdicts as V
from attnscale.audit.claim import Claim, Sources
from attnscale.audit.claims import q3_length as Q3
from attnscale.audit.evidence import Arm
from attnscale.audit.studies import PRESETS

SEEDS = range(10)


def arm(values, alt=None, lr=0.01, alt_lr=0.03, source=()):
    """An evidence arm: seed i at values[i] (LR ``lr``), and at ``alt_lr`` when ``alt``."""
    out = {"values": {str(s): v for s, v in zip(SEEDS, values, strict=False)},
           "lrs": {str(s): lr for s in SEEDS[:len(values)]}, "source": list(source)}
    if alt is not None:
        out.update(alt={str(s): v for s, v in zip(SEEDS, alt, strict=False)},
                   alt_lrs={str(s): alt_lr for s in SEEDS[:len(alt)]})
    return out


def length(scaled, sharp, scaled_alt=None, sharp_alt=None, log=0.3, log_alt=None):
    """Q3's evidence: scaled_dot's eval loss per seed at n=128 plainly (``scaled``) and with the
    log-n factor (``sharp``), the same runs, at its runner-up LR ``*_alt`` (n=32 solved, n=64
    equal); log_length (context) at ``log``; accuracy 0.9."""
    jitter = [0.01 * ((7 * s) % 5 - 2) for s in SEEDS]
    alts = {"scaled_dot": scaled_alt, "log_length": log_alt}
    def at(x, name, far=False, alt=None):
        """At the shorter lengths an arm's runner-up reads as its choice does."""
        alt = (alt if alt is not None else alts[name]) if far or alts[name] is None else x
        return arm([x + j for j in jitter], None if alt is None else [alt + j for j in jitter],
                   source=("length", "all", name))
    los = {"n=32": {"all": {"scaled_dot": at(0.01, "scaled_dot"),
                            "log_length": at(0.01, "log_length")}},
           "n=64": {"all": {"scaled_dot": at(0.10, "scaled_dot"),
                            "log_length": at(0.10, "log_length")}},
           "n=128": {"all": {"scaled_dot": at(scaled, "scaled_dot", True),
                             "log_length": at(log, "log_length", True)}}}
    shifts = [0.002 * ((3 * s) % 4) for s in SEEDS]  # the factor's effect varies by seed
    sharp_los = {"n=64": {"all": {"scaled_dot": at(0.10, "scaled_dot")}},
                 "n=128": {"all": {"scaled_dot": at(sharp, "scaled_dot", True, sharp_alt)}}}
    for k in sharp_los:
        a = sharp_los[k]["all"]["scaled_dot"]
        for key in ("values", "alt"):
            a[key] = {s: v + shifts[int(s)] for s, v in a.get(key, {}).items()}
    # accuracy and answer weight read the same runs (same source): they switch with the loss
    acc = {k: {"all": {a: arm([0.9] * 10, None if alts[a] is None else [0.9] * 10,
                              source=("length", "all", a)) for a in alts}} for k in los}
    sharp_acc = {k: {"all": {"scaled_dot": acc[k]["all"]["scaled_dot"]}} for k in sharp_los}
    return Q3.Evidence.model_validate(
        {"loss": los, "accuracy": acc, "answer_weight": acc, "lengths": list(los),
         "chance": 0.1, "log_n_loss": sharp_los, "log_n_accuracy": sharp_acc,
         "log_n_answer_weight": sharp_acc, "factors": {"n=64": 1.2, "n=128": 1.4}})


def decide(ev):
    return L.decide(Q3.CLAIM.judge, Q3.CLAIM.read, ev)


def test_without_a_runner_up_the_verdict_is_the_rules():
    ev = length(0.30, 0.43)
    assert L.switchable(ev) == {}
    v = decide(ev)
    assert (v.verdict, v.headline, v.plain) == (Q3.CLAIM.judge(ev).verdict,
                                                Q3.CLAIM.judge(ev).headline,
                                                Q3.CLAIM.judge(ev).plain)


def test_a_runner_up_that_flips_the_verdict_makes_it_inconclusive():
    """At 0.01 the log-n factor is worse at 4n (refuted); scaled_dot's runs at its runner-up
    0.03 generalize worse plainly (0.65) than with the factor (0.43): supported there."""
    ev = length(0.30, 0.43, scaled_alt=0.65, sharp_alt=0.43)
    assert Q3.CLAIM.judge(ev).verdict == V.REFUTED
    v = decide(ev)
    assert v.verdict == V.INCONCLUSIVE
    assert "scaled_dot (all) at 0.03" in v.headline and "refuted at the chosen LRs" in v.headline
    assert "supported" in v.because and L.RULE.strip() in v.rule
    assert v.numbers.keys() == Q3.CLAIM.judge(ev).numbers.keys()  # the figure still draws
    assert_reads_as(v, V.INCONCLUSIVE, "Q3")
    assert v.by_lr_choice and not Q3.CLAIM.judge(ev).by_lr_choice  # no seeds-to-decide line


def test_a_verdict_that_holds_at_every_reading_is_kept():
    ev = length(0.30, 0.43, scaled_alt=0.32, sharp_alt=0.45, log_alt=0.45)
    v = decide(ev)
    assert v.verdict == V.REFUTED == Q3.CLAIM.judge(ev).verdict
    assert "3 readings, 2 arms" in v.because  # each alone and both together
    assert "runner-up LR" in v.plain[-1]


def test_tables_of_the_same_runs_switch_together():
    """loss, accuracy and answer weight at every length, plainly and with the log-n factor,
    read the same runs (one source): one group per arm, fifteen tables of scaled_dot, switched
    together, whatever seeds each table has."""
    ev = length(0.30, 0.43, scaled_alt=0.65, sharp_alt=0.43)
    groups = L.switchable(ev)
    assert list(groups) == [("length", "all", "scaled_dot")]
    (paths,) = groups.values()
    assert len(paths) == 15 and ("loss", "n=128", "all", "scaled_dot") in paths
    assert ("log_n_loss", "n=128", "all", "scaled_dot") in paths
    switched = L.switched(ev, paths)
    assert switched["loss"]["n=128"]["all"]["scaled_dot"]["values"]["0"] == pytest.approx(
        0.65 + 0.01 * (0 - 2))
    assert switched["loss"]["n=128"]["all"]["log_length"] == ev.model_dump()["loss"]["n=128"][
        "all"]["log_length"]
    # a table of the same runs with one seed fewer is still the same arm
    dumped = ev.model_dump()
    for key in ("values", "lrs", "alt", "alt_lrs"):
        dumped["accuracy"]["n=64"]["all"]["scaled_dot"][key].pop("9")
    assert len(L.switchable(Q3.Evidence.model_validate(dumped))) == 1


def test_an_undecided_verdict_keeps_its_own_explanation():
    """Inconclusive at the chosen LRs (no effect, wide): a reading elsewhere cannot decide it,
    and the page keeps the rule's own sentences."""
    dumped = length(0.30, 0.30, scaled_alt=0.9, sharp_alt=0.3).model_dump()
    sharp = dumped["log_n_loss"]["n=128"]["all"]["scaled_dot"]["values"]
    dumped["log_n_loss"]["n=128"]["all"]["scaled_dot"]["values"] = {
        k: v + 0.3 * (-1) ** int(k) for k, v in sharp.items()}  # no effect, wide
    ev = Q3.Evidence.model_validate(dumped)
    base = Q3.CLAIM.judge(ev)
    assert base.verdict == V.INCONCLUSIVE
    v = decide(ev)
    assert (v.verdict, v.headline, v.plain) == (base.verdict, base.headline, base.plain)


def test_many_arms_are_switched_one_at_a_time_and_all_together():
    few = [("c", f"a{i}", (), ()) for i in range(L.MAX_PRODUCT)]
    assert len(L.readings(few)) == 2 ** L.MAX_PRODUCT - 1
    many = [("c", f"a{i}", (), ()) for i in range(L.MAX_PRODUCT + 1)]
    combos = L.readings(many)
    assert len(combos) == len(many) + 1 and combos[-1] == tuple(many)


def test_at_runner_up_swaps_values_and_lrs():
    a = Arm.model_validate(arm([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]))
    b = a.at_runner_up()
    assert b.values == a.alt and b.lrs == a.alt_lrs and not b.alt
    plain = Arm.model_validate(arm([1.0, 2.0, 3.0]))
    assert plain.at_runner_up() is plain


def test_a_rule_that_raises_on_a_reading_raises():
    ev = length(0.30, 0.43, scaled_alt=0.65, sharp_alt=0.43)
    calls = []
    def judge(e):
        calls.append(e)
        if len(calls) > 1:
            raise ZeroDivisionError("a bug in the rule")
        return Q3.CLAIM.judge(e)
    with pytest.raises(ZeroDivisionError):
        L.decide(judge, Q3.CLAIM.read, ev)


def test_the_page_gives_no_seeds_to_decide_figure_for_an_lr_tie():
    """An undecided LR choice is not settled by seeds at one LR: render.judge leaves out the
    planning figure it adds to other inconclusive verdicts, and reports the LR reading."""
    ev = length(0.30, 0.43, scaled_alt=0.65, sharp_alt=0.43).model_dump()
    toy = Claim("Q9", "a toy question", "what it measures", Q3.RULE, Q3.Evidence, lambda src: ev,
                Q3.CLAIM.judge)
    entry = render.judge(toy, Sources(PRESETS["tiny"], {}, {}, {}))[0]
    assert entry["verdict"] == V.INCONCLUSIVE
    assert entry["headline"].startswith("inconclusive: refuted at the chosen LRs")
    assert not any("paired seeds" in p for p in entry["plain"])
