"""The rules for the claims that training decides (C3, C4, C6, C7, C11, C13, Q1, Q3).

Each ``judge_*`` is a pure function of its claim's evidence dict (see
:mod:`attnscale.audit.verdicts` for the conventions); the claims themselves are stated in
docs/claims.md and listed in :mod:`attnscale.audit.claims`. The learning-rate metrics follow
Wortsman et al. 2023 (arXiv 2309.14322) as computed by :mod:`attnscale.lab.analysis`.
"""

from __future__ import annotations

from attnscale.audit.verdicts import (
    DEPENDS,
    NOT_LEARNED,
    REFUTED,
    SUPPORTED,
    Evidence,
    Verdict,
    above,
    fmt_ci,
    not_learned,
)

C3_RULE = ("On the salience task (the relevant key is marked only by its norm): supported if "
           "scaled_dot's accuracy is above EVERY cosine variant (τ=1, τ=10, learned τ) by more "
           "than 0.05 with non-overlapping 95% CIs; refuted if the best cosine variant's CI "
           "reaches scaled_dot's mean or higher; depends otherwise")


def judge_c3(ev: Evidence) -> Verdict:
    """C3: salience accuracy of scaled_dot against every cosine variant."""
    dot = ev["accuracy"]["scaled_dot"]
    if not_learned(dot, ev["chance"]):
        return Verdict(DEPENDS, C3_RULE + NOT_LEARNED,
                       f"inconclusive: scaled_dot reached only {fmt_ci(dot)} accuracy (chance "
                       f"{ev['chance']:.3g}); this budget does not learn the task")
    cosines = {k: v for k, v in ev["accuracy"].items() if k.startswith("cosine")}
    best_name = max(cosines, key=lambda k: cosines[k]["mean"])
    best = cosines[best_name]
    hi = best["hi"] if best.get("hi") is not None else best["mean"]
    if all(above(dot, c, 0.05) for c in cosines.values()):
        verdict = SUPPORTED
    elif hi >= dot["mean"]:
        verdict = REFUTED
    else:
        verdict = DEPENDS
    return Verdict(verdict, C3_RULE,
                   f"salience accuracy: scaled_dot {fmt_ci(dot)}, best cosine ({best_name}) "
                   f"{fmt_ci(best)}; chance {ev.get('chance', float('nan')):.3g}",
                   {"best_cosine": best_name})


C4_RULE = ("Theory: the largest weight bounded logits in [−τ, τ] allow over n keys is "
           "e^{2τ}/(e^{2τ}+n−1). Training (MQAR): supported if cosine at τ=1 fails (accuracy "
           "below half of scaled_dot's) AND no temperature rescues it (τ=10 and learned τ also "
           "below half); depends (on τ) if τ=1 fails but a larger or learned τ reaches at least "
           "80% of scaled_dot's accuracy; refuted if τ=1 itself reaches 80% of scaled_dot")


def judge_c4(ev: Evidence) -> Verdict:
    """C4: MQAR accuracy of cosine at τ = 1, τ = 10 and learned τ against scaled_dot."""
    acc = ev["accuracy"]
    ref = acc["scaled_dot"]["mean"]
    if not_learned(acc["scaled_dot"], ev["chance"]):
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


C6_RULE = ("For each task, each score's best-LR final eval loss (mean ± 95% CI over seeds). "
           "Supported if scaled_dot beats the thread's alternatives (unscaled dot, cosine τ=1) "
           "with non-overlapping CIs on every task; refuted if one of them beats scaled_dot on "
           "every task; depends otherwise")


def judge_c6(ev: Evidence) -> Verdict:
    """C6: best-LR loss of scaled_dot against unscaled dot and cosine τ = 1, per task."""
    wins, losses = [], []
    for by_score in ev["best_loss"].values():
        sd = by_score["scaled_dot"]
        rivals = {k: v for k, v in by_score.items() if k in ("dot", "cosine_tau1")}
        wins.append(all(above(v, sd) for v in rivals.values()))  # rivals' loss above ours
        losses.append(any(above(sd, v) for v in rivals.values()))
    verdict = SUPPORTED if all(wins) else REFUTED if all(losses) else DEPENDS
    parts = [f"{t}: scaled_dot {fmt_ci(b['scaled_dot'])}, dot {fmt_ci(b.get('dot'))}, cosine τ=1 "
             f"{fmt_ci(b.get('cosine_tau1'))}" for t, b in ev["best_loss"].items()]
    return Verdict(verdict, C6_RULE, "best-LR eval loss — " + "; ".join(parts))


C7_RULE = ("Unscaled vs scaled across head dims d_k (same LR grid, best LR each). Supported "
           "(dropping the constant is harmless) if unscaled dot's best loss is within the CI of "
           "scaled_dot's at every d_k; refuted if unscaled is worse (non-overlapping CIs) at the "
           "largest d_k; depends otherwise")


