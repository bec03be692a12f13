"""The claims of the "why √d_k?" thread (../shared/CLAIMS.md) and the rules that judge them.

Every rule is a pure function of an evidence dict (numbers the report measured and stored) and
returns a :class:`Verdict`: ``supported``, ``refuted`` or ``depends``, the rule as printed text,
and a sentence with the numbers that decided it. No verdict is written by hand: feed a rule the
opposite evidence and its verdict flips (tests/test_claims.py does exactly that).

Evidence conventions: a "mean ± CI" is a dict {"mean", "lo", "hi", "n"} (95% t-interval over
seeds); accuracies are in [0, 1]; losses are final eval losses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

SUPPORTED, REFUTED, DEPENDS = "supported", "refuted", "depends"
VERDICTS = (SUPPORTED, REFUTED, DEPENDS)

Evidence = dict[str, Any]


@dataclass
class Verdict:
    verdict: str
    rule: str
    because: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    measures: str
    rule: str
    judge: Callable[[Evidence], Verdict]
    thread_wrong: str = ""  # what the thread gets wrong, shown when the data says so


def _ci(x: dict) -> str:
    if x is None:
        return "n/a"
    if x.get("lo") is None or x.get("hi") is None or x.get("n", 1) < 2:
        return f"{x['mean']:.3g}"
    return f"{x['mean']:.3g} [{x['lo']:.3g}, {x['hi']:.3g}]"


def _above(a: dict, b: dict, margin: float = 0.0) -> bool:
    """a is above b: a's lower CI bound exceeds b's upper bound plus ``margin``
    (for single-seed values, the means are compared)."""
    a_lo = a["lo"] if a.get("lo") is not None else a["mean"]
    b_hi = b["hi"] if b.get("hi") is not None else b["mean"]
    return a_lo > b_hi + margin


# --------------------------------------------------------------------------------------------
# C1, C2: the implementation
# --------------------------------------------------------------------------------------------

C1_RULE = ("supported if attnscale.attention(score='scaled_dot') matches softmax(QKᵀ/√d)V "
           "(the float64 reference) and torch SDPA within 1e-5 on every tested case; else refuted")


def judge_c1(ev: Evidence) -> Verdict:
    err = max(ev["max_err_vs_reference"], ev["max_err_vs_sdpa"])
    ok = err < 1e-5 and ev["cases"] > 0
    return Verdict(SUPPORTED if ok else REFUTED, C1_RULE,
                   f"max abs error {err:.2e} over {ev['cases']} cases "
                   f"(masks, causal, GQA, float32)", {"max_abs_error": err})


C2_RULE = ("supported if cosine logits τ·cos(q,k) lie in [−τ, τ] for every tested input "
           "(including q, k norms from 1e-3 to 1e3) and the cosine score matches its float64 "
           "reference within 1e-5; else refuted")


def judge_c2(ev: Evidence) -> Verdict:
    in_range = ev["max_abs_logit_tau1"] <= 1 + 1e-6 and ev["max_abs_logit_tau10"] <= 10 + 1e-5
    ok = in_range and ev["max_err_vs_reference"] < 1e-5
    return Verdict(SUPPORTED if ok else REFUTED, C2_RULE,
                   f"max |logit| {ev['max_abs_logit_tau1']:.6f} at τ=1 and "
                   f"{ev['max_abs_logit_tau10']:.5f} at τ=10; error vs reference "
                   f"{ev['max_err_vs_reference']:.1e}", dict(ev))


# --------------------------------------------------------------------------------------------
# C3, C4: cosine on tasks
# --------------------------------------------------------------------------------------------

NOT_LEARNED = (". Guard: if scaled_dot's accuracy CI stays below twice chance the task was not "
               "learned and the verdict is depends (inconclusive)")
C3_RULE = ("On the salience task (the relevant key is marked only by its norm): supported if "
           "scaled_dot's accuracy is above EVERY cosine variant (τ=1, τ=10, learned τ) by more "
           "than 0.05 with non-overlapping 95% CIs; refuted if the best cosine variant's CI "
           "reaches scaled_dot's mean or higher; depends otherwise")


def _not_learned(acc: dict, chance: float) -> bool:
    """The baseline's accuracy CI does not clear twice chance: the task was not learned."""
    hi = acc["hi"] if acc.get("hi") is not None else acc["mean"]
    return hi < 2 * chance


