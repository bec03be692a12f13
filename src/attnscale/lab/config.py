"""The configuration of one training run: :class:`TrainConfig`, validated as a whole.

Every field is a CLI option of ``attnscale train`` and a key of a sweep file. Defaults never
conflict with a valid user choice:

* ``warmup_steps`` left unset is min(100, steps // 10), so every ``steps`` >= 1 works;
* each task brings the model settings it needs (the task class's ``model_defaults``, e.g.
  RoPE for the length task, and :data:`TASK_DEFAULTS`), applied to the fields the user did not
  set (pydantic's ``model_fields_set``);
* score parameters come from the registry (:mod:`attnscale.core.scores`): the common ones have
  their own field (:data:`SCORE_PARAMS`), any other parameter of a registered score goes in
  ``score_params``.

After validation every field holds the value the run uses, so ``model_dump()`` records it and
``TrainConfig(**config.model_dump())`` round-trips. The one exception: a field of
:data:`OFF_BY_DEFAULT` (``qk_clip``) is left out of the dump while it is None (off), so configs
stored before it existed resolve to the same dict, and the same run id, as before.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from attnscale.core.nn import check_sizes, check_temperature
from attnscale.core.scores import SCORES, get_score, resolve_params
from attnscale.integrations.qkclip import check_clippable_score
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
TASK_OPTIONS = (
    "vocab_size", "num_kv_pairs", "power_a", "num_items", "num_item_tokens", "num_values",
    "salient_scale", "jitter", "cue", "layout", "cue_at", "num_pairs", "num_keys", "num_fillers",
    "eval_multipliers", "eval_size", "eval_batch_size", "eval_windows",
)  # fmt: skip
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


def _param_help(name: str, what: str) -> str:
    """``what`` plus each registered score's default for parameter ``name`` (e.g. "cosine: 1")."""
    owners = [f"{sc.name}: {sc.defaults[name]:g}" for sc in SCORES.values()
              if name in sc.scalar_params()]
    return f"{what} ({', '.join(owners)})." if owners else f"{what}."


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


