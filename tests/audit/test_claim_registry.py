"""The claim registry: one module per claim, each registering one Claim that states its text,
rule, typed evidence, studies and measurements; the report learns about claims only here."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from pydantic import BaseModel

import attnscale.audit.claims as package
from attnscale.audit import claim as C
from attnscale.audit.evidence import Model
from attnscale.audit.studies import PRESETS
from attnscale.audit.verdicts import MissingEvidence, Verdict

CLAIMS_MD = (Path(__file__).parents[2] / "docs" / "claims.md").read_text()
SHIPPED = [f"C{i}" for i in range(1, 14)] + ["Q1", "Q2", "Q3", "Q4", "Q5"]


def test_every_claim_and_question_is_registered_in_order():
    assert [c.id for c in C.claims()] == SHIPPED[:13]
    assert [q.id for q in C.questions()] == SHIPPED[13:]
    assert [c.id for c in C.all_claims()] == SHIPPED


def test_one_module_per_claim_named_by_its_id():
    modules = [m.name for m in pkgutil.iter_modules(package.__path__)]
    found = {}
    for name in modules:
        module = importlib.import_module(f"{package.__name__}.{name}")
        mine = [v for v in vars(module).values() if isinstance(v, C.Claim)]
        assert len(mine) == 1, name
        found[mine[0].id] = name
    assert sorted(found) == sorted(SHIPPED)
    for cid, name in found.items():
        assert name.split("_")[0] == f"{cid[0].lower()}{int(cid[1:]):0{2 if cid[0] == 'C' else 1}d}"


def test_every_claim_states_what_it_reads():
    plan = C.training_plan(PRESETS["standard"])
    kinds: dict[str, object] = {}
    for c in C.all_claims():
        assert c.text and c.measures and c.rule and callable(c.judge), c.id
        assert issubclass(c.evidence, BaseModel), c.id
        assert set(c.studies) <= set(plan), (c.id, c.studies)
        assert c.studies or c.measurements, c.id  # it measures something
        for m in c.measurements:  # claims sharing a kind share one measurement
            assert kinds.setdefault(m.kind, m.compute) is m.compute, (c.id, m.kind)
        if c.question:
            assert set(c.answers) >= {"supported", "refuted", "depends", "inconclusive"}, c.id


def test_claims_doc_states_every_claim_and_cites_the_sources():
    for c in C.all_claims():
        assert f"**{c.id}" in CLAIMS_MD or f"### {c.id}" in CLAIMS_MD, c.id
    for arxiv in ("1706.03762", "2203.03466", "2010.04245", "2309.14322", "2501.19399"):
        assert arxiv in CLAIMS_MD


class Toy(Model):
    x: float


def toy(cid: str = "C98") -> C.Claim:
    return C.Claim(cid, "t", "m", "r", Toy, lambda src: {"x": 1.0},
                   lambda ev: Verdict("supported", "r", f"x = {ev.x}"))


def test_register_refuses_a_taken_or_malformed_id_and_registered_undoes_itself():
    with pytest.raises(ValueError, match="already registered"):
        C.register(toy("C1"))
    with pytest.raises(ValueError, match="C<k> or Q<k>"):
        toy("X1")
    with C.registered(toy()) as t:
        assert C.get_claim("C98") is t and C.claims()[-1] is t
    assert "C98" not in [c.id for c in C.all_claims()]
    with pytest.raises(KeyError, match="no registered claim 'C98'"):
        C.get_claim("C98")


def test_evidence_is_validated_into_the_typed_model():
    t = toy()
    assert t.decide({"x": 2}).because == "x = 2.0"
    with pytest.raises(MissingEvidence, match=r"C98: evidence does not fit Toy \(x: Field"):
        t.decide({})
    with pytest.raises(ValueError, match="y: Extra inputs are not permitted") as bug:
        t.decide({"x": 1.0, "y": 2.0})
    assert not isinstance(bug.value, MissingEvidence)  # a number it does not know: a bug
