"""The sections of a training config: the task, the model, the optimizer and schedule, the run.

Each section is a small pydantic model and the one place that names its fields, their defaults,
bounds and help; :class:`attnscale.lab.config.TrainConfig` holds one of each. The task section
is a discriminated union on ``name`` (one model per task, holding only that task's options),
so an option of another task is an error by construction.

Every field also has a *flat name*, its own name (``d_model``, ``lr``, ``vocab_size``; a task's
``name`` is ``task``): flat names are unique across the sections, so a flat key and a section
path (``model.d_model``) address the same field. :func:`flatten` turns either spelling, and
nested section tables, into flat keys -- the form sweeps, the command line and stored results
use, so a run's id never depends on how its config was spelled.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo

from attnscale.core.scores import SCORES

__all__ = [
    "FIELDS",
    "SECTIONS",
    "TASK_SECTIONS",
    "LengthTask",
    "ModelSection",
    "MqarTask",
    "OptimSection",
    "RunSection",
    "SalienceTask",
    "TaskSection",
    "TextTask",
    "error_path",
    "field_info",
    "flatten",
    "path_of",
]


class Section(BaseModel):
    """A config section: unknown keys are errors, NaN and infinities too."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# -- tasks ----------------------------------------------------------------------------------
# Options left at None take the task class's own default (attnscale.lab.tasks) or
# attnscale.lab.config.TASK_DEFAULTS; each section's options are its class's keyword arguments.


class TaskBase(Section):
    """What every task takes: its sequence length and evaluation batch."""

    seq_len: int | None = Field(None, ge=2, description="Training sequence length (task default).")
    eval_batch_size: int | None = Field(None, description="Eval batch size (task default).")

    def options(self) -> dict[str, Any]:
        """The options that were set, for the task class (``text`` is its ``path``)."""
        out = {k: v for k, v in self if k not in ("name", "seq_len") and v is not None}
        if "text" in out:
            out["path"] = out.pop("text")
        if "eval_multipliers" in out:
            out["eval_multipliers"] = tuple(out["eval_multipliers"])
        return out


class SampledTask(TaskBase):
    """A task whose eval set is a number of sampled sequences."""

    eval_size: int | None = Field(None, description="Eval sequences (task default).")


class MqarTask(SampledTask):
    """Multi-query associative recall (Arora et al. 2023, arXiv:2312.04927)."""

    name: Literal["mqar"] = "mqar"
    vocab_size: int | None = Field(None, description="mqar vocabulary (256; Zoology uses 8192).")
    num_kv_pairs: int | None = Field(None, description="mqar key-value pairs (4).")
    power_a: float | None = Field(None, description="mqar query-gap power law (0.01).")


class TextTask(TaskBase):
    """Next-byte prediction on a text file."""

    name: Literal["text"] = "text"
    text: str | None = Field(None, description="UTF-8 text file for task 'text' (default corpus).")
    eval_windows: int | None = Field(None, description="text eval windows (32).")


class SalienceTask(SampledTask):
    """Recall of the one item marked only by its embedding's norm."""

    name: Literal["salience"] = "salience"
    num_items: int | None = Field(None, description="salience items per sequence (8).")
    num_item_tokens: int | None = Field(None, description="salience item vocabulary (64).")
    num_values: int | None = Field(None, description="salience value vocabulary (64).")
    salient_scale: float | None = Field(None, description="salience embedding scale (3.0).")
    jitter: float | None = Field(None, description="salience scale jitter (0.1).")
    cue: str | None = Field(None, description="salience cue: scale, token or none.")
    layout: str | None = Field(None, description="salience layout: pairs or items.")
    cue_at: str | None = Field(
        None, description="salience cue applied to: embedding (default) or key (after W_k).")


class LengthTask(SampledTask):
    """Key-value recall trained at one length and evaluated at multiples of it."""

    name: Literal["length"] = "length"
    layout: str | None = Field(None, description="length layout: fused or pairs.")
    num_pairs: int | None = Field(None, description="length key-value pairs (4).")
    num_keys: int | None = Field(None, description="length key vocabulary (16).")
    num_values: int | None = Field(None, description="length value vocabulary (16).")
    num_fillers: int | None = Field(None, description="length filler vocabulary (64).")
    eval_multipliers: list[int] | None = Field(None, description="length eval lengths / n.")


TASK_SECTIONS: dict[str, type[TaskBase]] = {
    cls.model_fields["name"].default: cls for cls in (MqarTask, TextTask, SalienceTask, LengthTask)
}
TaskSection = Annotated[MqarTask | TextTask | SalienceTask | LengthTask,
                        Field(discriminator="name")]


