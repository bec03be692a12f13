"""Checkpoints and helpers shared by the ``attnscale check`` tests: tiny BERTs with a character
vocabulary and tiny GPT-2s whose tokenizer has no pad token, saved as safetensors."""

from __future__ import annotations

import json
from pathlib import Path

from attnscale.cli import run as cli_run
from attnscale.integrations.zoo import char_tokenizer
from attnscale.measure import inspection as I


def save_tiny_bert(folder: Path, qk_std: float | None) -> Path:
    """A 2-layer, 2-head BERT (hidden 32, head dim 16) with a character tokenizer. Its q and k
    weights are drawn with std ``qk_std`` (None: BERT's init, std 0.02), so a logit has std
    of order 32·qk_std²: measured on the default sentences (6565 characters, rows of up to 128,
    s_c = 3.06), 0.23 gives 0.43–0.49·s_c (H/ln n 0.78–0.87), 2.0 gives 32–37·s_c (past the
    one-hot limit of 23·s_c), the init 0.004·s_c."""
    import torch
    import transformers

    folder.mkdir(parents=True)
    tok = char_tokenizer()
    tok.save_pretrained(folder)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg)
    if qk_std is not None:
        with torch.no_grad():
            for layer in model.encoder.layer:
                for proj in (layer.attention.self.query, layer.attention.self.key):
                    proj.weight.normal_(0.0, qk_std)
                    proj.bias.zero_()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def save_tiny_gpt2(folder: Path, tokenizer: bool = True, eos: bool = True) -> Path:
    """A 2-layer GPT-2 (hidden 32) with a word-level tokenizer that, like GPT-2's and Llama's,
    has no pad token (and, with ``eos=False``, no end-of-sequence token either)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True)
    words = ["<unk>", "<eos>", *sorted({w for s in I.default_sentences() for w in s.split()})]
    vocab = {w: i for i, w in enumerate(words[:400])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if tokenizer:
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_object=core, unk_token="<unk>", **({"eos_token": "<eos>"} if eos else {}))
        assert tok.pad_token is None
        tok.save_pretrained(folder)
    cfg = transformers.GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=2,
                                  n_positions=128)
    torch.manual_seed(0)
    transformers.GPT2Model(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def check_json(args: list[str], capsys) -> tuple[int, dict]:
    """(exit status, parsed JSON) of ``attnscale check ARGS --json``."""
    code = cli_run(["check", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def heads_flagged(res: dict) -> list[str]:
    """The flagged heads as "L.H", in layer then head order."""
    return [f"{layer}.{head}" for layer, head in sorted({(f["layer"], f["head"])
                                                         for f in res["flags"]})]


def skip_args(heads: list[str]) -> list[str]:
    return [arg for head in heads for arg in ("--skip-head", head)]
