"""A process-wide cache of drawn batches, so that runs of one task and seed draw them once.

A task's batch number ``step`` is a function of the task's settings, its seed and the step
(:meth:`attnscale.lab.tasks.Task.train_batch`), and a study trains many runs on the same task
and seed (every arm and learning rate of a seed). Drawing a retrieval batch takes ~0.6 ms of a
~6 ms training step (rejection sampling of distinct keys, scatter), so a sweep worker keeps the
batches it drew, keyed by :func:`task_key`, and hands out copies: a run may do what it likes with
its batch. The cache is bounded in bytes (least recently used first out), so a long run with big
batches costs a dictionary lookup per step and no memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

# A batch here is a :class:`attnscale.lab.tasks.Batch` (tokens, targets, scale); base.py, which
# defines it, imports this module, so it is not imported back.
Batch = Any

__all__ = ["BATCHES", "BatchCache", "task_key"]

PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, PLAIN)


def task_key(task: Any) -> tuple[Hashable, ...]:
    """What decides a task's batches: its class, the plain public attributes of the class and
    its bases (e.g. a special token's id) and of the task (its settings and seed), but those
    the class names in ``key_skip`` (a text task's whole corpus, whose SHA-256 is in the key).
    Tensors derived from these are left out. Two tasks with the same key draw the same batches.
    Computed at each draw (~20 µs), so a task changed after its first draw gets a new key."""
    skip = set(getattr(task, "key_skip", ()))
    fields: dict[str, Any] = {}
    for klass in reversed(type(task).__mro__):
        fields.update(vars(klass))
    fields.update(vars(task))
    attrs = sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in fields.items()
                   if not k.startswith("_") and k not in skip and _plain(v))
    return (type(task).__module__, type(task).__qualname__, tuple(attrs))


def _nbytes(batch: Batch) -> int:
    return sum(t.numel() * t.element_size() for t in (batch.tokens, batch.targets, batch.scale)
               if t is not None)


class BatchCache:
    """LRU map from a key to a :class:`Batch`, at most ``max_bytes`` of tensors in all."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, Batch] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0

    def get(self, key: Hashable, draw: Callable[[], Batch]) -> Batch:
        """A copy of the batch stored under ``key``, drawing (and storing) it first if absent."""
        batch = self._items.get(key)
        if batch is None:
            self.misses += 1
            batch = draw()
            size = _nbytes(batch)
            if size <= self.max_bytes:
                self._items[key] = batch
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, old = self._items.popitem(last=False)
                    self._bytes -= _nbytes(old)
        else:
            self.hits += 1
            self._items.move_to_end(key)
        return replace(batch, tokens=batch.tokens.clone(), targets=batch.targets.clone(),
                       scale=None if batch.scale is None else batch.scale.clone())

    @contextmanager
    def disabled(self) -> Iterator[None]:
        """Within the block every batch is drawn afresh and nothing is kept (a benchmark that
        times training steps must not let one arm draw what another then reuses)."""
        old, self.max_bytes = self.max_bytes, 0
        self.clear()
        try:
            yield
        finally:
            self.max_bytes = old

    def clear(self) -> None:
        """Forget every batch (and the counts)."""
        self._items.clear()
        self._bytes = self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes of tensors held."""
        return self._bytes


# A sweep worker's share: ~10 seeds of the largest standard-preset retrieval study (6.5 MB each)
BATCHES = BatchCache(max_bytes=96 * 2**20)
