"""Shared phrasing for the sentences claims write (their verdicts' plain sentences and their
takeaways, :class:`attnscale.audit.claim.Says`): how a comparison reads in words, an effect
with its interval, the names of the scores. Pure functions of report.json's plain numbers."""

from __future__ import annotations

from typing import Any

from attnscale.audit.compare import no_worse

GREATER, LESS, EQUAL = "greater", "less", "equal"
SCORE_NAMES = {"scaled_dot": "scaled dot", "dot": "unscaled dot", "qk_layernorm": "QK-LayerNorm",
               "qk_rmsnorm": "QK-RMSNorm", "softcap": "soft-capping",
               "cosine_learned": "cosine with a learned τ", "cosine_tau1": "cosine τ = 1"}


def name(arm: str) -> str:
    """A score variant's name on the page."""
    return SCORE_NAMES.get(arm, arm)


def strip_verdict(headline: str, verdict: str) -> str:
    """A headline without its leading verdict word: "supported: gap +0.3" -> "gap +0.3"."""
    for sep in (": ", ", "):
        if headline.startswith(verdict + sep):
            return headline[len(verdict) + len(sep):]
    return "" if headline == verdict else headline


def fx(c: dict[str, Any], unit: str = "nats", digits: int = 3) -> str:
    """``+0.33 nats [+0.25, +0.41]``: one comparison's mean and 95% interval."""
    return (f"{c['mean']:+.{digits}f} {unit} [{c['lo']:+.{digits}f}, {c['hi']:+.{digits}f}]"
            if c.get("lo") is not None and c.get("hi") is not None
            else f"{c['mean']:+.{digits}f} {unit}")


def reads(c: dict[str, Any]) -> str:
    """How a rival's loss compares with the reference's, in words; an interval past ±δ that
    Holm's correction leaves undecided says so; identical differences are not measurable."""
    if c["reading"] == "not measurable":
        why = c.get("why") or "every seed's difference is the same"
        return f"could not be compared ({why}) with"
    word = {EQUAL: "matched", LESS: "beat", GREATER: "trailed"}.get(c["reading"])
    if word:
        return word
    if no_worse(c):
        return "was no worse (within δ) than"
    delta = c.get("smallest")
    if delta is not None and c.get("lo") is not None and (c["lo"] > delta or c["hi"] < -delta):
        return "was undecided after Holm's correction against"
    return "was undecided against"
