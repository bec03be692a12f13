"""Q2: in a real trained model (all-MiniLM-L6-v2, Wang et al. 2020, arXiv 2002.10957), how large
are the logits, how far from uniform is attention, and what would entropy be without 1/√d_k?

Offline inspection (:mod:`attnscale.measure.inspection`) of every layer and head on real
sentences, with the counterfactual entropies of the same q, k without 1/√d and with cosine at
τ = 1: supported when the logits are O(1) (mean logit std under s_c = √(2 ln n)), attention is
far from uniform (entropy under 90% of ln n) and dropping 1/√d would collapse it (below half).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnscale.audit.claim import Claim, Figure, Measurement, Sources, register
from attnscale.audit.evidence import Model
from attnscale.audit.studies import Preset
from attnscale.audit.verdicts import DEPENDS, INCONCLUSIVE, REFUTED, SUPPORTED, Verdict
from attnscale.measure import inspection

RULE = ("all-MiniLM-L6-v2 on real text. Hypothesis: logits are O(1) per head (mean logit std "
        "< s_c of the sentence length) and attention is far from uniform (mean entropy < 90% "
        "of ln n), while removing 1/√d would collapse the entropy (below half of the actual). "
        "Supported if all three hold, refuted if none holds, depends otherwise")


class Summary(Model):
    """Model-wide means over heads (:func:`attnscale.measure.inspection.summary`, in its key
    order); entropies in nats. The rule reads the logit std and the four entropies; the rest
    are context."""

    logit_std: float
    max_abs_logit: float
    entropy: float
    entropy_uniform: float
    entropy_normalized: float
    max_weight: float
    saturated_fraction: float
    effective_keys: float
    entropy_unscaled: float
    entropy_cosine_tau1: float

    def critical_scale(self) -> float:
        """s_c = √(2 ln n) with ln n the uniform entropy."""
        return math.sqrt(2 * math.log(math.exp(self.entropy_uniform)))


class Evidence(Model):
    """The summary, the largest |logit| of any head, and the whole inspection result
    (:func:`attnscale.measure.inspection.inspect_model` with its summary), which the figure's
    layer × head heatmaps draw."""

    summary: Summary
    max_abs_logit: float
    inspection: dict[str, Any]


def measure(p: Preset) -> dict[str, Any]:
    """all-MiniLM-L6-v2 on ``p.inspect_sentences`` default sentences, with its summary."""
    result = inspection.inspect_model("minilm", inspection.default_sentences(p.inspect_sentences))
    result["summary"] = inspection.summary(result)
    return result


def judge(ev: Evidence) -> Verdict:
    """Logit size and attention entropy of all-MiniLM-L6-v2, with counterfactuals."""
    s = ev.summary
    sc = s.critical_scale()
    checks = [s.logit_std < sc, s.entropy < 0.9 * s.entropy_uniform,
              s.entropy_unscaled < 0.5 * s.entropy]
    verdict = SUPPORTED if all(checks) else REFUTED if not any(checks) else DEPENDS
    return Verdict(verdict, RULE,
                   f"mean logit std {s.logit_std:.2f} (s_c {sc:.2f}), max |logit| up to "
                   f"{ev.max_abs_logit:.1f}; entropy {s.entropy:.2f} vs uniform "
                   f"{s.entropy_uniform:.2f} nats; without 1/√d {s.entropy_unscaled:.2f}; "
                   f"cosine τ=1 {s.entropy_cosine_tau1:.2f}", {"checks": checks},
                   headline=f"{verdict}: logit std {s.logit_std:.2f}, entropy "
                   f"{s.entropy:.2f} of {s.entropy_uniform:.2f} nats",
                   plain=[f"MiniLM's trained logits have std {s.logit_std:.2f} against s_c "
                          f"{sc:.2f} ({'below' if checks[0] else 'at or past'} saturation); "
                          f"attention entropy is {s.entropy:.2f} of "
                          f"{s.entropy_uniform:.2f} nats ({'far from' if checks[1] else 'near'}"
                          f" uniform).",
                          f"Without 1/√d_k the same queries and keys would give entropy "
                          f"{s.entropy_unscaled:.2f} nats "
                          f"({'collapse' if checks[2] else 'no collapse'}); cosine at τ=1 would "
                          f"give {s.entropy_cosine_tau1:.2f}.",
                          "This is one trained model on short sentences; other models differ."],
                   regime="all-MiniLM-L6-v2, real sentences")


def alt(result: Mapping[str, Any]) -> str:
    """MiniLM's logit size and entropy, and what removing 1/√d would do."""
    s = result["summary"]
    heads = [(layer["layer"], h) for layer in result["layers"] for h in layer["heads"]]
    li, top = max(heads, key=lambda x: x[1]["max_abs_logit"])
    return (f"In {result['model']} ({result['n_tokens']} tokens) the pre-softmax logits have "
            f"mean std {s['logit_std']:.2f} (largest |logit| {top['max_abs_logit']:.1f}, layer "
            f"{li} head {top['head']}) and attention keeps {s['entropy']:.2f} of "
            f"{s['entropy_uniform']:.2f} nats. Without 1/√d the same q and k would give "
            f"{s['entropy_unscaled']:.2f} nats ({s['entropy_unscaled'] / s['entropy']:.0%} of the "
            f"actual).")


def draw(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    """MiniLM's layer × head heatmaps (:func:`attnscale.measure.inspection.plot_heatmaps`)."""
    result = ev["inspection"]
    return [{"path": inspection.plot_heatmaps(result, str(folder))[0], "alt": alt(result)}]


def gather(src: Sources) -> dict[str, Any]:
    """The summary, the largest |logit| of any head, and the whole inspection result."""
    result = src.measured["minilm"]
    return {"summary": result["summary"],
            "max_abs_logit": max(h["max_abs_logit"] for layer in result["layers"]
                                 for h in layer["heads"]),
            # the heatmaps' data; not the machine's model path or the time it took
            "inspection": {k: v for k, v in result.items() if k not in ("path", "elapsed_s")}}


CLAIM = register(Claim(
    id="Q2", text="In a real trained model (all-MiniLM-L6-v2), how large are the logits, how far "
    "from uniform is attention, and what would entropy be without 1/√d_k?",
    measures="offline inspection with counterfactual scores", rule=RULE, evidence=Evidence,
    gather=gather, judge=judge, draw=draw,
    measurements=(Measurement("minilm", lambda p: {"sentences": p.inspect_sentences}, measure),),
    scale=lambda p: (f"one model (all-MiniLM-L6-v2, 6 layers, 12 heads, d_k = 32) on "
                     f"{p.inspect_sentences} short sentences"),
    answers={SUPPORTED: "Small: O(1), and the scale matters", REFUTED: "Large",
             DEPENDS: "Partly small", INCONCLUSIVE: "Not measured"}))
