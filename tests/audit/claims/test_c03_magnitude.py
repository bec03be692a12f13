"""C3 (salience, cue on ‖k‖ only) on synthetic per-seed values: the rule flips with opposite
data, reads inconclusive without an effect at 5 seeds, when the baseline did not learn the task
or when a control leaks the cue; its numbers are scipy's paired t-test; no sentence reads as
another verdict; its evidence model rejects a dict with a field missing; its figures are
print-quality PNGs whose alt text states the finding."""

from __future__ import annotations

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
from attnscale.audit.claims import c03_magnitude as M
from attnscale.audit.compare import mean
from attnscale.audit.evidence import accuracy_evidence, chance
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.verdicts import ACC_DELTA, MissingEvidence

C3_ARMS = ("cosine_tau1", "cosine_tau10", "cosine_learned")
CHANCE = 0.125


def c3(draw, accs, noise=0.005, base=0.9, controls=None):
    """Salience evidence: scaled_dot at ``base``, cosines at accs[arm], controls[arm] (default:
    uniform attention at chance)."""
    controls = {"uniform": CHANCE} if controls is None else controls
    acc = {"scaled_dot": draw.arm(base, noise), **{a: draw.arm(x, noise) for a, x in accs.items()},
           **{c: draw.arm(x, 0.005) for c, x in controls.items()}}
    return {"accuracy": {"all": acc}, "chance": CHANCE, "controls": list(controls)}


def decide(ev):
    return M.CLAIM.decide(ev)


# ------------------------------------------------------------------------------ the rule


def test_flips_between_blind_and_not():
    yes = decide(c3(Draw(4), dict.fromkeys(C3_ARMS, 0.13)))
    assert yes.verdict == "supported"
    ev = c3(Draw(4), dict.fromkeys(C3_ARMS, 0.9))
    no = decide(ev)
    assert no.verdict == "refuted"
    mixed = decide(c3(Draw(4), {"cosine_tau1": 0.13, "cosine_tau10": 0.13,
                                "cosine_learned": 0.9}))
    assert mixed.verdict == "depends"
    assert yes.headline != no.headline and yes.plain[0] != no.plain[0]
    acc = ev["accuracy"]["all"]
    best = max(mean(acc[a]) for a in C3_ARMS)
    assert no.headline == f"refuted: scaled {mean(acc['scaled_dot']):.2f}, cosine best {best:.2f}"
    assert f"cosine_learned {mean(acc['cosine_learned']):.2f}" in no.plain[0]


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_no_effect_is_inconclusive(rng_seed):
    ev = c3(Draw(rng_seed), dict.fromkeys(C3_ARMS, 0.9), noise=ACC_DELTA)
    assert decide(ev).verdict == "inconclusive"


@pytest.mark.parametrize("control", ["uniform", "cue_none"])
def test_a_leaking_control_is_inconclusive(control):
    clear = dict.fromkeys(C3_ARMS, 0.13)
    ok = c3(Draw(5), clear, controls={control: CHANCE + 0.04})
    assert decide(ok).verdict == "supported"
    leak = c3(Draw(5), clear, controls={control: CHANCE + 0.1})
    v = decide(leak)
    assert v.verdict == "inconclusive" and control in v.because
    # an arm that is not listed as a control is never read as one
    unlisted = {**leak, "controls": []}
    assert decide(unlisted).verdict == "supported"


def test_a_missing_control_is_inconclusive():
    """A control that is listed but has no runs proves nothing: no verdict."""
    ev = c3(Draw(5), dict.fromkeys(C3_ARMS, CHANCE))
    ev["controls"] = ["uniform", "cue_none"]  # cue_none has no arm in the evidence
    v = decide(ev)
    assert v.verdict == "inconclusive" and "cue_none" in v.because


@pytest.mark.parametrize(("base", "learned"), [(0.24, False), (0.26, True)])
def test_needs_the_baseline_to_learn(base, learned):
    v = decide(c3(Draw(6, spread=0.0), dict.fromkeys(C3_ARMS, 0.02), 0.001, base))
    assert (v.verdict == "supported") is learned
    assert ("did not learn" in v.because) is not learned


def test_censored_or_few_seeds_is_inconclusive():
    ev = c3(Draw(7), dict.fromkeys(C3_ARMS, 0.13))
    for a in C3_ARMS:
        ev["accuracy"]["all"][a]["censored"] = True
    assert decide(ev).verdict == "inconclusive"
    assert decide(c3(Draw(7, n=2), dict.fromkeys(C3_ARMS, 0.13))).verdict == "inconclusive"


