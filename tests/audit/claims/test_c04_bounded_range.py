"""C4 (the temperature of cosine attention on retrieval, at two sequence lengths) on synthetic
per-seed values: the rule flips between bounded and not, reads both lengths (τ=1 failing only at
the larger n is "depends"), never reads a gap out of no effect, reads identical losses as not
measurable, reads inconclusive when the baseline did not learn the task at some n, a comparison
is censored or seeds are few; its numbers are scipy's paired t-test with Holm over τ=1 across
lengths; no sentence reads as another verdict; its evidence model rejects a dict with a field
missing; the reader splits the study by its seq_len cells; its figures are print-quality PNGs
whose alt text states the finding."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
from support import (
    NULL_DRAWS,
    around,
    assert_reads_as,
    assert_scipy,
    best_p,
    holm_by_hand,
    layouts,
    png_info,
    vals,
)
from support import TaskDraw as Draw

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Sources
from attnscale.audit.claims import c04_bounded_range as M
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.task_readings import COSINES
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence
from attnscale.lab.paired import NOT_MEASURABLE
from attnscale.lab.records import Run
from attnscale.measure import theory

TAUS = {"cosine_tau1": 1, "cosine_tau2": 2, "cosine_tau4": 4, "cosine_tau10": 10}


def bound(tau, n=32):
    """Largest softmax weight with logits in [−τ, τ] over n keys: e^{2τ}/(e^{2τ}+n−1)."""
    return math.exp(2 * tau) / (math.exp(2 * tau) + n - 1)


def at_n(draw, n, losses, noise, base_acc, base=1.0, chance=0.1):
    """One length: scaled_dot's clipped loss at ``base``, cosine arm a at losses[a];
    accuracies decide only whether the task was learned."""
    loss = {"scaled_dot": draw.arm(base, noise),
            **{a: draw.arm(x, noise) for a, x in losses.items()}}
    acc = {a: draw.arm(base_acc, 0.0) for a in loss}
    return {"accuracy": {"all": acc}, "loss": {"all": loss}, "chance": chance, "n": n,
            "bound": {a: bound(t, n) for a, t in TAUS.items()}}


def c4(draw, losses, long=None, noise=0.005, base_acc=0.8, long_acc=None):
    """Retrieval evidence at n = 32 (cosine losses ``losses``) and n = 64 (``long``, default
    the same), scaled_dot at 1.0 at both."""
    return {"by_n": {"n=32": at_n(draw, 32, losses, noise, base_acc),
                     "n=64": at_n(draw, 64, losses if long is None else long, noise,
                                  base_acc if long_acc is None else long_acc)}}


ALL_HIGH = dict.fromkeys(COSINES, 1.5)  # every cosine variant's loss 0.5 nats above
FLAT = dict.fromkeys(COSINES, 1.0)


def decide(ev):
    return M.CLAIM.decide(ev)


# ------------------------------------------------------------------------------ the rule


def test_flips_between_bounded_and_not():
    yes = decide(c4(Draw(0), ALL_HIGH))
    assert yes.verdict == "supported"
    assert yes.headline == ("supported: τ=1 n=32 greater, n=64 greater; matched by n=32 none; "
                            "n=64 none")
    no = decide(c4(Draw(0), {**ALL_HIGH, "cosine_tau1": 1.0}))
    assert no.verdict == "refuted"
    assert decide(c4(Draw(0), dict.fromkeys(COSINES, 0.7))).verdict == "refuted"
    matched = decide(c4(Draw(0), {**ALL_HIGH, "cosine_tau10": 1.0, "cosine_learned": 0.8},
                        noise=0.002))
    assert matched.verdict == "depends"
    assert matched.headline == ("depends: τ=1 n=32 greater, n=64 greater; matched by n=32 "
                                "tau10, learned; n=64 tau10, learned")
    gap = yes.numbers["cosine_tau1"].mean
    assert f"cosine τ=1's loss is {gap:+.3f} nats from scaled_dot's (greater)" in yes.plain[0]
    assert f"At 32 keys no weight can exceed {bound(1):.3f} at τ=1" in yes.plain[0]
    assert f"At 64 keys no weight can exceed {bound(1, 64):.3f} at τ=1" in yes.plain[1]
    assert yes.plain != matched.plain


def test_tau1_failing_only_at_the_larger_n_depends_on_n():
    """τ=1 no worse at 32 keys but worse at 64: the bound binds as n grows."""
    v = decide(c4(Draw(0), FLAT, long={**FLAT, "cosine_tau1": 1.5}))
    assert v.verdict == "depends"
    assert v.numbers["cosine_tau1"].no_worse() and v.numbers["n=64 cosine_tau1"].greater()
    half = ", ".join(f"{float(theory.tau_for_max_weight(n, 0.5)):.2f} at n = {n}"
                     for n in (32, 64))
    assert v.plain[2] == f"For one key to take half the weight τ must reach ½·ln(n−1): {half}."
    assert v.plain[1].endswith("no worse than scaled_dot: tau2, tau4, tau10, learned.")


def test_refuted_needs_tau1_no_worse_at_every_n():
    assert decide(c4(Draw(0), FLAT)).verdict == "refuted"
    assert decide(c4(Draw(0), FLAT, long={**FLAT, "cosine_tau1": 1.5})).verdict != "refuted"


def test_no_effect_is_mostly_undecided_and_never_a_gap():
    """No effect measured coarsely (noise 5δ): never supported or depends, undecided in most
    draws; the rest read refuted, which is right (τ=1 truly is no worse). Finely measured
    (noise 0.002): refuted every time."""
    coarse = [decide(c4(Draw(r), FLAT, noise=5 * LOSS_DELTA)).verdict for r in NULL_DRAWS]
    assert set(coarse) <= {"inconclusive", "refuted"}
    assert coarse.count("inconclusive") >= 0.75 * len(coarse), coarse
    for r in NULL_DRAWS:
        assert decide(c4(Draw(r), FLAT, noise=LOSS_DELTA)).verdict in (
            "inconclusive", "refuted")
        assert decide(c4(Draw(r), FLAT, noise=0.002)).verdict == "refuted"


def test_identical_losses_are_not_measurable_and_inconclusive():
    ev = c4(Draw(0), FLAT)
    for t in ev["by_n"].values():
        base = t["loss"]["all"]["scaled_dot"]
        t["loss"]["all"].update({a: copy.deepcopy(base) for a in COSINES})
    v = decide(ev)
    assert {c.reading for c in v.numbers.values()} == {NOT_MEASURABLE}
    assert v.verdict == "inconclusive"


@pytest.mark.parametrize(("acc", "learned"), [(0.19, False), (0.21, True)])
@pytest.mark.parametrize("where", ["n=32", "n=64"])
def test_needs_the_baseline_to_learn_at_every_n(acc, learned, where):
    kw = {"base_acc": acc} if where == "n=32" else {"long_acc": acc}
    v = decide(c4(Draw(1, spread=0.0), ALL_HIGH, noise=0.001, **kw))
    assert (v.verdict == "supported") is learned
    if not learned:
        assert v.verdict == "inconclusive" and "did not learn" in v.because
        assert f"scaled_dot at n = {where[2:]} reached" in v.because
        assert "(chance 0.1)" in v.because


def test_censored_or_few_seeds_is_inconclusive():
    ev = c4(Draw(2), ALL_HIGH)
    for t in ev["by_n"].values():
        t["loss"]["all"]["cosine_tau1"]["censored"] = True
    assert decide(ev).verdict == "inconclusive"
    assert decide(c4(Draw(2, n=2), ALL_HIGH)).verdict == "inconclusive"


def test_statistics_are_scipys_with_holm_over_tau1_across_lengths():
    ev = c4(Draw(3), {"cosine_tau1": 1.3}, long={"cosine_tau1": 1.4}, noise=0.02)
    v = decide(ev)
    pairs = [(t["loss"]["all"]["cosine_tau1"], t["loss"]["all"]["scaled_dot"])
             for t in ev["by_n"].values()]
    want = holm_by_hand([best_p(vals(a), vals(b)) for a, b in pairs])
    for k, (a, b), p in zip(("cosine_tau1", "n=64 cosine_tau1"), pairs, want, strict=True):
        assert v.numbers[k].reading == "greater"
        assert_scipy(v.numbers[k], a, b, delta=LOSS_DELTA, p_holm=p)


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
    del ev["by_n"]["n=64"][field]
    with pytest.raises(MissingEvidence, match=f"C4: .*{field}"):
        decide(ev)
    with pytest.raises(MissingEvidence, match=r"C4: .*by_n"):
        decide({})


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


def test_the_answers_read_the_training_length_and_name_the_larger_n():
    v = decide(c4(Draw(0), {**ALL_HIGH, "cosine_tau4": 1.0, "cosine_learned": 1.0},
                  long={**ALL_HIGH, "cosine_learned": 1.0}))
    entry = {"numbers": {k: c.model_dump() for k, c in v.numbers.items()}}
    (said,) = M.says_alternatives(entry)
    assert said.startswith("Cosine attention needs a temperature: at τ = 1 its retrieval loss "
                           "is +0.")
    assert said.endswith("tau4, learned did no worse than scaled dot; at 64 keys, learned (C4).")
    assert M.says_answer(entry) and M.says_when(entry)[0].startswith("A learned temperature")


# ------------------------------------------------------------------------------ evidence


def run(variant, seed, n, loss, acc, lr=0.01):
    cfg = {**studies(PRESETS["tiny"])["tau"].base, "seq_len": n, "lr": lr, "seed": seed}
    return Run.from_row({"id": f"{variant}-{seed}-{n}", "variant": variant, "status": "done",
                         "config": cfg, "final_loss": loss, "final_metric": acc,
                         "initial_loss": 3.0, "history": []})


def test_the_reader_splits_the_study_by_its_lengths():
    from dataclasses import replace
    study = replace(studies(PRESETS["tiny"])["tau"], cells={"seq_len": (32, 64)})
    assert "seq_len" not in study.base
    runs = [run(a, s, n, 0.1 * n / 32, 0.9) for a in study.arms for n in (32, 64)
            for s in (*study.seeds, *study.tune_seeds)]
    ev = M.tau_by_length(study, runs)["by_n"]
    assert list(ev) == ["n=32", "n=64"]
    for n, t in ((32, ev["n=32"]), (64, ev["n=64"])):
        assert t["n"] == n and t["chance"] == 0.25
        assert t["bound"]["cosine_tau1"] == pytest.approx(bound(1, n))
        arm = t["accuracy"]["all"]["scaled_dot"]
        assert arm["source"] == ["tau", f"seq_len={n}", "scaled_dot"]  # switch apart
        assert set(arm["values"]) == {str(s) for s in study.seeds}
    assert M.lengths_of(study) == [32, 64]


def test_gather_reads_each_tau_study_once():
    p = PRESETS["tiny"]
    plan = studies(p)
    src = Sources(p, plan, {k: [] for k in plan}, {})
    got = M.gather(src)
    assert got == {"by_n": {**M.tau_by_length(plan["tau"], [])["by_n"],
                            **M.tau_by_length(plan["tau_n64"], [])["by_n"]}}
    assert M.gather(src) == got and len(src.memo) == 2  # each study read once
    ev = M.CLAIM.read(got)
    assert [t.n for t in ev.by_n.values()] == [32, 64]
    assert ev.by_n["n=64"].bound["cosine_tau1"] == pytest.approx(bound(1, 64))
    assert set(ev.by_n["n=64"].bound) == {"cosine_tau1", "cosine_tau2"}  # its arms only
    assert M.CLAIM.studies == ("tau", "tau_n64") and M.CLAIM.id == "C4"


# ------------------------------------------------------------------------------ figures


def tau(n=32, tau1=0.9):
    arms = {"scaled_dot": 1.0, "dot": 1.0, "cosine_tau1": tau1, "cosine_tau4": 1.0,
            "cosine_tau10": 1.0, "cosine_learned": 1.0}
    return {"accuracy": {"all": {a: around(v, 0.01, 10, j) for j, (a, v) in
                                 enumerate(arms.items())}},
            "loss": {"all": {a: around(0.1 + (0.3 if a == "cosine_tau1" else 0), 0.01, 10, j)
                             for j, a in enumerate(arms)}},
            "bound": {a: float(theory.max_weight_bound(n, t)) for a, t in
                      (("cosine_tau1", 1), ("cosine_tau4", 4), ("cosine_tau10", 10))},
            "n": n, "chance": 0.25}


def test_figures_are_print_quality_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = {"by_n": {"n=32": tau(32), "n=64": tau(64, 0.8)}}
    numbers = {k: c.model_dump() for k, c in decide(ev).numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c4_tau.png", "c4_tau_n64.png",
                                                    "c4_effects.png"]
    for f in figs:
        width, height, dpi = png_info(f["path"])
        assert dpi >= 150 and width >= 600 and height >= 400, (f["path"], width, height, dpi)
        assert len(f["alt"]) >= 40 and f["alt"].rstrip().endswith(".") and re.search(r"\d",
                                                                                 f["alt"])
    assert (f"e^(2τ)/(e^(2τ)+n−1) = {bound(1):.2f} at τ = 1 over 32 keys, "
            f"{bound(4):.2f} at τ = 4.") in figs[0]["alt"]
    assert f"= {bound(1, 64):.2f} at τ = 1 over 64 keys" in figs[1]["alt"]
    assert "Cosine minus scaled_dot retrieval loss" in figs[2]["alt"]
    assert {Path(p).name: bad for p, bad in saved if bad} == {}


def test_the_bound_sentence_says_less_without_a_bound():
    assert M.bound_alt({**tau(), "bound": {}}) == ""
    alone = M.bound_alt({**tau(), "bound": {"cosine_tau1": bound(1)}})
    assert alone.endswith(f"= {bound(1):.2f} at τ = 1 over 32 keys.") and "τ = 4" not in alone


def test_a_task_not_learned_draws_the_arms_and_no_forest(tmp_path):
    """scaled_dot at 0.3 on a chance-0.25 task at 64 keys: the rule compares nothing, so only
    the arms figures are drawn."""
    ev = {"by_n": {"n=32": tau(32), "n=64": tau(64)}}
    ev["by_n"]["n=64"]["accuracy"]["all"]["scaled_dot"] = around(0.3, 0.01, 10, 9)
    v = decide(ev)
    assert v.verdict == "inconclusive" and "did not learn" in v.because and not v.numbers
    figs = M.draw(ev, dict(v.numbers), tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c4_tau.png", "c4_tau_n64.png"]


def test_the_answer_names_the_temperatures_that_held_at_each_length():
    def comp(reading, no_worse):
        return {"mean": 0.1, "lo": 0.0, "hi": 0.2, "reading": reading, "not_greater": no_worse}
    e = {"id": "C4", "verdict": "depends", "evidence": {},
         "numbers": {"cosine_tau1": comp("greater", False), "cosine_tau2": comp("equal", True),
                     "cosine_learned": comp("equal", True),
                     "n=64 cosine_tau1": comp("greater", False),
                     "n=64 cosine_tau2": comp("greater", False),
                     "n=64 cosine_learned": comp("inconclusive", False)}}
    (line,) = M.says_answer(e)
    assert "matched by tau2, learned at the training length; no τ at 64 keys (C4)." in line
    e["numbers"]["cosine_tau1"] = comp("equal", True)
    assert M.says_answer(e) == []  # τ = 1 held: no sentence that it needs a temperature
