"""The page's takeaways: each claim writes its own sentences (``Claim.says``) from its own
entry; the collector orders them by rank, names the claims it used, never builds on a failed
rule, says what is missing and refuses an unknown section. Questions get answers."""

from __future__ import annotations

import pytest

from attnscale.audit import scale
from attnscale.audit import verdicts as V
from attnscale.audit.claim import Claim, Says, all_claims, get_claim, registered
from attnscale.audit.evidence import Model
from attnscale.audit.studies import PRESETS, cut_down
from attnscale.audit.takeaways import SECTIONS, answer, contributors, takeaways
from attnscale.audit.words import strip_verdict


class Toy(Model):
    x: float


def toy(cid: str, section: str = "when", rank: int = 0) -> Claim:
    """A claim whose one takeaway sentence prints its entry's number x."""
    return Claim(cid, "t", "m", "r", Toy, lambda src: {"x": 1.0},
                 lambda ev: V.Verdict("supported", "r", f"x = {ev.x}"),
                 says=(Says(section, lambda e: [f"Toy says x = {e['numbers']['x']}."], rank),))


def entry(cid: str, verdict: str = "supported", **numbers: float) -> dict:
    return {"id": cid, "verdict": verdict, "numbers": numbers, "evidence": {}, "headline": ""}


def section(ts: list[dict], key: str) -> dict:
    return next(t for t in ts if t["id"] == key)


def test_sections_in_page_order_with_the_claims_that_write_them():
    ts = takeaways([])
    assert [t["id"] for t in ts] == list(SECTIONS)
    for t in ts:
        assert t["sources"] == [c.id for _, c, _ in contributors(t["id"])]
        assert t["sources"], t["id"]  # every section has a writer among the real claims


def test_a_new_claim_writes_into_a_section_in_rank_order():
    with registered(toy("C97", rank=0)):
        t = section(takeaways([entry("C97", x=2.5)]), "when")
        assert t["answer"][0] == "Toy says x = 2.5." and t["sources"][0] == "C97"
        assert t["verdicts"] == {"C97": "supported"}
    with registered(toy("C97", rank=10_000)):
        t = section(takeaways([entry("C97", x=2.5)]), "when")
        assert t["answer"][-1] == "Toy says x = 2.5." and t["sources"][-1] == "C97"


def test_a_failed_rule_is_not_answered_and_a_missing_claim_is_said():
    with registered(toy("C97")):
        t = section(takeaways([entry("C97", V.ERROR)]), "when")
        assert t["answer"][0] == ("Not answered here: the rule of C97 failed (the error is "
                                  "shown there).")
        t = section(takeaways([]), "when")
        assert t["answer"][0] == "Not answered here: this report lacks C97."


def test_an_unknown_section_is_refused():
    with registered(toy("C97", section="nowhere")), pytest.raises(ValueError, match="nowhere"):
        takeaways([])


def test_every_real_claim_writes_into_a_known_section():
    for c in all_claims():
        for says in c.says:
            assert says.section in SECTIONS, c.id


def test_questions_get_answers_not_verdicts():
    q = {"id": "Q3", "verdict": "refuted", "headline": "refuted: at n=128 log_length +0.01"}
    words = get_claim("Q3").answers
    assert answer(q, words) == f"{words['refuted']} (at n=128 log_length +0.01)"
    assert answer({**q, "verdict": "supported", "headline": "supported"}, words) == \
        words["supported"]
    assert strip_verdict("supported, small: +3%", "supported") == "small: +3%"


def test_scale_caveat_names_model_steps_and_seeds():
    def caveats(p):
        return {c.id: scale.claim_scale(c, p) for c in all_claims()}
    notes = caveats(PRESETS["standard"])
    assert all(notes.values()) and len(notes) == len(all_claims())
    assert "150 steps" in notes["C13"] and "6 seeds" in notes["C13"] and "width 16–256" in \
        notes["C13"]
    assert "10 seeds" in notes["C4"] and "200 steps" in notes["C4"]  # the tau study's
    assert "5 seeds" in notes["C3"]  # seed_counts["salience"]
    assert "× 5 LRs" in notes["C11"]
    quick = caveats(PRESETS["quick"])
    assert quick["C13"] != notes["C13"] and "40 steps" in quick["C13"]


def test_smoke_presets():
    assert scale.is_smoke("quick") and scale.is_smoke("tiny")
    assert scale.is_smoke(cut_down(PRESETS["full"]).name)
    assert not scale.is_smoke("standard") and not scale.is_smoke("full")
