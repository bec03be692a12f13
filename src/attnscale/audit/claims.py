"""The claims of the "why √d_k?" thread and the rules that judge them.

The thread is a public Q&A, "Why do we use square root of key dimension for scaling?", whose
last answer quotes Vaswani et al. 2017 (arXiv 1706.03762, §3.2.1). Its claims C1–C13 and three
questions beyond it (Q1–Q3) are stated, with what measuring each involves, in docs/claims.md.

Every rule is a pure function of an evidence dict (numbers the report measured and stored) and
returns a :class:`attnscale.audit.verdicts.Verdict`: ``supported``, ``refuted`` or ``depends``,
the rule as printed text, and a sentence with the numbers that decided it. No verdict is
written by hand: feed a rule the opposite evidence and its verdict flips (the tests do exactly
that). The rules that training decides live in :mod:`attnscale.audit.rules_training`; this
module holds the rest (implementation, cost, theory, the MiniLM inspection) and the lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from attnscale.audit.rules_cost import C5_RULE, judge_c5
from attnscale.audit.rules_jacobian import C10_RULE, judge_c10
from attnscale.audit.rules_sweep import C11_RULE, C12_RULE, Q1_RULE, judge_c11, judge_c12, judge_q1
from attnscale.audit.rules_tasks import C3_RULE, C4_RULE, Q3_RULE, judge_c3, judge_c4, judge_q3
from attnscale.audit.rules_training import (
    C6_RULE,
    C7_RULE,
    C13_RULE,
    judge_c6,
    judge_c7,
    judge_c13,
)
from attnscale.audit.verdicts import (
    DEPENDS,
    INCONCLUSIVE,
    REFUTED,
    SUPPORTED,
    Evidence,
    Verdict,
    loglog_slope,
)


@dataclass(frozen=True)
class Claim:
    """One claim (or question): its statement, what is measured, its rule and judge."""

    id: str
    text: str
    measures: str
    rule: str
    judge: Callable[[Evidence], Verdict]


C1_RULE = ("supported if attnscale.attention(score='scaled_dot') matches softmax(QKᵀ/√d)V "
           "(the float64 reference) and torch SDPA within 1e-5 on every tested case; else refuted")


def judge_c1(ev: Evidence) -> Verdict:
    """C1: the largest error of attention against the float64 reference and SDPA."""
    err = max(ev["max_err_vs_reference"], ev["max_err_vs_sdpa"])
    ok = err < 1e-5 and ev["cases"] > 0
    plain = [f"attnscale's scaled_dot matches the formula softmax(QKᵀ/√d_k)V and PyTorch's SDPA "
             f"to {err:.1e} over {ev['cases']} cases (masks, causal, GQA)."
             if ok else f"attnscale's scaled_dot is {err:.1e} from the formula: a bug."]
    return Verdict(SUPPORTED if ok else REFUTED, C1_RULE,
                   f"max abs error {err:.2e} over {ev['cases']} cases "
                   f"(masks, causal, GQA, float32)", {"max_abs_error": err},
                   headline=f"{'supported' if ok else 'refuted'}: max error {err:.1e}",
                   plain=plain, regime="float32 on CPU", smallest="1e-5 absolute")


C2_RULE = ("supported if cosine logits τ·cos(q,k) lie in [−τ, τ] for every tested input "
           "(including q, k norms from 1e-3 to 1e3) and the cosine score matches its float64 "
           "reference within 1e-5; else refuted")


def judge_c2(ev: Evidence) -> Verdict:
    """C2: the range of cosine logits and the cosine score's exactness."""
    in_range = ev["max_abs_logit_tau1"] <= 1 + 1e-6 and ev["max_abs_logit_tau10"] <= 10 + 1e-5
    ok = in_range and ev["max_err_vs_reference"] < 1e-5
    plain = [f"Cosine logits {'stayed within' if in_range else 'left'} [−τ, τ] (largest |logit| "
             f"{ev['max_abs_logit_tau1']:.3f} at τ=1, {ev['max_abs_logit_tau10']:.2f} at τ=10) "
             f"for q, k norms from 1e-3 to 1e3.",
             "Only with τ = 1 is the range [−1, 1]: practice learns or fixes a larger τ (C4)."]
    return Verdict(SUPPORTED if ok else REFUTED, C2_RULE,
                   f"max |logit| {ev['max_abs_logit_tau1']:.6f} at τ=1 and "
                   f"{ev['max_abs_logit_tau10']:.5f} at τ=10; error vs reference "
                   f"{ev['max_err_vs_reference']:.1e}", dict(ev),
                   headline=f"{'supported' if ok else 'refuted'}: |τ·cos| ≤ τ",
                   plain=plain, smallest="1e-5 absolute against the float64 formula")


C8_RULE = ("Monte Carlo of q·k for unit-variance independent components over d_k. The thread's "
           "'E[q·k] grows like O(d_k)' is refuted if the mean is within 3 SE of 0 at every d_k "
           "while the std grows like √d_k (log-log slope within 0.5 ± 0.05); supported if the "
           "mean grows with d_k (slope of |mean| ≥ 0.9 and means > 3 SE); inconclusive otherwise")


