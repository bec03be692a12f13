"""Multi-query associative recall (Zoology, Arora et al. 2023, arXiv 2312.04927)."""

from __future__ import annotations

from typing import ClassVar

import torch

from attnscale.lab.tasks.base import IGNORE_INDEX, Batch, Task, distinct
from attnscale.util.validate import check_float, check_int


class MQARTask(Task):
    """Multi-query associative recall, after Zoology (Arora et al. 2023, arXiv 2312.04927).

    Layout (one sequence of length ``seq_len`` = T, with K = ``num_kv_pairs``, V =
    ``vocab_size``)::

        k1 v1 k2 v2 ... kK vK | 0 0 k_a 0 0 0 k_b 0 ...

    Keys are drawn from [1, V/2) and are distinct within a sequence; values are drawn uniformly
    (with replacement) from [V/2, V). Token 0 is filler. After the 2K context tokens, the
    remaining positions form ``(T - 2K) // 2`` query slots of two tokens each; every key is
    queried exactly once, at a slot chosen by sampling without replacement with probability
    proportional to ``power_a * g**(power_a - 1)`` (g = 1, 2, ... the slot's gap from the end of
    the context), so short gaps are most frequent (Zoology uses ``power_a = 0.01``). The query
    of the i-th pair takes the i-th sampled slot. The target at a query position is the value of
    that key (the value itself never appears there); every other target is IGNORE_INDEX, so the
    loss and the metric see query positions only. Causal decoder.

    Metric: accuracy at the query positions. Chance: a model that outputs the value of a random
    key from the context scores ``1 / num_kv_pairs`` (``chance_level``); uniform guessing over
    values scores ``1 / (V - V/2)``.

    Defaults follow the Zoology setup: V = 8192, T = 64, K = 8; the paper's sweep
    is (T, K) in {(64, 4), (128, 8), (256, 16)}. A small ``vocab_size`` such as 256 suits CPU
    runs. Needs ``seq_len >= 4 * num_kv_pairs`` and ``vocab_size // 2 - 1 >= num_kv_pairs``.
    """

    name: ClassVar[str] = "mqar"

    def __init__(self, *, seq_len: int | None = None, seed: int = 0, vocab_size: int = 8192,
                 num_kv_pairs: int = 8, power_a: float = 0.01, eval_size: int = 512,
                 eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.seq_len = check_int("seq_len", 64 if seq_len is None else seq_len)
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=4)
        self.num_kv_pairs = check_int("num_kv_pairs", num_kv_pairs)
        self.power_a = check_float("power_a", power_a, low=0.0)
        if self.seq_len < 4 * self.num_kv_pairs:
            raise ValueError(
                f"seq_len={self.seq_len} has too few positions for num_kv_pairs="
                f"{self.num_kv_pairs}: the 2K context tokens plus K two-token query slots need "
                f"seq_len >= 4 * num_kv_pairs = {4 * self.num_kv_pairs}"
            )
        if self.vocab_size // 2 - 1 < self.num_kv_pairs:
            raise ValueError(
                f"vocab_size={self.vocab_size} gives only {self.vocab_size // 2 - 1} keys in "
                f"[1, vocab_size/2), fewer than num_kv_pairs={self.num_kv_pairs} distinct keys; "
                f"need vocab_size >= {2 * (self.num_kv_pairs + 1)}"
            )
        self._set_eval_sizes(eval_size, eval_batch_size)
        self.key_range = (1, self.vocab_size // 2)
        self.value_range = (self.vocab_size // 2, self.vocab_size)
        self.num_slots = (self.seq_len - 2 * self.num_kv_pairs) // 2
        gaps = torch.arange(1, self.num_slots + 1, dtype=torch.float64)
        probs = self.power_a * gaps.pow(self.power_a - 1.0)
        self.gap_probs = (probs / probs.sum()).float()
        self.chance_level = 1.0 / self.num_kv_pairs

    def _sample(self, g: torch.Generator, batch_size: int, length: int) -> Batch:
        k = self.num_kv_pairs
        lo, hi = self.key_range
        keys = distinct(g, batch_size, hi - lo, k) + lo
        values = torch.randint(self.value_range[0], self.value_range[1], (batch_size, k),
                               generator=g)
        slots = torch.multinomial(self.gap_probs.expand(batch_size, -1).contiguous(), k,
                                  replacement=False, generator=g)
        tokens = torch.zeros(batch_size, length, dtype=torch.long)
        tokens[:, 0:2 * k:2] = keys
        tokens[:, 1:2 * k:2] = values
        query_pos = 2 * k + 2 * slots
        tokens.scatter_(1, query_pos, keys)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets.scatter_(1, query_pos, values)
        return Batch(tokens, targets)


