"""The page's takeaways and answers: computed from the verdicts' numbers, never fixed text."""

from __future__ import annotations

from attnscale.audit import scale
from attnscale.audit.claim import all_claims, get_claim
from attnscale.audit.studies import PRESETS, cut_down
from attnscale.audit.takeaways import answer, strip_verdict, takeaways


def comp(mean: float, reading: str, n: int = 6) -> dict:
    """A comparison as family() writes it; equal and less readings also pass non-inferiority
    (no worse), equal and greater its mirror."""
    return {"mean": mean, "lo": mean - 0.05, "hi": mean + 0.05, "n": n, "reading": reading,
            "not_greater": reading in ("equal", "less"),
            "not_less": reading in ("equal", "greater")}


def entries(gap: float, gap_reading: str, c13: str, tau1: str = "greater",
            q3: str = "refuted", diverged: int = 0) -> list[dict]:
    """Report entries shaped like the rules' output, with one knob per finding."""
    return [
        {"id": "C13", "verdict": c13, "evidence": {},
         "numbers": {"gaps": {"16": comp(0.0, "equal"), "256": comp(gap, gap_reading)},
                     "slope": comp(0.09, "greater"),
                     "context": {"gpt2": {"256": comp(0.001, "equal")}}}},
        {"id": "C7", "verdict": "depends", "evidence": {},
         "numbers": {"dot": {"256": comp(gap, gap_reading)}, "partial": [],
                     "identity": [{"d_k": 16, "max_loss_diff": 0.0},
                                  {"d_k": 256, "max_loss_diff": 2e-9}]}},
        {"id": "C9", "verdict": "supported", "numbers": {},
         "evidence": {"max_weight_unscaled_64_512": 0.91, "max_weight_scaled_64_512": 0.012}},
        {"id": "Q1", "verdict": "depends", "evidence": {},
         "numbers": {"d_model=128 qk_layernorm loss": comp(0.001, "equal"),
                     "d_model=128 qk_layernorm sensitivity": comp(-0.2, "less"),
                     "d_model=128 softcap loss": comp(0.04, "greater"),
                     "d_model=128 softcap sensitivity": comp(0.0, "equal")}},
        {"id": "C4", "verdict": "depends", "evidence": {},
         "numbers": {"cosine_tau1": comp(0.3, tau1), "cosine_tau4": comp(0.0, "equal"),
                     "cosine_learned": comp(0.01, "equal")}},
        {"id": "C3", "verdict": "supported", "evidence": {},
         "numbers": {"cosine_tau1": comp(-0.7, "less")}},
        {"id": "C5", "verdict": "depends", "evidence": {},
         "numbers": {"by_n": {"256": {"ratio": 1.10}, "4096": {"ratio": 1.01}}}},
        {"id": "C11", "verdict": "inconclusive", "numbers": {},
         "evidence": {"sweep": {"d_model=128": {
             "scaled_dot": {"peak_logit_by_lr": {"0.01": 30.0, "0.3": 900.0},
                            "n_diverged": diverged},
             "qk_layernorm": {"peak_logit_by_lr": {"0.01": 8.0, "0.3": 12.0}}}}}},
        {"id": "Q3", "verdict": q3, "numbers": {},
         "evidence": {"answer_weight": {"n=128": {"all": {
             "log_length": {"values": {"0": 0.8, "1": 0.74}},
             "scaled_dot": {"values": {"0": 0.6, "1": 0.64}}}}}}},
    ]


def text(ts: list[dict]) -> str:
    return " ".join(s for t in ts for s in t["answer"])


def test_three_answers_with_their_sources():
    ts = takeaways(entries(0.33, "greater", "supported"))
    assert [t["id"] for t in ts] == ["answer", "scale", "alternatives", "when"]
    assert all(t["answer"] and t["sources"] for t in ts)
    assert ts[0]["verdicts"]["C13"] == "supported"


