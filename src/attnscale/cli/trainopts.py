"""The ``attnscale train`` options: one per :class:`attnscale.lab.config.TrainConfig` field, made
from the config's sections so the command line and the config never disagree."""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Annotated, Any

import typer
from rich.markup import escape

from attnscale.lab.build import build_task
from attnscale.lab.config import TASK_OPTIONS, TrainConfig, model_defaults
from attnscale.lab.sections import FIELDS, field_info, path_of

__all__ = ["cli_type", "shown_default", "with_train_options"]

# Older spellings still accepted for TrainConfig fields (the first name is the field's).
TRAIN_ALIASES = {"n_heads": ("--heads",), "n_kv_heads": ("--kv-heads",), "n_layers": ("--layers",)}
# A trailing "(8)." in a field's description: a task class's own default, which the shown
# default (what runs actually use, TASK_DEFAULTS included) replaces.
BARE_NUMBER_NOTE = re.compile(r"\s*\(\s*-?[0-9][0-9.e+-]*\s*\)\.$")
# The help panels of the train options: section -> title ("" is the top-level seed).
PANELS = {"task": "Task", "model": "Model", "optim": "Optimizer and schedule",
          "": "Seed, logging and control", "run": "Seed, logging and control"}


def with_train_options(
    command: typer.models.CommandFunctionType,
) -> typer.models.CommandFunctionType:
    """Add one option per ``attnscale.lab.config.TrainConfig`` field to ``command``'s signature,
    by flat name and section path (``--d-model``, ``--model.d-model``), grouped by section.

    Every option defaults to None, meaning "the config's default", so the CLI and the config
    never disagree about defaults and a new config field is an option without further edits.
    """
    hints = typing.get_type_hints(command, include_extras=True)
    params = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(command).parameters.values()
        if p.kind != p.VAR_KEYWORD
    ]
    resolved = TrainConfig()
    flat, task = resolved.flat(), build_task(resolved)
    for name in sorted(FIELDS, key=lambda n: list(PANELS).index(FIELDS[n])):
        info = field_info(name)
        kind, choices = cli_type(info.annotation)
        flag, path = "--" + name.replace("_", "-"), "--" + path_of(name).replace("_", "-")
        names = [flag, *([path] if path != flag else []), *TRAIN_ALIASES.get(name, ())]
        decls = [f"{flag}/--no-{flag[2:]}", f"{path}/--no-{path[2:]}"] if kind is bool else names
        default = shown_default(name, flat, task)
        help_text = info.description or ""
        if default:
            help_text = BARE_NUMBER_NOTE.sub(".", help_text)
        if choices:
            help_text += f" One of: {', '.join(choices)}."
        if default:
            help_text += f" [default: {default}]"
        option = typer.Option(*decls, help=escape(help_text),  # help is rich markup: no "[...]"
                              rich_help_panel=PANELS[FIELDS[name]])
        annotation = Annotated[kind | None, option]
        kw_only = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(name, kw_only, default=None, annotation=annotation))
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


def shown_default(name: str, flat: dict[str, Any], task: object) -> str:
    """The value a run uses for field ``name`` when the option is not given ("" if it depends
    on other options), "VALUE for TASK" where the default task sets it; ``flat``: the default
    config's :meth:`TrainConfig.flat`."""
    task_name = flat["task"]
    value = flat.get(name)
    if name == "seq_len" or name in TASK_OPTIONS or name in model_defaults(task_name):
        value = getattr(task, name, None) if value is None else value
        return "" if value is None else f"{value} for {task_name}"
    info = field_info(name)
    if info.default is None or info.default_factory is not None:
        return ""
    return str(value)


def cli_type(annotation: object) -> tuple[object, tuple[str, ...]]:
    """The click-parsable type of a config field (Literal -> str with its choices)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return str, typing.get_args(annotation)
    return annotation, ()
