"""The report's measurements that need no training, and their cache in the results database.

Each claim declares its own (:class:`attnscale.audit.claim.Measurement`, in its module), a
JSON-ready dict; :func:`measure_all` runs them once per preset and attnscale version and keeps
the answers in the store's ``measurements`` table, so a rerun reads them back instead of
measuring again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from attnscale.audit.claim import Measurement, all_claims
from attnscale.audit.studies import Preset
from attnscale.lab.store import Store
from attnscale.util.jsonio import dumps
from attnscale.util.provenance import versions


def measurement_key(kind: str, params: dict[str, Any]) -> str:
    """``kind:`` and the first 16 hex digits of the sha256 of ``params`` as sorted-key JSON."""
    digest = hashlib.sha256(dumps(params, sort_keys=True, default=str).encode()).hexdigest()
    return f"{kind}:{digest[:16]}"


def cached(store: Store, kind: str, params: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """The stored value for (kind, params); on a miss, ``compute()`` stored and returned."""
    key = measurement_key(kind, params)
    value = store.get_measurement(key)
    if value is None:
        value = store.put_measurement(key, compute(), kind=kind, params=params)
    return value


def measure_all(p: Preset, store: Store, say: Callable[[str], None]) -> dict[str, Any]:
    """Every measurement the registered claims declare (:class:`attnscale.audit.claim.
    Measurement`), by kind, each once, from the store when already there."""
    jobs: dict[str, Measurement] = {}
    for claim in all_claims():
        for m in claim.measurements:
            first = jobs.setdefault(m.kind, m)
            if first.compute is not m.compute or first.params(p) != m.params(p):
                raise ValueError(f"{claim.id} declares measurement {m.kind!r} with another "
                                 "compute or params than a claim before it: one kind, one "
                                 "measurement")
    measured = {}
    for kind, m in jobs.items():
        say(f"measuring {kind}")
        params = {**m.params(p), "attnscale": versions().get("attnscale")}
        measured[kind] = cached(store, kind, params, lambda m=m: m.compute(p))
    return measured


