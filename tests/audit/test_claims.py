"""Every verdict rule flips when fed the opposite evidence: no verdict is hard-coded."""

from __future__ import annotations

import math

import pytest

from attnscale.audit import claims as C


def ci(mean, half=0.01, n=3):
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def test_every_claim_and_question_has_a_rule():
    assert [c.id for c in C.CLAIMS] == [f"C{i}" for i in range(1, 14)]
    assert [q.id for q in C.QUESTIONS] == ["Q1", "Q2", "Q3"]
    for c in C.CLAIMS + C.QUESTIONS:
        assert c.rule and callable(c.judge)


def test_c1():
    good = {"max_err_vs_reference": 1e-7, "max_err_vs_sdpa": 2e-7, "cases": 10}
    assert C.judge_c1(good).verdict == "supported"
    assert C.judge_c1({**good, "max_err_vs_sdpa": 1e-2}).verdict == "refuted"


def test_c2():
    good = {"max_abs_logit_tau1": 0.9999, "max_abs_logit_tau10": 9.99, "max_err_vs_reference": 1e-7}
    assert C.judge_c2(good).verdict == "supported"
    assert C.judge_c2({**good, "max_abs_logit_tau1": 1.5}).verdict == "refuted"


def test_c3():
    ev = {"accuracy": {"scaled_dot": ci(0.95), "cosine_tau1": ci(0.2), "cosine_tau10": ci(0.3),
                       "cosine_learned": ci(0.4)}, "chance": 0.125}
    assert C.judge_c3(ev).verdict == "supported"
    ev["accuracy"]["cosine_learned"] = ci(0.96)
    assert C.judge_c3(ev).verdict == "refuted"
    ev["accuracy"]["cosine_learned"] = ci(0.9, 0.03)
    assert C.judge_c3(ev).verdict == "depends"
    ev["accuracy"]["scaled_dot"] = ci(0.13)  # nothing learned: inconclusive, whatever cosine does
    ev["accuracy"]["cosine_learned"] = ci(0.12)
    assert C.judge_c3(ev).verdict == "depends"
    assert "inconclusive" in C.judge_c3(ev).because


def test_c4():
    ev = {"accuracy": {"scaled_dot": ci(1.0), "cosine_tau1": ci(0.1), "cosine_tau10": ci(0.99),
                       "cosine_learned": ci(0.98)}, "max_weight_bound": 0.0142, "n": 512,
          "chance": 0.25}
    assert C.judge_c4(ev).verdict == "depends"
    ev["accuracy"]["cosine_tau10"] = ci(0.2)
    ev["accuracy"]["cosine_learned"] = ci(0.1)
    assert C.judge_c4(ev).verdict == "supported"
    ev["accuracy"]["cosine_tau1"] = ci(0.95)
    assert C.judge_c4(ev).verdict == "refuted"
    ev["accuracy"] = {k: ci(0.27) for k in ev["accuracy"]}  # chance 0.25: nothing learned
    assert C.judge_c4(ev).verdict == "depends"


def test_c5():
    assert C.judge_c5({"ratio_by_n": {"256": 1.3, "1024": 1.2}}).verdict == "supported"
    assert C.judge_c5({"ratio_by_n": {"256": 1.02, "1024": 0.98}}).verdict == "refuted"
    assert C.judge_c5({"ratio_by_n": {"256": 1.3, "1024": 1.01}}).verdict == "depends"


def test_c6():
    ev = {"best_loss": {t: {"scaled_dot": ci(1.0), "dot": ci(1.5), "cosine_tau1": ci(2.0)}
                        for t in ("mqar", "text")}}
    assert C.judge_c6(ev).verdict == "supported"
    for t in ev["best_loss"]:
        ev["best_loss"][t]["cosine_tau1"] = ci(0.5)
    assert C.judge_c6(ev).verdict == "refuted"
    ev["best_loss"]["text"]["cosine_tau1"] = ci(2.0)
    assert C.judge_c6(ev).verdict == "depends"


def dk(gaps):
    return {"best_loss": {str(d): {"scaled_dot": ci(1.0), "dot": ci(1.0 + g)}
                          for d, g in zip((8, 32, 128), gaps, strict=True)}}


def test_c7_and_c13():
    growing = dk([0.0, 0.2, 0.8])
    assert C.judge_c7(growing).verdict == "refuted"
    assert C.judge_c13(growing).verdict == "supported"
    flat = dk([0.0, 0.0, 0.0])
    assert C.judge_c7(flat).verdict == "supported"
    assert C.judge_c13(flat).verdict == "refuted"
    middle = dk([0.0, 0.5, 0.0])
    assert C.judge_c7(middle).verdict == "depends"
    shrinking = dk([0.9, 0.5, 0.3])
    assert C.judge_c13(shrinking).verdict == "depends"


def width(dot_div, sd_div, dot_lr, dot_sens, sd_sens=0.1):
    return {"dot": {"divergence_rate": dot_div, "max_stable_lr": dot_lr,
                    "lr_sensitivity": dot_sens},
            "scaled_dot": {"divergence_rate": sd_div, "max_stable_lr": 0.1,
                           "lr_sensitivity": sd_sens}}


