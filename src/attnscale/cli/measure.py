"""Commands over the measure layer: ``bench``, ``theory`` and ``inspect``."""

from __future__ import annotations

from typing import Annotated

import typer

from attnscale.cli.app import app, console, fmt, print_json
from attnscale.cli.tables import print_table
from attnscale.measure import bench as B
from attnscale.measure import inspection as I
from attnscale.measure import montecarlo
from attnscale.util.validate import check_input_file, check_output_folder

BENCH_COLUMNS = ("score", "N", "causal", "fwd ms", "fwd+bwd ms", "SDPA ms", "× SDPA", "naive ms",
                 "naive/ours", "GFLOP/s", "% peak", "peak MB")
INSPECT_COLUMNS = ("layer", "head", "logit std", "max |logit|", "entropy", "ln n", "max w",
                   "eff. keys", "H without 1/√d", "H cosine τ=1")


@app.command()
def bench(
    quick: Annotated[bool, typer.Option("--quick", help="N = 1024 only.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
    n: Annotated[list[int] | None, typer.Option("--n", help="Sequence lengths.")] = None,
    score: Annotated[
        list[str] | None, typer.Option("--score", help="Scores (default all).")
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed calls per measurement.")] = 3,
    no_naive: Annotated[bool, typer.Option("--no-naive", help="Skip the naive baseline.")] = False,
) -> None:
    """Time every score against PyTorch SDPA and the naive formula (B=8, H=8, D=64, float32)."""
    n_values = n or ([1024] if quick else [256, 1024, 2048])
    if any(v < 1 for v in n_values):
        raise ValueError(f"--n must be positive, got {n_values}")
    with console.status("benchmarking") as status:
        rows, facts = B.run(
            n_values=n_values,
            scores=score,
            repeats=repeats,
            naive=not no_naive,
            progress=lambda msg: status.update(f"benchmarking {msg}"),
        )
    if as_json:
        print_json([r.to_dict() for r in rows])
    else:
        print_bench_table(rows, facts)


def print_bench_table(rows: list, facts: dict) -> None:
    """The benchmark rows as a rich table on stdout."""
    title = (f"attention vs SDPA, fwd+bwd, float32, matmul peak "
             f"{facts['matmul_peak_gflops']:.0f} GFLOP/s")
    cells = [
        (r.score, str(r.n), "yes" if r.causal else "no", f"{r.fwd_ms:.1f}",
         f"{r.fwdbwd_ms:.1f}", f"{r.sdpa_fwdbwd_ms:.1f}", f"{r.ratio_fwdbwd:.2f}",
         fmt(r.naive_fwdbwd_ms, ".0f"), fmt(r.ratio_naive, ".2f"), f"{r.gflops:.1f}",
         f"{100 * r.peak_fraction:.0f}", fmt(r.peak_mem_mb, ".0f"))
        for r in rows
    ]
    print_table(title, BENCH_COLUMNS, cells, left=("score",))


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
    if text is not None and sentence:
        raise ValueError("give --text or --sentence, not both")
    if text is not None:
        check_input_file("--text", text)
    if plot is not None:
        check_output_folder("--plot", plot)
    sentences = I.sentences_from_file(text) if text is not None else (sentence or None)
    with console.status(f"inspecting {model}"):
        result = I.inspect_model(model, sentences, max_tokens=max_tokens)
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
