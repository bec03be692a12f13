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

from attnscale.audit.rules_training import (
    C3_RULE,
    C4_RULE,
    C6_RULE,
    C7_RULE,
    C11_RULE,
    C13_RULE,
    Q1_RULE,
    Q3_RULE,
    judge_c3,
    judge_c4,
    judge_c6,
    judge_c7,
    judge_c11,
    judge_c13,
    judge_q1,
    judge_q3,
)
from attnscale.audit.verdicts import (
    DEPENDS,
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
    thread_wrong: str = ""  # what the thread gets wrong, shown when the data says so


C1_RULE = ("supported if attnscale.attention(score='scaled_dot') matches softmax(QKᵀ/√d)V "
           "(the float64 reference) and torch SDPA within 1e-5 on every tested case; else refuted")


def judge_c1(ev: Evidence) -> Verdict:
    """C1: the largest error of attention against the float64 reference and SDPA."""
    err = max(ev["max_err_vs_reference"], ev["max_err_vs_sdpa"])
    ok = err < 1e-5 and ev["cases"] > 0
    return Verdict(SUPPORTED if ok else REFUTED, C1_RULE,
                   f"max abs error {err:.2e} over {ev['cases']} cases "
                   f"(masks, causal, GQA, float32)", {"max_abs_error": err})


C2_RULE = ("supported if cosine logits τ·cos(q,k) lie in [−τ, τ] for every tested input "
           "(including q, k norms from 1e-3 to 1e3) and the cosine score matches its float64 "
           "reference within 1e-5; else refuted")


def judge_c2(ev: Evidence) -> Verdict:
    """C2: the range of cosine logits and the cosine score's exactness."""
    in_range = ev["max_abs_logit_tau1"] <= 1 + 1e-6 and ev["max_abs_logit_tau10"] <= 10 + 1e-5
    ok = in_range and ev["max_err_vs_reference"] < 1e-5
    return Verdict(SUPPORTED if ok else REFUTED, C2_RULE,
                   f"max |logit| {ev['max_abs_logit_tau1']:.6f} at τ=1 and "
                   f"{ev['max_abs_logit_tau10']:.5f} at τ=10; error vs reference "
                   f"{ev['max_err_vs_reference']:.1e}", dict(ev))


C5_RULE = ("From `attnscale bench`: cosine time / scaled_dot time on the same fused kernel, "
           "forward+backward. Supported if the overhead exceeds 10% at every N measured, refuted "
           "if it stays within 10% at every N, depends (on N) otherwise")


def judge_c5(ev: Evidence) -> Verdict:
    """C5: cosine / scaled_dot forward+backward time at each N."""
    ratios = ev["ratio_by_n"]  # {N: cosine_ms / scaled_dot_ms}
    over = [r > 1.10 for r in ratios.values()]
    verdict = SUPPORTED if all(over) else REFUTED if not any(over) else DEPENDS
    text = ", ".join(f"N={n}: {r:.2f}×" for n, r in sorted(ratios.items(), key=lambda x: int(x[0])))
    return Verdict(verdict, C5_RULE, f"cosine / scaled_dot fwd+bwd time: {text}", dict(ratios))


C8_RULE = ("Monte Carlo of q·k for unit-variance independent components over d_k. The thread's "
           "'E[q·k] grows like O(d_k)' is refuted if the mean is within 3 SE of 0 at every d_k "
           "while the std grows like √d_k (log-log slope within 0.5 ± 0.05); supported if the "
           "mean grows with d_k (slope of |mean| ≥ 0.9 and means > 3 SE); depends otherwise")


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
        verdict = DEPENDS
    worst = max(rows, key=lambda r: abs(r["mean"]) / r["se_mean"])
    return Verdict(verdict, C8_RULE,
                   f"std(q·k) ∝ d_k^{slope:.3f}; largest |mean|/SE = "
                   f"{abs(worst['mean']) / worst['se_mean']:.2f} (d_k={worst['d']})",
                   {"std_slope": slope, "mean_slope": mean_slope})


C9_RULE = ("Exact theory (checked by Monte Carlo) for softmax over n i.i.d. N(0, s²) logits: "
           "supported if normalized entropy falls monotonically with s, stays above 0.5 below "
           "s_c/2 and falls below 0.5 beyond s_c = √(2 ln n) for every n tested, with theory and "
           "Monte Carlo within 4 SE; refuted if entropy does not fall with s; depends otherwise")


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
        verdict = DEPENDS
    return Verdict(verdict, C9_RULE,
                   f"entropy monotone in s: {monotone}; sharp around s_c: {sharp}; max |z| "
                   f"theory vs MC {ev['max_abs_z']:.2f}; at d_k=64, n=512 unscaled logits (s=8) "
                   f"give max weight {ev['max_weight_unscaled_64_512']:.2f} vs "
                   f"{ev['max_weight_scaled_64_512']:.3f} scaled")


C10_RULE = ("RMS Frobenius norm of the softmax Jacobian against s (exact theory). Supported if it "
            "decreases monotonically with s (saturation alone shrinks gradients); depends if it "
            "peaks at an interior s and at s = 10·s_c is below 25% of its peak (gradients vanish "
            "deep in saturation AND near uniform); refuted if at 10·s_c it keeps ≥ 25% of its peak")


def judge_c10(ev: Evidence) -> Verdict:
    """C10: the softmax Jacobian norm against the logit scale s."""
    verdicts = []
    for curve in ev["curves"]:  # {"n", "s", "jacobian", "at_10_sc"}
        j = curve["jacobian"]
        peak = max(j)
        monotone = all(b <= a + 1e-12 for a, b in pairwise(j))
        ratio = curve["at_10_sc"] / peak
        verdicts.append(SUPPORTED if monotone else DEPENDS if ratio < 0.25 else REFUTED)
    verdict = verdicts[0] if len(set(verdicts)) == 1 else DEPENDS
    c = ev["curves"][-1]
    peak_s = c["s"][max(range(len(c["jacobian"])), key=lambda i: c["jacobian"][i])]
    return Verdict(verdict, C10_RULE,
                   f"n={c['n']}: ‖J‖ {c['jacobian'][0]:.3f} at s={c['s'][0]:.2g}, peak "
                   f"{max(c['jacobian']):.3f} at s={peak_s:.2f} "
                   f"(s_c={math.sqrt(2 * math.log(c['n'])):.2f}), "
                   f"{c['at_10_sc']:.3f} at 10·s_c; measured q/k gradient norm ratio "
                   f"unscaled/scaled at d_k=64: {ev.get('grad_ratio_64', float('nan')):.3g}")


C12_RULE = ("Supported if scaled_dot's logit std at init is O(1) (between 0.25 and 4) at every "
            "d_k AND after training at its best LR its max |logit| stays below 4·s_c(n); "
            "depends if O(1) at "
            "init but trained logits grow past that (learned q, k grow, as µP argues); refuted if "
            "init logits are not O(1)")


def judge_c12(ev: Evidence) -> Verdict:
    """C12: scaled_dot's logit size at initialization and after training."""
    init_ok = all(0.25 <= v <= 4 for v in ev["init_std_scaled"].values())
    trained = ev["trained_max_abs_logit"]
    limit = 4 * math.sqrt(2 * math.log(ev["n"]))
    verdict = REFUTED if not init_ok else SUPPORTED if trained < limit else DEPENDS
    inits = ", ".join(f"d_k={d}: {v:.2f}" for d, v in sorted(ev["init_std_scaled"].items(),
                                                              key=lambda x: int(x[0])))
    return Verdict(verdict, C12_RULE,
                   f"init logit std (scaled): {inits}; after training max |logit| {trained:.1f} "
                   f"(limit {limit:.1f}), growth ×{ev.get('growth', float('nan')):.1f} from init")


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
                   f"cosine τ=1 {s['entropy_cosine_tau1']:.2f}", {"checks": checks})