def judge_c8(ev: Evidence) -> Verdict:
    """C8: mean and spread of q·k over d_k (Monte Carlo)."""
    rows = sorted(ev["by_d"], key=lambda r: r["d"])
    zero_mean = all(abs(r["mean"]) <= 3 * r["se_mean"] for r in rows)
    slope = loglog_slope([r["d"] for r in rows], [r["std"] for r in rows])
    mean_slope = loglog_slope([r["d"] for r in rows], [abs(r["mean"]) + 1e-12 for r in rows])
    grows = mean_slope >= 0.9 and all(abs(r["mean"]) > 3 * r["se_mean"] for r in rows)
    if zero_mean and abs(slope - 0.5) <= 0.05:
        verdict = REFUTED
    elif grows:
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    worst = max(rows, key=lambda r: abs(r["mean"]) / r["se_mean"])
    z = abs(worst["mean"]) / worst["se_mean"]
    plain = [f"Wrong as worded: E[q·k] is 0 at every d_k (largest |mean| is {z:.1f} standard "
             f"errors from 0)." if verdict == REFUTED else
             f"The mean of q·k is {z:.1f} standard errors from 0 at worst (d_k={worst['d']}), "
             f"growing with d_k like d_k^{mean_slope:.2f}.",
             f"What grows is the spread: std(q·k) ∝ d_k^{slope:.2f} (√d_k would be 0.50), the "
             f"size that 1/√d_k undoes.",
             "It depends on q and k having independent unit-variance components (init=unit)."]
    return Verdict(verdict, C8_RULE,
                   f"std(q·k) ∝ d_k^{slope:.3f}; largest |mean|/SE = {z:.2f} "
                   f"(d_k={worst['d']})", {"std_slope": slope, "mean_slope": mean_slope},
                   headline=f"{verdict}: |mean| ≤ {z:.1f} SE, std ∝ d_k^{slope:.2f}",
                   plain=plain,
                   regime="independent unit-variance components",
                   smallest="3 standard errors for the mean; ±0.05 on the slope")


C9_RULE = ("Exact theory (checked by Monte Carlo) for softmax over n i.i.d. N(0, s²) logits: "
           "supported if normalized entropy falls monotonically with s, stays above 0.5 below "
           "s_c/2 and falls below 0.5 beyond s_c = √(2 ln n) for every n tested, with theory and "
           "Monte Carlo within 4 SE; refuted if entropy does not fall with s; inconclusive "
           "otherwise")


def judge_c9(ev: Evidence) -> Verdict:
    """C9: softmax entropy against the logit scale s around s_c = √(2 ln n)."""
    ok_mc = ev["max_abs_z"] <= 4.0
    monotone, sharp = True, True
    for curve in ev["curves"]:  # {"n", "s": [...], "entropy_norm": [...]}
        h, s, sc = curve["entropy_norm"], curve["s"], math.sqrt(2 * math.log(curve["n"]))
        monotone &= all(b <= a + 1e-9 for a, b in pairwise(h))
        sharp &= all(v > 0.5 for x, v in zip(s, h, strict=True) if x < sc / 2)
        sharp &= all(v < 0.5 for x, v in zip(s, h, strict=True) if x > sc)
    if not monotone:
        verdict = REFUTED
    elif sharp and ok_mc:
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    w_un, w_sc = ev["max_weight_unscaled_64_512"], ev["max_weight_scaled_64_512"]
    plain = [f"{'Right' if verdict == SUPPORTED else 'Checked'}: entropy falls with the logit "
             f"scale s: {monotone}; it drops through half of ln n near s_c = √(2 ln n): {sharp}; "
             f"theory and Monte Carlo within {ev['max_abs_z']:.1f} SE.",
             f"At d_k = 64 over 512 keys, unscaled logits (s = 8) put {w_un:.2f} of the weight "
             f"on one key on average, scaled ones {w_sc:.3f}.",
             "The threshold grows only like √(ln n): longer contexts tolerate little more."]
    return Verdict(verdict, C9_RULE,
                   f"entropy monotone in s: {monotone}; sharp around s_c: {sharp}; max |z| "
                   f"theory vs MC {ev['max_abs_z']:.2f}; at d_k=64, n=512 unscaled logits (s=8) "
                   f"give max weight {ev['max_weight_unscaled_64_512']:.2f} vs "
                   f"{ev['max_weight_scaled_64_512']:.3f} scaled", headline=f"{verdict}: "
                   f"max weight {w_un:.2f} unscaled vs {w_sc:.3f} scaled (d_k=64, n=512)",
                   plain=plain, regime="n i.i.d. N(0, s²) logits",
                   smallest="4 standard errors between theory and Monte Carlo")


Q2_RULE = ("all-MiniLM-L6-v2 on real text. Hypothesis: logits are O(1) per head (mean logit std "
           "< s_c of the sentence length) and attention is far from uniform (mean entropy < 90% "
           "of ln n), while removing 1/√d would collapse the entropy (below half of the actual). "
           "Supported if all three hold, refuted if none holds, depends otherwise")