def test_statistics_are_scipys():
    ev = c3(Draw(8), {"cosine_tau1": 0.75}, noise=0.03)
    c = decide(ev).numbers["cosine_tau1"]
    assert c.reading == "less"
    assert_scipy(c, ev["accuracy"]["all"]["cosine_tau1"], ev["accuracy"]["all"]["scaled_dot"],
                 ACC_DELTA)


def test_typed_and_dict_evidence_give_the_same_verdict():
    ev = c3(Draw(4), dict.fromkeys(C3_ARMS, 0.13))
    a, b = decide(ev), M.judge(M.Evidence.model_validate(ev))
    assert (a.verdict, a.because, a.headline, a.plain) == (b.verdict, b.because, b.headline,
                                                          b.plain)


@pytest.mark.parametrize("field", ["accuracy", "chance"])
def test_evidence_with_a_missing_field_is_missing_evidence(field):
    ev = c3(Draw(4), dict.fromkeys(C3_ARMS, 0.13))
    del ev[field]
    with pytest.raises(MissingEvidence, match=f"C3: .*{field}"):
        decide(ev)


# ------------------------------------------------------------------------------ sentences

CASES = {
    V.SUPPORTED: lambda: decide(c3(Draw(4), dict.fromkeys(C3_ARMS, 0.13))),
    V.REFUTED: lambda: decide(c3(Draw(4), dict.fromkeys(C3_ARMS, 0.9))),
    V.DEPENDS: lambda: decide(c3(Draw(4), {"cosine_tau1": 0.13, "cosine_tau10": 0.13,
                                           "cosine_learned": 0.9})),
    V.INCONCLUSIVE: lambda: decide(c3(Draw(4, n=2), dict.fromkeys(C3_ARMS, 0.13))),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(CASES[verdict](), verdict, "C3")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


# ------------------------------------------------------------------------------ evidence


def test_gather_reads_the_salience_study_with_its_controls_and_chance():
    """gather builds what the report's evidence collection built: accuracy per arm, the
    control arms and the task's chance level."""
    p = PRESETS["tiny"]
    plan = studies(p)
    src = Sources(p, plan, {k: [] for k in plan}, {})
    got = M.gather(src)
    study = plan["salience"]
    want = accuracy_evidence(study, [], controls=[a for a in study.arms
                                                  if a in ("uniform", "cue_none")],
                             chance=chance(study))
    assert got == want and got["controls"] == ["uniform", "cue_none"]
    assert M.CLAIM.read(got).chance == pytest.approx(chance(study))
    assert M.gather(src) is got  # the study is read once
    assert M.CLAIM.studies == ("salience",) and M.CLAIM.id == "C3"


# ------------------------------------------------------------------------------ figures


def salience():
    arms = {"scaled_dot": 0.75, "cosine_tau1": 0.05, "cosine_tau10": 0.05,
            "cosine_learned": 0.05, "uniform": 0.06, "cue_none": 0.06}
    return {"accuracy": {"all": {a: around(v, 0.02, 10, j) for j, (a, v) in
                                 enumerate(arms.items())}},
            "controls": ["uniform", "cue_none"], "chance": 0.0625}


def test_figures_are_print_quality_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = salience()
    numbers = {k: c.model_dump() for k, c in decide(ev).numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c3_salience.png", "c3_effects.png"]
    for f in figs:
        width, height, dpi = png_info(f["path"])
        assert dpi >= 150 and width >= 600 and height >= 400, (f["path"], width, height, dpi)
        assert len(f["alt"]) >= 40 and f["alt"].rstrip().endswith(".") and re.search(r"\d",
                                                                                 f["alt"])
    assert "The controls stay near chance: uniform 0.06, cue_none 0.06." in figs[0]["alt"]
    assert "Cosine minus scaled_dot accuracy with the cue on ‖k‖" in figs[1]["alt"]
    assert {Path(p).name: bad for p, bad in saved if bad} == {}


def test_a_figure_without_accuracy_is_an_error_not_faked(tmp_path):
    ev = {**salience(), "accuracy": {"all": {}}}
    with pytest.raises(ValueError, match="no arm has accuracy"):
        M.draw(ev, {}, tmp_path)


def test_a_task_not_learned_draws_the_arms_and_no_forest(tmp_path):
    """scaled_dot at 0.12 on a chance-0.06 task (the quick preset's budget): the rule compares
    nothing, so the page shows the arms figure alone, not a failed forest plot."""
    assert_unlearned_draws_arms_only(M, salience(), 0.12, tmp_path)
