"""The alarm zoo's second half: Hugging Face GPT-2s trained through ``transformers.Trainer``
with :class:`attnscale.integrations.hf.AttentionHealthCallback` attached, a held-out check of
the alarm's shipped defaults on a model, optimizer and training loop it was not tuned on.

Members: ``GPT2LMHeadModel`` at the lab zoo's size (:mod:`attnscale.lab.runzoo`: width 64, 2
layers of 2 heads, 64-token sequences, batch 16, :data:`STEPS` steps) over the characters of
CPython's ``pydoc_data.topics`` (its first 90%), GPT-2's own init (std 0.02) and
``scale_attn_weights`` True (1/√d, ``scaled_dot``) or False (``dot``); Trainer's AdamW
(β = (0.9, 0.95), weight decay 1e-4, gradient clip 1) with ``constant_with_warmup`` over 0 or
100 steps, the zoo's LRs and seeds. Batches are random windows drawn from the run's seed, so
runs of one (score, warmup, seed) see the same batches from the same init and differ by LR only.

What a run records: the loss of every step (``logging_steps=1``) and the callback's ``history``
at every ``every``-th step. Steps are the Trainer's global steps: the sample at step s measured
the forward that produced the loss of step s, which :func:`label_hf_zoo` places at s (the lab
zoo counts from 0, so its divergence onsets are moved by one).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from attnscale.lab.runzoo import BASE, STEPS, Member, label_zoo, train_zoo
from attnscale.lab.tasks.text import default_corpus
from attnscale.lab.train import num_threads
from attnscale.util.validate import check_int

__all__ = ["WindowDataset", "label_hf_zoo", "train_hf_member", "train_hf_zoo"]


class WindowDataset(torch.utils.data.Dataset):
    """``size`` windows of ``seq_len`` characters at random starts (``seed``) of ``ids``;
    each item ``{"input_ids", "labels"}`` (GPT-2 shifts the labels itself)."""

    def __init__(self, ids: torch.Tensor, seq_len: int, size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, len(ids) - seq_len, (size,), generator=gen)
        self.ids, self.seq_len = ids, seq_len

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = int(self.starts[i])
        window = self.ids[start:start + self.seq_len]
        return {"input_ids": window, "labels": window}


def _corpus() -> tuple[torch.Tensor, int]:
    text = default_corpus()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    train = text[:int(0.9 * len(text))]
    return torch.tensor([index[c] for c in train], dtype=torch.long), len(chars)


def _trainer(member: Member, steps: int, out_dir: str, callbacks: list[Any]) -> Any:
    import transformers

    ids, vocab = _corpus()
    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_positions=BASE["seq_len"], n_embd=BASE["d_model"],
        n_layer=BASE["n_layers"], n_head=BASE["n_heads"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, scale_attn_weights=member.score == "scaled_dot",
        bos_token_id=None, eos_token_id=None)  # GPT-2's 50256 lies outside a char vocab
    torch.manual_seed(member.seed)
    model = transformers.GPT2LMHeadModel(cfg)
    batch = BASE["batch_size"]
    data = WindowDataset(ids, BASE["seq_len"], steps * batch, seed=member.seed)
    args = transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=batch, max_steps=steps,
        learning_rate=member.lr, warmup_steps=min(member.warmup, steps),
        lr_scheduler_type="constant_with_warmup", weight_decay=1e-4, adam_beta2=0.95,
        max_grad_norm=1.0, logging_steps=1, logging_nan_inf_filter=False,  # NaN stays NaN
        save_strategy="no", report_to=[], use_cpu=True,
        seed=member.seed, data_seed=member.seed, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=callbacks)
    trainer.remove_callback(transformers.PrinterCallback)  # one dict printed per step
    return trainer


def train_hf_member(member: Member, every: int = 5, steps: int = STEPS,
                    callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train ``member`` through ``Trainer`` single-threaded with the health callback (its
    default thresholds, no warnings) and ``callbacks``; {"member", "name", "losses" (the loss
    of each step, NaN or inf as logged), "samples": [[step, stats]], "callback": the callback's
    :meth:`record`, "every", "elapsed_s"}."""
    from attnscale.integrations.hf import AttentionHealthCallback

    every = check_int("every", every, minimum=1)
    start = time.perf_counter()
    callback = AttentionHealthCallback(every_n_steps=every, warn=False)
    with num_threads(1), tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(member, steps, tmp, [callback, *callbacks])
        callback.attach(trainer)
        trainer.train()
    logged: list[float | None] = [None] * steps
    for entry in trainer.state.log_history:
        if "loss" in entry and 1 <= entry["step"] <= steps:
            logged[entry["step"] - 1] = float(entry["loss"])
    missing = logged.count(None)
    if missing:
        raise RuntimeError(f"{member.name}: {missing} of {steps} steps logged no loss")
    losses = [math.nan if x is None else x for x in logged]  # (for the type checker)
    return {"member": asdict(member), "name": f"hf-{member.name}", "losses": losses,
            "samples": [[step, values] for step, values in callback.history],
            "callback": callback.record(), "every": every,
            "elapsed_s": time.perf_counter() - start}


def train_hf_zoo(zoo: list[Member], every: int = 5, workers: int = 2,
                 steps: int = STEPS) -> list[dict[str, Any]]:
    """:func:`train_hf_member` for every member, ``workers`` processes (1: in this one)."""
    return train_zoo(zoo, every, workers, steps, train=train_hf_member)


def label_hf_zoo(runs: list[dict[str, Any]], reference_lr: float) -> list[dict[str, Any]]:
    """Each run with ``outcome`` (:func:`label_run` against its group's run at
    ``reference_lr``), the onset moved to the Trainer's 1-based global step (module docstring)."""
    return label_zoo(runs, reference_lr, step_offset=1)