CLAIMS: list[Claim] = [
    Claim("C1", "Attention is softmax(QKᵀ/√d_k)V.", "exactness against a float64 reference",
          C1_RULE, judge_c1),
    Claim("C2", "Cosine similarity is an alternative scoring with scores in [−1, 1].",
          "range and exactness of the cosine score, with and without τ", C2_RULE, judge_c2),
    Claim("C3", "Cosine similarity throws away magnitude information the dot product keeps.",
          "salience task: accuracy across scores and seeds", C3_RULE, judge_c3),
    Claim("C4", "Softmax needs unbounded inputs; cosine's [−1, 1] range limits it.",
          "exact max-weight bound; MQAR with cosine at τ = 1, 10 and learned", C4_RULE, judge_c4,
          "The range limits the softmax only at a fixed small τ: a temperature removes it."),
    Claim("C5", "Cosine similarity adds computational overhead.",
          "fused-kernel time, cosine vs scaled dot", C5_RULE, judge_c5,
          "The extra work is O(N·d) normalization against O(N²·d) attention."),
    Claim("C6", "Empirical evidence favours the scaled dot product.",
          "training runs across tasks, scores, LRs and seeds", C6_RULE, judge_c6),
    Claim("C7", "Dropping the scaling would also keep magnitude information; why a constant √d_k?",
          "unscaled vs scaled across d_k", C7_RULE, judge_c7),
    Claim("C8", "E[q·k] grows like O(d_k).", "Monte Carlo of q·k; init and trained logits",
          C8_RULE, judge_c8,
          "The mean of q·k is 0; its variance is d_k, so its typical size is √d_k."),
    Claim("C9", "Large dot products make the softmax peaky.",
          "entropy, max weight, effective keys vs scale, d_k and n", C9_RULE, judge_c9),
    Claim("C10", "A saturated softmax gives vanishing gradients.",
          "softmax Jacobian norm and q/k gradient norms vs scale", C10_RULE, judge_c10,
          "The Jacobian also vanishes toward a uniform softmax: the curve is not monotone."),
    Claim("C11", "Training is unstable without scaling, especially for larger models.",
          "LR sweeps across widths: divergence, stable LR range, LR sensitivity",
          C11_RULE, judge_c11),
    Claim("C12", "Dividing by √d_k keeps logits O(1): no saturation, gradients flow.",
          "logit size at init and after training", C12_RULE, judge_c12),
    Claim("C13", "(Paper) For large d_k unscaled attention underperforms; 1/√d_k counteracts it.",
          "unscaled vs scaled as a function of d_k", C13_RULE, judge_c13),
]

QUESTIONS: list[Claim] = [
    Claim("Q1", "Which alternatives do modern models use, and how do they compare?",
          "every score on the same tasks and LR grid", Q1_RULE, judge_q1),
    Claim("Q2", "In a real trained model (all-MiniLM-L6-v2), how large are the logits, how far "
          "from uniform is attention, and what would entropy be without 1/√d_k?",
          "offline inspection with counterfactual scores", Q2_RULE, judge_q2),
    Claim("Q3", "At long context does a fixed 1/√d_k spread attention too thin, and does log-n "
          "scaling help length generalization?", "train at n, evaluate at 2n and 4n",
          Q3_RULE, judge_q3),
]
