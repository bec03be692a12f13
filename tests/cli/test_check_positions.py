"""``check`` (and ``inspect``) on any context length: the token budget never exceeds the
positions the model has (its config's ``n_positions``, ``max_position_embeddings``, ... or its
tokenizer's ``model_max_length``), and the output says when it was lowered.

The model: a tiny random GPT-2 with 64 positions and the zoo's character tokenizer (one token
a character, no download), so that every default sentence, and the long input here, is past
its positions at the default ``--max-tokens 128``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnscale.cli import run as cli_run
from attnscale.measure import inspection as I

POSITIONS = 64
LONG = "the quick brown fox jumps over the lazy dog " * 8  # 352 characters, 352 tokens


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    """A 1-layer GPT-2 (2 heads, width 16, 64 positions) with a character tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from attnscale.integrations.zoo import char_tokenizer

    folder = tmp_path_factory.mktemp("gpt2-64")
    tok = char_tokenizer()
    tok.save_pretrained(folder)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_positions=POSITIONS, n_layer=1,
                                  n_head=2, n_embd=16)
    torch.manual_seed(0)
    transformers.GPT2Model(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def test_the_model_itself_fails_past_its_positions(gpt2):
    """The control: truncating at 128 tokens crashes this model, as check did."""
    import torch

    model, tok = I.load_model(gpt2)
    batch = tok([LONG], truncation=True, max_length=128, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 128
    with pytest.raises(IndexError), torch.no_grad():
        model(**batch)


@pytest.mark.parametrize("lines", [[LONG], [LONG, "short", "a b"]], ids=["long", "mixed"])
def test_check_reads_at_most_the_models_positions(lines, gpt2, tmp_path, capsys):
    text = tmp_path / "inputs.txt"
    text.write_text("\n".join(lines) + "\n")
    code = cli_run(["check", str(gpt2), "--text", str(text), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err  # healthy or flagged, never an error
    result = json.loads(out)
    assert result["max_tokens"] == {"asked": 128, "used": POSITIONS, "limit": POSITIONS,
                                    "limit_from": f"n_positions of {gpt2}"}
    assert POSITIONS <= result["n_tokens"] <= POSITIONS * len(lines)
    assert err.splitlines()[0] == f"--max-tokens 128 lowered to 64: n_positions of {gpt2}"
    assert "error" not in err


def test_check_with_the_default_inputs_and_a_table(gpt2, capsys):
    code = cli_run(["check", str(gpt2)])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert "lowered to 64" in err and ("healthy:" in out or "flagged:" in out)


def test_a_short_text_and_a_smaller_budget_are_kept(gpt2, tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("a cat\n")
    code = cli_run(["check", str(gpt2), "--text", str(text), "--max-tokens", "32", "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    result = json.loads(out)
    assert result["max_tokens"]["used"] == 32 and "lowered" not in err
    assert result["n_tokens"] == 6  # [CLS] a c ##a ##t [SEP]


def test_inspect_too(gpt2, capsys):
    assert cli_run(["inspect", str(gpt2), "--sentence", LONG, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["n_tokens"] == POSITIONS and "lowered to 64" in err


@pytest.mark.parametrize("config,tokenizer_max,limit", [
    ({"n_positions": 64, "n_ctx": 1024}, None, (64, "n_positions")),
    ({"max_position_embeddings": 512}, 10**30, (512, "max_position_embeddings")),
    ({"max_position_embeddings": 2048}, 1024, (1024, "the tokenizer's model_max_length")),
    ({"max_seq_len": 2048, "model_type": "mpt"}, None, (2048, "max_seq_len")),
    ({"seq_length": 8192}, None, (8192, "seq_length")),
    ({"text_config": {"max_position_embeddings": 77}}, None, (77, "max_position_embeddings")),
    ({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}, None,
     (512, "max_position_embeddings - 2 (roberta positions start at pad_token_id + 1)")),
    ({"relative_attention_num_buckets": 32}, None, None),  # T5: no limit
    ({"n_positions": True, "max_position_embeddings": 1.5}, "x", None),  # not counts
])
def test_token_limit(config, tokenizer_max, limit):
    assert I.token_limit(config, tokenizer_max) == limit


def test_token_budget_takes_the_least_of_several_models(tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    for folder, n in ((small, 32), (big, 512)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"max_position_embeddings": n}))
    (big / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 300}))
    assert I.token_budget(128, big) == {"asked": 128, "used": 128, "limit": 300,
                                        "limit_from": f"the tokenizer's model_max_length of {big}"}
    assert I.token_budget(128, big, small)["used"] == 32
    assert I.token_budget(128, tmp_path)["limit"] is None  # no config: nothing known
