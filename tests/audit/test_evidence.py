"""Evidence from a hand-made results store: the numbers the claim rules read."""

from __future__ import annotations

import pytest

from attnscale.audit import evidence as E
from attnscale.audit import measurements as M
from attnscale.lab.store import Store
from attnscale.lab.sweep import config_id, resolve


def finish(store, sweep, rid, variant, config, loss, metric=None, loss0=4.0, status="done"):
    """Store one finished run; its id is the real one of its resolved config (evidence skips
    runs whose id does not match their config), ``rid`` only names it in the fixture."""
    config = resolve(config)
    rid = config_id(config)
    store.add_runs([{"id": rid, "config": config, "variant": variant}], sweep=sweep)
    store.finish(rid, {"status": status, "final_loss": loss, "final_metric": metric,
                       "initial_loss": loss0, "steps": 10,
                       "history": [{"step": 0, "loss": loss0, "max_abs_logit": 1.0},
                                   {"step": 10, "loss": loss, "max_abs_logit": 3.0}]})


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "results.db") as s:
        # text LR sweep at width 32: scaled_dot best at 1e-2 (losses 2.0, 2.2), dot diverges
        # at 1e-1 (clipped to its loss0 = 4) and is best at 1e-2 (3.0 and 5.0 -> clipped 4)
        for seed in (0, 1):
            for lr, sd, dot in ((1e-2, 2.0 + 0.2 * seed, 3.0 + 2 * seed), (1e-1, 3.5, None)):
                cfg = {"task": "text", "d_model": 32, "lr": lr, "seed": seed}
                finish(s, "lr_text", f"s{lr}{seed}", "scaled_dot", {**cfg, "score": "scaled_dot"},
                       sd)
                finish(s, "lr_text", f"d{lr}{seed}", "dot", {**cfg, "score": "dot"},
                       dot if dot is not None else 9.0,
                       status="done" if dot is not None else "diverged")
        s.add_runs([{"id": "queued", "config": {"lr": 1e-2}}], sweep="lr_text")  # ignored
        yield s


def test_best_loss_uses_the_clipped_loss_at_the_best_lr(store):
    ev = E.evidence_lr(store)
    sd, dot = ev["best_loss"]["text"]["scaled_dot"], ev["best_loss"]["text"]["dot"]
    assert sd["mean"] == pytest.approx(2.1) and sd["n"] == 2 and sd["lo"] < 2.0 < sd["hi"]
    assert dot["mean"] == pytest.approx(3.5)  # min(5, loss0 = 4) = 4 and 3
    row = ev["by_task"]["text"]["dot"]
    assert row["best_lr"] == 1e-2 and row["divergence_rate"] == 0.5 and row["stable_lrs"] == [1e-2]
    assert row["lr_sensitivity"] == pytest.approx((4.0 - 3.5) / 2)
    assert "queued" not in ev["runs"] and len(ev["runs"]) == 8
    assert ev["by_width"]["32"]["dot"]["max_stable_lr"] == 1e-2
    assert ev["by_width"]["32"]["scaled_dot"]["peak_max_logit"] == 3.0


def test_trained_logits_at_the_best_lr(store):
    ev = E.evidence_trained_logits(store, n=64)
    assert ev["trained_max_abs_logit"] == 3.0 and ev["growth"] == pytest.approx(3.0)
    best = [config_id(resolve({"task": "text", "d_model": 32, "lr": 1e-2, "seed": seed,
                               "score": "scaled_dot"})) for seed in (0, 1)]
    assert sorted(ev["runs"]) == sorted(best)


def test_salience_accuracy_counts_a_missing_metric_as_zero(tmp_path):
    with Store(tmp_path / "r.db") as s:
        finish(s, "salience", "a", "scaled_dot", {"lr": 1e-3, "seed": 0}, 1.0, metric=0.9)
        finish(s, "salience", "b", "scaled_dot", {"lr": 1e-3, "seed": 1}, 1.0, metric=None,
               status="diverged")
        ev = E.evidence_salience(s)
    assert ev["accuracy"]["scaled_dot"]["mean"] == pytest.approx(0.45)
    assert 0 < ev["chance"] < 1


def test_length_accuracy_per_variant_and_eval_length(tmp_path):
    with Store(tmp_path / "r.db") as s:
        for seed, (a2, a4) in enumerate(((1.0, 0.5), (0.8, None))):
            cfg = {"task": "length", "seq_len": 32, "pos": "none", "lr": 1e-3, "seed": seed}
            config = resolve(cfg)
            rid = config_id(config)
            s.add_runs([{"id": rid, "config": config, "variant": "scaled_dot"}], sweep="length")
            s.finish(rid, {"status": "done", "final_loss": 1.0, "history": [],
                           "final_metrics": {"n=64": {"metric": a2}, "n=128": {"metric": a4},
                                             "train": {"metric": 1.0}}})
        ev = E.evidence_length(s)
    acc = ev["accuracy"]["scaled_dot"]
    assert set(acc) == {"n=64", "n=128"} and acc["n=64"]["mean"] == pytest.approx(0.9)
    assert acc["n=128"]["mean"] == pytest.approx(0.25)  # a missing metric counts as 0
    assert len(ev["runs"]) == 2 and 0 < ev["chance"] < 1


def test_bench_ratios():
    rows = [{"n": n, "score": sc, "causal": False, "fwdbwd_ms": ms}
            for n, sc, ms in ((256, "cosine", 3.0), (256, "scaled_dot", 2.0),
                              (1024, "cosine", 8.0), (1024, "scaled_dot", 8.0))]
    rows.append({"n": 256, "score": "cosine", "causal": True, "fwdbwd_ms": 99.0})
    assert E.bench_ratios(rows) == {"256": 1.5, "1024": 1.0}


def test_measurements_are_cached_in_the_store(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"x": float("nan"), "y": (1, 2)}

    with Store(tmp_path / "r.db") as s:
        first = M.cached(s, "demo", {"n": (1, 2)}, compute)
        again = M.cached(s, "demo", {"n": [1, 2]}, compute)  # same key: tuples are lists
        other = M.cached(s, "demo", {"n": [2]}, compute)
    assert first == again == other == {"x": None, "y": [1, 2]}
    assert len(calls) == 2
    key = M.measurement_key
    assert key("demo", {"b": 1, "a": 2}) == key("demo", {"a": 2, "b": 1}) != key("qk", {})