def judge_q2(ev: Evidence) -> Verdict:
    """Q2: logit size and attention entropy of all-MiniLM-L6-v2, with counterfactuals."""
    s = ev["summary"]
    sc = math.sqrt(2 * math.log(math.exp(s["entropy_uniform"])))
    checks = [s["logit_std"] < sc, s["entropy"] < 0.9 * s["entropy_uniform"],
              s["entropy_unscaled"] < 0.5 * s["entropy"]]
    verdict = SUPPORTED if all(checks) else REFUTED if not any(checks) else DEPENDS
    return Verdict(verdict, Q2_RULE,
                   f"mean logit std {s['logit_std']:.2f} (s_c {sc:.2f}), max |logit| up to "
                   f"{ev['max_abs_logit']:.1f}; entropy {s['entropy']:.2f} vs uniform "
                   f"{s['entropy_uniform']:.2f} nats; without 1/√d {s['entropy_unscaled']:.2f}; "
                   f"cosine τ=1 {s['entropy_cosine_tau1']:.2f}", {"checks": checks},
                   headline=f"{verdict}: logit std {s['logit_std']:.2f}, entropy "
                   f"{s['entropy']:.2f} of {s['entropy_uniform']:.2f} nats",
                   plain=[f"MiniLM's trained logits have std {s['logit_std']:.2f} against s_c "
                          f"{sc:.2f} ({'below' if checks[0] else 'at or past'} saturation); "
                          f"attention entropy is {s['entropy']:.2f} of "
                          f"{s['entropy_uniform']:.2f} nats ({'far from' if checks[1] else 'near'}"
                          f" uniform).",
                          f"Without 1/√d_k the same queries and keys would give entropy "
                          f"{s['entropy_unscaled']:.2f} nats "
                          f"({'collapse' if checks[2] else 'no collapse'}); cosine at τ=1 would "
                          f"give {s['entropy_cosine_tau1']:.2f}.",
                          "This is one trained model on short sentences; other models differ."],
                   regime="all-MiniLM-L6-v2, real sentences")


CLAIMS: list[Claim] = [
    Claim("C1", "Attention is softmax(QKᵀ/√d_k)V.", "exactness against a float64 reference",
          C1_RULE, judge_c1),
    Claim("C2", "Cosine similarity is an alternative scoring with scores in [−1, 1].",
          "range and exactness of the cosine score, with and without τ", C2_RULE, judge_c2),
    Claim("C3", "Cosine similarity throws away magnitude information the dot product keeps.",
          "salience with the cue on ‖k‖ only, and two controls: paired accuracy",
          C3_RULE, judge_c3),
    Claim("C4", "Softmax needs unbounded inputs; cosine's [−1, 1] range limits it.",
          "exact max-weight bound; retrieval at n = 32, cosine τ = 1, 2, 4, 10, learned",
          C4_RULE, judge_c4),
    Claim("C5", "Cosine similarity adds computational overhead.",
          "interleaved timing ratios against a noise floor, N = 256 to 4096", C5_RULE, judge_c5),
    Claim("C6", "Empirical evidence favours the scaled dot product.",
          "text at two widths and retrieval, LRs chosen on other seeds: paired losses",
          C6_RULE, judge_c6),
    Claim("C7", "Dropping the scaling would also keep magnitude information; why a constant √d_k?",
          "unscaled, scaled and absorbed over d_k, both init regimes", C7_RULE, judge_c7),
    Claim("C8", "E[q·k] grows like O(d_k).", "Monte Carlo of q·k; init and trained logits",
          C8_RULE, judge_c8),
    Claim("C9", "Large dot products make the softmax peaky.",
          "entropy, max weight, effective keys vs scale, d_k and n", C9_RULE, judge_c9),
    Claim("C10", "A saturated softmax gives vanishing gradients.",
          "per-row softmax Jacobian norm distribution against s", C10_RULE, judge_c10),
    Claim("C11", "Training is unstable without scaling, especially for larger models.",
          "LR sweeps at two widths: instability, LR sensitivity, max |logit|",
          C11_RULE, judge_c11),
    Claim("C12", "Dividing by √d_k keeps logits O(1): no saturation, gradients flow.",
          "the model's logit std at init; trained max |logit| at every LR", C12_RULE, judge_c12),
    Claim("C13", "(Paper) For large d_k unscaled attention underperforms; 1/√d_k counteracts it.",
          "unscaled vs scaled over d_k: the gap and its slope", C13_RULE, judge_c13),
]

QUESTIONS: list[Claim] = [
    Claim("Q1", "Which alternatives do modern models use, and how do they compare?",
          "modern scores on the same LR sweep at two widths", Q1_RULE, judge_q1),
    Claim("Q2", "In a real trained model (all-MiniLM-L6-v2), how large are the logits, how far "
          "from uniform is attention, and what would entropy be without 1/√d_k?",
          "offline inspection with counterfactual scores", Q2_RULE, judge_q2),
    Claim("Q3", "At long context does a fixed 1/√d_k spread attention too thin, and does log-n "
          "scaling help length generalization?", "train at n, evaluate at 2n and 4n",
          Q3_RULE, judge_q3),
]
