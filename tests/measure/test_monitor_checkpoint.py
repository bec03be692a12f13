"""Activation checkpointing runs each checkpointed forward again during backward; the monitor
records a training step once, as it does without checkpointing."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.measure.monitor import Monitor

transformers = pytest.importorskip("transformers")


def step_stats(model, inputs, *, every: int = 1) -> dict[str, float]:
    with Monitor(model, every=every) as mon:
        for _ in range(2):
            model(inputs).sum().backward()
    return mon.flat_stats()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_checkpointed_attnscale_layer_is_recorded_once(use_reentrant):
    torch.manual_seed(0)
    layer = MultiheadSelfAttention(16, 4, causal=True)
    x = torch.randn(2, 7, 16, requires_grad=True)

    class Wrapper(torch.nn.Module):
        def __init__(self, checkpointed: bool) -> None:
            super().__init__()
            self.attn, self.checkpointed = layer, checkpointed

        def forward(self, x):
            if self.checkpointed:
                return checkpoint(self.attn, x, use_reentrant=use_reentrant)
            return self.attn(x)

    plain, checked = step_stats(Wrapper(False), x), step_stats(Wrapper(True), x)
    assert checked.keys() == plain.keys() and checked == pytest.approx(plain, rel=1e-6)
    # every=2 counts calls: with the recomputations counted, the second step would be skipped
    assert step_stats(Wrapper(True), x, every=2) == pytest.approx(
        step_stats(Wrapper(False), x, every=2), rel=1e-6)

def test_hf_gradient_checkpointing_is_recorded_once():
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(1))

    def run() -> dict[str, float]:
        with Monitor(model) as mon:
            model(ids, labels=ids).loss.backward()
        return mon.flat_stats()

    plain = run()
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    checked = run()
    rows = [k for k in plain if k.endswith("/rows")]
    assert rows and all(checked[k] == plain[k] for k in rows)
    assert checked == pytest.approx(plain, rel=1e-5)
