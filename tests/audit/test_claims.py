"""The claim list and the non-training rules flip when fed the opposite evidence."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from attnscale.audit import claims as C

CLAIMS_MD = (Path(__file__).parents[2] / "docs" / "claims.md").read_text()


def test_every_claim_and_question_has_a_rule():
    assert [c.id for c in C.CLAIMS] == [f"C{i}" for i in range(1, 14)]
    assert [q.id for q in C.QUESTIONS] == ["Q1", "Q2", "Q3"]
    for c in C.CLAIMS + C.QUESTIONS:
        assert c.rule and callable(c.judge)
        assert c.id in CLAIMS_MD  # every claim is stated in docs/claims.md


def test_claims_doc_states_every_claim_and_cites_the_sources():
    for cid in [f"C{i}" for i in range(1, 14)] + ["Q1", "Q2", "Q3"]:
        assert f"**{cid}" in CLAIMS_MD or f"### {cid}" in CLAIMS_MD
    for arxiv in ("1706.03762", "2203.03466", "2010.04245", "2309.14322", "2501.19399"):
        assert arxiv in CLAIMS_MD
    assert "docs/claims.md" in C.__doc__


def test_c1():
    good = {"max_err_vs_reference": 1e-7, "max_err_vs_sdpa": 2e-7, "cases": 10}
    assert C.judge_c1(good).verdict == "supported"
    assert C.judge_c1({**good, "max_err_vs_sdpa": 1e-2}).verdict == "refuted"


def test_c2():
    good = {"max_abs_logit_tau1": 0.9999, "max_abs_logit_tau10": 9.99, "max_err_vs_reference": 1e-7}
    assert C.judge_c2(good).verdict == "supported"
    assert C.judge_c2({**good, "max_abs_logit_tau1": 1.5}).verdict == "refuted"


def test_c8():
    right = {"by_d": [{"d": d, "mean": 0.01 * math.sqrt(d), "se_mean": 0.05 * math.sqrt(d),
                       "std": math.sqrt(d)} for d in (16, 64, 256, 1024)]}
    assert C.judge_c8(right).verdict == "refuted"  # the thread's wording is wrong
    thread = {"by_d": [{"d": d, "mean": 0.5 * d, "se_mean": 0.01 * d, "std": math.sqrt(d)}
                       for d in (16, 64, 256, 1024)]}
    assert C.judge_c8(thread).verdict == "supported"
    # a mean that neither vanishes nor grows like d_k: no reading
    flat = {"by_d": [{"d": d, "mean": 5.0, "se_mean": 0.1, "std": math.sqrt(d)}
                     for d in (16, 64, 256, 1024)]}
    assert C.judge_c8(flat).verdict == "inconclusive"


def rem_curves(shape):
    out = []
    for n in (64, 4096):
        sc = math.sqrt(2 * math.log(n))
        s = [0.1 * i * sc for i in range(1, 31)]
        out.append({"n": n, "s": s, "entropy_norm": [shape(x / sc) for x in s]})
    return out


def test_c9():
    ev = {"curves": rem_curves(lambda r: 1 / (1 + r**4)), "max_abs_z": 2.0,
          "max_weight_unscaled_64_512": 0.6, "max_weight_scaled_64_512": 0.01}
    assert C.judge_c9(ev).verdict == "supported"
    ev["curves"] = rem_curves(lambda r: 0.5 + 0.1 * r)  # entropy rising with scale
    assert C.judge_c9(ev).verdict == "refuted"
    ev["curves"] = rem_curves(lambda r: 0.9 - 0.01 * r)  # falls, but never sharp
    assert C.judge_c9(ev).verdict == "inconclusive"


def test_q2_no_effect_is_depends():
    """A model matching only some of the three checks gives depends (a mixed answer)."""
    mixed = {"summary": {"logit_std": 2.0, "entropy": 3.89, "entropy_uniform": 3.9,
                         "entropy_unscaled": 3.8, "entropy_cosine_tau1": 3.85},
             "max_abs_logit": 20.0}
    assert C.judge_q2(mixed).verdict == "depends"


def test_q2():
    good = {"summary": {"logit_std": 2.0, "entropy": 2.4, "entropy_uniform": 3.9,
                        "entropy_unscaled": 0.35, "entropy_cosine_tau1": 3.85},
            "max_abs_logit": 20.0}
    assert C.judge_q2(good).verdict == "supported"
    bad = {"summary": {"logit_std": 9.0, "entropy": 3.89, "entropy_uniform": 3.9,
                       "entropy_unscaled": 3.8, "entropy_cosine_tau1": 3.85}, "max_abs_logit": 20.0}
    assert C.judge_q2(bad).verdict == "refuted"


def test_verdict_values_are_checked():
    with pytest.raises(ValueError):
        C.Verdict("maybe", "rule", "because")


def test_plain_sentences_follow_the_evidence():
    """The sentences above a rule are built from its numbers: other data, other sentences."""
    rows = [{"d": d, "mean": 0.0, "se_mean": 1.0, "std": math.sqrt(d)} for d in (16, 64)]
    a = C.judge_c8({"by_d": rows})
    b = C.judge_c8({"by_d": [{**r, "std": r["d"] ** 0.7} for r in rows]})
    assert a.plain != b.plain and "d_k^0.50" in a.plain[1] and "d_k^0.70" in b.plain[1]
