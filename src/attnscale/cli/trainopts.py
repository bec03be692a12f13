"""The ``attnscale train`` options: one per :class:`attnscale.lab.config.TrainConfig` field, made
from the config's sections so the command line and the config never disagree.

The config imports torch (its checks are the model's), which ``attnscale --help`` and the other
commands do without: ``train`` registers with its own options only (:func:`with_own_options`),
and :class:`TrainCommand` adds the config's the first time ``train`` is parsed (a run, a usage
error or ``train --help``).
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperCommand
from typer.main import get_command_from_info
from typer.models import CommandInfo

__all__ = ["TrainCommand", "cli_type", "shown_default", "train_options", "with_own_options"]

# Older spellings still accepted for TrainConfig fields (the first name is the field's).
TRAIN_ALIASES = {"n_heads": ("--heads",), "n_kv_heads": ("--kv-heads",), "n_layers": ("--layers",)}
# A trailing "(8)." in a field's description: a task class's own default, which the shown
# default (what runs actually use, TASK_DEFAULTS included) replaces.
BARE_NUMBER_NOTE = re.compile(r"\s*\(\s*-?[0-9][0-9.e+-]*\s*\)\.$")
# The help panels of the train options: section -> title ("" is the top-level seed).
PANELS = {"task": "Task", "model": "Model", "optim": "Optimizer and schedule",
          "": "Seed, logging and control", "run": "Seed, logging and control"}


def own_parameters(command: Callable[..., Any]) -> list[inspect.Parameter]:
    """``command``'s parameters, annotations resolved, less its ``**options``."""
    hints = typing.get_type_hints(command, include_extras=True)
    return [p.replace(annotation=hints[p.name])
            for p in inspect.signature(command, follow_wrapped=False).parameters.values()
            if p.kind != p.VAR_KEYWORD]


def with_own_options(command: typer.models.CommandFunctionType
                     ) -> typer.models.CommandFunctionType:
    """Register ``command`` (which takes the config fields as ``**options``) with its own
    options only; :class:`TrainCommand` adds the config's when ``train`` is parsed."""
    command.__signature__ = inspect.Signature(own_parameters(command))
    return command


@functools.cache  # one per process: it builds the default config and task
def train_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """A function calling ``command`` whose signature has ``command``'s own options and one
    option per ``attnscale.lab.config.TrainConfig`` field, by flat name and section path
    (``--d-model``, ``--model.d-model``), grouped by section.

    Every option defaults to None, meaning "the config's default", so the CLI and the config
    never disagree about defaults and a new config field is an option without further edits.
    """
    from attnscale.lab.build import build_task
    from attnscale.lab.config import TrainConfig
    from attnscale.lab.sections import FIELDS, field_info, path_of

    params = own_parameters(command)
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

    def with_options(**values: Any) -> Any:
        return command(**values)

    with_options.__name__, with_options.__doc__ = command.__name__, command.__doc__
    with_options.__signature__ = inspect.Signature(params)
    with_options.__annotations__ = {p.name: p.annotation for p in params}
    return with_options


class TrainCommand(TyperCommand):
    """The ``train`` command, its config options added at its first parse (:meth:`make_context`:
    a run, a usage error or ``train --help``); ``attnscale --help`` lists it from its
    docstring alone, without importing the config."""

    full = False  # whether the config options are in

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        """Add the config options, then parse as any command."""
        self.add_config_options()
        return super().make_context(info_name, args, parent, **extra)

    def add_config_options(self) -> None:
        """Take the parameters and callback of the command :func:`train_options` makes of
        the registered function (once)."""
        if self.full:
            return
        registered = self.callback.__wrapped__  # typer's wrapper of the train function
        full = get_command_from_info(CommandInfo(callback=train_options(registered)),
                                     pretty_exceptions_short=False,
                                     rich_markup_mode=self.rich_markup_mode)
        self.params, self.callback, self.full = full.params, full.callback, True


def shown_default(name: str, flat: dict[str, Any], task: object) -> str:
    """The value a run uses for field ``name`` when the option is not given ("" if it depends
    on other options), "VALUE for TASK" where the default task sets it; ``flat``: the default
    config's :meth:`TrainConfig.flat`."""
    from attnscale.lab.config import TASK_OPTIONS, model_defaults
    from attnscale.lab.sections import field_info

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
