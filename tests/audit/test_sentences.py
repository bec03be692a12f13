"""Sentences cannot contradict verdicts: for every rule with verdict-dependent wording and every
verdict it can give, no headline or plain-language sentence carries a phrase that only another
verdict may use ("held up" or "Right:" for an undecided comparison, "Undecided" for a decided
one). The evidence comes from each rule's own flip tests, which pin the verdict it gives."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import test_rules_jacobian as TJ
import test_rules_sweep as TS
import test_rules_tasks as TK
import test_rules_training as TT

from attnscale.audit import rules_jacobian, rules_sweep, rules_tasks, rules_training
from attnscale.audit import verdicts as V
from attnscale.audit.verdicts import Verdict

# Phrases that assert one verdict; a sentence under any other verdict must not hold them.
ONLY = {
    V.SUPPORTED: ("Right:", "holds in its own regime", "wins every comparison",
                  "the bound limits cosine attention at every τ", "It cannot see a cue"),
    V.REFUTED: ("Wrong", "does not show at this budget", "No comparison favours",
                "Even τ=1 is enough", "It still found a cue", "None matched"),
    V.DEPENDS: ("Partly right", "it depends on τ", "Which alternative and which task decide",
                "does not grow with d_k at this budget", "Right for the typical row"),
    V.INCONCLUSIVE: ("Undecided", "too wide to", "Not decided", "not decided"),
}

CASES: dict[str, dict[str, Callable[[], Verdict]]] = {
    "C3": {
        V.SUPPORTED: lambda: rules_tasks.judge_c3(TK.c3(TK.Draw(4),
                                                        dict.fromkeys(TK.C3_ARMS, 0.13))),
        V.REFUTED: lambda: rules_tasks.judge_c3(TK.c3(TK.Draw(4),
                                                      dict.fromkeys(TK.C3_ARMS, 0.9))),
        V.DEPENDS: lambda: rules_tasks.judge_c3(TK.c3(TK.Draw(4), {
            "cosine_tau1": 0.13, "cosine_tau10": 0.13, "cosine_learned": 0.9})),
        V.INCONCLUSIVE: lambda: rules_tasks.judge_c3(TK.c3(TK.Draw(4, n=2),
                                                           dict.fromkeys(TK.C3_ARMS, 0.13))),
    },
    "C4": {
        V.SUPPORTED: lambda: rules_tasks.judge_c4(TK.c4(TK.Draw(0), TK.ALL_HIGH)),
        V.REFUTED: lambda: rules_tasks.judge_c4(TK.c4(TK.Draw(0), {**TK.ALL_HIGH,
                                                                   "cosine_tau1": 1.0})),
        V.DEPENDS: lambda: rules_tasks.judge_c4(TK.c4(TK.Draw(0), {
            **TK.ALL_HIGH, "cosine_tau10": 1.0, "cosine_learned": 0.8})),
        V.INCONCLUSIVE: lambda: rules_tasks.judge_c4(TK.c4(TK.Draw(0, n=2), TK.ALL_HIGH)),
    },
    "Q3": {
        V.SUPPORTED: lambda: rules_tasks.judge_q3(TK.q3(TK.Draw(9), (0.0, -0.1, -0.3))),
        V.REFUTED: lambda: rules_tasks.judge_q3(TK.q3(TK.Draw(9), (0.0, 0.0, 0.0))),
        V.DEPENDS: lambda: rules_tasks.judge_q3(TK.q3(TK.Draw(9), (0.0, -0.2, 0.0))),
        V.INCONCLUSIVE: lambda: rules_tasks.judge_q3(TK.q3(TK.Draw(9, n=2), (0.0, -0.1, -0.3))),
    },
    "C7": {
        V.SUPPORTED: lambda: rules_training.judge_c7(TT.head_dim(TT.Draw(0), 0.0)),
        V.DEPENDS: lambda: rules_training.judge_c7(TT.head_dim(TT.Draw(0), 0.2, absorbed=0.0)),
        V.INCONCLUSIVE: lambda: rules_training.judge_c7(TT.head_dim(TT.Draw(0, n=2), 0.0)),
    },
    "C13": {
        V.SUPPORTED: lambda: rules_training.judge_c13(TT.head_dim(TT.Draw(4), TT.growing)),
        V.REFUTED: lambda: rules_training.judge_c13(TT.head_dim(TT.Draw(4), 0.0)),
        V.DEPENDS: lambda: rules_training.judge_c13(TT.head_dim(TT.Draw(4), 0.2)),
        V.INCONCLUSIVE: lambda: rules_training.judge_c13(TT.head_dim(TT.Draw(4, n=2),
                                                                     TT.growing)),
    },
    "C6": {
        V.SUPPORTED: lambda: rules_training.judge_c6(TT.c6(TT.Draw(8), {"dot": 0.2,
                                                                        "cosine_tau1": 0.3})),
        V.REFUTED: lambda: rules_training.judge_c6(TT.c6(TT.Draw(8), {"dot": -0.2,
                                                                      "cosine_tau1": 0.0})),
        V.DEPENDS: lambda: rules_training.judge_c6(TT.c6(TT.Draw(8), {"dot": 0.2,
                                                                      "cosine_tau1": -0.2})),
        V.INCONCLUSIVE: lambda: rules_training.judge_c6(TT.c6(TT.Draw(8, n=2), {
            "dot": 0.2, "cosine_tau1": 0.3})),
    },
    "C11": {
        V.SUPPORTED: lambda: rules_sweep.judge_c11(TS.c11(TS.Draw(0), (0.05, 0.3),
                                                          unstable=(0.0, 0.5))),
        V.REFUTED: lambda: rules_sweep.judge_c11(TS.c11(TS.Draw(0, n=8), (0.0, 0.0))),
        V.DEPENDS: lambda: rules_sweep.judge_c11(TS.c11(TS.Draw(0), (0.3, 0.3))),
        V.INCONCLUSIVE: lambda: rules_sweep.judge_c11(TS.c11(TS.Draw(0, n=2), (0.05, 0.3))),
    },
    "Q1": {
        V.SUPPORTED: lambda: rules_sweep.judge_q1(TS.q1(TS.Draw(3),
                                                        dict.fromkeys(TS.WIDTHS, TS.MATCHES))),
        V.REFUTED: lambda: rules_sweep.judge_q1(TS.q1(TS.Draw(3),
                                                      dict.fromkeys(TS.WIDTHS, TS.NONE))),
        V.DEPENDS: lambda: rules_sweep.judge_q1(TS.q1(TS.Draw(3), {TS.WIDTHS[0]: TS.MATCHES,
                                                                   TS.WIDTHS[1]: TS.NONE})),
        V.INCONCLUSIVE: lambda: rules_sweep.judge_q1(TS.q1(TS.Draw(3, n=2), dict.fromkeys(
            TS.WIDTHS, TS.MATCHES))),
    },
    "C10": {
        V.SUPPORTED: lambda: rules_jacobian.judge_c10(TJ.evidence(TJ.exponential,
                                                                  TJ.exponential)),
        V.REFUTED: lambda: rules_jacobian.judge_c10(TJ.evidence(TJ.power, TJ.power)),
        V.DEPENDS: lambda: rules_jacobian.judge_c10(TJ.evidence(TJ.exponential, TJ.power)),
        V.INCONCLUSIVE: lambda: rules_jacobian.judge_c10({"curves": [TJ.curve(64)]}),
    },
}


@pytest.mark.parametrize(("claim", "verdict"),
                         [(c, v) for c, by in CASES.items() for v in by])
def test_no_sentence_reads_as_another_verdict(claim, verdict):
    v = CASES[claim][verdict]()
    assert v.verdict == verdict, (claim, v.verdict, v.because)
    text = [v.headline, *v.plain]
    for other, phrases in ONLY.items():
        if other == verdict:
            continue
        for sentence in text:
            hit = [p for p in phrases if p in sentence]
            assert not hit, f"{claim} {verdict}: {hit} (a {other} phrase) in {sentence!r}"
    assert v.headline.startswith(verdict), v.headline


def test_every_rule_with_worded_verdicts_is_covered():
    """Each of these rules gives every verdict it can here, so a new wording is checked (C7
    cannot be refuted: that would need the exact identity to fail, which raises)."""
    assert all(set(by) == set(V.VERDICTS) - ({V.REFUTED} if c == "C7" else set())
               for c, by in CASES.items())
    assert set(CASES) == {"C3", "C4", "Q3", "C7", "C13", "C6", "C11", "Q1", "C10"}
