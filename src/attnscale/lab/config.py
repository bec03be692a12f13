"""The configuration of one training run: :class:`TrainConfig`, in sections, validated as a whole.

The sections (:mod:`attnscale.lab.sections`): ``task`` (one model per task), ``model``,
``optim`` (optimizer and schedule), ``run`` (logging and control), and the ``seed``. Every field
is a CLI option of ``attnscale train`` and a key of a sweep file, by its flat name (``d_model``)
or its section path (``model.d_model``). Defaults never conflict with a valid user choice:

* ``warmup_steps`` left unset is min(100, steps // 10), so every ``steps`` >= 1 works;
* each task brings the model settings it needs (the task class's ``model_defaults``, e.g.
  RoPE for the length task, and :data:`TASK_DEFAULTS`), applied to the fields the user did not
  set (pydantic's ``model_fields_set``);
* score parameters come from the registry (:mod:`attnscale.core.scores`): the common ones have
  their own field (:data:`SCORE_PARAMS`), any other parameter of a registered score goes in
  ``score_params``.

After validation every field holds the value the run uses. :meth:`TrainConfig.flat` records
it as one flat dict -- the form stored with every run and hashed into its id, the same as before
the config had sections, so stored runs keep their ids -- and ``TrainConfig(**config.flat())``
and ``TrainConfig(**config.model_dump())`` both round-trip. A field of :data:`OFF_BY_DEFAULT`
(``qk_clip``) is left out of the flat dict while it is None (off), so configs stored before it
existed resolve to the same dict, and the same run id, as before.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attnscale.core.nn import check_sizes, check_temperature
from attnscale.core.scores import get_score, resolve_params
from attnscale.integrations.qkclip import check_clippable_score
from attnscale.lab.sections import (
    FIELDS,
    SECTIONS,
    TASK_SECTIONS,
    ModelSection,
    MqarTask,
    OptimSection,
    RunSection,
    TaskSection,
    flatten,
)
from attnscale.lab.tasks import TASKS
from attnscale.util.validate import check_input_file

__all__ = [
    "OFF_BY_DEFAULT",
    "SCORE_PARAMS",
    "TASK_DEFAULTS",
    "TASK_OPTIONS",
    "TrainConfig",
    "accepted_score_params",
    "model_defaults",
]

SCORE_PARAMS = ("tau", "cap", "c", "s", "eps", "scale")  # score parameters with their own field
# every task's options (the task sections' fields but the name, seq_len and text), in order
TASK_OPTIONS = tuple(n for n, where in FIELDS.items()
                     if where == "task" and n not in ("task", "seq_len", "text"))
# Fields added after runs were stored, whose default (None) is the behaviour before them: a dump
# leaves them out while they are None, so the resolved config -- and the run id hashed from it
# (attnscale.lab.sweep.config_id) -- of every earlier run stays what it was.
OFF_BY_DEFAULT = ("qk_clip",)
# Per-task values for fields left unset: the MQAR quick config. Zoology's vocabulary of 8192
# would make the readout dominate a small CPU model; (seq 64, 4 pairs) is the first point of the
# Zoology sweep; its MQAR models are attention-only (state mixer = identity), and here, too, an
# MLP delays the jump out of the chance plateau by thousands of steps.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "mqar": {"vocab_size": 256, "num_kv_pairs": 4, "mlp": False},
}


def model_defaults(task: str) -> dict[str, Any]:
    """Model fields ``task`` sets unless the user does: its class's ``model_defaults`` (what the
    task needs), then the non-task-option entries of :data:`TASK_DEFAULTS` (the quick config)."""
    own = dict(getattr(TASKS[task], "model_defaults", {}))
    quick = {k: v for k, v in TASK_DEFAULTS.get(task, {}).items() if k not in TASK_OPTIONS}
    return {**own, **quick}


def accepted_score_params(score: str) -> list[str]:
    """The number-valued parameters ``score`` takes (registry defaults), plus ``scale`` if it
    has one."""
    sc = get_score(score)
    names = list(sc.scalar_params())
    return [*names, "scale"] if sc.uses_scale else names


class TrainConfig(BaseModel):
    """Everything a run depends on, in sections. Unknown keys are an error; flat keys
    (``d_model=64``), section paths (``**{"model.d_model": 64}``) and sections
    (``model={"d_model": 64}``) all work, and ``TrainConfig(**config.flat())`` round-trips.

    Defaults are the MQAR quick config (with :data:`TASK_DEFAULTS`): sequence 64, 4 key-value
    pairs, vocabulary 256; a 2-layer, attention-only, d_model 128 model with one head (d_k = 128)
    and 1/√d_k attention, as Zoology's MQAR configs (lr 1e-3 is also Zoology's); AdamW lr 1e-3,
    batch 64, 2000 steps, the first 100 warming up. With it ``scaled_dot`` reaches >= 99% eval
    accuracy in a few single-thread CPU minutes. The accuracy stays at chance (1/4) on a plateau
    for a seed-dependent 200-1300 steps, then jumps; with an MLP in the blocks, 2 heads
    (d_k = 64) or lr 1e-2 the plateau outlasted 1500-5000 steps in our trials.
    Score parameters and task options left at None take the score's / task's defaults;
    model fields left unset take the task's (:func:`model_defaults`).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    task: TaskSection = Field(default_factory=MqarTask, description="The task and its options.")
    model: ModelSection = Field(default_factory=ModelSection, description="The network.")
    optim: OptimSection = Field(default_factory=OptimSection,
                                description="Optimizer and schedule.")
    run: RunSection = Field(default_factory=RunSection, description="Logging and control.")
    seed: int = Field(0, ge=0, description="Seed of the initialization and the data.")

    @model_validator(mode="before")
    @classmethod
    def _sectioned(cls, data: Any) -> Any:
        """Flat keys and section paths -> sections; a task option of another task is an error."""
        if not isinstance(data, dict):
            return data
        flat = flatten(data)
        task = flat.pop("task", "mqar")
        if task not in TASK_SECTIONS:
            raise ValueError(f"task must be one of {sorted(TASK_SECTIONS)}, got {task!r}")
        accepted = TASK_SECTIONS[task].model_fields
        out: dict[str, Any] = {"task": {"name": task}}
        for name, value in flat.items():
            section = FIELDS[name]
            if section == "task" and name not in accepted:
                if value is None:  # the flat form lists every task's options, None if unset
                    continue
                if name == "text":
                    raise ValueError(f"text is only for task 'text', not {task!r}")
                raise ValueError(f"{name} is not an option of task {task!r}")
            if not section:
                out[name] = value
            else:
                out.setdefault(section, {})[name] = value
        return out

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        self._apply_defaults()
        self._check_sizes()
        self._check_score_params()
        self._check_task()
        if self.optim.warmup_steps > self.optim.steps:
            raise ValueError(f"warmup_steps ({self.optim.warmup_steps}) must be <= steps "
                             f"({self.optim.steps})")
        return self

    def _apply_defaults(self) -> None:
        """Fill the fields the user left unset with the task's and the steps' defaults."""
        # Written to __dict__: assignment would count them as set by the user.
        for name, value in model_defaults(self.task.name).items():
            if name not in self.model.model_fields_set:
                self.model.__dict__[name] = value
        if self.optim.warmup_steps is None:
            self.optim.__dict__["warmup_steps"] = min(100, self.optim.steps // 10)

    def _check_sizes(self) -> None:
        m = self.model
        check_sizes(m.d_model, m.n_heads, m.n_heads if m.n_kv_heads is None else m.n_kv_heads)
        if m.pos == "rope" and (m.d_model // m.n_heads) % 2:
            raise ValueError("pos='rope' needs an even head dimension d_model/n_heads")

    def _check_score_params(self) -> None:
        m = self.model
        accepted = accepted_score_params(m.score)
        given = [n for n in SCORE_PARAMS if getattr(m, n) is not None]
        for name in [*given, *m.score_params]:
            if name not in accepted:
                raise ValueError(
                    f"{name} is not a parameter of score {m.score!r} "
                    f"(it accepts: {', '.join(accepted) or 'none'})"
                )
            if name in m.score_params and name in SCORE_PARAMS:
                raise ValueError(f"score_params: {name} has its own option; set {name} instead")
        check_temperature(m.score, m.temperature)
        if m.absorb_scale:
            sc, d_k = get_score(m.score), m.d_model // m.n_heads
            if sc.dot_factor is None or sc.dot_factor(d_k, None, sc.defaults) != 1.0:
                raise ValueError(f"absorb_scale needs an unscaled score (logit q·k, such as "
                                 f"'dot'), not {m.score!r}")
        if m.temperature != "fixed":
            for name in get_score(m.score).learnable[m.temperature].supplies:
                if name in given or name in m.score_params:
                    raise ValueError(
                        f"{name} is learned under temperature={m.temperature!r}; omit it"
                    )
        if self.optim.qk_clip is not None:
            try:
                check_clippable_score(m.score)
            except ValueError as err:
                raise ValueError(f"qk_clip: {err}") from None
        params = self.score_kwargs()
        resolve_params(get_score(m.score), params, params.pop("scale", None))

    def _check_task(self) -> None:
        if getattr(self.task, "text", None) is not None:
            check_input_file("text", self.task.text)
        if self.task.name == "length" and self.model.pos == "learned":
            raise ValueError(
                "pos='learned' cannot reach the length task's longer eval sequences; "
                "use pos='rope' or pos='none'"
            )

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name (JSON values; every task's options, None where another
        task's): the form stored with a run and hashed into its id
        (:func:`attnscale.lab.sweep.config_id`), as it was before the config had sections."""
        task = self.task.model_dump(mode="json")
        out: dict[str, Any] = {"task": task.pop("name"), "seq_len": task.pop("seq_len"),
                               "text": task.pop("text", None)}
        out.update({name: task.get(name) for name in TASK_OPTIONS})
        for section in SECTIONS:
            out.update(getattr(self, section).model_dump(mode="json"))
        out["seed"] = self.seed
        for name in OFF_BY_DEFAULT:
            if out.get(name, 0) is None:
                del out[name]
        return out

    def replace(self, **changes: Any) -> TrainConfig:
        """A new config, validated, with ``changes`` (flat names or section paths) over the
        fields this one was given: ``config.replace(seed=3)``. Values this one filled in by
        default (the warmup from its steps, the task's model settings) are worked out again."""
        sections = {name: getattr(self, name) for name in ("task", *SECTIONS)}
        given = {**flatten(sections), "seed": self.seed}
        return TrainConfig(**{**given, **flatten(changes, "changes: ")})

    def score_kwargs(self) -> dict[str, float]:
        """The score parameters that were set (own fields and ``score_params``), for
        :class:`attnscale.lab.models.GPTConfig`."""
        m = self.model
        own = {n: getattr(m, n) for n in SCORE_PARAMS if getattr(m, n) is not None}
        return {**own, **m.score_params}

    def task_options(self) -> dict[str, Any]:
        """Options for :func:`attnscale.lab.tasks.make_task`: the set ones over the CPU defaults."""
        accepted = inspect.signature(TASKS[self.task.name].__init__).parameters
        defaults = TASK_DEFAULTS.get(self.task.name, {})
        options = {k: v for k, v in defaults.items() if k in accepted}
        return {**options, **self.task.options()}
