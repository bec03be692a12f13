"""Key-value retrieval among filler tokens, for length generalisation (claim C9, SSMax)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from attnscale.lab.tasks.base import IGNORE_INDEX, Batch, Task, distinct
from attnscale.util.validate import check_int


class LengthTask(Task):
    """Key-value retrieval among filler tokens, for length generalisation (C9, SSMax).

    Vocabulary (K = ``num_keys``, W = ``num_values``, F = ``num_fillers``): 0 = PAD (unused by
    the generator), keys [1, 1+K), values [1+K, 1+K+W), fillers [1+K+W, 1+K+W+F); the same at
    every length. A sequence of length L holds ``num_pairs`` (default 4) adjacent pairs
    ``key value`` with distinct keys and distinct values, at uniformly random non-overlapping
    positions in the first L-1 tokens; every other context token is a uniform filler. The last
    token repeats one of the keys (chosen uniformly) and its target is that key's value; no
    other position is labelled. Training uses L = ``seq_len`` = n; ``eval_batches`` returns
    ``{"n=<L>": [...]}`` for L in n * ``eval_multipliers`` (default n, 2n, 4n), each from its
    own eval stream. The number of fillers (distractors) grows with L while the answer is one
    position, which is where a fixed 1/sqrt(d) softmax spreads thin ("attention fading") and
    log-length scaling s * log(n) * q.k / sqrt(d) is meant to help (Nakanishi 2025, arXiv
    2501.19399). Causal decoder.

    The model must use positional encodings that extend beyond the training length: RoPE, or
    none (NoPE; causal masking still gives position information, Kazemnejad et al. 2023,
    arXiv 2305.19466). Learned absolute embeddings have no rows for positions >= n.

    Metric: accuracy at the labelled (last) position. Chance (``chance_level``) =
    1/``num_pairs``: copying the value of a random pair in the context; uniform guessing over
    values gives 1/W.
    """

    name: ClassVar[str] = "length"
    # learned absolute positions have no rows past the training length; RoPE extends
    model_defaults: ClassVar[dict[str, Any]] = {"pos": "rope"}

    def __init__(self, *, seq_len: int | None = None, seed: int = 0, num_pairs: int = 4,
                 num_keys: int = 64, num_values: int = 64, num_fillers: int = 128,
                 eval_multipliers: tuple[int, ...] = (1, 2, 4), eval_size: int = 512,
                 eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.seq_len = check_int("seq_len", 64 if seq_len is None else seq_len)
        self.num_pairs = check_int("num_pairs", num_pairs)
        self.num_keys = check_int("num_keys", num_keys)
        self.num_values = check_int("num_values", num_values)
        self.num_fillers = check_int("num_fillers", num_fillers)
        if isinstance(eval_multipliers, (str, bytes)) or not hasattr(eval_multipliers, "__iter__"):
            raise TypeError(
                f"eval_multipliers must be a sequence of positive ints; got {eval_multipliers!r}"
            )
        mults = tuple(check_int("eval_multipliers[]", x) for x in eval_multipliers)
        if not mults or len(set(mults)) != len(mults):
            raise ValueError(
                f"eval_multipliers must be a non-empty sequence of distinct positive ints; "
                f"got {eval_multipliers!r}"
            )
        self.eval_multipliers = mults
        if self.num_pairs > self.num_keys or self.num_pairs > self.num_values:
            raise ValueError(
                f"num_pairs={self.num_pairs} needs that many distinct keys and values; got "
                f"num_keys={self.num_keys}, num_values={self.num_values}"
            )
        if self.seq_len < 2 * self.num_pairs + 1:
            raise ValueError(
                f"seq_len={self.seq_len} has too few positions for num_pairs={self.num_pairs}: "
                f"need seq_len >= 2 * num_pairs + 1 = {2 * self.num_pairs + 1}"
            )
        self._set_eval_sizes(eval_size, eval_batch_size)
        self.key_offset = 1
        self.value_offset = 1 + self.num_keys
        self.filler_offset = 1 + self.num_keys + self.num_values
        self.vocab_size = self.filler_offset + self.num_fillers
        self.eval_lengths = tuple(self.seq_len * x for x in mults)
        self.chance_level = 1.0 / self.num_pairs

    def sample(self, length: int, batch_size: int, step: int = 0) -> Batch:
        """A batch at any ``length``, from its own stream (neither train nor eval)."""
        length = check_int("length", length, minimum=2 * self.num_pairs + 1)
        batch_size = check_int("batch_size", batch_size)
        step = check_int("step", step, minimum=0)
        return self._sample(self.generator(f"sample:n={length}", step), batch_size, length)

    def _sample(self, g: torch.Generator, batch_size: int, length: int) -> Batch:
        b, k = batch_size, self.num_pairs
        rows = torch.arange(b)
        keys = distinct(g, b, self.num_keys, k) + self.key_offset
        values = distinct(g, b, self.num_values, k) + self.value_offset
        tokens = torch.randint(self.filler_offset, self.vocab_size, (b, length), generator=g)
        # Non-overlapping placement: the context holds `free` fillers and k two-token blocks,
        # i.e. free + k units; pick which units are blocks, then block i starts at unit c_i + i.
        free = length - 1 - 2 * k
        units = distinct(g, b, free + k, k).sort(dim=1).values
        starts = units + torch.arange(k)
        tokens.scatter_(1, starts, keys)
        tokens.scatter_(1, starts + 1, values)
        which = torch.randint(0, k, (b,), generator=g)
        tokens[:, -1] = keys[rows, which]
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, -1] = values[rows, which]
        return Batch(tokens, targets)

    def _make_eval_batches(self) -> dict[str, list[Batch]]:
        return {f"n={n}": self._eval_set(f"eval:n={n}", n) for n in self.eval_lengths}


