"""The page's first screen: short answers for practitioners, written by the claims themselves.

Each registered claim says what it adds to these answers (:class:`attnscale.audit.claim.Says`):
sentences built from its own report entry, so they change with its data. This module only
collects them: for each section of :data:`SECTIONS`, every claim's sentences in rank order. A
claim whose rule failed adds "Not answered", never a sentence; a section no claim could write
says the report lacks the measurements. It names no claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnscale.audit.claim import Entry, all_claims
from attnscale.audit.verdicts import ERROR
from attnscale.audit.words import strip_verdict

# section id -> the practitioner's question it answers, in page order
SECTIONS = {
    "answer": "In short: should I change my model's attention scaling?",
    "scale": "What does dividing by √d_k buy, and when?",
    "alternatives": "Which alternatives held up, and at what cost?",
    "when": "When should I reach for QK-norm, soft-capping, QK-Clip or a learned temperature?",
}


def answer(entry: Entry, words_for: Mapping[str, str]) -> str:
    """A question's answer: its verdict as words (``words_for``: the question's
    :attr:`attnscale.audit.claim.Claim.answers`), then the headline's numbers."""
    if entry["verdict"] == ERROR:
        return f"Not answered: {entry['error']}"
    words = words_for.get(entry["verdict"], entry["verdict"])
    rest = strip_verdict(entry.get("headline", ""), entry["verdict"]).replace("—", "none")
    return f"{words} ({rest})" if rest else words


def contributors(section: str) -> list[tuple[int, Any, Any]]:
    """(rank, claim, says) of every registered claim that writes in ``section``, in order."""
    out = []
    for i, claim in enumerate(all_claims()):
        for says in claim.says:
            if says.section not in SECTIONS:
                raise ValueError(f"{claim.id}: Says names section {says.section!r}, not one of "
                                 f"{list(SECTIONS)}")
            if says.section == section:
                out.append((says.rank, i, claim, says))
    return [(r, c, s) for r, _, c, s in sorted(out, key=lambda t: t[:2])]


def takeaways(entries: list[Entry]) -> list[dict[str, Any]]:
    """The page's answers, each ``{"id", "question", "answer": [sentences], "sources",
    "verdicts"}``; an answer whose evidence is missing says so instead of guessing."""
    by_id = {x["id"]: x for x in entries}
    out = []
    for key, question in SECTIONS.items():
        writers = contributors(key)
        sources = list(dict.fromkeys(c.id for _, c, _ in writers))
        sentences: list[str] = []
        for _, claim, says in writers:
            entry = by_id.get(claim.id)
            if entry is None:
                sentences.append(f"Not answered here: this report lacks {claim.id}.")
                continue
            if entry["verdict"] == ERROR:  # an answer is never built around a failed rule
                sentences.append(f"Not answered here: the rule of {claim.id} failed (the error "
                                 "is shown there).")
                continue
            sentences += says.build(entry)  # a bug here fails the report: it is not an answer
        if not sentences:
            sentences = [f"This report lacks the measurements to answer this "
                         f"({', '.join(sources) or 'no claim writes it'})."]
        out.append({"id": key, "question": question, "answer": sentences, "sources": sources,
                    "verdicts": {s: by_id[s]["verdict"] for s in sources if s in by_id}})
    return out