# -- model, optimizer, run ------------------------------------------------------------------


def _parse_params(value: Any) -> Any:
    """``"a=1,b=2"`` (the command-line form) -> {"a": 1.0, "b": 2.0}; anything else unchanged."""
    if not isinstance(value, str):
        return value
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, number = item.partition("=")
        try:
            out[name.strip()] = float(number)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ValueError(f"score_params must be name=value[,name=value...], got {item!r}")
    return out


def _param_help(name: str, what: str) -> str:
    """``what`` plus each registered score's default for parameter ``name`` (e.g. "cosine: 1")."""
    owners = [f"{sc.name}: {sc.defaults[name]:g}" for sc in SCORES.values()
              if name in sc.scalar_params()]
    return f"{what} ({', '.join(owners)})." if owners else f"{what}."


class ModelSection(Section):
    """The network and its attention score. Fields named as in
    :class:`attnscale.lab.models.GPTConfig` are passed to it by name."""

    d_model: int = Field(128, ge=1, description="Model width.")
    n_heads: int = Field(1, ge=1, description="Query heads.")
    n_kv_heads: int | None = Field(None, ge=1, description="Key/value heads (GQA; n_heads).")
    n_layers: int = Field(2, ge=1, description="Transformer blocks.")
    pos: Literal["learned", "rope", "none"] = Field(
        "learned", description="Positions (the task's default: rope for length).")
    init_std: float = Field(0.02, gt=0, description="Weight init std (GPT-2: 0.02).")
    init: Literal["gpt2", "mup", "unit"] = Field(
        "gpt2", description="Initialization: gpt2 (std 0.02), mup, or unit (q and k components "
        "of unit variance at init, as Vaswani's √d_k argument assumes).")
    absorb_scale: bool = Field(
        False, description="Absorb 1/√d_k into q and k: their projections' init and Adam LR × "
        "d_k^(−1/4) (for an unscaled score such as dot; under Adam this reproduces scaled_dot).")
    tie_embeddings: bool = Field(True, description="Share input embedding and readout.")
    mlp: bool = Field(True, description="MLP in every block (the task's default: off for mqar).")
    score: str = Field("scaled_dot", description="Attention score (attnscale.SCORES).")
    score_params: str | dict[str, float] = Field(
        default_factory=dict,
        description="Other score parameters, name=value[,name=value] (those without an option).")
    tau: float | None = Field(None, gt=0, description=_param_help("tau", "Temperature τ"))
    cap: float | None = Field(None, gt=0, description=_param_help("cap", "Soft-cap"))
    c: float | None = Field(None, gt=0, description=_param_help("c", "Constant c in q·k·c/d"))
    s: float | None = Field(None, gt=0, description=_param_help("s", "Initial s of s·ln(n)"))
    eps: float | None = Field(None, gt=0, description=_param_help("eps", "Normalization eps"))
    scale: float | None = Field(None, description="Logit scale replacing 1/√d.")
    temperature: str = Field(
        "fixed", description="fixed, or a learned temperature of the score (cosine: swin, qknorm).")

    @field_validator("score")
    @classmethod
    def _known_score(cls, value: str) -> str:
        if value not in SCORES:
            raise ValueError(f"score must be one of {sorted(SCORES)}, got {value!r}")
        return value

    @field_validator("score_params", mode="before")
    @classmethod
    def _parse_score_params(cls, value: Any) -> Any:
        return _parse_params(value)


