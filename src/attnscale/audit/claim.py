"""What a claim is, and the registry that is the one place the report learns about claims.

A claim (or a question beyond the thread) is one module under :mod:`attnscale.audit.claims`
holding one :class:`Claim`: its statement, what it measures (the shared training studies of
:mod:`attnscale.audit.studies` it reads, a training study of its own (:class:`Training`) and its
own measurements), how its evidence is read (``gather`` into a typed model), its rule and smallest
effect (``judge``), its sentences (built inside the rule from the same reading as its verdict)
and its figures (``draw``). The module ends with ``register(Claim(...))``, as a score does in
:mod:`attnscale.core.scores`; the report, the page, report.json and its schema
(:mod:`attnscale.audit.schema`) iterate over :func:`claims`, so adding a claim touches its
module, docs/claims.md and its test, nothing else. :func:`registered` adds one for the duration
of a ``with`` block (the tests' toy claim).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from attnscale.audit.studies import Preset, Study, studies
from attnscale.audit.verdicts import MissingEvidence, Verdict
from attnscale.lab.records import Run

Figure = dict[str, str]  # {"path": PNG file, "alt": one or two sentences with its finding}
Entry = dict[str, Any]  # one claim's report.json entry: id, verdict, headline, numbers, evidence


@dataclass(frozen=True)
class Says:
    """Sentences a claim adds to one of the page's short answers (the sections of
    :data:`attnscale.audit.takeaways.SECTIONS`): ``build(entry)`` writes them from the claim's
    own report.json entry (its verdict, numbers and evidence), so they change with the data;
    ``rank`` orders the claims' sentences within a section (lower first, then claim order)."""

    section: str
    build: Callable[[Entry], list[str]]
    rank: int = 50