def test_the_answer_follows_the_data():
    real = text(takeaways(entries(0.33, "greater", "supported")))
    none = text(takeaways(entries(0.004, "equal", "refuted")))
    assert "costs +0.330 nats" in real and "cost nothing we could measure" not in real
    assert "cost nothing we could measure" in none and "+0.330" not in none
    assert "0.91 of the weight" in real
    assert "in float64 the two trained alike to 2e-09 nats (C7)" in real
    assert "QK-LayerNorm: matched scaled dot" in real and "with lower LR sensitivity" in real
    assert "soft-capping: trailed scaled dot" in real
    assert "max |logit| reached 900" in real and "QK-LayerNorm's 12" in real
    assert "saw divergence in longer runs once it passes about 1e4; here no run of the sweep " \
        "diverged" in real
    blown = text(takeaways(entries(0.33, "greater", "supported", diverged=3)))
    assert "here 3 runs diverged" in blown and "no run of the sweep" not in blown
    flipped = text(takeaways(entries(0.33, "greater", "supported", tau1="equal")))
    assert "needs a temperature: at τ = 1 its retrieval loss is +0.300 nats" in real
    assert "tau4, learned did no worse than scaled dot" in real
    assert "held up on retrieval" in flipped and "needs a temperature" not in flipped


def test_the_bottom_line_follows_the_verdicts():
    keep = takeaways(entries(0.33, "greater", "supported"))[0]["answer"]
    drop = takeaways(entries(0.004, "equal", "refuted", tau1="equal"))[0]["answer"]
    assert keep[0].startswith("Keep 1/√d_k") and drop[0].startswith("At this scale dropping")
    assert "QK-LayerNorm held up" in keep[1] and "soft-capping trailed" in keep[1]
    assert any("only with a temperature" in s for s in keep)
    assert not any("only with a temperature" in s for s in drop)


def test_an_interval_past_delta_that_holm_leaves_undecided_is_called_so():
    es = entries(0.33, "greater", "supported")
    q1 = next(e for e in es if e["id"] == "Q1")
    q1["numbers"]["d_model=128 softcap loss"] = {**comp(-0.13, "inconclusive"), "smallest": 0.02}
    t = text(takeaways(es))
    assert "undecided after Holm's correction against scaled dot (-0.130 nats" in t


def test_the_c7_sentence_needs_its_identity_check():
    es = entries(0.33, "greater", "supported")
    next(e for e in es if e["id"] == "C7")["numbers"]["identity"] = []
    assert "(C7)" not in text(takeaways(es))


def test_undecided_data_is_called_undecided():
    t = text(takeaways(entries(0.05, "inconclusive", "inconclusive")))
    assert "could not decide" in t


def test_missing_measurements_are_said_not_guessed():
    ts = takeaways([e for e in entries(0.3, "greater", "supported") if e["id"] != "C13"])
    assert "lacks the measurements" in ts[0]["answer"][0]
    assert "lacks the measurements" in ts[1]["answer"][0]
    assert all("lacks" not in s for s in ts[2]["answer"])


def test_questions_get_answers_not_verdicts():
    q = {"id": "Q3", "verdict": "refuted", "headline": "refuted: at n=128 log_length +0.01"}
    words = get_claim("Q3").answers
    assert answer(q, words) == "No measurable gain in loss (at n=128 log_length +0.01)"
    assert answer({**q, "verdict": "supported", "headline": "supported"}, words).startswith("Yes")
    assert strip_verdict("supported, small: +3%", "supported") == "small: +3%"


def test_scale_caveat_names_model_steps_and_seeds():
    def caveats(p):
        return {c.id: scale.claim_scale(c, p) for c in all_claims()}
    notes = caveats(PRESETS["standard"])
    assert all(notes.values()) and len(notes) == 17
    assert "150 steps" in notes["C13"] and "6 seeds" in notes["C13"] and "width 16–256" in \
        notes["C13"]
    assert "10 seeds" in notes["C4"] and "200 steps" in notes["C4"]  # the tau study's
    assert "5 seeds" in notes["C3"]  # seed_counts["salience"]
    assert "× 7 LRs" in notes["C11"]
    quick = caveats(PRESETS["quick"])
    assert quick["C13"] != notes["C13"] and "40 steps" in quick["C13"]


def test_smoke_presets():
    assert scale.is_smoke("quick") and scale.is_smoke("tiny")
    assert scale.is_smoke(cut_down(PRESETS["full"]).name)
    assert not scale.is_smoke("standard") and not scale.is_smoke("full")
