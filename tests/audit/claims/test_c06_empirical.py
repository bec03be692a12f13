"""C6 (scaled dot product against unscaled dot and cosine τ=1 on text and retrieval) on
synthetic per-seed evidence: the rule flips with opposite data, reads inconclusive when there
is no effect at 5 seeds, an arm is missing or censored, or seeds are few; its Holm correction
over its six comparisons is scipy's paired t-test adjusted by hand; no sentence reads as
another verdict; its evidence model rejects a dict with a field missing; its forest plot is a
print-quality PNG whose alt text states the finding."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from support import NULL_DRAWS, WIDTHS, Draw, assert_reads_as, layouts, one_sided, png_info, vals

from attnscale.audit import verdicts as V
from attnscale.audit.claim import Sources
from attnscale.audit.claims import c04_bounded_range
from attnscale.audit.claims import c06_empirical as M
from attnscale.audit.evidence import lr_text_evidence, tau_evidence
from attnscale.audit.studies import PRESETS, studies
from attnscale.audit.verdicts import LOSS_DELTA, MissingEvidence


def c6(draw, text_gap, retrieval_gap=None, noise=0.002, arms=("dot", "cosine_tau1"),
       context_gap=None):
    """rival − scaled_dot = gap[rival] on text (each width, unit init) and on retrieval, and
    ``context_gap`` (default: the opposite of ``text_gap``) on GPT-2-init text; the other
    fields of the text LR study and the retrieval study as their readers write them (the rule
    does not read them)."""
    def row(gap):
        return {"scaled_dot": draw.arm(2.0, noise),
                **{r: draw.arm(2.0 + gap[r], noise) for r in arms}}
    retrieval_gap = text_gap if retrieval_gap is None else retrieval_gap
    context_gap = context_gap or {r: -g for r, g in text_gap.items()}
    loss = {**{f"init=unit {w}": row(text_gap) for w in WIDTHS},
            **{f"init=gpt2 {w}": row(context_gap) for w in WIDTHS}}
    text = {"loss": loss, "sweep": {}, "lrs": [1e-3, 1e-2],
            "n": 32, "logit_limit": 1e4, "loss_margin": 1.0}
    retrieval = {"loss": {"all": row(retrieval_gap)}, "accuracy": {"all": {}},
                 "bound": {"cosine_tau1": 0.19}, "n": 32, "chance": 0.1}
    return {"text": text, "retrieval": retrieval}


def decide(ev):
    return M.CLAIM.decide(ev)


# ------------------------------------------------------------------------------ the rule


def test_flips_between_scaled_best_and_not():
    yes = decide(c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3}))
    assert yes.verdict == "supported" and yes.headline == "supported: scaled better in 6/6"
    no = decide(c6(Draw(8), {"dot": -0.2, "cosine_tau1": 0.0}))
    assert no.verdict == "refuted" and no.headline == "refuted: scaled better in 0/6"
    mixed = decide(c6(Draw(8), {"dot": 0.2, "cosine_tau1": -0.2}))
    assert mixed.verdict == "depends"
    assert "d_model=32: dot" in mixed.plain[0] and "retrieval: cosine_tau1" in mixed.plain[1]
    assert yes.plain != no.plain != mixed.plain


def test_gpt2_context_is_shown_but_never_decides():
    """The GPT-2-init rows flip (default: the opposite gap) and the verdict does not move."""
    yes = decide(c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3}))
    same = decide(c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3},
                     context_gap={"dot": 0.2, "cosine_tau1": 0.3}))
    assert yes.verdict == same.verdict == "supported"
    ctx = {k: c for k, c in yes.numbers.items() if k.startswith(M.CONTEXT)}
    assert len(ctx) == 4 and all(c.less() for c in ctx.values())
    assert yes.plain[-1].startswith("Context, not in the verdict") and "beat" in yes.plain[-1]


@pytest.mark.parametrize("rng_seed", NULL_DRAWS)
def test_no_effect_is_inconclusive(rng_seed):
    ev = c6(Draw(rng_seed), {"dot": 0.0, "cosine_tau1": 0.0}, noise=LOSS_DELTA)
    assert decide(ev).verdict == "inconclusive"


def test_missing_censored_or_few_seeds_is_inconclusive():
    ev = c6(Draw(9), {"dot": 0.2, "cosine_tau1": 0.3})
    del ev["retrieval"]["loss"]["all"]["cosine_tau1"]
    v = decide(ev)
    assert v.numbers["retrieval: cosine_tau1"].why == "an arm has no runs"
    assert v.verdict == "inconclusive"
    ev = c6(Draw(9), {"dot": 0.2, "cosine_tau1": 0.3})
    ev["text"]["loss"]["init=unit d_model=32"]["dot"]["censored"] = True
    assert decide(ev).verdict == "inconclusive"
    ev = c6(Draw(9, n=2), {"dot": 0.2, "cosine_tau1": 0.3})
    assert decide(ev).verdict == "inconclusive"


def test_holm_over_its_six_comparisons_is_scipys():
    ev = c6(Draw(10), {"dot": 0.06, "cosine_tau1": 0.0}, noise=0.015)
    v = decide(ev)
    keys = [k for k in v.numbers if not k.startswith(M.CONTEXT)]
    assert len(keys) == 6
    def arms(k):
        where, rival = k.split(": ")
        row = (ev["retrieval"]["loss"]["all"] if where == "retrieval"
               else ev["text"]["loss"][where.replace("unit init ", "init=unit ")])
        return vals(row[rival]), vals(row["scaled_dot"])
    best = {k: min(("greater", "less", "equal"), key=lambda r, k=k: one_sided(*arms(k), r))
            for k in keys}
    ps = np.array([one_sided(*arms(k), best[k]) for k in keys])
    order = np.argsort(ps)
    holm = np.maximum.accumulate(np.minimum(1, (len(ps) - np.arange(len(ps))) * ps[order]))
    for k, p in zip((keys[i] for i in order), holm, strict=True):
        assert v.numbers[k].p_holm == pytest.approx(p, rel=1e-9)
        assert v.numbers[k].reading == (best[k] if p <= 0.025 else "inconclusive")


def test_typed_and_dict_evidence_give_the_same_verdict():
    ev = c6(Draw(8), {"dot": 0.2, "cosine_tau1": -0.2})
    a, b = decide(ev), M.judge(M.Evidence.model_validate(ev))
    assert (a.verdict, a.because, a.headline, a.plain) == (b.verdict, b.because, b.headline,
                                                          b.plain)


@pytest.mark.parametrize(("part", "field"), [(None, "retrieval"), ("text", "loss"),
                                             ("text", "sweep"), ("retrieval", "loss"),
                                             ("retrieval", "bound")])
def test_evidence_with_a_missing_field_is_missing_evidence(part, field):
    ev = c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3})
    del (ev[part] if part else ev)[field]
    with pytest.raises(MissingEvidence, match=f"C6: .*{field}"):
        decide(ev)


# ------------------------------------------------------------------------------ sentences

CASES = {
    V.SUPPORTED: lambda: decide(c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3})),
    V.REFUTED: lambda: decide(c6(Draw(8), {"dot": -0.2, "cosine_tau1": 0.0})),
    V.DEPENDS: lambda: decide(c6(Draw(8), {"dot": 0.2, "cosine_tau1": -0.2})),
    V.INCONCLUSIVE: lambda: decide(c6(Draw(8, n=2), {"dot": 0.2, "cosine_tau1": 0.3})),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(CASES[verdict](), verdict, "C6")


def test_every_verdict_is_covered():
    assert set(CASES) == set(V.VERDICTS)


# ------------------------------------------------------------------------------ evidence


def test_gather_reads_the_text_and_tau_studies_and_shares_tau_with_c4():
    p = PRESETS["tiny"]
    plan = studies(p)
    src = Sources(p, plan, {k: [] for k in plan}, {})
    got = M.gather(src)
    text = lr_text_evidence(plan["lr_text"], [])
    gpt2 = lr_text_evidence(plan["lr_text_gpt2"], [])
    assert got == {"text": {**text, "loss": {**text["loss"], **gpt2["loss"]},
                            "sweep": {}, "entropy_init": {**text["entropy_init"],
                                                          **gpt2["entropy_init"]}},
                   "retrieval": tau_evidence(plan["tau"], []), "long": None}
    # the same numbers C4 reads at the training length (C4 reads every length)
    assert got["retrieval"] == c04_bounded_range.gather(src)["by_n"]["n=32"]
    M.CLAIM.read(got)
    assert M.CLAIM.studies == ("lr_text", "lr_text_gpt2", "tau", "long_text")


# ------------------------------------------------------------------------------ figures


def test_forest_plot_is_print_quality_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = c6(Draw(8), {"dot": 0.2, "cosine_tau1": -0.2})
    v = decide(ev)
    numbers = {k: c.model_dump() for k, c in v.numbers.items()}
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c6_effects.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400, (width, height, dpi)
    alt = figs[0]["alt"]
    assert len(alt) >= 40 and alt.rstrip().endswith(".") and re.search(r"\d", alt)
    assert alt.startswith("Rival minus scaled_dot loss: of 10 paired comparisons (5 seeds,")
    assert "5 greater, 5 less" in alt
    assert {Path(p).name: bad for p, bad in saved if bad} == {}


def test_a_forest_without_any_estimate_is_an_error_not_faked(tmp_path):
    ev = c6(Draw(8, n=2), {"dot": 0.2, "cosine_tau1": 0.3})
    numbers = {k: c.model_dump() for k, c in decide(ev).numbers.items()}
    with pytest.raises(ValueError, match="no comparison has an estimate"):
        M.draw(ev, numbers, tmp_path)


def test_the_text_loss_is_printed_in_bits_against_the_corpus_levels():
    ev = c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3})
    ev["text"]["levels"] = {"unigram": 4.69, "bigram": 3.35}
    line = decide(ev).plain[-1]
    unit = ev["text"]["loss"]["init=unit d_model=32"]["scaled_dot"]["values"].values()
    bits = np.mean(list(unit)) / np.log(2)  # nats -> bits
    assert line.startswith("How far the text models got: scaled dot ends at ")
    assert f"{bits:.2f} at d_model=32 (unit)" in line and "(gpt2)" in line
    assert "4.69 for the corpus' unigram model and 3.35 for its bigram model" in line
    del ev["text"]["levels"]
    assert not decide(ev).plain[-1].startswith("How far")


def test_the_long_study_joins_the_decision_and_the_page_says_what_it_changed():
    """With --deep, the 1,500-step unit-init comparisons decide with the rest: here the short
    studies say scaled dot wins everywhere, the long one says dot catches up."""
    ev = c6(Draw(8), {"dot": 0.2, "cosine_tau1": 0.3})
    draw = Draw(9)
    row = {"scaled_dot": draw.arm(2.0, 0.002), "dot": draw.arm(2.0, 0.002),
           "cosine_tau1": draw.arm(2.0, 0.002)}
    ev["long"] = {"loss": {"init=unit": row, "init=gpt2": row}, "steps": 1500}
    v = decide(ev)
    assert v.verdict == "depends"
    assert v.numbers["unit init, 1500 steps: dot"].no_worse()
    assert any(k.startswith(M.CONTEXT + ", 1500 steps") for k in v.numbers)
    assert v.plain[-1] == "Without the 1500-step study this verdict would read supported."
    del ev["long"]
    assert decide(ev).verdict == "supported"
