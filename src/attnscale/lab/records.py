"""Typed run records: one run of the results store as a :class:`Run`, its config a validated
:class:`attnscale.lab.config.TrainConfig`.

:meth:`Run.from_row` builds one from a row of :meth:`attnscale.lab.store.Store.runs` (with
``history=True`` for the time series). The stored config is the flat dict
:meth:`TrainConfig.flat` wrote, so ``TrainConfig(**row["config"])`` gives it back and
:meth:`Run.value` reads a flat key (``d_model``, ``init``, ``seq_len``) as the stored dict
holds it; a config that no longer validates raises ValueError naming the run and the field.

History rows stay plain dicts (``step``, ``loss``, ``qk_clipped``, max-logit statistics and
``layers``, a list of per-layer statistics): their keys grow with what the trainer logs.

A row with only some columns (what the tests build) is accepted: a missing column is None (an
empty dict or list for ``final_metrics`` and ``history``) and a missing config field takes its
TrainConfig default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from attnscale.lab.config import TrainConfig
from attnscale.lab.sections import FIELDS, error_path, flatten
from attnscale.lab.store import STATUSES

__all__ = ["Run", "config_error"]


def config_error(error: ValidationError) -> str:
    """A TrainConfig validation error as one line: ``model.d_model: Input should be …``, one
    part per error."""
    parts = []
    for err in error.errors():
        where = error_path(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Run:
    """One stored run: its labels and status, its config as a :class:`TrainConfig`, its final
    numbers and its time series (history rows, plain dicts)."""

    id: str
    status: str
    config: TrainConfig
    sweep: str | None = None
    variant: str | None = None
    final_loss: float | None = None
    final_metric: float | None = None
    final_metrics: dict[str, Any] = field(default_factory=dict)
    initial_loss: float | None = None
    diverged_step: int | None = None
    steps: int | None = None
    elapsed_s: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seed(self) -> int:
        """The config's seed."""
        return self.config.seed

    @property
    def lr(self) -> float:
        """The config's peak learning rate."""
        return self.config.optim.lr

    @cached_property
    def flat_config(self) -> dict[str, Any]:
        """The config as the flat dict the store keeps (:meth:`TrainConfig.flat`)."""
        return self.config.flat()

    def value(self, key: str) -> Any:
        """Config field ``key`` by its flat name (``d_model``) or section path
        (``model.d_model``), as the stored dict holds it (None for a field left out while off,
        such as ``qk_clip``); ValueError for a name TrainConfig does not have."""
        name = key if key in FIELDS else next(iter(flatten({key: None}, "value: ")))
        return self.flat_config.get(name)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        """The record of one row of :meth:`attnscale.lab.store.Store.runs` (a dict with
        ``config``; ``id``, ``status`` and the numbers as the store names them). ValueError
        naming the run and the field for a config TrainConfig rejects, or an unknown status."""
        rid = str(row.get("id") or "")
        status = row.get("status") or "queued"
        if status not in STATUSES:
            raise ValueError(f"run {rid or '?'}: unknown status {status!r}; valid: "
                             f"{list(STATUSES)}")
        return cls(
            id=rid, status=status, config=_config(rid, row.get("config")),
            sweep=row.get("sweep"), variant=row.get("variant"),
            final_loss=_number(row.get("final_loss")),
            final_metric=_number(row.get("final_metric")),
            final_metrics=dict(row.get("final_metrics") or {}),
            initial_loss=_number(row.get("initial_loss")),
            diverged_step=_count(row.get("diverged_step")), steps=_count(row.get("steps")),
            elapsed_s=_number(row.get("elapsed_s")),
            history=list(row.get("history") or []),
        )


def _config(rid: str, config: Any) -> TrainConfig:
    """The stored config validated; ValueError naming run ``rid`` and the bad field."""
    if isinstance(config, TrainConfig):
        return config
    if not isinstance(config, Mapping):
        raise ValueError(f"run {rid or '?'}: config must be a dict of TrainConfig fields, got "
                         f"{type(config).__name__}")
    try:
        return TrainConfig(**config)
    except ValidationError as e:
        raise ValueError(f"run {rid or '?'}: config: {config_error(e)}") from None
