"""The training rules flip when fed the opposite evidence: no verdict is hard-coded."""

from __future__ import annotations

import pytest

from attnscale.audit import rules_training as T
from attnscale.audit import verdicts as V


def ci(mean, half=0.01, n=3):
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def test_c3():
    ev = {"accuracy": {"scaled_dot": ci(0.95), "cosine_tau1": ci(0.2), "cosine_tau10": ci(0.3),
                       "cosine_learned": ci(0.4)}, "chance": 0.125}
    assert T.judge_c3(ev).verdict == "supported"
    ev["accuracy"]["cosine_learned"] = ci(0.96)
    assert T.judge_c3(ev).verdict == "refuted"
    ev["accuracy"]["cosine_learned"] = ci(0.9, 0.03)
    assert T.judge_c3(ev).verdict == "depends"
    ev["accuracy"]["scaled_dot"] = ci(0.13)  # nothing learned: inconclusive, whatever cosine does
    ev["accuracy"]["cosine_learned"] = ci(0.12)
    assert T.judge_c3(ev).verdict == "depends"
    assert "inconclusive" in T.judge_c3(ev).because


def test_c4():
    ev = {"accuracy": {"scaled_dot": ci(1.0), "cosine_tau1": ci(0.1), "cosine_tau10": ci(0.99),
                       "cosine_learned": ci(0.98)}, "max_weight_bound": 0.0142, "n": 512,
          "chance": 0.25}
    assert T.judge_c4(ev).verdict == "depends"
    ev["accuracy"]["cosine_tau10"] = ci(0.2)
    ev["accuracy"]["cosine_learned"] = ci(0.1)
    assert T.judge_c4(ev).verdict == "supported"
    ev["accuracy"]["cosine_tau1"] = ci(0.95)
    assert T.judge_c4(ev).verdict == "refuted"
    ev["accuracy"] = {k: ci(0.27) for k in ev["accuracy"]}  # chance 0.25: nothing learned
    assert T.judge_c4(ev).verdict == "depends"


def test_c6():
    ev = {"best_loss": {t: {"scaled_dot": ci(1.0), "dot": ci(1.5), "cosine_tau1": ci(2.0)}
                        for t in ("mqar", "text")}}
    assert T.judge_c6(ev).verdict == "supported"
    for t in ev["best_loss"]:
        ev["best_loss"][t]["cosine_tau1"] = ci(0.5)
    assert T.judge_c6(ev).verdict == "refuted"
    ev["best_loss"]["text"]["cosine_tau1"] = ci(2.0)
    assert T.judge_c6(ev).verdict == "depends"


def dk(gaps):
    return {"best_loss": {str(d): {"scaled_dot": ci(1.0), "dot": ci(1.0 + g)}
                          for d, g in zip((8, 32, 128), gaps, strict=True)}}


def test_c7_and_c13():
    growing = dk([0.0, 0.2, 0.8])
    assert T.judge_c7(growing).verdict == "refuted"
    assert T.judge_c13(growing).verdict == "supported"
    flat = dk([0.0, 0.0, 0.0])
    assert T.judge_c7(flat).verdict == "supported"
    assert T.judge_c13(flat).verdict == "refuted"
    middle = dk([0.0, 0.5, 0.0])
    assert T.judge_c7(middle).verdict == "depends"
    shrinking = dk([0.9, 0.5, 0.3])
    assert T.judge_c13(shrinking).verdict == "depends"


def width(dot_div, sd_div, dot_lr, dot_sens, sd_sens=0.1):
    return {"dot": {"divergence_rate": dot_div, "max_stable_lr": dot_lr,
                    "lr_sensitivity": dot_sens},
            "scaled_dot": {"divergence_rate": sd_div, "max_stable_lr": 0.1,
                           "lr_sensitivity": sd_sens}}


def test_c11():
    unstable = {"by_width": {"64": width(0.3, 0.0, 0.03, 0.3), "128": width(0.5, 0.0, 0.01, 0.5)}}
    assert T.judge_c11(unstable).verdict == "supported"
    stable = {"by_width": {"64": width(0.0, 0.0, 0.1, 0.1), "128": width(0.0, 0.0, 0.1, 0.12)}}
    assert T.judge_c11(stable).verdict == "refuted"
    mixed = {"by_width": {"64": width(0.3, 0.0, 0.01, 0.3), "128": width(0.5, 0.0, 0.03, 0.1)}}
    assert T.judge_c11(mixed).verdict == "depends"


def q1_rows(modern_loss, modern_sens):
    rows = {"scaled_dot": {"best_loss": ci(1.0), "lr_sensitivity": 0.3}}
    for m in ("qk_layernorm", "softcap"):
        rows[m] = {"best_loss": ci(modern_loss), "lr_sensitivity": modern_sens}
    return rows


def test_q1():
    assert T.judge_q1({"by_task": {"mqar": q1_rows(1.0, 0.1), "text": q1_rows(0.9, 0.1)}}
                      ).verdict == "supported"
    assert T.judge_q1({"by_task": {"mqar": q1_rows(2.0, 0.1), "text": q1_rows(1.0, 0.5)}}
                      ).verdict == "refuted"
    assert T.judge_q1({"by_task": {"mqar": q1_rows(1.0, 0.1), "text": q1_rows(2.0, 0.1)}}
                      ).verdict == "depends"
    assert T.judge_q1({"by_task": {}}).verdict == "depends"


def test_q3():
    acc = {"scaled_dot": {"n=64": ci(1.0), "n=128": ci(0.6), "n=256": ci(0.3)},
           "log_length": {"n=64": ci(1.0), "n=128": ci(0.8), "n=256": ci(0.7)}}
    assert T.judge_q3({"accuracy": acc}).verdict == "supported"
    acc["log_length"] = {"n=64": ci(1.0), "n=128": ci(0.5), "n=256": ci(0.2)}
    assert T.judge_q3({"accuracy": acc}).verdict == "refuted"
    acc["log_length"] = {"n=64": ci(1.0), "n=128": ci(0.7), "n=256": ci(0.3)}
    assert T.judge_q3({"accuracy": acc}).verdict == "depends"
    acc["log_length"] = {"n=64": ci(1.0), "n=128": ci(0.8), "n=256": ci(0.7)}
    assert T.judge_q3({"accuracy": acc, "chance": 0.25}).verdict == "supported"
    acc["scaled_dot"]["n=64"] = ci(0.3)  # the baseline never learned the task
    assert T.judge_q3({"accuracy": acc, "chance": 0.25}).verdict == "depends"


def test_shared_comparisons():
    assert V.above(ci(0.9), ci(0.5)) and not V.above(ci(0.5), ci(0.49))
    assert V.above({"mean": 0.6}, {"mean": 0.5})  # single seeds: the means
    assert V.not_learned(ci(0.3), chance=0.25) and not V.not_learned(ci(0.6), chance=0.25)
    assert V.fmt_ci(ci(0.5)) == "0.5 [0.49, 0.51]" and V.fmt_ci({"mean": 0.5}) == "0.5"
    assert V.fmt_ci(None) == "n/a"
    assert V.loglog_slope([1, 10, 100], [2, 20, 200]) == pytest.approx(1.0)
