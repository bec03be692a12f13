"""The callbacks' statistics reach every ``report_to`` backend, not the console, unless asked
(``verbose=True``): AttentionHealthCallback and QKClipCallback with a real Trainer."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("tbparse")

from attnscale.integrations import AttentionHealthCallback  # noqa: E402
from attnscale.integrations.hf_qkclip import QKClipCallback  # noqa: E402


def run(hf_kit, tmp_path, monkeypatch, capfd, *, verbose: bool, disable_tqdm: bool = True):
    """6 steps of a tiny GPT-2 with the health callback every 3 steps, TensorBoard on
    (TENSORBOARD_LOGGING_DIR: transformers 5 has no logging_dir); (stdout + stderr, scalars)."""
    logdir = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logdir))
    trainer = hf_kit.make_trainer(hf_kit.tiny_gpt2(dropout=0.0), tmp_path / "out", steps=6,
                                  report_to=["tensorboard"])
    if not disable_tqdm:  # the tqdm bar's callback in place of the printer
        trainer.remove_callback(transformers.PrinterCallback)
        trainer.add_callback(transformers.ProgressCallback)
    health = AttentionHealthCallback(trainer, every_n_steps=3, verbose=verbose)
    capfd.readouterr()
    trainer.train()
    out, err = capfd.readouterr()
    assert [step for step, _ in health.history] == [3, 6]
    return out + err, hf_kit.read_scalars(logdir)


@pytest.mark.parametrize("disable_tqdm", [True, False])  # PrinterCallback / ProgressCallback
def test_statistics_reach_tensorboard_and_not_the_console(hf_kit, tmp_path, monkeypatch, capfd,
                                                          disable_tqdm):
    console, scalars = run(hf_kit, tmp_path, monkeypatch, capfd, verbose=False,
                           disable_tqdm=disable_tqdm)
    assert "attention/" not in console and "max_abs_logit" not in console
    assert "'loss'" in console  # the Trainer's own loss log still prints
    for step in (3, 6):
        tags = {tag for tag, s in scalars if s == step}
        assert "train/attention/alarms" in tags and "train/loss" in tags
        for stat in ("max_abs_logit", "logit_std", "entropy_uniform", "logit_std_head1"):
            assert f"train/attention/transformer.h.0.attn/{stat}" in tags


def test_verbose_prints_them(hf_kit, tmp_path, monkeypatch, capfd):
    console, scalars = run(hf_kit, tmp_path, monkeypatch, capfd, verbose=True)
    assert console.count("attention/transformer.h.0.attn/max_abs_logit'") == 2
    assert ("train/attention/alarms", 3) in scalars


def test_qkclip_logs_clips_to_the_reporters_not_the_console(hf_kit, tmp_path, monkeypatch,
                                                            capfd):
    """Per layer: the heads clipped since the last log and the max logit before clipping,
    at the Trainer's logging steps, in TensorBoard; nothing of it printed."""
    logdir = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logdir))
    trainer = hf_kit.make_trainer(hf_kit.tiny_gpt2(dropout=0.0), tmp_path / "out", steps=4,
                                  lr=0.05, report_to=["tensorboard"],
                                  data=hf_kit.TokenData(padded=False))
    clip = QKClipCallback(tau=0.05, trainer=trainer)  # below every head's max: all clip
    capfd.readouterr()
    trainer.train()
    out, err = capfd.readouterr()
    assert "qkclip/" not in out + err
    scalars = hf_kit.read_scalars(logdir)
    layers = sorted({c.layer for _, c in clip.clips})
    assert layers == ["transformer.h.0.attn", "transformer.h.1.attn"]
    for step in range(1, 5):
        clipped = [c for s, c in clip.clips if s == step]
        assert scalars[("train/qkclip/clipped_heads", step)] == len(clipped)
        for layer in layers:
            mine = [c for c in clipped if c.layer == layer]
            assert scalars[(f"train/qkclip/{layer}/clipped_heads", step)] == len(mine)
            top = scalars[(f"train/qkclip/{layer}/max_logit", step)]
            if mine:  # the largest S_h, as measured before the clip
                assert top == pytest.approx(max(c.max_logit for c in mine), rel=1e-6)
            else:
                assert top <= 0.05
    assert ("train/loss", 4) in scalars
