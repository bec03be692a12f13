"""``attnscale check PATH``: per-head attention health of a local Hugging Face checkpoint, with an
exit status a CI pipeline can gate on (0 healthy, 1 flagged, 2 bad input).

:mod:`attnscale.integrations.checkup` (torch, transformers) is imported when the command runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from attnscale.cli.app import app, console, print_json, say_token_budget
from attnscale.cli.tables import print_table

FLAGGED = 1  # exit status when any head is flagged
CHECK_COLUMNS = ("layer", "head", "logit std", "s_c", "max |logit|", "entropy", "ln n", "H/ln n",
                 "max w", "sat. rows", "eff. keys", "H without 1/√d", "H cosine τ=1", "flags")


@dataclass(frozen=True)
class Defaults:
    """The defaults the options show: attnscale.integrations.checkup's ``Thresholds()``,
    ``GROWTH`` and ``PLOT_NAME``, whose import takes torch (tests/cli/test_startup.py checks
    that these agree with them)."""

    std_factor: float = 23.0
    uniform_above: float = 0.99
    saturated_above: float = 1.0
    uniform_share: float = 0.5
    growth: float = 2.0
    plot_name: str = "attention_check.png"


DEFAULTS = Defaults()


@app.command("check")
def check_command(
    path: Annotated[str, typer.Argument(
        help="A local Hugging Face model folder with *.safetensors weights, or 'minilm'.")],
    text: Annotated[str | None, typer.Option("--text", help=escape(
        "UTF-8 file, one input a line. [default: 64 fixed sentences]"))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    plot: Annotated[str | None, typer.Option(
        "--plot", help=f"Write {DEFAULTS.plot_name} (logit std / s_c against H/ln n) here.")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=2, help="Truncate inputs to this.")] = 128,
    std_factor: Annotated[float, typer.Option(
        min=0.0, help="Flag logit std above this × s_c = √(2 ln n) (23: the median row is "
        "one-hot in float32).")] = DEFAULTS.std_factor,
    uniform_above: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Flag entropy / ln n above this.")] = DEFAULTS.uniform_above,
    uniform_share: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Near-uniform heads flag once they are this share of the heads "
        "(0: each one flags).")] = DEFAULTS.uniform_share,
    saturated_above: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Flag a saturated-row fraction above this (1 = never).")
    ] = DEFAULTS.saturated_above,
    skip_head: Annotated[list[str] | None, typer.Option(
        "--skip-head", metavar="L.H", help="Accept a known head, e.g. 0.2 (layer 0, head 2; "
        "repeatable): still in the table, marked skipped, flagged only for non-finite logits.")
    ] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", metavar="REF", help="A reference checkpoint of the same architecture "
        "('minilm' or a folder): flag heads whose logit std grew past --growth times the same "
        "head's there.")
    ] = None,
    growth: Annotated[float, typer.Option(
        min=1.0, help="With --baseline: flag a logit std above this × the reference head's.")
    ] = DEFAULTS.growth,
    skip_file: Annotated[str | None, typer.Option(
        "--skip-file", metavar="FILE", help="Accept the heads listed in FILE, one L.H a line "
        "(# starts a comment); adds to --skip-head.")] = None,
) -> None:
    """Is this checkpoint's attention healthy? inspect's per-head table, then one line per flag.

    Frozen: logit std above 23 × s_c, s_c = √(2 ln n): the median row is one-hot in float32.
    Near-uniform: entropy / ln n above 0.99 in half the heads (untrained or diverged). Exit 0
    healthy, 1 flagged, 2 bad input. Skipped heads flag only for NaN/inf logits or growth
    against --baseline. Only safetensors weights are read; pickles are never loaded.
    """
    from attnscale.integrations import checkup as C

    folder, skip, models = checked_inputs(path, baseline, text, plot, skip_head, skip_file)
    thresholds = C.Thresholds(std_factor, uniform_above, saturated_above, uniform_share)
    result = measured(path, models, text, thresholds=thresholds, max_tokens=max_tokens,
                      baseline=baseline, growth=growth)
    named = "--skip-head" if skip_file is None else "--skip-head/--skip-file"
    C.apply_skips(result, skip, named)  # a head the model lacks: exit 2 here
    if folder is not None:
        console.print(f"wrote {C.plot_check(result, folder)}", soft_wrap=True)
    if as_json:
        print_json(result)
    else:
        print_check(result)
    if not result["healthy"]:
        raise typer.Exit(FLAGGED)


def measured(path: str, models: list[Path], text: str | None, max_tokens: int,
             **options: Any) -> dict[str, Any]:
    """:func:`attnscale.integrations.checkup.check_model` of ``path`` on the lines of ``text``
    (default: the fixed sentences), with ``options``, truncated to ``max_tokens`` or less:
    never past the positions of ``models`` (PATH's and the baseline's folders), said in one
    line when lowered, recorded as the result's ``max_tokens``."""
    from attnscale.integrations import checkup as C
    from attnscale.measure import inspection as I

    sentences = I.sentences_from_file(text) if text is not None else None
    budget = I.token_budget(max_tokens, *models)
    say_token_budget(budget)
    source = None if text is None else f"{len(sentences)} lines of {text}"
    with console.status(f"checking {path}"):
        result = C.check_model(path, sentences, max_tokens=budget["used"], source=source,
                               **options)
    result["max_tokens"] = budget
    return result