def judge_c3(ev: Evidence) -> Verdict:
    dot = ev["accuracy"]["scaled_dot"]
    if _not_learned(dot, ev["chance"]):
        return Verdict(DEPENDS, C3_RULE + NOT_LEARNED,
                       f"inconclusive: scaled_dot reached only {_ci(dot)} accuracy (chance "
                       f"{ev['chance']:.3g}); this budget does not learn the task")
    cosines = {k: v for k, v in ev["accuracy"].items() if k.startswith("cosine")}
    best_name = max(cosines, key=lambda k: cosines[k]["mean"])
    best = cosines[best_name]
    hi = best["hi"] if best.get("hi") is not None else best["mean"]
    if all(_above(dot, c, 0.05) for c in cosines.values()):
        verdict = SUPPORTED
    elif hi >= dot["mean"]:
        verdict = REFUTED
    else:
        verdict = DEPENDS
    return Verdict(verdict, C3_RULE,
                   f"salience accuracy: scaled_dot {_ci(dot)}, best cosine ({best_name}) "
                   f"{_ci(best)}; chance {ev.get('chance', float('nan')):.3g}",
                   {"best_cosine": best_name})


C4_RULE = ("Theory: the largest weight bounded logits in [−τ, τ] allow over n keys is "
           "e^{2τ}/(e^{2τ}+n−1). Training (MQAR): supported if cosine at τ=1 fails (accuracy "
           "below half of scaled_dot's) AND no temperature rescues it (τ=10 and learned τ also "
           "below half); depends (on τ) if τ=1 fails but a larger or learned τ reaches at least "
           "80% of scaled_dot's accuracy; refuted if τ=1 itself reaches 80% of scaled_dot")


def judge_c4(ev: Evidence) -> Verdict:
    acc = ev["accuracy"]
    ref = acc["scaled_dot"]["mean"]
    if _not_learned(acc["scaled_dot"], ev["chance"]):
        return Verdict(DEPENDS, C4_RULE + NOT_LEARNED,
                       f"inconclusive: scaled_dot reached only {ref:.3f} MQAR accuracy (chance "
                       f"{ev['chance']:.3g}); the bound itself: max weight ≤ "
                       f"{ev['max_weight_bound']:.4f} at τ=1, n={ev['n']}")
    tau1 = acc["cosine_tau1"]["mean"]
    rescued = max(acc[k]["mean"] for k in acc if k.startswith("cosine") and k != "cosine_tau1")
    if tau1 >= 0.8 * ref:
        verdict = REFUTED
    elif rescued >= 0.8 * ref:
        verdict = DEPENDS
    elif tau1 < 0.5 * ref and rescued < 0.5 * ref:
        verdict = SUPPORTED
    else:
        verdict = DEPENDS
    bound = ev["max_weight_bound"]
    return Verdict(verdict, C4_RULE,
                   f"bound at τ=1, n={ev['n']}: max weight ≤ {bound:.4f}; MQAR accuracy "
                   f"scaled_dot {ref:.3f}, cosine τ=1 {tau1:.3f}, best larger/learned τ "
                   f"{rescued:.3f}", {"bound": bound})


# --------------------------------------------------------------------------------------------
# C5: cost
# --------------------------------------------------------------------------------------------

C5_RULE = ("From `attnscale bench`: cosine time / scaled_dot time on the same fused kernel, "
           "forward+backward. Supported if the overhead exceeds 10% at every N measured, refuted "
           "if it stays within 10% at every N, depends (on N) otherwise")


