"""Q3 (log-n scaling past the training length) on synthetic per-seed values: the verdict reads
the evaluation-time log-n factor against plain scaled_dot on the same runs and flips between
helping and not; the trained log-length arms are context and never move it; identical losses
are not measurable, hence inconclusive; it reads the loss, not the accuracy; it is inconclusive
without an effect, when the baseline did not learn the task, a comparison is censored or seeds
are few; its numbers are scipy's paired t-test with Holm over the lengths; no sentence reads as
another verdict; its evidence model rejects a dict with a field missing; the reader takes the
runs' log-n metrics and refuses runs stored without them; its figure is a print-quality PNG
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
from attnscale.audit.claims import q3_length as M
from attnscale.audit.compare import mean
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence
from attnscale.lab.paired import NOT_MEASURABLE
from attnscale.lab.records import Run

LENGTHS = ("n=32", "n=64", "n=128")
FACTORS = {"n=64": 1.2, "n=128": 1.4}


def q3(draw, gaps, trained=(0.0, 0.0, 0.0), base=(0.9, 0.6, 0.4), noise=0.005,
       lengths=LENGTHS, loss=(0.3, 1.0, 1.6)):
    """Length evidence: scaled_dot's plain eval loss loss[i] at lengths[i]; with the log-n
    factor loss[i] + gaps[i] at the longer lengths (gaps[0] is the training length's, where the
    factor is 1, and is not drawn); the trained arms at loss[i] + trained[i]; accuracy
    (context) base[i] and base[i] − gaps[i]."""
    los, acc, weight = {}, {}, {}
    ln_loss, ln_acc, ln_weight = {}, {}, {}
    for i, (k, b, x) in enumerate(zip(lengths, base, loss, strict=False)):
        los[k] = {"all": {"scaled_dot": draw.arm(x, noise),
                          **{a: draw.arm(x + trained[i], noise) for a in M.TRAINED}}}
        acc[k] = {"all": {a: draw.arm(b, noise) for a in ("scaled_dot", *M.TRAINED)}}
        weight[k] = {"all": {a: draw.arm(b / 2) for a in ("scaled_dot", *M.TRAINED)}}
        if i:
            ln_loss[k] = {"all": {"scaled_dot": draw.arm(x + gaps[i], noise)}}
            ln_acc[k] = {"all": {"scaled_dot": draw.arm(b - gaps[i], noise)}}
            ln_weight[k] = {"all": {"scaled_dot": draw.arm((b - gaps[i]) / 2)}}
    return {"loss": los, "accuracy": acc, "answer_weight": weight, "lengths": list(lengths),
            "chance": 0.1, "log_n_loss": ln_loss, "log_n_accuracy": ln_acc,
            "log_n_answer_weight": ln_weight,
            "factors": {k: FACTORS.get(k, 1.5) for k in lengths[1:]}}


def decide(ev):
    return M.CLAIM.decide(ev)


def factor(k):
    return f"{M.FACTOR} {k}"


# ------------------------------------------------------------------------------ the rule


def test_flips_between_helping_and_not():
    yes = decide(q3(Draw(9), (0.0, -0.1, -0.3)))
    assert yes.verdict == "supported"
    no = decide(q3(Draw(9), (0.0, 0.0, 0.0)))
    assert no.verdict == "refuted"
    assert decide(q3(Draw(9), (0.0, 0.2, 0.3))).verdict == "refuted"
    assert decide(q3(Draw(9), (0.0, -0.2, 0.2))).verdict == "depends"
    assert decide(q3(Draw(9), (0.0, 0.0, -0.3))).verdict == "supported"
    assert yes.headline == (f"supported: at n=128 the log-n factor "
                            f"{yes.numbers[factor('n=128')].mean:+.3f} nats")
    assert yes.plain != no.plain


def test_the_trained_arms_are_context_and_never_move_the_verdict():
    for trained in ((0.0, -0.5, -0.5), (0.0, 0.5, 0.5)):
        v = decide(q3(Draw(9), (0.0, 0.0, 0.0), trained=trained))
        assert v.verdict == "refuted"
        assert {f"{a} {k} (context)" for a in M.TRAINED for k in LENGTHS[1:]} <= set(v.numbers)
        reading = "less" if trained[1] < 0 else "greater"
        assert v.numbers["log_length n=128 (context)"].reading == reading
    better = decide(q3(Draw(9), (0.0, 0.0, 0.0), trained=(0.0, -0.5, -0.5)))
    assert any(s.startswith("Context, each arm at its own LR: trained log-length scaling")
               for s in better.plain)


def test_identical_losses_are_not_measurable_and_inconclusive():
    """The factor changed nothing (every seed's loss the same with and without it): no test
    reads differences that are all equal."""
    ev = q3(Draw(9), (0.0, 0.0, 0.0))
    for k in LENGTHS[1:]:
        ev["log_n_loss"][k] = copy.deepcopy({"all": {"scaled_dot": ev["loss"][k]["all"][
            "scaled_dot"]}})
    v = decide(ev)
    assert [v.numbers[factor(k)].reading for k in LENGTHS[1:]] == [NOT_MEASURABLE] * 2
    assert v.verdict == "inconclusive"


def test_reads_loss_not_accuracy():
    """An accuracy gain with no change in loss is not a gain: the rule reads the loss."""
    ev = q3(Draw(15), (0.0, 0.0, 0.0))
    for k in LENGTHS[1:]:
        ev["log_n_accuracy"][k]["all"]["scaled_dot"] = Draw(15).arm(0.99)
    assert decide(ev).verdict == "refuted"


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_no_effect_is_inconclusive(rng_seed):
    ev = q3(Draw(rng_seed), (0.0, 0.0, 0.0), noise=2 * LOSS_DELTA)
    assert decide(ev).verdict == "inconclusive"


@pytest.mark.parametrize(("base", "learned"), [(0.19, False), (0.21, True)])
def test_needs_the_baseline_to_learn_at_the_training_length(base, learned):
    v = decide(q3(Draw(10, spread=0.0), (0.0, -0.3, -0.3), base=(base, 0.15, 0.12),
                  noise=0.001))
    assert (v.verdict == "supported") is learned
    assert ("did not learn" in v.because) is not learned


def test_no_length_is_not_learned_and_inconclusive():
    v = decide({"loss": {}, "accuracy": {}, "answer_weight": {}, "lengths": [], "chance": 0.1,
                "log_n_loss": {}, "log_n_accuracy": {}, "log_n_answer_weight": {},
                "factors": {}})
    assert v.verdict == "inconclusive" and "did not learn" in v.because
    assert v.regime.startswith("trained at ?")


def test_censored_or_few_seeds_is_inconclusive():
    ev = q3(Draw(11), (0.0, -0.1, -0.3))
    for k in LENGTHS[1:]:
        ev["loss"][k]["all"]["scaled_dot"]["censored"] = True
    assert decide(ev).verdict == "inconclusive"
    assert decide(q3(Draw(11, n=2), (0.0, -0.1, -0.3))).verdict == "inconclusive"


def test_statistics_are_scipys_with_holm_over_the_lengths():
    ev = q3(Draw(12), (0.0, -0.15, -0.1), noise=0.03)
    v = decide(ev)
    pairs = [(ev["log_n_loss"][k]["all"]["scaled_dot"], ev["loss"][k]["all"]["scaled_dot"])
             for k in LENGTHS[1:]]
    want = holm_by_hand([best_p(vals(a), vals(b)) for a, b in pairs])
    for k, (a, b), p in zip(LENGTHS[1:], pairs, want, strict=True):
        assert v.numbers[factor(k)].reading == "less"
        assert_scipy(v.numbers[factor(k)], a, b, LOSS_DELTA, p_holm=p)


def test_typed_and_dict_evidence_give_the_same_verdict():
    ev = q3(Draw(9), (0.0, -0.1, -0.3))
    a, b = decide(ev), M.judge(M.Evidence.model_validate(ev))
    assert (a.verdict, a.because, a.headline, a.plain) == (b.verdict, b.because, b.headline,
                                                          b.plain)


@pytest.mark.parametrize("field", ["loss", "accuracy", "answer_weight", "lengths", "chance",
                                   "log_n_loss", "log_n_answer_weight", "factors"])
def test_evidence_with_a_missing_field_is_missing_evidence(field):
    ev = q3(Draw(9), (0.0, -0.1, -0.3))
    del ev[field]
    with pytest.raises(MissingEvidence, match=f"Q3: .*{field}"):
        decide(ev)


def test_answers_word_every_verdict():
    assert set(M.CLAIM.answers) == set(V.VERDICTS) and M.CLAIM.question
    assert M.CLAIM.answers[V.SUPPORTED].startswith("Yes: a log-n factor at evaluation")
    assert M.CLAIM.answers[V.REFUTED] == "No measurable gain in loss"


# ------------------------------------------------------------------------------ sentences

CASES = {
    V.SUPPORTED: lambda: decide(q3(Draw(9), (0.0, -0.1, -0.3))),
    V.REFUTED: lambda: decide(q3(Draw(9), (0.0, 0.0, 0.0))),
    V.DEPENDS: lambda: decide(q3(Draw(9), (0.0, -0.2, 0.2))),
    V.INCONCLUSIVE: lambda: decide(q3(Draw(9, n=2), (0.0, -0.1, -0.3))),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(CASES[verdict](), verdict, "Q3")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


def test_sentences_give_plain_and_factor_losses_per_length():
    ev = q3(Draw(9), (0.0, -0.1, -0.3))
    plain = decide(ev).plain
    def at(table, ks, digits):
        return ", ".join(f"{mean(ev[table][k]['all']['scaled_dot']):.{digits}f}" for k in ks)
    assert plain[0] == (f"scaled_dot's eval loss at n=32, n=64, n=128: "
                        f"{at('loss', LENGTHS, 3)} nats; with the log-n factor (×1.20 at n=64, "
                        f"×1.40 at n=128) {at('log_n_loss', LENGTHS[1:], 3)}.")
    assert plain[1] == (f"Its attention on the answer at n=64, n=128: plain "
                        f"{at('answer_weight', LENGTHS[1:], 2)}, with the factor "
                        f"{at('log_n_answer_weight', LENGTHS[1:], 2)}.")


def test_the_takeaway_names_the_factor_and_the_answer():
    ev = q3(Draw(9), (0.0, -0.1, -0.3))
    v = decide(ev)
    entry = {"verdict": v.verdict, "evidence": ev,
             "numbers": {k: c.model_dump() for k, c in v.numbers.items()}}
    (said,) = M.says_when(entry)
    w = mean(ev["log_n_answer_weight"]["n=128"]["all"]["scaled_dot"])
    assert said.startswith("Log-n scaling, for inputs longer than training: at n=128, "
                           "multiplying scaled dot's logits by ln L / ln n (1.40) at evaluation "
                           f"put {w:.2f} of the attention on the answer")
    assert said.endswith("yes: a log-n factor at evaluation lowers the loss past the training "
                         "length (Q3).")
    assert M.says_when({"verdict": "refuted", "evidence": {"answer_weight": {}}}) == []


# ------------------------------------------------------------------------------ evidence


def run(variant, seed, lr=0.01, metrics=None, seq_len=32):
    """A finished length-study run with final metrics ``metrics``."""
    cfg = {**studies(PRESETS["tiny"])["length"].base, "lr": lr, "seed": seed}
    return Run.from_row({"id": f"{variant}-{seed}-{lr}", "variant": variant, "status": "done",
                         "config": cfg, "final_loss": 0.1, "initial_loss": 3.0, "history": [],
                         "final_metrics": metrics or {}})


def metrics(plain, sharp):
    out = {f"n={n}": {"loss": plain + i, "metric": 0.9, "answer_weight": 0.5}
           for i, n in enumerate((32, 64, 128))}
    out.update({f"log_n:n={n}": {"loss": sharp + i, "metric": 0.9, "answer_weight": 0.6,
                                 "factor": math.log(n) / math.log(32)}
                for i, n in enumerate((64, 128), start=1)})
    return out


def test_the_reader_takes_the_runs_log_n_metrics():
    study = studies(PRESETS["tiny"])["length"]
    runs = [run("scaled_dot", s, lr, metrics(0.1 * s, 0.1 * s - 0.05))
            for s in (*study.seeds, *study.tune_seeds) for lr in study.lrs]
    ev = M.q3_evidence(study, runs)
    assert ev["factors"] == pytest.approx({"n=64": 1.2, "n=128": 1.4})
    sharp = ev["log_n_loss"]["n=128"]["all"]["scaled_dot"]
    assert sharp["values"] == pytest.approx({str(s): 0.1 * s + 1.95 for s in study.seeds})
    assert sharp["source"] == ["length", "all", "scaled_dot"]  # switches with the plain table
    assert set(ev["log_n_loss"]) == {"n=64", "n=128"}
    assert ev["loss"]["n=128"]["all"]["scaled_dot"]["values"]["1"] == pytest.approx(2.1)


def test_a_run_stored_without_the_log_n_metrics_is_missing_evidence():
    study = studies(PRESETS["tiny"])["length"]
    old = metrics(0.1, 0.05)
    del old["log_n:n=128"]
    with pytest.raises(MissingEvidence, match="no log-n evaluation"):
        M.q3_evidence(study, [run("scaled_dot", 0, metrics=old)])
    assert M.q3_evidence(study, [run("log_length", 0, metrics=old)])["log_n_loss"]


def test_gather_reads_the_length_study():
    p = PRESETS["tiny"]
    plan = studies(p)
    src = Sources(p, plan, {k: [] for k in plan}, {})
    got = M.gather(src)
    assert got == M.q3_evidence(plan["length"], [])
    assert M.gather(src) is got
    assert M.CLAIM.read(got).lengths == []
    assert M.CLAIM.studies == ("length",) and M.CLAIM.id == "Q3"
    assert plan["length"].arms == ("scaled_dot", "log_length", "log_length_matched")


# ------------------------------------------------------------------------------ figures


def length():
    lengths = ["n=32", "n=64", "n=128"]
    arms = ("scaled_dot", "log_length")
    def table(f):
        return {k: {"all": {a: around(f(i, j), seed=i + 5 * j) for j, a in enumerate(arms)}}
                for i, k in enumerate(lengths)}
    def sharp(f):
        return {k: {"all": {"scaled_dot": around(f(i), seed=i + 20)}}
                for i, k in enumerate(lengths) if i}
    return {"lengths": lengths, "chance": 0.25,
            "loss": table(lambda i, j: 0.2 + (0.3 - 0.05 * j) * i),
            "accuracy": table(lambda i, j: 1 - (0.03 + 0.01 * j) * i),
            "answer_weight": table(lambda i, j: 0.9 - (0.1 - 0.03 * j) * i),
            "log_n_loss": sharp(lambda i: 0.2 + 0.28 * i),
            "log_n_accuracy": sharp(lambda i: 1 - 0.03 * i),
            "log_n_answer_weight": sharp(lambda i: 0.95 - 0.08 * i),
            "factors": {"n=64": 1.2, "n=128": 1.4}}


def test_figure_is_print_quality_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = length()
    numbers = {k: c.model_dump() for k, c in decide(ev).numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["q3_length.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400, (width, height, dpi)
    alt = figs[0]["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and re.search(r"\d", alt)
    assert alt.startswith("Trained at n=32 and evaluated at n=128, eval loss is scaled_dot ")
    w = mean(ev["log_n_answer_weight"]["n=128"]["all"]["scaled_dot"])
    assert "The attention weight on the answer at n=128 is scaled_dot" in alt
    assert f"scaled_dot with log-n factor {w:.2f}." in alt
    assert {Path(p).name: bad for p, bad in saved if bad} == {}


def test_the_factor_series_starts_at_the_plain_value():
    ev = length()
    lines = M.series(ev, "loss")
    assert list(lines) == ["scaled_dot", "log_length", "scaled_dot, log-n factor at eval"]
    assert lines["scaled_dot, log-n factor at eval"][0] == lines["scaled_dot"][0]


@pytest.mark.parametrize("lengths", [[], ["n=32"]])
def test_a_figure_without_longer_lengths_is_an_error_not_faked(tmp_path, lengths):
    with pytest.raises(ValueError, match="at least two evaluation lengths"):
        M.draw({**length(), "lengths": lengths}, {}, tmp_path)
    with pytest.raises(ValueError, match="at least two evaluation lengths"):
        M.alt({**length(), "lengths": lengths})