class OptimSection(Section):
    """AdamW, its schedule (linear warmup, cosine decay) and what acts on the gradients."""

    lr: float = Field(1e-3, gt=0, description="Peak learning rate.")
    steps: int = Field(2000, ge=1, description="Optimizer steps.")
    warmup_steps: int | None = Field(
        None, ge=0, description="Linear warmup steps (default min(100, steps // 10)).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine floor / peak lr.")
    batch_size: int = Field(64, ge=1, description="Sequences per step.")
    weight_decay: float = Field(1e-4, ge=0, description="Independent weight decay λ.")
    beta1: float = Field(0.9, ge=0, lt=1, description="Adam β1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="Adam β2.")
    adam_eps: float = Field(1e-8, gt=0, description="Adam ε.")
    grad_clip: float = Field(1.0, ge=0, description="Gradient-norm clip (0 = off).")
    z_loss: float = Field(0.0, ge=0, description="z-loss coefficient (0 = off; 1e-4 Wortsman).")
    qk_clip: float | None = Field(
        None, gt=0, description="QK-Clip threshold τ (Kimi K2: 100): after each step, heads whose "
        "max |logit| on the step's batch exceeded τ get W_q, W_k × √(τ/max) (off by default).")


class RunSection(Section):
    """Logging and control: what is recorded, how often, and when a run stops."""

    log_every: int = Field(25, ge=1, description="Steps between history rows.")
    eval_every: int | None = Field(None, ge=1, description="Steps between evals (end only).")
    divergence_factor: float = Field(3.0, gt=1, description="Diverged if loss > this × loss₀.")
    threads: int = Field(1, ge=1, description="torch intra-op threads during the run.")
    stats: bool = Field(True, description="Log attention statistics in history rows.")
    stats_batch: int = Field(16, ge=1, description="Sequences of the batch the statistics use.")


SECTIONS: dict[str, type[Section]] = {
    "model": ModelSection, "optim": OptimSection, "run": RunSection,
}


def _flat_fields() -> dict[str, str]:
    """Flat name -> section ("task" for every task option, "" for the top-level seed); raises
    RuntimeError if two sections share a name (a coding error, caught at import)."""
    fields = {"task": "task", "seed": ""}
    fields.update({n: "task" for c in TASK_SECTIONS.values() for n in c.model_fields
                   if n != "name"})
    for section, cls in SECTIONS.items():
        shared = set(cls.model_fields) & set(fields)
        if shared:
            raise RuntimeError(f"section {section} reuses the flat names {sorted(shared)}")
        fields.update({n: section for n in cls.model_fields})
    return fields


FIELDS: dict[str, str] = _flat_fields()


def path_of(name: str) -> str:
    """A flat name's section path: ``d_model`` -> ``model.d_model``, ``task`` -> ``task.name``."""
    section = FIELDS[name]
    return name if not section else "task.name" if name == "task" else f"{section}.{name}"


def field_info(name: str, task: str = "mqar") -> FieldInfo:
    """The pydantic field behind flat name ``name``; a task option that several tasks have
    with their own meanings (``layout``) gets one field whose help joins theirs, ``task``'s
    first."""
    section = FIELDS[name]
    if section in SECTIONS:
        return SECTIONS[section].model_fields[name]
    if name == "task":
        return FieldInfo(annotation=Literal[tuple(TASK_SECTIONS)], default="mqar",
                         description="Task (attnscale.lab.tasks).")
    if name == "seed":
        return FieldInfo(annotation=int, default=0,
                         description="Seed of the initialization and the data.")
    owners = [c.model_fields[name] for c in (TASK_SECTIONS[task], *TASK_SECTIONS.values())
              if name in c.model_fields]
    described = list(dict.fromkeys(f.description for f in owners))  # several tasks' own option
    if len(described) == 1:
        return owners[0]
    return FieldInfo(annotation=owners[0].annotation, default=None,
                     description=" ".join(described))


def error_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a path one can type: ``("task", "mqar", "seq_len")``
    -> ``task.seq_len`` (the union's tag dropped)."""
    parts = [str(p) for p in loc]
    if len(parts) > 2 and parts[0] == "task" and parts[1] in TASK_SECTIONS:
        del parts[1]
    return ".".join(parts)


def flatten(table: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``table`` with section paths (``model.d_model``) and section tables (``{"model": {...}}``,
    ``{"task": {"name": "text", ...}}``) spelled as flat names; flat keys pass unchanged.
    Raises ValueError, its message prefixed by ``where`` (e.g. "[base] "), for an unknown key
    or a field given twice."""
    out: dict[str, Any] = {}

    def put(name: str, value: Any, spelled: str, section: str | None = None) -> None:
        if name not in FIELDS or (section is not None and FIELDS[name] != section):
            known = [*FIELDS, *(path_of(n) for n in FIELDS)]
            hint = difflib.get_close_matches(spelled, known, n=1)
            maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(f"{where}unknown TrainConfig field {spelled!r}{maybe}")
        if name in out:
            raise ValueError(f"{where}{path_of(name)} is given twice")
        out[name] = value

    for key, value in table.items():
        if isinstance(value, BaseModel):  # a section object: the fields it was given
            kind = {"name": value.name} if isinstance(value, TaskBase) else {}
            value = {**kind, **value.model_dump(exclude_unset=True)}
        section, dot, rest = key.partition(".")
        if dot:
            put("task" if key == "task.name" else rest, value, key, section)
        elif key in SECTIONS or (key == "task" and isinstance(value, dict)):
            if not isinstance(value, dict):
                raise ValueError(f"{where}{key} must be a table of its fields, got {value!r}")
            for name, inner in value.items():
                put("task" if key == "task" and name == "name" else name, inner, f"{key}.{name}",
                    key)
        else:
            put(key, value, key)
    return out