def checked_inputs(path: str, baseline: str | None, text: str | None, plot: str | None,
                   skip_head: list[str] | None, skip_file: str | None
                   ) -> tuple[Path | None, set[tuple[int, int]], list[Path]]:
    """(the --plot folder or None, the heads to skip, the model folders: PATH's and the
    baseline's), after every input is checked, before any model is read: a pickle-only folder
    or one without a tokenizer, a missing --text or --skip-file, a malformed head are each one
    ValueError naming the argument (exit 2)."""
    from attnscale.integrations import checkup as C
    from attnscale.util.validate import check_input_file, check_output_folder

    models = [C.check_weights(path)]
    if baseline is not None:
        models.append(C.check_weights(baseline, "--baseline"))
    if text is not None:
        check_input_file("--text", text)
    folder = check_output_folder("--plot", plot) if plot is not None else None
    skip = C.heads_of(skip_head or [], "--skip-head")
    if skip_file is not None:
        check_input_file("--skip-file", skip_file)
        skip |= C.heads_of(C.read_skip_file(skip_file), "--skip-file")
    return folder, skip, models


def print_check(result: dict) -> None:
    """The per-head table, then one line per flag (FLAG) and per flag of a skipped head (SKIP),
    and a verdict line, all on stdout."""
    kinds: dict[tuple[int, int], list[str]] = {}
    for f in result["flags"]:
        kinds.setdefault((f["layer"], f["head"]), []).append(f["kind"])
    skipped: dict[tuple[int, int], list[str]] = {}
    for f in result.get("skipped_flags", []):
        skipped.setdefault((f["layer"], f["head"]), []).append(f["kind"])
    title = (f"{result['model']}: {result['n_tokens']} tokens ({result['inputs']}), "
             f"pre-softmax scores per head")
    cells = [
        (str(layer["layer"]), str(h["head"]), f"{h['logit_std']:.2f}", f"{h['critical_std']:.2f}",
         f"{h['max_abs_logit']:.1f}", f"{h['entropy']:.2f}", f"{h['entropy_uniform']:.2f}",
         f"{h['entropy_normalized']:.2f}", f"{h['max_weight']:.2f}",
         f"{h['saturated_fraction']:.2f}", f"{h['effective_keys']:.1f}",
         f"{h['entropy_unscaled']:.2f}", f"{h['entropy_cosine_tau1']:.2f}",
         flags_cell(h, kinds.get((layer["layer"], h["head"]), []),
                    skipped.get((layer["layer"], h["head"]), [])))
        for layer in result["layers"] for h in layer["heads"]
    ]
    print_table(escape(title), CHECK_COLUMNS, cells, left=("flags",))
    lines = [f"FLAG {f['message']}" for f in result["flags"]]
    lines += [f"SKIP {f['message']}" for f in result.get("skipped_flags", [])]
    heads = sum(len(layer["heads"]) for layer in result["layers"])
    n_skipped = len(result.get("skip_heads", []))
    aside = f" ({n_skipped} skipped)" if n_skipped else ""
    lines.append(f"healthy: no flags in {heads} heads{aside}" if result["healthy"] else
                 f"flagged: {len(result['flags'])} flag(s) on {len(kinds)} of {heads} "
                 f"heads{aside}")
    sys.stdout.write("\n".join(lines) + "\n")


def flags_cell(head: dict, kinds: list[str], skipped_kinds: list[str]) -> str:
    """The flags column: the head's flags, "-" for none; a skipped head reads "skipped", with
    the flags it would have raised in parentheses."""
    if head.get("skipped"):
        return "skipped" + (f" ({','.join(skipped_kinds)})" if skipped_kinds else "")
    return ",".join(kinds) or "-"