def judge_c5(ev: Evidence) -> Verdict:
    ratios = ev["ratio_by_n"]  # {N: cosine_ms / scaled_dot_ms}
    over = [r > 1.10 for r in ratios.values()]
    verdict = SUPPORTED if all(over) else REFUTED if not any(over) else DEPENDS
    text = ", ".join(f"N={n}: {r:.2f}×" for n, r in sorted(ratios.items(), key=lambda x: int(x[0])))
    return Verdict(verdict, C5_RULE, f"cosine / scaled_dot fwd+bwd time: {text}", dict(ratios))


# --------------------------------------------------------------------------------------------
# C6, C7, C13, C11: training comparisons
# --------------------------------------------------------------------------------------------

C6_RULE = ("For each task, each score's best-LR final eval loss (mean ± 95% CI over seeds). "
           "Supported if scaled_dot beats the thread's alternatives (unscaled dot, cosine τ=1) "
           "with non-overlapping CIs on every task; refuted if one of them beats scaled_dot on "
           "every task; depends otherwise")


def judge_c6(ev: Evidence) -> Verdict:
    wins, losses = [], []
    for by_score in ev["best_loss"].values():
        sd = by_score["scaled_dot"]
        rivals = {k: v for k, v in by_score.items() if k in ("dot", "cosine_tau1")}
        wins.append(all(_above(v, sd) for v in rivals.values()))  # rivals' loss above ours
        losses.append(any(_above(sd, v) for v in rivals.values()))
    verdict = SUPPORTED if all(wins) else REFUTED if all(losses) else DEPENDS
    parts = [f"{t}: scaled_dot {_ci(b['scaled_dot'])}, dot {_ci(b.get('dot'))}, cosine τ=1 "
             f"{_ci(b.get('cosine_tau1'))}" for t, b in ev["best_loss"].items()]
    return Verdict(verdict, C6_RULE, "best-LR eval loss — " + "; ".join(parts))


C7_RULE = ("Unscaled vs scaled across head dims d_k (same LR grid, best LR each). Supported "
           "(dropping the constant is harmless) if unscaled dot's best loss is within the CI of "
           "scaled_dot's at every d_k; refuted if unscaled is worse (non-overlapping CIs) at the "
           "largest d_k; depends otherwise")


def _dk_gaps(ev: Evidence) -> tuple[list[int], list[bool]]:
    dks = sorted(ev["best_loss"], key=int)
    worse = [_above(ev["best_loss"][d]["dot"], ev["best_loss"][d]["scaled_dot"]) for d in dks]
    return dks, worse


def _dk_text(ev: Evidence) -> str:
    return "; ".join(
        f"d_k={d}: dot {_ci(v['dot'])} vs scaled {_ci(v['scaled_dot'])}"
        for d, v in sorted(ev["best_loss"].items(), key=lambda x: int(x[0]))
    )


def judge_c7(ev: Evidence) -> Verdict:
    _, worse = _dk_gaps(ev)
    verdict = REFUTED if worse[-1] else SUPPORTED if not any(worse) else DEPENDS
    return Verdict(verdict, C7_RULE, "best-LR eval loss — " + _dk_text(ev))


C13_RULE = ("Supported if unscaled dot-product attention's best loss is worse than scaled "
            "(non-overlapping CIs) at the largest d_k and its gap grows with d_k (gap at the "
            "largest d_k > gap at the smallest); refuted if it is not worse at the largest d_k; "
            "depends otherwise")


def judge_c13(ev: Evidence) -> Verdict:
    dks, worse = _dk_gaps(ev)
    gaps = [ev["best_loss"][d]["dot"]["mean"] - ev["best_loss"][d]["scaled_dot"]["mean"]
            for d in dks]
    if not worse[-1]:
        verdict = REFUTED
    elif gaps[-1] > gaps[0]:
        verdict = SUPPORTED
    else:
        verdict = DEPENDS
    return Verdict(verdict, C13_RULE, "best-LR eval loss — " + _dk_text(ev),
                   {"gaps": dict(zip(map(str, dks), gaps, strict=True))})


C11_RULE = ("LR sweeps at two widths (Wortsman et al. 2023 metrics). Supported if unscaled dot "
            "diverges more often than scaled_dot at both widths AND its largest stable LR is "
            "lower at the larger width than at the smaller one (or its LR sensitivity grows with "
            "width more than scaled_dot's); refuted if unscaled dot diverges no more often than "
            "scaled_dot at both widths and its LR sensitivity is within 0.05 of scaled_dot's; "
            "depends otherwise")


