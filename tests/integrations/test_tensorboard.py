"""attnscale.integrations.tensorboard.log_attention: a plain PyTorch loop's TensorBoard helper."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnscale.integrations import log_attention
from attnscale.integrations.health import HEALTH_STATISTICS
from attnscale.integrations.tensorboard import attention_health, padding_query_mask, run_batch
from attnscale.measure.monitor import Monitor


class Writer:
    """Records add_scalar calls, as SummaryWriter would write them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))


class TorchMHA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x, y=None):
        y = x if y is None else y
        return self.attn(x, y, y, need_weights=False)[0]


def bert_batch(kit):
    data = kit.TokenData(n=6, seed=3)
    items = [data[i] for i in range(6)]
    return {k: torch.stack([it[k] for it in items]) for k in ("input_ids", "attention_mask")}


def test_log_attention_matches_the_monitor_on_the_same_batch(hf_kit):
    pytest.importorskip("transformers")
    model, batch = hf_kit.tiny_bert(dropout=0.1).train(), bert_batch(hf_kit)
    writer = Writer()
    values = log_attention(model, batch, writer, 7)
    assert model.training  # its mode is restored
    model.eval()
    with torch.no_grad(), Monitor(model) as monitor:
        monitor.query_mask = batch["attention_mask"].bool()
        model(**batch)
    expected = {f"attention/{k}": v for k, v in monitor.flat_stats().items()
                if k.rsplit("/", 1)[1] in HEALTH_STATISTICS}
    assert len(expected) == 2 * len(HEALTH_STATISTICS)  # two layers
    assert values.keys() == expected.keys()
    assert values == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert writer.calls == [(tag, value, 7) for tag, value in values.items()]


def test_padding_rows_change_the_statistics(hf_kit):
    """The padding rows are left out: the same batch measured with every row differs."""
    pytest.importorskip("transformers")
    model, batch = hf_kit.tiny_bert(), bert_batch(hf_kit)
    assert padding_query_mask(model, batch) is not None
    with_rows = attention_health(model, {**batch, "attention_mask": torch.ones(6, 12,
                                                                                dtype=torch.long)})
    key = "attention/bert.encoder.layer.0.attention.self/entropy_normalized"
    assert attention_health(model, batch)[key] != pytest.approx(with_rows[key], rel=1e-6)
    assert padding_query_mask(model, {"attention_mask": torch.ones(2, 3)}) is None
    assert padding_query_mask(model, {"input_ids": torch.ones(2, 3)}) is None


def test_log_attention_writes_an_event_file(tmp_path, hf_kit):
    pytest.importorskip("tbparse")
    from torch.utils.tensorboard import SummaryWriter

    model, x = TorchMHA(), torch.randn(3, 5, 16)
    with SummaryWriter(str(tmp_path)) as writer:
        first = log_attention(model, x, writer, 0, prefix="health")
        second = log_attention(model, (x, 2 * x), writer, 5, prefix="health")
    scalars = hf_kit.read_scalars(tmp_path)
    assert {tag for tag, _ in scalars} == set(first) == {
        f"health/attn/{s}" for s in HEALTH_STATISTICS}
    for step, values in ((0, first), (5, second)):
        got = {tag: value for (tag, s), value in scalars.items() if s == step}
        assert got == pytest.approx(values, rel=1e-6)  # event files hold float32
    assert first != second


def test_run_batch_forms():
    model, x = TorchMHA(), torch.randn(2, 3, 16)
    assert torch.equal(run_batch(model, x), model(x))
    assert torch.equal(run_batch(model, [x, x]), model(x, x))
    assert torch.equal(run_batch(model, {"x": x}), model(x))
    with pytest.raises(TypeError, match="batch"):
        run_batch(model, "tokens")


def test_log_attention_validates_arguments():
    model, x = TorchMHA(), torch.randn(2, 3, 16)
    with pytest.raises(TypeError, match="writer"):
        log_attention(model, x, object(), 0)
    with pytest.raises(ValueError, match="step"):
        log_attention(model, x, Writer(), -1)
    with pytest.raises(TypeError, match="step"):
        log_attention(model, x, Writer(), 1.0)
    with pytest.raises(ValueError, match="prefix"):
        log_attention(model, x, Writer(), 0, prefix="")
    with pytest.raises(TypeError, match="model"):
        log_attention(lambda t: t, x, Writer(), 0)
    with pytest.raises(TypeError, match="batch"):
        log_attention(model, "tokens", Writer(), 0)
    with pytest.raises(ValueError, match="no attention"):
        log_attention(nn.Linear(16, 16), x, Writer(), 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_are_flagged_by_the_flat_statistics(hf_kit, bad):
    """A layer whose logits overflowed must not look calm: Monitor.flat_stats() itself reads
    nonfinite_fraction > 0 and max_abs_logit inf there, the same on the native kernel and the
    Python path; the next layer, fed NaN, reads NaN (no finite row), never 0; and
    attention_health logs it."""
    pytest.importorskip("transformers")
    model, batch = hf_kit.tiny_bert().eval(), bert_batch(hf_kit)
    layers = [f"bert.encoder.layer.{i}.attention.self" for i in range(2)]
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.query.weight[0, 0] = bad
    flats = {}
    for compile in (None, False):  # the native kernel and the Python path
        with torch.no_grad(), Monitor(model, compile=compile) as monitor:
            model(**batch)
        flats[compile] = monitor.flat_stats()
    flat = flats[None]
    assert flat.keys() == flats[False].keys()
    for key, value in flat.items():
        assert value == pytest.approx(flats[False][key], rel=1e-5, abs=1e-6, nan_ok=True), key
    assert 0 < flat[f"{layers[0]}/nonfinite_fraction"] < 1  # head 0 of 2 holds the bad weight
    assert flat[f"{layers[0]}/max_abs_logit"] == math.inf
    assert math.isfinite(flat[f"{layers[0]}/entropy_normalized"])  # head 1's rows
    assert flat[f"{layers[1]}/nonfinite_fraction"] == 1.0 and flat[f"{layers[1]}/rows"] == 0
    assert math.isnan(flat[f"{layers[1]}/entropy_normalized"])
    assert math.isnan(flat[f"{layers[1]}/logit_std"])
    values = attention_health(model, batch)
    assert values[f"attention/{layers[0]}/nonfinite_fraction"] > 0
    healthy = attention_health(hf_kit.tiny_bert(), batch)
    assert all(healthy[f"attention/{layer}/nonfinite_fraction"] == 0 for layer in layers)
    assert all(math.isfinite(value) for value in healthy.values())
