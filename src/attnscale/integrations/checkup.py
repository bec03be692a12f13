"""``attnscale check PATH``: is the attention of a trained Hugging Face checkpoint healthy?

:func:`check_model` runs a local model folder (safetensors weights only) on fixed inputs with the
machinery of ``attnscale inspect`` (:func:`attnscale.measure.inspection.resolve_model_dir`,
:func:`~attnscale.measure.inspection.load_model`, :class:`attnscale.measure.monitor.Monitor`),
keeps inspect's per-head statistics plus the fraction of saturated rows, and :func:`flags` marks
the heads that break one of these rules (defaults in :class:`Thresholds`):

* ``frozen``: logit std s > f·s_c with s_c = √(2 ln n) and f = :data:`ONE_HOT_FACTOR` (23).
  For n i.i.d. N(0, s²) logits the softmax is Derrida's Random Energy Model (Derrida 1981),
  which freezes at s_c (:func:`attnscale.measure.theory.rem_critical_scale`): past it the weight
  condenses on a few keys. Sharp heads of healthy trained models sit past s_c by design
  (all-MiniLM-L6-v2 has heads at up to 4.7·s_c), so s_c alone is no alarm. What is broken is a
  head whose rows are one-hot to machine precision: the top weight rounds to 1 in float32, so
  1 − p and the softmax's gradient p(1 − p) through it are 0, and every other key gets less than
  2⁻²³ of its weight. By extreme-value theory the gap between a row's two largest logits tends
  to (s/s_c) times a standard exponential (the spacing of the top of n Gaussians, Gumbel scale
  s/√(2 ln n)), so the median row's gap is about ln 2 · s/s_c and reaches ln(2²³) = 23 ln 2 at
  s/s_c = 23. The limit is asymptotic: at the n of the default inputs (10–128 keys) a Monte
  Carlo puts the median row one-hot in float32 at 19–21·s_c and 54–57% of rows at 23·s_c
  (tests/integrations/test_check_calibration.py), so 23 errs towards passing. s is the head's
  logit std pooled over its rows (row means included), as inspect reports it; ln n is the mean
  over its query rows of ln n_i, n_i the keys row i sees (inspect's "ln n" column). Calibrated on
  a labelled zoo (:mod:`attnscale.integrations.zoo`, README): MiniLM as shipped passes, its
  layer-3 q and k scaled by 10 or 30 do not.
* ``uniform``: entropy / ln n above 0.99, in at least half of the heads (``uniform_share``;
  skipped heads count). Below s_c the exact Gaussian-logit entropy is H/ln n ≈ 1 − (s/s_c)²
  (:func:`attnscale.measure.theory.expected_entropy` gives 0.990–0.991 at s = s_c/10 for
  n = 10…128), so 0.99 means logits spread less than a tenth of the freezing scale: the head
  averages its keys, as a head at init does (weights of std 0.02 give s ≈ 0.01). One such head
  is a choice a trained model may make (a tiny BERT trained at a good LR kept one of 8); most
  heads averaging is a model that does not attend: untrained, or diverged (its heads die).
* ``saturated`` (off by default: ``saturated_above`` = 1): more than a given share of the head's
  query rows put more than :data:`attnscale.measure.stats.SATURATION` (0.9) of their weight on
  one key. The slope of the winning weight, ∂p/∂ℓ = p(1 − p), is then below 0.09, a quarter of
  its value at p = ½: the entropy collapse that Zhai et al. 2023 (arXiv:2303.06296) and
  Wortsman et al. 2023 (arXiv:2309.14322) tie to unstable training. But healthy models keep
  such heads on purpose (MiniLM's layer-0 head 2 puts nearly all its weight on one key in every
  row), so it only flags when asked (``--saturated-above 0.5``: most rows are one-key lookups).
* ``nonfinite``: the logits hold NaN or inf (weights that diverged).

Known heads can be accepted (:func:`apply_skips`, ``attnscale check --skip-head L.H``, or a file
of them, ``--skip-file``, :func:`read_skip_file`): their ``frozen``, ``uniform`` and ``saturated``
flags move to ``skipped_flags`` and no longer make the model unhealthy; the heads stay in the
record, marked ``skipped``. A skipped head still counts among the near-uniform share, and its
``nonfinite`` and ``grew`` (against ``--baseline``) flags stay: a known sharp head that keeps
growing, or turns NaN, is news.

Pickle checkpoints (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``, ...) are never loaded:
unpickling runs arbitrary code. :func:`check_weights` refuses a folder without safetensors
weights before anything is read from it, and the loader is asked for safetensors only.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# the frozen criterion is shared with the training alarm (one implementation, in alarm.py)
from attnscale.integrations.alarm import ONE_HOT_FACTOR, critical_std, frozen_limit, is_frozen
from attnscale.measure import inspection as I
from attnscale.measure.stats import SATURATION
from attnscale.util.validate import check_float, check_int

__all__ = ["FLAG_KINDS", "GROWTH", "NEVER_SKIPPED", "ONE_HOT_FACTOR", "Flag", "Thresholds",
           "apply_skips",
           "check_model", "check_weights", "critical_std", "flags", "growth_flags", "head_of",
           "heads_of", "mark_flags", "measure_heads", "number", "plot_check", "read_skip_file"]

FLAG_KINDS = ("nonfinite", "frozen", "uniform", "saturated", "grew")
# a non-finite logit is a broken head, and growth against a reference is a change, not a known
# quirk: no skip hides either
NEVER_SKIPPED = ("nonfinite", "grew")
# --baseline: a head whose logit std more than doubled against the same head of a reference
# checkpoint, i.e. whose softmax now acts at under half the temperature (a convention: the
# zoo's healthy MiniLM against itself reads 1.0, its layer 3 with q, k × 3 reads 9)
GROWTH = 2.0
PLOT_NAME = "attention_check.png"
HEAD_SPEC = re.compile(r"([0-9]+)\.([0-9]+)")  # "L.H": layer L, head H, both 0-based



@dataclass(frozen=True)
class Thresholds:
    """When a head is flagged (module docstring): logit std > ``std_factor``·s_c, entropy/ln n
    > ``uniform_above`` once at least ``uniform_share`` of the heads are, saturated fraction of
    rows > ``saturated_above`` (1: never)."""

    std_factor: float = ONE_HOT_FACTOR
    uniform_above: float = 0.99
    saturated_above: float = 1.0
    uniform_share: float = 0.5  # near-uniform heads flag once they are this share of all heads

    def __post_init__(self) -> None:
        check_float("std_factor", self.std_factor, low=0.0)
        check_float("uniform_share", self.uniform_share, low=0.0, high=1.0,
                    low_inclusive=True, high_inclusive=True)
        check_float("uniform_above", self.uniform_above, low=0.0, high=1.0, high_inclusive=True)
        check_float("saturated_above", self.saturated_above, low=0.0, high=1.0,
                    low_inclusive=True, high_inclusive=True)


@dataclass(frozen=True)
class Flag:
    """One rule one head breaks: ``kind`` (one of :data:`FLAG_KINDS`), the head's ``value`` of
    the statistic the rule reads and the ``limit`` it crossed."""

    layer: int
    head: int
    kind: str
    value: float
    limit: float

    def message(self) -> str:
        """One line saying which head, what rule, and by how much."""
        where = f"layer {self.layer} head {self.head}"
        if self.kind == "frozen":
            return (f"{where}: frozen: logit std {self.value:.2f} > {self.limit:.2f} "
                    f"(std_factor × s_c, s_c = √(2 ln n) the REM freezing point at its input "
                    f"length; past 23 × s_c the median row is one-hot in float32)")
        if self.kind == "uniform":
            return (f"{where}: near-uniform: entropy / ln n {self.value:.3f} > {self.limit:.3g} "
                    f"(the head averages its keys)")
        if self.kind == "saturated":
            return (f"{where}: saturated: {self.value:.0%} of rows put > {SATURATION:g} of their "
                    f"weight on one key (limit {self.limit:.0%})")
        if self.kind == "grew":
            return (f"{where}: grew: logit std {self.value:.2f}× the baseline's same head "
                    f"(limit {self.limit:g}×)")
        return f"{where}: logits not finite (max |logit| {self.value})"


def number(value: Any) -> float:
    """``value`` as a float; None (a NaN after a JSON round trip) as NaN."""
    return math.nan if value is None else float(value)


def flags(result: dict[str, Any], thresholds: Thresholds | None = None) -> list[Flag]:
    """The flags of a :func:`check_model` result (pure: reads ``result["layers"]`` only).

    Each head needs ``logit_std``, ``max_abs_logit``, ``entropy_uniform`` (mean ln n_i),
    ``entropy_normalized`` (mean H_i / ln n_i) and ``saturated_fraction``. A head with non-finite
    logits gets only the ``nonfinite`` flag; heads whose rows see one key (ln n = 0) have no
    freezing point and no entropy scale, so only saturation is checked for them.
    """
    t = Thresholds() if thresholds is None else thresholds
    if not isinstance(t, Thresholds):
        raise TypeError(f"thresholds must be a Thresholds, got {type(t).__name__}")
    out: list[Flag] = []
    uniform_heads: list[Flag] = []
    judged = 0
    for layer in result["layers"]:
        for h in layer["heads"]:
            at = (int(layer["layer"]), int(h["head"]))
            std, top = number(h["logit_std"]), number(h["max_abs_logit"])
            if not (math.isfinite(std) and math.isfinite(top)):
                out.append(Flag(*at, "nonfinite", top if not math.isfinite(top) else std, 0.0))
                continue
            log_n = number(h["entropy_uniform"])
            if is_frozen(std, log_n, t.std_factor):  # the alarm's frozen rule, the same test
                out.append(Flag(*at, "frozen", std, frozen_limit(log_n, t.std_factor)))
            uniform = number(h["entropy_normalized"])
            judged += log_n > 0
            if log_n > 0 and uniform > t.uniform_above:
                uniform_heads.append(Flag(*at, "uniform", uniform, t.uniform_above))
            saturated = number(h["saturated_fraction"])
            if saturated > t.saturated_above:
                out.append(Flag(*at, "saturated", saturated, t.saturated_above))
    # one averaging head is a choice a trained model may make; most heads averaging is a model
    # that does not attend (untrained, or its heads died when it diverged)
    if uniform_heads and len(uniform_heads) >= t.uniform_share * judged:
        out += uniform_heads
    return sorted(out, key=lambda f: (f.layer, f.head, FLAG_KINDS.index(f.kind)))


def growth_flags(result: dict[str, Any], reference: dict[str, Any], growth: float = GROWTH,
                 name: str = "baseline") -> list[Flag]:
    """A ``grew`` flag for each head whose logit std is more than ``growth`` times the same
    head's in ``reference`` (both results of the same inputs; reads ``layers`` only).
    ValueError naming ``name`` when the two do not have the same heads."""
    check_float("growth", growth, low=1.0, low_inclusive=True)
    def shape(r: dict[str, Any]) -> list[tuple[int, int]]:
        return [(int(layer["layer"]), len(layer["heads"])) for layer in r["layers"]]
    if shape(result) != shape(reference):
        raise ValueError(f"{name}: the reference has (layer, heads) {shape(reference)}, the "
                         f"model {shape(result)}: not checkpoints of one architecture")
    out = []
    for now_layer, then_layer in zip(result["layers"], reference["layers"], strict=True):
        for now, then in zip(now_layer["heads"], then_layer["heads"], strict=True):
            a, b = number(now["logit_std"]), number(then["logit_std"])
            if math.isfinite(a) and math.isfinite(b) and b > 0 and a > growth * b:
                out.append(Flag(int(now_layer["layer"]), int(now["head"]), "grew", a / b,
                                growth))
    return out


def head_of(spec: str | tuple[int, int], name: str = "skip_heads") -> tuple[int, int]:
    """(layer, head) of ``spec``: the text "L.H" (0-based, as the check table numbers them, e.g.
    "0.2") or a pair of ints. ValueError / TypeError naming ``name`` otherwise."""
    if isinstance(spec, str):
        match = HEAD_SPEC.fullmatch(spec.strip())
        if match is None:
            raise ValueError(f"{name} must be LAYER.HEAD with two non-negative ints, e.g. 0.2; "
                             f"got {spec!r}")
        return int(match[1]), int(match[2])
    if (isinstance(spec, tuple) and len(spec) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) for i in spec)):
        if min(spec) < 0:
            raise ValueError(f"{name} must hold non-negative (layer, head) pairs; got {spec!r}")
        return spec
    raise TypeError(f"{name} must hold 'L.H' strings or (layer, head) int pairs; got "
                    f"{type(spec).__name__} {spec!r}")


def heads_of(heads: Iterable[str | tuple[int, int]], name: str = "skip_heads"
             ) -> set[tuple[int, int]]:
    """The (layer, head) pairs of ``heads``, each read by :func:`head_of`; TypeError naming
    ``name`` for a lone string (a list of one is meant)."""
    if isinstance(heads, str):
        raise TypeError(f"{name} must be a list of 'L.H' strings, not the string {heads!r}")
    return {head_of(h, name) for h in heads}


def read_skip_file(path: str | Path, name: str = "--skip-file") -> list[str]:
    """The heads listed in a skip file: one ``L.H`` a line (as :func:`head_of` reads it); text
    after ``#`` is a comment, blank lines are ignored. ValueError naming ``name`` and the line
    for a malformed entry."""
    heads = []
    for number_, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if entry:
            head_of(entry, f"{name} line {number_}")
            heads.append(entry)
    return heads


def apply_skips(result: dict[str, Any], heads: Iterable[str | tuple[int, int]],
                name: str = "skip_heads") -> dict[str, Any]:
    """Accept ``heads`` (see :func:`head_of`) of a :func:`check_model` result, in place: their
    flags, except :data:`NEVER_SKIPPED`, move from ``flags`` to ``skipped_flags``, ``healthy``
    counts the rest only, each head row gets ``skipped`` (bool) and ``skip_heads`` lists them as
    "L.H". Replaces any earlier skips. ValueError naming ``name`` for a head the model does not
    have."""
    wanted = heads_of(heads, name)
    sizes = {int(layer["layer"]): len(layer["heads"]) for layer in result["layers"]}
    for layer, head in sorted(wanted):
        if head >= sizes.get(layer, 0):
            counts = sorted(set(sizes.values()))
            shape = (f"{len(sizes)} layers of {counts[0]} heads" if len(counts) == 1 else
                     "heads per layer: " + ", ".join(str(sizes[i]) for i in sorted(sizes)))
            raise ValueError(f"{name}: {layer}.{head} is not a head of this model ({shape}, "
                             f"both numbered from 0)")
    for layer in result["layers"]:
        for h in layer["heads"]:
            h["skipped"] = (int(layer["layer"]), int(h["head"])) in wanted
    every = sorted([*result["flags"], *result.get("skipped_flags", [])],
                   key=lambda f: (f["layer"], f["head"], FLAG_KINDS.index(f["kind"])))
    hidden = [f for f in every
              if (f["layer"], f["head"]) in wanted and f["kind"] not in NEVER_SKIPPED]
    result["flags"] = [f for f in every if f not in hidden]
    result["skipped_flags"] = hidden
    result["skip_heads"] = [f"{layer}.{head}" for layer, head in sorted(wanted)]
    result["healthy"] = not result["flags"]
    return result


def check_weights(path: str | Path, name: str = "PATH") -> Path:
    """The model folder of ``path`` ("minilm" or a local folder) if it holds safetensors weights
    and a tokenizer.

    Decided from file names alone, before anything in the folder is opened: a folder whose
    weights are only pickle checkpoints is refused with a ValueError naming ``name`` (the
    argument that gave it), so its pickles are never unpickled; so is one without a tokenizer
    (:func:`attnscale.measure.inspection.check_tokenizer`). The rest (config.json present) is
    :func:`attnscale.measure.inspection.resolve_model_dir`'s check.
    """
    folder = I.minilm_path() if str(path) == I.MINILM else Path(path)
    if not folder.is_dir():
        raise ValueError(f"{name} must be 'minilm' or a local model folder; {str(folder)!r} is "
                         f"not a folder")
    if not any(p.is_file() for p in folder.glob("*.safetensors")):
        pickles = sorted(p.name for p in folder.iterdir()
                         if p.suffix in (*I.PICKLE_SUFFIXES, ".pickle"))
        found = (f"only pickle checkpoint(s) {', '.join(pickles)}, which check never loads "
                 f"(unpickling runs code); resave with save_pretrained(safe_serialization=True)"
                 if pickles else "no *.safetensors weights")
        raise ValueError(f"{name} {str(folder)!r} holds {found}")
    try:
        resolved = I.resolve_model_dir(str(path))
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from e
    return I.check_tokenizer(resolved, name)


def check_model(
    model: str = I.MINILM,
    sentences: list[str] | None = None,
    *,
    source: str | None = None,
    thresholds: Thresholds | None = None,
    max_tokens: int = I.MAX_TOKENS,
    batch_size: int = 16,
    skip_heads: Iterable[str | tuple[int, int]] = (),
    baseline: str | None = None,
    growth: float = GROWTH,
) -> dict[str, Any]:
    """Run ``model`` ("minilm" or a local folder) on ``sentences`` (default: the fixed
    :func:`attnscale.measure.inspection.default_sentences`) and flag its heads.

    Returns inspect's record (``model``, ``path``, ``n_tokens``, ``n_sentences``, ``elapsed_s``,
    ``layers`` with inspect's per-head keys plus ``entropy_normalized``, ``saturated_fraction``
    and ``critical_std``) with ``inputs`` (``source``, else what the default inputs are),
    ``thresholds``, ``flags`` (dicts of :class:`Flag` plus ``message``) and ``healthy``, less
    the heads of ``skip_heads`` (:func:`apply_skips`: ``skipped_flags``, ``skip_heads``).
    With ``baseline`` (a reference checkpoint of the same architecture, "minilm" or a folder),
    the reference runs on the same inputs and heads whose logit std grew more than ``growth``
    times get a ``grew`` flag (:func:`growth_flags`); ``baseline`` records it.
    """
    thresholds = Thresholds() if thresholds is None else thresholds
    skip = heads_of(skip_heads)  # a malformed head fails before the model runs
    path = check_weights(model)  # before any load: a pickle-only folder is never opened
    reference = check_weights(baseline, "baseline") if baseline is not None else None
    check_float("growth", growth, low=1.0, low_inclusive=True)
    default = sentences is None
    sentences = I.default_sentences() if default else list(sentences)
    if not sentences or not all(isinstance(s, str) for s in sentences):
        raise ValueError("sentences must be a non-empty list of strings")
    check_int("max_tokens", max_tokens, minimum=2)
    check_int("batch_size", batch_size, minimum=1)
    started = time.perf_counter()
    n_tokens, layers = measure_heads(path, sentences, max_tokens, batch_size)
    result = {
        "model": "all-MiniLM-L6-v2" if model == I.MINILM else str(model),
        "path": str(path),
        "inputs": source or (f"{len(sentences)} fixed sentences from pydoc_data.topics" if default
                             else f"{len(sentences)} given inputs"),
        "n_tokens": n_tokens,
        "n_sentences": len(sentences),
        "elapsed_s": time.perf_counter() - started,
        "thresholds": asdict(thresholds),
        "layers": layers,
    }
    found = flags(result, thresholds)
    if reference is not None:
        _, ref_layers = measure_heads(reference, sentences, max_tokens, batch_size)
        found += growth_flags(result, {"layers": ref_layers}, growth)
        result["baseline"] = {"path": str(reference), "growth": growth, "layers": ref_layers}
    result["flags"] = [{**asdict(f), "message": f.message()} for f in found]
    return apply_skips(result, skip)


def measure_heads(path: Path, sentences: list[str], max_tokens: int, batch_size: int
                  ) -> tuple[int, list[dict[str, Any]]]:
    """(real tokens, per-layer head rows) of the model in ``path`` on ``sentences``, as
    :func:`attnscale.measure.inspection.inspect_model` measures them (padding rows left out,
    counterfactual entropies without 1/√d and with cosine τ = 1), plus the saturated fraction
    and H/ln n of each head."""
    n_tokens, (actual, unscaled, cosine) = I.monitored_stats(path, sentences, max_tokens,
                                                             batch_size)
    layers = I.head_rows(actual, unscaled, cosine)
    for layer in layers:
        for head in layer["heads"]:
            head["critical_std"] = critical_std(head["entropy_uniform"])
    return n_tokens, layers


def mark_flags(ax: Any, heads: list[tuple[int, int]], x: np.ndarray, y: np.ndarray,
               found: list[dict[str, Any]], labels: int = 10) -> None:
    """Ring flagged heads in red (a square for saturated or non-finite ones) and label
    "layer.head" on those and on the ``labels`` flagged heads furthest right, so a crowd of
    heads just past s_c does not bury the labels."""
    kinds: dict[tuple[int, int], set[str]] = {}
    for f in found:
        kinds.setdefault((f["layer"], f["head"]), set()).add(f["kind"])
    at = {head: i for i, head in enumerate(heads)}
    flagged = [at[head] for head in kinds if head in at]
    shown = set(sorted(flagged, key=lambda i: -np.nan_to_num(x[i], nan=np.inf))[:labels])
    for i in flagged:
        square = bool(kinds[heads[i]] & {"saturated", "nonfinite"})
        ax.scatter([x[i]], [y[i]], s=130 if square else 110, marker="s" if square else "o",
                   facecolors="none", edgecolors="red", lw=1.4, zorder=4)
        if square or i in shown:
            ax.annotate(f"{heads[i][0]}.{heads[i][1]}", (x[i], y[i]), xytext=(5, 4),
                        textcoords="offset points", fontsize=7, color="red")


def plot_check(result: dict[str, Any], folder: str | Path, dpi: int = 160) -> str:
    """One PNG, ``folder/attention_check.png``: every head as a point of logit std / s_c (x)
    against entropy / ln n (y), coloured by layer, flagged heads ringed in red
    (:func:`mark_flags`); the flag limits as dashed lines, and the exact curve for n i.i.d. Gaussian
    logits at the heads' median n (:func:`attnscale.measure.theory.expected_entropy`) for
    reference. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnscale.measure.theory import expected_entropy

    check_int("dpi", dpi, minimum=150)
    heads = [(layer["layer"], h) for layer in result["layers"] for h in layer["heads"]]
    x = np.array([h["logit_std"] / max(h["critical_std"], 1e-12) for _, h in heads])
    y = np.array([h["entropy_normalized"] for _, h in heads])
    flagged = {(f["layer"], f["head"]) for f in result["flags"]}
    t = result["thresholds"]
    fig, ax = plt.subplots(figsize=(7.5, 5.2), layout="constrained")
    n = max(2, round(math.exp(float(np.median([h["entropy_uniform"] for _, h in heads])))))
    ratios = np.linspace(0.0, max(float(np.nanmax(x, initial=1.0)), t["std_factor"]) * 1.1, 120)
    curve = [float(expected_entropy(n, r * critical_std(math.log(n)))) / math.log(n)
             for r in ratios]
    ax.plot(ratios, curve, color="0.55", lw=1.2, label=f"i.i.d. Gaussian logits, n = {n}")
    points = ax.scatter(x, y, c=[layer for layer, _ in heads], cmap="viridis", s=28, zorder=3)
    fig.colorbar(points, ax=ax, label="layer")
    mark_flags(ax, [(layer, h["head"]) for layer, h in heads], x, y, result["flags"])
    ax.axvline(t["std_factor"], color="red", ls="--", lw=1,
               label=f"frozen: std > {t['std_factor']:g}·$s_c$, $s_c=\\sqrt{{2\\ln n}}$")
    ax.axhline(t["uniform_above"], color="orange", ls="--", lw=1,
               label=f"near-uniform: $H/\\ln n$ > {t['uniform_above']:g}")
    ax.set(xlabel="logit std / $s_c$ (per head)", ylabel="entropy / ln n", ylim=(-0.03, 1.05))
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"{result['model']}: {len(flagged)} of {len(heads)} heads flagged (red ring; "
                 f"square: saturated rows)\n"
                 f"inputs: {result['inputs']}, {result['n_tokens']} tokens", fontsize=10)
    out = Path(folder) / PLOT_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return str(out)
