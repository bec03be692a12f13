"""Tiny random-weight Hugging Face models built from configs (no download), small synthetic
datasets and a Trainer factory for the integration tests, handed out by the ``hf_kit`` fixture."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

VOCAB = 50
SEQ = 12


class TokenData(torch.utils.data.Dataset):
    """``n`` random sequences of SEQ tokens, every third one padded after 8 tokens (attention
    mask 0, label -100), labels = inputs (masked or causal LM alike)."""

    def __init__(self, n: int = 64, seed: int = 0, padded: bool = True) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
        self.mask = torch.ones(n, SEQ, dtype=torch.long)
        if padded:
            self.mask[::3, 8:] = 0
            self.ids[self.mask == 0] = 0

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.ids[i].masked_fill(self.mask[i] == 0, -100)
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": labels}


def tiny_bert(dropout: float = 0.1):
    import transformers

    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, hidden_dropout_prob=dropout,
                                  attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg)


def tiny_gpt2(dropout: float = 0.1):
    import transformers

    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2,
                                  n_positions=32, bos_token_id=0, eos_token_id=0,
                                  resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


MODELS = {"bert": tiny_bert, "gpt2": tiny_gpt2}


def make_trainer(model, out: Path, *, steps: int = 6, lr: float = 1e-3, report_to=None,
                 data: torch.utils.data.Dataset | None = None, callbacks=None, **extra):
    """A CPU Trainer over ``data`` (default TokenData()), batch 8, logging every step."""
    import transformers

    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=8, learning_rate=lr,
        logging_steps=1, report_to=report_to or "none", save_strategy="no", disable_tqdm=True,
        log_level="error", use_cpu=True, seed=0, dataloader_num_workers=0, **extra)
    return transformers.Trainer(model=model, args=args, train_dataset=data or TokenData(),
                                callbacks=callbacks)


@pytest.fixture(autouse=True)
def _single_threaded():
    """Tiny models on a shared 2-core machine run fastest on one thread."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def read_scalars(logdir: Path) -> dict[tuple[str, int], float]:
    """{(tag, step): value} of every scalar in the event files under ``logdir`` (tbparse)."""
    import tbparse

    with warnings.catch_warnings():  # tbparse's own pandas deprecation warnings
        warnings.simplefilter("ignore")
        frame = tbparse.SummaryReader(str(logdir)).scalars
    return {(tag, int(step)): float(value)
            for tag, step, value in zip(frame["tag"], frame["step"], frame["value"], strict=True)}


@pytest.fixture
def hf_kit() -> SimpleNamespace:
    """The helpers above: TokenData, tiny_bert, tiny_gpt2, MODELS, make_trainer, read_scalars."""
    return SimpleNamespace(TokenData=TokenData, tiny_bert=tiny_bert, tiny_gpt2=tiny_gpt2,
                           MODELS=MODELS, make_trainer=make_trainer, read_scalars=read_scalars,
                           SEQ=SEQ)