def judge_c11(ev: Evidence) -> Verdict:
    w = sorted(ev["by_width"], key=int)
    small, large = ev["by_width"][w[0]], ev["by_width"][w[-1]]
    more_div = all(ev["by_width"][x]["dot"]["divergence_rate"]
                   > ev["by_width"][x]["scaled_dot"]["divergence_rate"] for x in w)
    shrinks = (large["dot"]["max_stable_lr"] or 0) < (small["dot"]["max_stable_lr"] or 0)
    sens_growth = (large["dot"]["lr_sensitivity"] - small["dot"]["lr_sensitivity"]) > (
        large["scaled_dot"]["lr_sensitivity"] - small["scaled_dot"]["lr_sensitivity"])
    never_more = all(ev["by_width"][x]["dot"]["divergence_rate"]
                     <= ev["by_width"][x]["scaled_dot"]["divergence_rate"] for x in w)
    close = all(abs(ev["by_width"][x]["dot"]["lr_sensitivity"]
                    - ev["by_width"][x]["scaled_dot"]["lr_sensitivity"]) <= 0.05 for x in w)
    if more_div and (shrinks or sens_growth):
        verdict = SUPPORTED
    elif never_more and close:
        verdict = REFUTED
    else:
        verdict = DEPENDS
    parts = []
    for x in w:
        d, s = ev["by_width"][x]["dot"], ev["by_width"][x]["scaled_dot"]
        parts.append(f"width {x}: divergence dot {d['divergence_rate']:.0%} vs scaled "
                     f"{s['divergence_rate']:.0%}, max stable LR dot {d['max_stable_lr']} vs "
                     f"{s['max_stable_lr']}, LR sensitivity dot {d['lr_sensitivity']:.3f} vs "
                     f"{s['lr_sensitivity']:.3f}")
    return Verdict(verdict, C11_RULE, "; ".join(parts))


# --------------------------------------------------------------------------------------------
# C8, C9, C10, C12: theory and logit size
# --------------------------------------------------------------------------------------------

C8_RULE = ("Monte Carlo of q·k for unit-variance independent components over d_k. The thread's "
           "'E[q·k] grows like O(d_k)' is refuted if the mean is within 3 SE of 0 at every d_k "
           "while the std grows like √d_k (log-log slope within 0.5 ± 0.05); supported if the "
           "mean grows with d_k (slope of |mean| ≥ 0.9 and means > 3 SE); depends otherwise")


def judge_c8(ev: Evidence) -> Verdict:
    rows = sorted(ev["by_d"], key=lambda r: r["d"])
    zero_mean = all(abs(r["mean"]) <= 3 * r["se_mean"] for r in rows)
    slope = _loglog_slope([r["d"] for r in rows], [r["std"] for r in rows])
    mean_slope = _loglog_slope([r["d"] for r in rows], [abs(r["mean"]) + 1e-12 for r in rows])
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


def _loglog_slope(x: list[float], y: list[float]) -> float:
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    den = sum((a - mx) ** 2 for a in lx)
    return num / den


C9_RULE = ("Exact theory (checked by Monte Carlo) for softmax over n i.i.d. N(0, s²) logits: "
           "supported if normalized entropy falls monotonically with s, stays above 0.5 below "
           "s_c/2 and falls below 0.5 beyond s_c = √(2 ln n) for every n tested, with theory and "
           "Monte Carlo within 4 SE; refuted if entropy does not fall with s; depends otherwise")


def judge_c9(ev: Evidence) -> Verdict:
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
    init_ok = all(0.25 <= v <= 4 for v in ev["init_std_scaled"].values())
    trained = ev["trained_max_abs_logit"]
    limit = 4 * math.sqrt(2 * math.log(ev["n"]))
    verdict = REFUTED if not init_ok else SUPPORTED if trained < limit else DEPENDS
    inits = ", ".join(f"d_k={d}: {v:.2f}" for d, v in sorted(ev["init_std_scaled"].items(),
                                                              key=lambda x: int(x[0])))
    return Verdict(verdict, C12_RULE,
                   f"init logit std (scaled): {inits}; after training max |logit| {trained:.1f} "
                   f"(limit {limit:.1f}), growth ×{ev.get('growth', float('nan')):.1f} from init")