def _dk_gaps(ev: Evidence) -> tuple[list[int], list[bool]]:
    dks = sorted(ev["best_loss"], key=int)
    worse = [above(ev["best_loss"][d]["dot"], ev["best_loss"][d]["scaled_dot"]) for d in dks]
    return dks, worse


def _dk_text(ev: Evidence) -> str:
    return "; ".join(
        f"d_k={d}: dot {fmt_ci(v['dot'])} vs scaled {fmt_ci(v['scaled_dot'])}"
        for d, v in sorted(ev["best_loss"].items(), key=lambda x: int(x[0]))
    )


def judge_c7(ev: Evidence) -> Verdict:
    """C7: best-LR loss of unscaled against scaled dot product over d_k."""
    _, worse = _dk_gaps(ev)
    verdict = REFUTED if worse[-1] else SUPPORTED if not any(worse) else DEPENDS
    return Verdict(verdict, C7_RULE, "best-LR eval loss — " + _dk_text(ev))


C13_RULE = ("Supported if unscaled dot-product attention's best loss is worse than scaled "
            "(non-overlapping CIs) at the largest d_k and its gap grows with d_k (gap at the "
            "largest d_k > gap at the smallest); refuted if it is not worse at the largest d_k; "
            "depends otherwise")


def judge_c13(ev: Evidence) -> Verdict:
    """C13: whether unscaled attention's loss gap to scaled grows with d_k."""
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
    """C11: divergence, stable LRs and LR sensitivity of unscaled vs scaled at two widths."""
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


Q1_RULE = ("Hypothesis (Wortsman et al. 2023): the normalized or capped scores (qk_layernorm, "
           "qk_rmsnorm, softcap, learned-τ cosine) reach scaled_dot's best loss (CIs overlap or "
           "better) with lower LR sensitivity. Supported if at least one does on every task, "
           "refuted if none does on any task, depends otherwise")


def judge_q1(ev: Evidence) -> Verdict:
    """Q1: which modern scores match scaled_dot's loss with lower LR sensitivity, per task."""
    modern = ("qk_layernorm", "qk_rmsnorm", "softcap", "cosine_learned")
    if not ev["by_task"]:
        return Verdict(DEPENDS, Q1_RULE, "inconclusive: no task was swept over an LR grid")
    per_task = []
    for task, rows in ev["by_task"].items():  # rows: score -> {"best_loss", "lr_sensitivity"}
        sd = rows["scaled_dot"]
        good = [m for m in modern if m in rows
                and not above(rows[m]["best_loss"], sd["best_loss"])
                and rows[m]["lr_sensitivity"] < sd["lr_sensitivity"]]
        per_task.append((task, good))
    hits = [bool(g) for _, g in per_task]
    verdict = SUPPORTED if all(hits) else REFUTED if not any(hits) else DEPENDS
    text = "; ".join(f"{t}: {', '.join(g) or 'none'}" for t, g in per_task)
    return Verdict(verdict, Q1_RULE,
                   f"scores matching scaled_dot with lower LR sensitivity — {text}")


Q3_RULE = ("Length task trained at n, evaluated at 2n and 4n. Hypothesis: log-length scaling "
           "generalizes better than fixed 1/√d. Supported if log_length's accuracy is above "
           "scaled_dot's (non-overlapping CIs) at 4n; refuted if scaled_dot's is above or equal "
           "at both 2n and 4n; depends otherwise. Attention fading: scaled_dot's entropy/ln n "
           "at 4n vs n is reported")


def judge_q3(ev: Evidence) -> Verdict:
    """Q3: length generalization of log-length scaling against fixed 1/√d."""
    acc = ev["accuracy"]  # {"scaled_dot": {"n=64": ci, ...}, "log_length": {...}}
    lengths = sorted(acc["scaled_dot"], key=lambda k: int(k.split("=")[1]))
    train_len = lengths[0]
    base = acc["scaled_dot"][train_len]
    if "chance" in ev and not_learned(base, ev["chance"]):
        return Verdict(DEPENDS, Q3_RULE + NOT_LEARNED,
                       f"inconclusive: scaled_dot reached only {fmt_ci(base)} "
                       f"at the training length {train_len} (chance {ev['chance']:.3g})")
    longest = lengths[-1]
    if above(acc["log_length"][longest], acc["scaled_dot"][longest]):
        verdict = SUPPORTED
    elif all(acc["scaled_dot"][x]["mean"] >= acc["log_length"][x]["mean"] for x in lengths[1:]):
        verdict = REFUTED
    else:
        verdict = DEPENDS
    parts = [f"{x}: scaled {fmt_ci(acc['scaled_dot'][x])} vs log_length "
             f"{fmt_ci(acc['log_length'][x])}" for x in lengths]
    return Verdict(verdict, Q3_RULE, "accuracy — " + "; ".join(parts))