def test_c11():
    unstable = {"by_width": {"64": width(0.3, 0.0, 0.03, 0.3), "128": width(0.5, 0.0, 0.01, 0.5)}}
    assert C.judge_c11(unstable).verdict == "supported"
    stable = {"by_width": {"64": width(0.0, 0.0, 0.1, 0.1), "128": width(0.0, 0.0, 0.1, 0.12)}}
    assert C.judge_c11(stable).verdict == "refuted"
    mixed = {"by_width": {"64": width(0.3, 0.0, 0.01, 0.3), "128": width(0.5, 0.0, 0.03, 0.1)}}
    assert C.judge_c11(mixed).verdict == "depends"


def test_c8():
    right = {"by_d": [{"d": d, "mean": 0.01 * math.sqrt(d), "se_mean": 0.05 * math.sqrt(d),
                       "std": math.sqrt(d)} for d in (16, 64, 256, 1024)]}
    assert C.judge_c8(right).verdict == "refuted"  # the thread's wording is wrong
    thread = {"by_d": [{"d": d, "mean": 0.5 * d, "se_mean": 0.01 * d, "std": math.sqrt(d)}
                       for d in (16, 64, 256, 1024)]}
    assert C.judge_c8(thread).verdict == "supported"


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
    assert C.judge_c9(ev).verdict == "depends"


def jac_curves(values, at_10):
    return {"curves": [{"n": 64, "s": [0.1 * i for i in range(len(values))], "jacobian": values,
                        "at_10_sc": at_10}], "grad_ratio_64": 0.5}


def test_c10():
    assert C.judge_c10(jac_curves([0.3, 0.2, 0.1], 0.01)).verdict == "supported"
    assert C.judge_c10(jac_curves([0.1, 0.3, 0.2], 0.03)).verdict == "depends"
    assert C.judge_c10(jac_curves([0.1, 0.3, 0.2], 0.2)).verdict == "refuted"


def test_c12():
    ev = {"init_std_scaled": {"16": 1.0, "1024": 1.0}, "trained_max_abs_logit": 5.0, "n": 64,
          "growth": 2.0}
    assert C.judge_c12(ev).verdict == "supported"
    assert C.judge_c12({**ev, "trained_max_abs_logit": 500.0}).verdict == "depends"
    assert C.judge_c12({**ev, "init_std_scaled": {"16": 4.0, "1024": 32.0}}).verdict == "refuted"


def q1_rows(modern_loss, modern_sens):
    rows = {"scaled_dot": {"best_loss": ci(1.0), "lr_sensitivity": 0.3}}
    for m in ("qk_layernorm", "softcap"):
        rows[m] = {"best_loss": ci(modern_loss), "lr_sensitivity": modern_sens}
    return rows


def test_q1():
    assert C.judge_q1({"by_task": {"mqar": q1_rows(1.0, 0.1), "text": q1_rows(0.9, 0.1)}}
                      ).verdict == "supported"
    assert C.judge_q1({"by_task": {"mqar": q1_rows(2.0, 0.1), "text": q1_rows(1.0, 0.5)}}
                      ).verdict == "refuted"
    assert C.judge_q1({"by_task": {"mqar": q1_rows(1.0, 0.1), "text": q1_rows(2.0, 0.1)}}
                      ).verdict == "depends"
    assert C.judge_q1({"by_task": {}}).verdict == "depends"


def test_q2():
    good = {"summary": {"logit_std": 2.0, "entropy": 2.4, "entropy_uniform": 3.9,
                        "entropy_unscaled": 0.35, "entropy_cosine_tau1": 3.85},
            "max_abs_logit": 20.0}
    assert C.judge_q2(good).verdict == "supported"
    bad = {"summary": {"logit_std": 9.0, "entropy": 3.89, "entropy_uniform": 3.9,
                       "entropy_unscaled": 3.8, "entropy_cosine_tau1": 3.85}, "max_abs_logit": 20.0}
    assert C.judge_q2(bad).verdict == "refuted"


def test_q3():
    acc = {"scaled_dot": {"n=64": ci(1.0), "n=128": ci(0.6), "n=256": ci(0.3)},
           "log_length": {"n=64": ci(1.0), "n=128": ci(0.8), "n=256": ci(0.7)}}
    assert C.judge_q3({"accuracy": acc}).verdict == "supported"
    acc["log_length"] = {"n=64": ci(1.0), "n=128": ci(0.5), "n=256": ci(0.2)}
    assert C.judge_q3({"accuracy": acc}).verdict == "refuted"
    acc["log_length"] = {"n=64": ci(1.0), "n=128": ci(0.7), "n=256": ci(0.3)}
    assert C.judge_q3({"accuracy": acc}).verdict == "depends"
    acc["log_length"] = {"n=64": ci(1.0), "n=128": ci(0.8), "n=256": ci(0.7)}
    assert C.judge_q3({"accuracy": acc, "chance": 0.25}).verdict == "supported"
    acc["scaled_dot"]["n=64"] = ci(0.3)  # the baseline never learned the task
    assert C.judge_q3({"accuracy": acc, "chance": 0.25}).verdict == "depends"


def test_verdict_values_are_checked():
    with pytest.raises(ValueError):
        C.Verdict("maybe", "rule", "because")