# --------------------------------------------------------------------------------------------
# Questions beyond the thread
# --------------------------------------------------------------------------------------------

Q1_RULE = ("Hypothesis (Wortsman et al. 2023): the normalized or capped scores (qk_layernorm, "
           "qk_rmsnorm, softcap, learned-τ cosine) reach scaled_dot's best loss (CIs overlap or "
           "better) with lower LR sensitivity. Supported if at least one does on every task, "
           "refuted if none does on any task, depends otherwise")


def judge_q1(ev: Evidence) -> Verdict:
    modern = ("qk_layernorm", "qk_rmsnorm", "softcap", "cosine_learned")
    if not ev["by_task"]:
        return Verdict(DEPENDS, Q1_RULE, "inconclusive: no task was swept over an LR grid")
    per_task = []
    for task, rows in ev["by_task"].items():  # rows: score -> {"best_loss", "lr_sensitivity"}
        sd = rows["scaled_dot"]
        good = [m for m in modern if m in rows
                and not _above(rows[m]["best_loss"], sd["best_loss"])
                and rows[m]["lr_sensitivity"] < sd["lr_sensitivity"]]
        per_task.append((task, good))
    hits = [bool(g) for _, g in per_task]
    verdict = SUPPORTED if all(hits) else REFUTED if not any(hits) else DEPENDS
    text = "; ".join(f"{t}: {', '.join(g) or 'none'}" for t, g in per_task)
    return Verdict(verdict, Q1_RULE,
                   f"scores matching scaled_dot with lower LR sensitivity — {text}")


Q2_RULE = ("all-MiniLM-L6-v2 on real text. Hypothesis: logits are O(1) per head (mean logit std "
           "< s_c of the sentence length) and attention is far from uniform (mean entropy < 90% "
           "of ln n), while removing 1/√d would collapse the entropy (below half of the actual). "
           "Supported if all three hold, refuted if none holds, depends otherwise")


def judge_q2(ev: Evidence) -> Verdict:
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


Q3_RULE = ("Length task trained at n, evaluated at 2n and 4n. Hypothesis: log-length scaling "
           "generalizes better than fixed 1/√d. Supported if log_length's accuracy is above "
           "scaled_dot's (non-overlapping CIs) at 4n; refuted if scaled_dot's is above or equal "
           "at both 2n and 4n; depends otherwise. Attention fading: scaled_dot's entropy/ln n "
           "at 4n vs n is reported")


def judge_q3(ev: Evidence) -> Verdict:
    acc = ev["accuracy"]  # {"scaled_dot": {"n=64": ci, ...}, "log_length": {...}}
    lengths = sorted(acc["scaled_dot"], key=lambda k: int(k.split("=")[1]))
    train_len = lengths[0]
    if "chance" in ev and _not_learned(acc["scaled_dot"][train_len], ev["chance"]):
        return Verdict(DEPENDS, Q3_RULE + NOT_LEARNED,
                       f"inconclusive: scaled_dot reached only {_ci(acc['scaled_dot'][train_len])} "
                       f"at the training length {train_len} (chance {ev['chance']:.3g})")
    longest = lengths[-1]
    if _above(acc["log_length"][longest], acc["scaled_dot"][longest]):
        verdict = SUPPORTED
    elif all(acc["scaled_dot"][x]["mean"] >= acc["log_length"][x]["mean"] for x in lengths[1:]):
        verdict = REFUTED
    else:
        verdict = DEPENDS
    parts = [f"{x}: scaled {_ci(acc['scaled_dot'][x])} vs log_length {_ci(acc['log_length'][x])}"
             for x in lengths]
    return Verdict(verdict, Q3_RULE, "accuracy — " + "; ".join(parts))


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
