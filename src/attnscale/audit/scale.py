"""How large each verdict's evidence is: the one-line scale caveat printed under every verdict.

A verdict about training holds for the models, steps and seeds it was measured on, not for a
70B model. This module states that scale from the preset and its studies, so the line changes
with the preset: model size (layers, width, heads), steps, reported seeds and tuning seeds.
"""

from __future__ import annotations

from attnscale.audit.claim import Claim, training_plan
from attnscale.audit.studies import Preset, Study

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


def claim_scale(claim: Claim, p: Preset, plan: dict[str, Study] | None = None) -> str:
    """The scale ``claim``'s verdict rests on: its own ``scale(p)`` line, else the sizes of
    the studies it reads (``plan``: the preset's studies, built when not given)."""
    if claim.scale is not None:
        return claim.scale(p)
    plan = plan if plan is not None else training_plan(p)
    return "; ".join(f"{name}: {study_scale(plan[name])}" for name in claim.studies
                     if plan[name].seeds)  # a study this preset does not run is no scale
