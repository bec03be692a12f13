"""Commands over the measure layer: ``bench``, ``theory`` and ``inspect``.

The measure modules (torch, scipy) are imported by each command when it runs, not here.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from attnscale.cli.app import app, console, fmt, print_json, say_token_budget
from attnscale.cli.progress import Progress
from attnscale.cli.tables import print_table

BENCH_COLUMNS = ("score", "N", "causal", "fwd ×SDPA [95% CI]", "fwd+bwd ×SDPA [95% CI]",
                 "naive ×SDPA [95% CI]", "fwd+bwd ms", "GFLOP/s", "% peak", "peak MB")
# The bench presets the help quotes: attnscale.measure.bench.QUICK and STANDARD, whose import
# takes torch (tests/cli/test_startup.py checks that these agree with them)
Q = {"n_values": (1024,), "batch": 4, "repeats": 5}
S = {"n_values": (256, 1024, 2048), "batch": 8, "repeats": 8}
INSPECT_COLUMNS = ("layer", "head", "logit std", "max |logit|", "entropy", "ln n", "max w",
                   "eff. keys", "H without 1/√d", "H cosine τ=1")


@app.command()
def bench(
    quick: Annotated[bool, typer.Option(
        "--quick", help=f"N = {Q['n_values'][0]}, B = {Q['batch']}, {Q['repeats']} repeats per "
        "cell, no naive formula.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
    n: Annotated[list[int] | None, typer.Option(
        "--n", help=escape(f"Sequence lengths. [default: {' '.join(map(str, S['n_values']))}; "
                           f"{Q['n_values'][0]} with --quick]"))] = None,
    score: Annotated[
        list[str] | None, typer.Option("--score", help="Scores (default all).")
    ] = None,
    repeats: Annotated[int | None, typer.Option(
        min=2, help=escape(f"Interleaved repeats per cell. [default: {S['repeats']}; "
                           f"{Q['repeats']} with --quick]"))] = None,
    naive: Annotated[bool | None, typer.Option(
        "--naive/--no-naive", help=escape("Time the naive formula too. [default: yes; no with "
                                          "--quick]"))] = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help=escape("Torch threads for the run. [default: torch's]"))] = None,
) -> None:
    """Time every score against PyTorch SDPA (B=8, or 4 with --quick; H=8, D=64, float32):
    forward, forward+backward and the naive formula's forward+backward, each a ratio with a
    95% interval from interleaved repeats. Each block starts with the noise floor, SDPA
    against itself."""
    n_values = n or list((Q if quick else S)["n_values"])
    if any(v < 1 for v in n_values):
        raise ValueError(f"--n must be positive, got {n_values}")
    from attnscale.measure import bench as B

    preset = B.QUICK if quick else B.STANDARD
    with console.status("benchmarking") as status, Progress("bench", console=console) as lines:

        def progress(msg: str) -> None:
            status.update(f"benchmarking {msg}")
            lines.note(msg)  # elsewhere than on a terminal: a line at most every 20 s

        rows, facts = B.run(
            n_values=n_values,
            scores=score,
            batch=preset["batch"],
            repeats=repeats or preset["repeats"],
            naive=preset["naive"] if naive is None else naive,
            naive_repeats=preset["naive_repeats"],
            threads=threads,
            progress=progress,
        )
    if as_json:
        print_json(B.to_record(rows, facts))
    else:
        print_bench_table(rows, facts)


def interval_cell(c: dict | None) -> str:
    """A ratio cell as "1.03 [0.99, 1.07]" (ratio, 95% interval), or "-" when absent; values
    of 100 or more in 3 significant digits (a 2-repeat interval can reach 1e+06)."""
    if c is None:
        return "-"

    def num(x: float | None) -> str:
        return fmt(x, ".2f" if x is None or x < 100 else ".3g")

    return f"{num(c['ratio'])} [{num(c['lo'])}, {num(c['hi'])}]"


def repeats_text(counts: set[int]) -> str:
    """"5", or "3–5" when the cells ran different numbers of repeats."""
    return str(min(counts)) if len(counts) == 1 else f"{min(counts)}–{max(counts)}"


def print_bench_table(rows: list, facts: dict) -> None:
    """The benchmark rows as a table on stdout; the title says the shape and the repeats. The
    naive column is left out when no row has a naive cell (``--no-naive``, ``--quick``)."""
    cfg = facts["config"]
    timed = repeats_text({r.fwd["repeats"] for r in rows} | {r.fwdbwd["repeats"] for r in rows})
    naive = {r.naive["repeats"] for r in rows if r.naive is not None}
    naive_note = f" ({repeats_text(naive)} for naive)" if naive else ""
    title = (f"time ÷ SDPA with 95% CI, {timed} interleaved repeats per cell{naive_note}; "
             f"B={cfg['batch']} H={cfg['heads']} D={cfg['head_dim']} float32, "
             f"threads={cfg['threads']}; first row of each block: noise floor (SDPA ÷ SDPA); "
             f"matmul peak {facts['matmul_peak_gflops']:.0f} GFLOP/s")
    cells = [
        ("SDPA (noise floor)" if r.noise_floor else r.score, str(r.n),
         "yes" if r.causal else "no", interval_cell(r.fwd), interval_cell(r.fwdbwd),
         interval_cell(r.naive), f"{r.fwdbwd['ms']:.1f}", f"{r.gflops:.1f}",
         f"{100 * r.peak_fraction:.0f}", fmt(r.peak_mem_mb, ".0f"))
        for r in rows
    ]
    keep = [i for i, col in enumerate(BENCH_COLUMNS) if naive or not col.startswith("naive")]
    print_table(title, [BENCH_COLUMNS[i] for i in keep], [[c[i] for i in keep] for c in cells],
                left=("score",))


@app.command()
def theory(
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write figures to a folder.")] = None,
    samples: Annotated[int, typer.Option(min=10, help="Monte Carlo queries per cell.")] = 600,
    seed: Annotated[int, typer.Option(help="Monte Carlo seed.")] = 0,
) -> None:
    """Exact theory next to Monte Carlo: logit std, entropy, max weight, effective keys, ‖J‖.

    One row block per registered score with exact theory (at its defaults, and at its
    benchmark parameters where they differ). --plot adds the entropy figures, one of them with
    every such score.
    """
    from attnscale.measure import montecarlo
    from attnscale.util.validate import check_output_folder

    folder = check_output_folder("--plot", plot) if plot is not None else None
    with console.status("theory and Monte Carlo"):
        rows = montecarlo.theory_table(seed=seed, samples=samples)
    if folder is not None:
        # the plots pull in matplotlib, which the other commands do not need
        from attnscale.audit import theory_plots

        for path in (theory_plots.plot_entropy_vs_scale(str(folder / "entropy_vs_scale.png")),
                     theory_plots.plot_phase_diagram(str(folder / "phase_diagram.png")),
                     theory_plots.plot_score_entropy(str(folder / "score_entropy.png"))):
            console.print(f"wrote {path}")
    if as_json:
        print_json({"rows": rows})
        return
    cells = []
    for r in rows:
        se = r["mc_se"]
        z = (r["mc_mean"] - r["theory"]) / se if se else 0.0
        cells.append((r["score"], str(r["d"]), str(r["n"]), r["quantity"], f"{r['theory']:.4g}",
                      f"{r['mc_mean']:.4g}", f"{se:.2g}", f"{z:+.1f}"))
    print_table("softmax over n keys at init: theory vs Monte Carlo (z = diff / SE)",
                ("score", "d", "n", "quantity", "theory", "MC mean", "MC SE", "z"), cells,
                left=("score", "quantity"))


@app.command("inspect")
def inspect_command(
    model: Annotated[str, typer.Argument(help="'minilm' or a local HF model folder.")] = "minilm",
    text: Annotated[str | None, typer.Option("--text", help="UTF-8 file, an input a line.")] = None,
    sentence: Annotated[list[str] | None, typer.Option("--sentence", help="An input.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write heatmaps here.")] = None,
    max_tokens: Annotated[int, typer.Option(min=2, help="Truncate inputs to this.")] = 128,
) -> None:
    """Per-layer, per-head attention statistics of a real trained model, offline."""
    from attnscale.measure import inspection as I
    from attnscale.util.validate import check_input_file, check_output_folder

    if text is not None and sentence:
        raise ValueError("give --text or --sentence, not both")
    if text is not None:
        check_input_file("--text", text)
    if plot is not None:
        check_output_folder("--plot", plot)
    sentences = I.sentences_from_file(text) if text is not None else (sentence or None)
    with console.status(f"inspecting {model}"):
        result = I.inspect_model(model, sentences, max_tokens=max_tokens)
    say_token_budget(result.get("max_tokens"))
    if plot is not None:
        for path in I.plot_heatmaps(result, plot):
            console.print(f"wrote {path}")
    if as_json:
        print_json(result)
    else:
        print_inspect_table(result)


def print_inspect_table(result: dict) -> None:
    """Per-layer, per-head statistics as a rich table on stdout."""
    title = (f"{result['model']}: {result['n_tokens']} tokens "
             f"({result['n_sentences']} inputs), pre-softmax scores per head")
    cells = [
        (str(layer["layer"]), str(h["head"]), f"{h['logit_std']:.2f}",
         f"{h['max_abs_logit']:.1f}", f"{h['entropy']:.2f}", f"{h['entropy_uniform']:.2f}",
         f"{h['max_weight']:.2f}", f"{h['effective_keys']:.1f}", f"{h['entropy_unscaled']:.2f}",
         f"{h['entropy_cosine_tau1']:.2f}")
        for layer in result["layers"] for h in layer["heads"]
    ]
    print_table(title, INSPECT_COLUMNS, cells)