@dataclass(frozen=True)
class Panel:
    """A table a claim shows under its entry on the page and stores in report.json (e.g. C5's
    timing table): ``columns`` are the header, ``rows`` the cells as text."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def _no_panels(entry: Entry) -> list[Panel]:
    return []


@dataclass(frozen=True)
class Measurement:
    """A measurement that needs no training, cached in the results database under ``kind`` and
    its ``params(preset)`` (with the attnscale version): ``compute(preset)`` returns JSON-ready
    data. Claims that read the same ``kind`` share one measurement."""

    kind: str
    params: Callable[[Preset], dict[str, Any]]
    compute: Callable[[Preset], Any]


@dataclass(frozen=True)
class Training:
    """A training study a claim declares itself: ``build(preset)`` returns it (its name must be
    ``name``). The report trains it beside the shared studies of
    :func:`attnscale.audit.studies.studies`; claims that declare the same name must declare the
    same study."""

    name: str
    build: Callable[[Preset], Study]


@dataclass
class Sources:
    """What a claim's evidence is gathered from: the preset, its studies and their finished
    runs, and every measurement by kind. :meth:`study` memoizes a reader of one study's runs,
    so claims that read the same study share the work."""

    preset: Preset
    studies: dict[str, Study]
    runs: dict[str, list[Run]]  # typed records (attnscale.lab.records.Run)
    measured: dict[str, Any]
    memo: dict[tuple[str, Callable[..., Any]], Any] = field(default_factory=dict)

    def study(self, name: str, reader: Callable[[Study, list[Run]], Any]) -> Any:
        """``reader(study, runs)`` for study ``name``, computed once."""
        key = (name, reader)
        if key not in self.memo:
            self.memo[key] = reader(self.studies[name], self.runs[name])
        return self.memo[key]


def _no_figures(ev: Mapping[str, Any], numbers: Mapping[str, Any], folder: Path) -> list[Figure]:
    return []


@dataclass(frozen=True)
class Claim:
    """One claim of the thread (id ``C<k>``) or question beyond it (``Q<k>``).

    ``evidence`` is the pydantic model its rule reads; ``gather(sources)`` builds it (or the
    dict it validates from); ``judge(evidence)`` returns the :class:`Verdict` with its rule,
    numbers and sentences; ``draw(evidence_dict, numbers, folder)`` its figures, from the same
    plain numbers report.json stores; ``studies`` (shared studies by name), ``trains`` (studies
    of its own) and ``measurements`` say what it measures (a study with a missing run makes the
    claim an error, never a verdict); ``scale(preset)``
    the one-line scale caveat (default: its studies' sizes); ``answers`` how a question's
    verdicts read as an answer on the page; ``says`` its sentences in the page's short answers
    (:class:`Says`); ``panels(entry)`` any table of its own (:class:`Panel`)."""

    id: str
    text: str
    measures: str
    rule: str
    evidence: type[BaseModel]
    gather: Callable[[Sources], Any]
    judge: Callable[[Any], Verdict]
    draw: Callable[[Mapping[str, Any], Mapping[str, Any], Path], list[Figure]] = _no_figures
    studies: tuple[str, ...] = ()
    measurements: tuple[Measurement, ...] = ()
    trains: tuple[Training, ...] = ()
    scale: Callable[[Preset], str] | None = None
    answers: Mapping[str, str] = field(default_factory=dict)
    says: tuple[Says, ...] = ()
    panels: Callable[[Entry], list[Panel]] = _no_panels

    def __post_init__(self) -> None:
        if not (self.id[:1] in "CQ" and self.id[1:].isdigit()):
            raise ValueError(f"claim id must be C<k> or Q<k>, got {self.id!r}")
        own = tuple(t.name for t in self.trains if t.name not in self.studies)
        object.__setattr__(self, "studies", self.studies + own)  # what it reads, all of it

    @property
    def question(self) -> bool:
        """A question beyond the thread (answered on the page) rather than a claim of it."""
        return self.id.startswith("Q")

    def read(self, ev: Any) -> Any:
        """``ev`` as this claim's typed evidence. Fields that are missing raise
        :class:`MissingEvidence` naming them; a field of the wrong type or one the model does
        not declare is a bug (ValueError)."""
        if isinstance(ev, self.evidence):
            return ev
        try:
            return self.evidence.model_validate(ev)
        except ValidationError as e:
            where = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}"
                              for x in e.errors()[:3])
            text = f"{self.id}: evidence does not fit {self.evidence.__name__} ({where})"
            if all(x["type"] == "missing" for x in e.errors()):
                raise MissingEvidence(text) from e
            raise ValueError(text) from e  # a number of the wrong kind: a bug, not a gap

    def decide(self, ev: Any) -> Verdict:
        """The verdict on evidence ``ev`` (typed, or the dict it validates from)."""
        return self.judge(self.read(ev))


REGISTRY: dict[str, Claim] = {}
PACKAGE = "attnscale.audit.claims"  # importing it registers every claim module in it


def register(claim: Claim) -> Claim:
    """Add ``claim`` to the registry (its id must be new)."""
    if claim.id in REGISTRY:
        raise ValueError(f"claim {claim.id} is already registered")
    REGISTRY[claim.id] = claim
    return claim


def unregister(claim_id: str) -> Claim:
    """Remove and return a registered claim."""
    return REGISTRY.pop(claim_id)


@contextmanager
def registered(claim: Claim) -> Iterator[Claim]:
    """``claim`` registered for the duration of the ``with`` block."""
    all_claims()
    register(claim)
    try:
        yield claim
    finally:
        unregister(claim.id)


def all_claims() -> list[Claim]:
    """Every registered claim, then every question, each in number order."""
    importlib.import_module(PACKAGE)
    return sorted(REGISTRY.values(), key=lambda c: (c.question, int(c.id[1:])))


def claims() -> list[Claim]:
    """The registered claims of the thread, C1 first."""
    return [c for c in all_claims() if not c.question]


def questions() -> list[Claim]:
    """The registered questions beyond the thread, Q1 first."""
    return [c for c in all_claims() if c.question]


def get_claim(claim_id: str) -> Claim:
    """The registered claim ``claim_id``."""
    all_claims()
    if claim_id not in REGISTRY:
        raise KeyError(f"no registered claim {claim_id!r}; registered: {sorted(REGISTRY)}")
    return REGISTRY[claim_id]


def training_plan(p: Preset) -> dict[str, Study]:
    """Every training study of preset ``p``: the shared ones of
    :func:`attnscale.audit.studies.studies`, then those registered claims declare
    (:class:`Training`). A declared study whose built name differs from its ``name``, or that
    differs from another of the same name, raises ValueError naming it."""
    plan = studies(p)
    declared: dict[str, Study] = {}
    for claim in all_claims():
        for t in claim.trains:
            study = t.build(p)
            if study.name != t.name:
                raise ValueError(f"{claim.id}: training {t.name!r} built a study named "
                                 f"{study.name!r}")
            known = declared.get(t.name, plan.get(t.name))
            if known is not None and known != study:
                raise ValueError(f"{claim.id}: training study {t.name!r} differs from the one "
                                 "of the same name already planned")
            declared[t.name] = study
    return {**plan, **declared}
