"""C4 (the temperature of cosine attention on retrieval) on synthetic per-seed values: the rule
flips between bounded and not, never reads a gap out of no effect, reads inconclusive when the
baseline did not learn the task, a comparison is censored or seeds are few; its numbers are
scipy's paired t-test; no sentence reads as another verdict; its evidence model rejects a dict
with a field missing; its figures are print-quality PNGs whose alt text states the finding."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from support import (
    NULL_DRAWS,
    around,
    assert_reads_as,
    assert_scipy,
    assert_unlearned_draws_arms_only,
    layouts,
    png_info,
)
from support import TaskDraw as Draw

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Sources
from attnscale.audit.claims import c04_bounded_range as M
from attnscale.audit.evidence import tau_evidence
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.task_readings import COSINES
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence
from attnscale.measure import theory


def bound(tau, n=32):
    """Largest softmax weight with logits in [−τ, τ] over n keys: e^{2τ}/(e^{2τ}+n−1)."""
    return math.exp(2 * tau) / (math.exp(2 * tau) + n - 1)


def c4(draw, losses, noise=0.005, chance=0.1, base_acc=0.8, base=1.0):
    """Retrieval evidence (n = 32 keys): scaled_dot's clipped loss at ``base``, cosine arm a at
    losses[a]; accuracies from a second draw (they decide only whether the task was learned)."""
    loss = {"scaled_dot": draw.arm(base, noise),
            **{a: draw.arm(x, noise) for a, x in losses.items()}}
    acc = {a: draw.arm(base_acc, 0.0) for a in loss}
    taus = {"cosine_tau1": 1, "cosine_tau2": 2, "cosine_tau4": 4, "cosine_tau10": 10}
    return {"accuracy": {"all": acc}, "loss": {"all": loss}, "chance": chance, "n": 32,
            "bound": {a: bound(t) for a, t in taus.items()}}


ALL_HIGH = dict.fromkeys(COSINES, 1.5)  # every cosine variant's loss 0.5 nats above


def decide(ev):
    return M.CLAIM.decide(ev)


# ------------------------------------------------------------------------------ the rule


def test_flips_between_bounded_and_not():
    yes = decide(c4(Draw(0), ALL_HIGH))
    assert yes.verdict == "supported" and yes.headline == "supported: τ=1 greater; matched by none"
    no = decide(c4(Draw(0), {**ALL_HIGH, "cosine_tau1": 1.0}))
    assert no.verdict == "refuted"
    assert decide(c4(Draw(0), dict.fromkeys(COSINES, 0.7))).verdict == "refuted"
    matched = decide(c4(Draw(0), {**ALL_HIGH, "cosine_tau10": 1.0, "cosine_learned": 0.8}))
    assert matched.verdict == "depends"
    assert matched.headline == "depends: τ=1 greater; matched by cosine_tau10, cosine_learned"
    gap = yes.numbers["cosine_tau1"].mean
    assert f"loss is {gap:+.3f} nats from scaled_dot's (greater)" in yes.plain[0]
    assert f"{bound(1):.3f} over 32 keys" in yes.plain[0] and yes.plain != matched.plain


def test_no_effect_is_mostly_undecided_and_never_a_gap():
    """No effect measured coarsely (noise 5δ): never supported or depends, undecided in most
    draws; the rest read refuted, which is right (τ=1 truly is no worse). Finely measured
    (noise 0.002): refuted every time."""
    flat = dict.fromkeys(COSINES, 1.0)
    coarse = [decide(c4(Draw(r), flat, noise=5 * LOSS_DELTA)).verdict for r in NULL_DRAWS]
    assert set(coarse) <= {"inconclusive", "refuted"}
    assert coarse.count("inconclusive") >= 0.75 * len(coarse), coarse
    for r in NULL_DRAWS:
        assert decide(c4(Draw(r), flat, noise=LOSS_DELTA)).verdict in (
            "inconclusive", "refuted")
        assert decide(c4(Draw(r), flat, noise=0.002)).verdict == "refuted"


@pytest.mark.parametrize(("base_acc", "learned"), [(0.19, False), (0.21, True)])
def test_needs_the_baseline_to_learn(base_acc, learned):
    ev = c4(Draw(1, spread=0.0), ALL_HIGH, noise=0.001, base_acc=base_acc)
    v = decide(ev)
    assert (v.verdict == "supported") is learned
    if not learned:
        assert v.verdict == "inconclusive" and "did not learn" in v.because
        assert "(chance 0.1)" in v.because


def test_censored_or_few_seeds_is_inconclusive():
    ev = c4(Draw(2), ALL_HIGH)
    ev["loss"]["all"]["cosine_tau1"]["censored"] = True
    assert decide(ev).verdict == "inconclusive"
    assert decide(c4(Draw(2, n=2), ALL_HIGH)).verdict == "inconclusive"


def test_statistics_are_scipys():
    ev = c4(Draw(3), {"cosine_tau1": 1.3}, noise=0.02)
    c = decide(ev).numbers["cosine_tau1"]
    assert c.reading == "greater"
    assert_scipy(c, ev["loss"]["all"]["cosine_tau1"], ev["loss"]["all"]["scaled_dot"],
                 delta=LOSS_DELTA)


def test_typed_and_dict_evidence_give_the_same_verdict():
    ev = c4(Draw(0), ALL_HIGH)
    a, b = decide(ev), M.judge(M.Evidence.model_validate(ev))
    assert (a.verdict, a.because, a.headline, a.plain) == (b.verdict, b.because, b.headline,
                                                          b.plain)
    assert {k: c.model_dump() for k, c in a.numbers.items()} == {
        k: c.model_dump() for k, c in b.numbers.items()}


@pytest.mark.parametrize("field", ["loss", "bound", "n", "chance"])
def test_evidence_with_a_missing_field_is_missing_evidence(field):
    ev = c4(Draw(0), ALL_HIGH)
    del ev[field]
    with pytest.raises(MissingEvidence, match=f"C4: .*{field}"):
        decide(ev)


# ------------------------------------------------------------------------------ sentences

CASES = {
    V.SUPPORTED: lambda: decide(c4(Draw(0), ALL_HIGH)),
    V.REFUTED: lambda: decide(c4(Draw(0), {**ALL_HIGH, "cosine_tau1": 1.0})),
    V.DEPENDS: lambda: decide(c4(Draw(0), {**ALL_HIGH, "cosine_tau10": 1.0,
                                           "cosine_learned": 0.8})),
    V.INCONCLUSIVE: lambda: decide(c4(Draw(0, n=2), ALL_HIGH)),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(CASES[verdict](), verdict, "C4")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


# ------------------------------------------------------------------------------ evidence


def test_gather_reads_the_tau_study_once():
    p = PRESETS["tiny"]
    plan = studies(p)
    src = Sources(p, plan, {k: [] for k in plan}, {})
    got = M.gather(src)
    assert got == tau_evidence(plan["tau"], [])
    assert M.gather(src) is got  # the study is read once, and shared (C6 reads it too)
    ev = M.CLAIM.read(got)
    assert ev.n == 32 and ev.bound["cosine_tau1"] == pytest.approx(bound(1))
    assert M.CLAIM.studies == ("tau",) and M.CLAIM.id == "C4"


# ------------------------------------------------------------------------------ figures


def tau():
    arms = {"scaled_dot": 1.0, "dot": 1.0, "cosine_tau1": 0.9, "cosine_tau4": 1.0,
            "cosine_tau10": 1.0, "cosine_learned": 1.0}
    return {"accuracy": {"all": {a: around(v, 0.01, 10, j) for j, (a, v) in
                                 enumerate(arms.items())}},
            "loss": {"all": {a: around(0.1 + (0.3 if a == "cosine_tau1" else 0), 0.01, 10, j)
                             for j, a in enumerate(arms)}},
            "bound": {a: float(theory.max_weight_bound(32, t)) for a, t in
                      (("cosine_tau1", 1), ("cosine_tau4", 4), ("cosine_tau10", 10))},
            "n": 32, "chance": 0.25}


def test_figures_are_print_quality_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = tau()
    numbers = {k: c.model_dump() for k, c in decide(ev).numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c4_tau.png", "c4_effects.png"]
    for f in figs:
        width, height, dpi = png_info(f["path"])
        assert dpi >= 150 and width >= 600 and height >= 400, (f["path"], width, height, dpi)
        assert len(f["alt"]) >= 40 and f["alt"].rstrip().endswith(".") and re.search(r"\d",
                                                                                 f["alt"])
    assert (f"e^(2τ)/(e^(2τ)+n−1) = {bound(1):.2f} at τ = 1 over 32 keys, "
            f"{bound(4):.2f} at τ = 4.") in figs[0]["alt"]
    assert "Cosine minus scaled_dot retrieval loss" in figs[1]["alt"]
    assert {Path(p).name: bad for p, bad in saved if bad} == {}


def test_the_bound_sentence_says_less_without_a_bound():
    assert M.bound_alt({**tau(), "bound": {}}) == ""
    alone = M.bound_alt({**tau(), "bound": {"cosine_tau1": bound(1)}})
    assert alone.endswith(f"= {bound(1):.2f} at τ = 1 over 32 keys.") and "τ = 4" not in alone


def test_a_task_not_learned_draws_the_arms_and_no_forest(tmp_path):
    """scaled_dot at 0.3 on a chance-0.25 task: the rule compares nothing, so only the arms
    figure is drawn."""
    assert_unlearned_draws_arms_only(M, tau(), 0.3, tmp_path)
