"""Run by ``torchrun --nproc_per_node 2`` in tests/integrations/test_ddp.py: a tiny GPT-2
trained by a Hugging Face Trainer under DDP (gloo, CPU) with the attention health callback
(stop at the first alarm) and QK-Clip; each rank writes what it saw to OUT/rank{r}.json."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import transformers

from attnscale.integrations.alarm import HealthThresholds
from attnscale.integrations.hf import AttentionHealthCallback
from attnscale.integrations.hf_qkclip import QKClipCallback

STOP_AT_LOGIT = 3.0  # max |logit| at which the alarm fires: reached after a few steps at LR 0.05


class Tokens(torch.utils.data.Dataset):
    """64 random sequences of 12 tokens (vocabulary 50), labels = inputs."""

    def __init__(self) -> None:
        self.ids = torch.randint(1, 50, (64, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(out: Path, tau: float) -> None:
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(
        output_dir=str(out / "trainer"), max_steps=12, per_device_train_batch_size=4,
        learning_rate=0.05, logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, log_level="error", use_cpu=True, seed=0, ddp_backend="gloo",
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
    health = AttentionHealthCallback(
        trainer, every_n_steps=2, stop=True, warn=False,
        thresholds=HealthThresholds(max_logit=STOP_AT_LOGIT))
    clip = QKClipCallback(tau=tau)
    trainer.add_callback(clip)
    trainer.train()
    rank = torch.distributed.get_rank()
    weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest()
    record = {"rank": rank, "health": health.record(), "history": health.history,
              "global_step": trainer.state.global_step, "weights": weights,
              "clips": clip.record()["clips"]}
    (out / f"rank{rank}.json").write_text(json.dumps(record, default=float))


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
