"""Training and evaluation tasks for the attention-scaling experiments.

Four tasks share one small interface (:class:`Task`) so the model and trainer never branch on
the task:

``mqar``
    Multi-query associative recall (Zoology, Arora et al. 2023, arXiv 2312.04927).
``text``
    Character-level language modelling on a UTF-8 file; by default the CPython documentation
    text shipped in :mod:`pydoc_data.topics` (no download).
``salience``
    Retrieval where the relevant item is marked only by the *magnitude* of its embedding
    (claim C3: "cosine similarity throws away magnitude information").
``length``
    Key-value retrieval among filler tokens, trained at length n and evaluated at n, 2n, 4n
    (claim C9 and log-length scaling, Nakanishi 2025, arXiv 2501.19399).

Every batch is a deterministic function of ``(task name, seed, split, step)``: a
:class:`torch.Generator` is seeded from a hash of that tuple, so the same step always gives the
same batch on the same torch version, and the evaluation sets come from a different stream
(split ``"eval"``) than the training batches (split ``"train"``). All generators are vectorised
tensor operations; the only Python loops are over eval batches.

Targets use :data:`IGNORE_INDEX` (-100) where there is no loss, the convention of
:func:`torch.nn.functional.cross_entropy`. Synthetic eval batches all have the same size and the
same number of labelled positions, so the plain mean of per-batch metrics is the exact metric;
:meth:`Task.metric_sum` gives (sum, count) for exact pooling in any case.
"""

from __future__ import annotations

import inspect
from typing import Any

from attnscale.lab.tasks.base import IGNORE_INDEX, Batch, Task, distinct, stream_seed
from attnscale.lab.tasks.length import LengthTask
from attnscale.lab.tasks.mqar import MQARTask
from attnscale.lab.tasks.salience import SalienceTask
from attnscale.lab.tasks.text import TextTask, default_corpus

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "Batch",
    "LengthTask",
    "MQARTask",
    "SalienceTask",
    "Task",
    "TextTask",
    "default_corpus",
    "distinct",
    "make_task",
    "stream_seed",
]

TASKS: dict[str, type[Task]] = {
    "mqar": MQARTask,
    "text": TextTask,
    "salience": SalienceTask,
    "length": LengthTask,
}


def make_task(name: str, *, seq_len: int | None = None, seed: int = 0, **options: Any) -> Task:
    """Build a task by registry name (see :data:`TASKS`); ``options`` go to the task class.

    Unknown names raise ValueError listing the valid ones; unknown options raise TypeError
    listing the accepted ones.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, one of {sorted(TASKS)}; got {type(name).__name__}")
    if name not in TASKS:
        raise ValueError(f"unknown task name {name!r}; valid names: {sorted(TASKS)}")
    cls = TASKS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters
                if p not in ("self", "seq_len", "seed")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for task {name!r}; accepted: {accepted}")
    return cls(seq_len=seq_len, seed=seed, **options)