class TrainConfig(BaseModel):
    """Everything a run depends on. Unknown keys are an error; ``TrainConfig(**d)`` round-trips
    ``model_dump()``.

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

    # -- task ---------------------------------------------------------------------------------
    task: Literal["mqar", "text", "salience", "length"] = Field(
        "mqar", description="Task (attnscale.lab.tasks)."
    )
    seq_len: int | None = Field(None, ge=2, description="Training sequence length (task default).")
    text: str | None = Field(None, description="UTF-8 text file for task 'text' (default corpus).")
    vocab_size: int | None = Field(None, description="mqar vocabulary (256; Zoology uses 8192).")
    num_kv_pairs: int | None = Field(None, description="mqar key-value pairs (4).")
    power_a: float | None = Field(None, description="mqar query-gap power law (0.01).")
    num_items: int | None = Field(None, description="salience items per sequence (8).")
    num_item_tokens: int | None = Field(None, description="salience item vocabulary (64).")
    num_values: int | None = Field(None, description="value vocabulary (salience 64, length 16).")
    salient_scale: float | None = Field(None, description="salience embedding scale (3.0).")
    jitter: float | None = Field(None, description="salience scale jitter (0.1).")
    cue: str | None = Field(None, description="salience cue: scale, token or none.")
    layout: str | None = Field(
        None, description="salience: pairs or items; length: fused or pairs.")
    cue_at: str | None = Field(
        None, description="salience cue applied to: embedding (default) or key (after W_k)."
    )
    num_pairs: int | None = Field(None, description="length key-value pairs (4).")
    num_keys: int | None = Field(None, description="length key vocabulary (16).")
    num_fillers: int | None = Field(None, description="length filler vocabulary (64).")
    eval_multipliers: list[int] | None = Field(None, description="length eval lengths / n.")
    eval_size: int | None = Field(None, description="Eval sequences (task default).")
    eval_batch_size: int | None = Field(None, description="Eval batch size (task default).")
    eval_windows: int | None = Field(None, description="text eval windows (32).")

    # -- attention score ----------------------------------------------------------------------
    score: str = Field("scaled_dot", description="Attention score (attnscale.SCORES).")
    score_params: str | dict[str, float] = Field(
        default_factory=dict,
        description="Other score parameters, name=value[,name=value] (those without an option).",
    )
    tau: float | None = Field(None, gt=0, description=_param_help("tau", "Temperature τ"))
    cap: float | None = Field(None, gt=0, description=_param_help("cap", "Soft-cap"))
    c: float | None = Field(None, gt=0, description=_param_help("c", "Constant c in q·k·c/d"))
    s: float | None = Field(None, gt=0, description=_param_help("s", "Initial s of s·ln(n)"))
    eps: float | None = Field(None, gt=0, description=_param_help("eps", "Normalization eps"))
    scale: float | None = Field(None, description="Logit scale replacing 1/√d.")
    temperature: str = Field(
        "fixed", description="fixed, or a learned temperature of the score (cosine: swin, qknorm)."
    )

    # -- model --------------------------------------------------------------------------------
    d_model: int = Field(128, ge=1, description="Model width.")
    n_heads: int = Field(1, ge=1, description="Query heads.")
    n_kv_heads: int | None = Field(None, ge=1, description="Key/value heads (GQA; n_heads).")
    n_layers: int = Field(2, ge=1, description="Transformer blocks.")
    pos: Literal["learned", "rope", "none"] = Field(
        "learned", description="Positions (the task's default: rope for length)."
    )
    init_std: float = Field(0.02, gt=0, description="Weight init std (GPT-2: 0.02).")
    init: Literal["gpt2", "mup", "unit"] = Field(
        "gpt2", description="Initialization: gpt2 (std 0.02), mup, or unit (q and k components "
        "of unit variance at init, as Vaswani's √d_k argument assumes).")
    absorb_scale: bool = Field(
        False, description="Absorb 1/√d_k into q and k: their projections' init and Adam LR × "
        "d_k^(−1/4) (for an unscaled score such as dot; under Adam this reproduces scaled_dot).")
    tie_embeddings: bool = Field(True, description="Share input embedding and readout.")
    mlp: bool = Field(True, description="MLP in every block (the task's default: off for mqar).")

    # -- optimization -------------------------------------------------------------------------
    lr: float = Field(1e-3, gt=0, description="Peak learning rate.")
    steps: int = Field(2000, ge=1, description="Optimizer steps.")
    warmup_steps: int | None = Field(
        None, ge=0, description="Linear warmup steps (default min(100, steps // 10))."
    )
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
    seed: int = Field(0, ge=0, description="Seed of the initialization and the data.")

    # -- logging and control ------------------------------------------------------------------
    log_every: int = Field(25, ge=1, description="Steps between history rows.")
    eval_every: int | None = Field(None, ge=1, description="Steps between evals (end only).")
    divergence_factor: float = Field(3.0, gt=1, description="Diverged if loss > this × loss₀.")
    threads: int = Field(1, ge=1, description="torch intra-op threads during the run.")
    stats: bool = Field(True, description="Log attention statistics in history rows.")
    stats_batch: int = Field(16, ge=1, description="Sequences of the batch the statistics use.")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The dump, without the :data:`OFF_BY_DEFAULT` fields that are None."""
        out = handler(self)
        for name in OFF_BY_DEFAULT:
            if out.get(name, 0) is None:
                del out[name]
        return out

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

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        self._apply_defaults()
        self._check_sizes()
        self._check_score_params()
        self._check_task_options()
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be <= steps ({self.steps})")
        return self

    def _apply_defaults(self) -> None:
        """Fill the fields the user left unset with the task's and the steps' defaults."""
        # Written to __dict__: assignment would count them as set by the user.
        for name, value in model_defaults(self.task).items():
            if name not in self.model_fields_set:
                self.__dict__[name] = value
        if self.warmup_steps is None:
            self.__dict__["warmup_steps"] = min(100, self.steps // 10)

    def _check_sizes(self) -> None:
        n_kv_heads = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        check_sizes(self.d_model, self.n_heads, n_kv_heads)  # the module's own check
        if self.pos == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError("pos='rope' needs an even head dimension d_model/n_heads")

    def _check_score_params(self) -> None:
        accepted = accepted_score_params(self.score)
        given = [n for n in SCORE_PARAMS if getattr(self, n) is not None]
        for name in [*given, *self.score_params]:
            if name not in accepted:
                raise ValueError(
                    f"{name} is not a parameter of score {self.score!r} "
                    f"(it accepts: {', '.join(accepted) or 'none'})"
                )
            if name in self.score_params and name in SCORE_PARAMS:
                raise ValueError(f"score_params: {name} has its own option; set {name} instead")
        check_temperature(self.score, self.temperature)
        if self.absorb_scale:
            sc, d_k = get_score(self.score), self.d_model // self.n_heads
            if sc.dot_factor is None or sc.dot_factor(d_k, None, sc.defaults) != 1.0:
                raise ValueError(f"absorb_scale needs an unscaled score (logit q·k, such as "
                                 f"'dot'), not {self.score!r}")
        if self.temperature != "fixed":
            for name in get_score(self.score).learnable[self.temperature].supplies:
                if name in given or name in self.score_params:
                    raise ValueError(
                        f"{name} is learned under temperature={self.temperature!r}; omit it"
                    )
        if self.qk_clip is not None:
            try:
                check_clippable_score(self.score)
            except ValueError as err:
                raise ValueError(f"qk_clip: {err}") from None
        params = self.score_kwargs()
        resolve_params(get_score(self.score), params, params.pop("scale", None))

    def _check_task_options(self) -> None:
        accepted = inspect.signature(TASKS[self.task].__init__).parameters
        for name in TASK_OPTIONS:
            if getattr(self, name) is not None and name not in accepted:
                raise ValueError(f"{name} is not an option of task {self.task!r}")
        if self.text is not None:
            if self.task != "text":
                raise ValueError(f"text is only for task 'text', not {self.task!r}")
            check_input_file("text", self.text)
        if self.task == "length" and self.pos == "learned":
            raise ValueError(
                "pos='learned' cannot reach the length task's longer eval sequences; "
                "use pos='rope' or pos='none'"
            )

    def score_kwargs(self) -> dict[str, float]:
        """The score parameters that were set (own fields and ``score_params``), for
        :class:`attnscale.lab.models.GPTConfig`."""
        own = {n: getattr(self, n) for n in SCORE_PARAMS if getattr(self, n) is not None}
        return {**own, **self.score_params}

    def task_options(self) -> dict[str, Any]:
        """Options for :func:`attnscale.lab.tasks.make_task`: the set ones over the CPU defaults."""
        accepted = inspect.signature(TASKS[self.task].__init__).parameters
        defaults = TASK_DEFAULTS.get(self.task, {})
        options = {k: v for k, v in defaults.items() if k in accepted}
        options.update({n: getattr(self, n) for n in TASK_OPTIONS if getattr(self, n) is not None})
        if "eval_multipliers" in options:
            options["eval_multipliers"] = tuple(options["eval_multipliers"])
        if self.text is not None:
            options["path"] = self.text
        return options
