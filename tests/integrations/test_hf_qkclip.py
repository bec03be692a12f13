"""QKClipCallback: Kimi K2's QK-Clip inside a Hugging Face Trainer. A τ no head reaches leaves
training bitwise unchanged; a τ below the heads' max clips them after the step, and the model's
max |logit| then stays near τ while an unclipped run's grows past it."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnscale.integrations.hf_qkclip import QKClipCallback  # noqa: E402
from attnscale.measure.monitor import Monitor  # noqa: E402


def max_logit(model, data) -> float:
    """The model's max |logit| over one batch of ``data``, eval mode, no grad."""
    batch = {k: torch.stack([data[i][k] for i in range(16)]) for k in ("input_ids",)}
    model.eval()
    with torch.no_grad(), Monitor(model) as mon:
        model(**batch)
    model.train()
    return max(float(s.max_abs_logit.max()) for s in mon.stats().values())


def train(hf_kit, tmp_path, callbacks, lr=1e-3, steps=6):
    model = hf_kit.tiny_gpt2(dropout=0.0)
    data = hf_kit.TokenData(padded=False)
    hf_kit.make_trainer(model, tmp_path, steps=steps, lr=lr, data=data,
                        callbacks=callbacks).train()
    return model, data


def test_a_tau_no_head_reaches_changes_nothing(hf_kit, tmp_path):
    plain, _ = train(hf_kit, tmp_path / "plain", [])
    clip = QKClipCallback(tau=1e9)
    clipped, _ = train(hf_kit, tmp_path / "clip", [clip])
    assert clip.clips == []
    for (name, a), (_, b) in zip(plain.named_parameters(), clipped.named_parameters(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_heads_past_tau_are_clipped_after_each_step(hf_kit, tmp_path):
    """At LR 0.05 the logits grow; τ at half their value at init clips from the first step."""
    model, data = hf_kit.tiny_gpt2(dropout=0.0), hf_kit.TokenData(padded=False)
    tau = max_logit(model, data) / 2
    plain, _ = train(hf_kit, tmp_path / "plain", [], lr=0.05, steps=20)
    clip = QKClipCallback(tau=tau)
    clipped, data = train(hf_kit, tmp_path / "clip", [clip], lr=0.05, steps=20)
    first_step, first = clip.clips[0]
    assert first_step == 1 and first.max_logit > tau and first.gamma == pytest.approx(
        tau / first.max_logit)
    assert {c.layer for _, c in clip.clips} <= {n for n, _ in clipped.named_modules()}
    assert max_logit(plain, data) > 2 * tau
    assert max_logit(clipped, data) < 1.5 * tau  # τ, up to one step's growth
    assert clip.record()["clips"][0]["step"] == 1


@pytest.mark.parametrize("tau,error", [(0.0, ValueError), (float("nan"), ValueError),
                                       ("100", TypeError)])
def test_a_bad_tau_is_named(tau, error):
    with pytest.raises(error, match="tau"):
        QKClipCallback(tau=tau)
