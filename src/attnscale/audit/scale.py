"""How large each verdict's evidence is: the one-line scale caveat printed under every verdict.

A verdict about training holds for the models, steps and seeds it was measured on, not for a
70B model. This module states that scale from the preset and its studies, so the line changes
with the preset: model size (layers, width, heads), steps, reported seeds and tuning seeds.
"""

from __future__ import annotations

from attnscale.audit.studies import Preset, Study, studies

# Report presets whose verdicts are a smoke test of the pipeline, not evidence.
SMOKE_PRESETS = ("tiny", "quick")


def is_smoke(preset_name: str) -> bool:
    """Whether a report built with ``preset_name`` is a smoke test (``--quick``, the tests'
    ``tiny`` and every ``cut_down`` preset, named ``<name>-cut``)."""
    return preset_name in SMOKE_PRESETS or preset_name.endswith("-cut")


def _span(xs: tuple[int, ...] | list[int]) -> str:
    xs = sorted(set(xs))
    return str(xs[0]) if len(xs) == 1 else f"{xs[0]}–{xs[-1]}"


def study_scale(study: Study) -> str:
    """One study's scale: ``"2 layers, width 32–128, 2 heads, 150 steps, 6 seeds"`` (plus
    the tuning seeds when the LR was tuned on other seeds)."""
    base = study.base
    widths = study.cells.get("d_model", (base.get("d_model", 64),))
    heads = base.get("n_heads", 1)
    seeds = f"{len(study.seeds)} seeds"
    if study.lr_choice == "tuned":
        seeds += f" (LR tuned on {len(study.tune_seeds)} other)"
    else:
        seeds += f" × {len(study.lrs)} LRs"
    return (f"{base.get('n_layers', 1)} layer{'s' if base.get('n_layers', 1) > 1 else ''}, "
            f"width {_span(list(widths))}, {heads} head{'s' if heads > 1 else ''}, "
            f"{base['steps']} steps, {seeds}")


def caveats(p: Preset) -> dict[str, str]:
    """Claim id -> the scale its verdict rests on, for every claim and question."""
    plan = studies(p)
    trained: dict[str, list[str]] = {}
    for name, study in plan.items():
        for cid in study.claims:
            trained.setdefault(cid, []).append(f"{name}: {study_scale(study)}")
    bench = p.bench
    out = {
        "C1": "float32 on CPU, small shapes with masks, causal and GQA",
        "C2": "random q, k with norms 1e-3 to 1e3; exact range",
        "C5": (f"one CPU thread, N = {', '.join(map(str, bench['n_values']))}, ≥ "
               f"{bench['min_repeats']} interleaved repeats; other hardware differs"),
        "C8": "Monte Carlo, 20000 samples per d_k, unit-variance components",
        "C9": "exact theory of n i.i.d. Gaussian logits (n = 64–4096), checked by Monte Carlo",
        "Q2": (f"one model (all-MiniLM-L6-v2, 6 layers, 12 heads, d_k = 32) on "
               f"{p.inspect_sentences} short sentences"),
    }
    out["C10"] = f"{p.jacobian_rows} random rows per (n, s) and " + \
        trained.get("C10", ["no trained models"])[0]
    for cid, parts in trained.items():
        if cid != "C10":
            out[cid] = "; ".join(parts)
    return out
