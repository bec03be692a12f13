"""attnscale.lab.tasks.cache: a batch is drawn once per process for a task's settings and seed,
handed out as a copy, bounded in bytes, and a run trains bit for bit the same with or without
the drawn batches in the cache."""

from __future__ import annotations

import inspect

import pytest
import torch

from attnscale.lab.tasks import TASKS, Batch, make_task
from attnscale.lab.tasks.cache import BATCHES, BatchCache, task_key
from attnscale.lab.train import run

SMALL = {"mqar": {"vocab_size": 256}, "text": {}, "salience": {}, "length": {}}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_setting_of_a_task_is_in_its_key(name):
    """A setting left out of the key would hand one task's batches to another."""
    task = make_task(name, **SMALL[name])
    key_names = {k for k, _ in task_key(task)[2]}
    params = set(inspect.signature(TASKS[name].__init__).parameters) - {"self"}
    assert params <= key_names


@pytest.mark.parametrize("name", sorted(TASKS))
def test_same_settings_and_seed_draw_once_and_hand_out_copies(name):
    BATCHES.clear()
    a, b = make_task(name, **SMALL[name]), make_task(name, **SMALL[name])
    first = a.train_batch(5, 4)
    first.tokens.fill_(0)  # a run may modify its batch: the cache keeps its own
    again = b.train_batch(5, 4)
    assert BATCHES.misses == 1 and BATCHES.hits == 1
    BATCHES.clear()
    fresh = make_task(name, **SMALL[name]).train_batch(5, 4)
    assert torch.equal(again.tokens, fresh.tokens) and torch.equal(again.targets, fresh.targets)
    assert not torch.equal(again.tokens, first.tokens)
    other = make_task(name, seed=1, **SMALL[name]).train_batch(5, 4)
    assert not torch.equal(other.tokens, fresh.tokens)  # another seed, another key
    assert BATCHES.misses == 2


def test_the_cache_is_bounded_in_bytes_least_recently_used_first_out():
    def batch(v):
        return Batch(torch.full((2, 4), v), torch.full((2, 4), v))  # 128 bytes

    cache = BatchCache(max_bytes=300)
    for v in (1, 2):
        cache.get(v, lambda v=v: batch(v))
    cache.get(1, lambda: batch(9))  # a hit: 1 is now the most recent
    cache.get(3, lambda: batch(3))  # 384 bytes > 300: the least recent (2) goes
    assert len(cache) == 2 and cache.nbytes == 256
    assert cache.get(1, lambda: batch(9)).tokens[0, 0] == 1
    assert cache.get(2, lambda: batch(7)).tokens[0, 0] == 7  # drawn again
    huge = BatchCache(max_bytes=100)
    assert huge.get(1, lambda: batch(5)).tokens[0, 0] == 5 and len(huge) == 0  # never stored


def test_a_run_is_the_same_with_a_cold_or_a_warm_cache():
    cfg = {"task": "length", "seq_len": 12, "num_pairs": 2, "d_model": 16, "n_heads": 2,
           "n_layers": 1, "mlp": False, "eval_size": 32, "steps": 6, "warmup_steps": 0,
           "init": "unit", "log_every": 2}
    BATCHES.clear()
    cold = run(cfg)
    warm = run(cfg)
    assert BATCHES.hits >= 6
    assert cold.final_loss == warm.final_loss
    assert [r["loss"] for r in cold.history] == [r["loss"] for r in warm.history]


def test_the_key_holds_class_constants_and_the_corpus_by_its_hash_and_follows_changes():
    text = make_task("text", seq_len=16)
    key = dict(task_key(text)[2])
    assert "text" not in key and key["sha256"] == text.sha256
    assert key["TRAIN_FRACTION"] == 0.9  # a class constant that decides the batches
    task = make_task("length", **SMALL["length"])
    before = task_key(task)
    task.seed = 7  # changed after construction: a new key, not the old batches
    assert task_key(task) != before


def test_a_task_that_overrides_only_metric_sum_is_refused():
    from attnscale.lab.tasks.base import Task

    with pytest.raises(TypeError, match="labelled_metric_sum"):
        type("Scored", (Task,), {"metric_sum": lambda self, logits, batch: (0.0, 1)})
