"""report.json's JSON Schema, built from the claim registry.

The fixed part (the page's fields, an entry's fields, the verdicts) lives in
``templates/report.schema.json`` and is what docs/report.schema.json documents (a test keeps
the two equal; ``python -m attnscale.audit.schema > docs/report.schema.json`` rewrites it);
:func:`report_schema` adds what the registry knows: the ids of the registered claims and
questions, in order, one entry each. So a registered claim reaches the schema every report is
validated against with no other edit.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

from attnscale.audit.claim import claims, questions


@cache
def base_schema() -> dict[str, Any]:
    """The registry-independent part of the schema."""
    text = resources.files("attnscale.audit").joinpath("templates/report.schema.json")
    return json.loads(text.read_text())


def _entries(ids: list[str]) -> dict[str, Any]:
    """An array with one entry per id, in this order."""
    return {"type": "array", "minItems": len(ids), "maxItems": len(ids),
            "prefixItems": [{"allOf": [{"$ref": "#/$defs/entry"},
                                       {"properties": {"id": {"const": i}}}]} for i in ids],
            "items": False}


def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every report.json validates against."""
    schema = copy.deepcopy(base_schema())
    schema["properties"]["claims"] = _entries([c.id for c in claims()])
    schema["properties"]["questions"] = _entries([q.id for q in questions()])
    return schema


if __name__ == "__main__":
    print(json.dumps(base_schema(), indent=2, ensure_ascii=False))
