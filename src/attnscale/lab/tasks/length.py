"""Key-value retrieval among filler tokens, for length generalisation (claim C9, SSMax)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from attnscale.lab.tasks.base import IGNORE_INDEX, Batch, Task, distinct
from attnscale.util.validate import check_choice, check_int

LAYOUTS = ("fused", "pairs")


class LengthTask(Task):
    """Key-value retrieval among filler tokens, for length generalisation (C9, SSMax).

    A sequence of length L holds ``num_pairs`` = P (default 4) key-value pairs with distinct
    keys (of K = ``num_keys``) and distinct values (of W = ``num_values``), at uniformly random
    non-overlapping positions in the first L-1 tokens; every other context token is a uniform
    filler (of F = ``num_fillers``). The last token repeats one of the keys (chosen uniformly);
    only it is labelled. Layouts:

    * ``"fused"`` (default): a pair is one token (k, v), and the target is that pair token.
      One attention layer solves it: the query key matches the pair token that holds it and
      copies it, so the answer's weight at the query is the quantity that fades with length.
      Vocabulary: 0 = PAD (unused by the generator), keys [1, 1+K), fillers [1+K, 1+K+F),
      pair tokens [1+K+F, 1+K+F+K·W), the token of (key index k, value index v) being
      1+K+F + k·W + v (:meth:`pair_token`).
    * ``"pairs"``: a pair is two adjacent tokens ``key value`` and the target is the value.
      It needs an induction circuit (a previous-token head, then a match on the previous
      token; Olsson et al. 2022, arXiv 2209.11895), which a 2-layer model did not reach in
      600 CPU steps (accuracy near 1/P at n = 16 and 32). Vocabulary: 0 = PAD, keys [1, 1+K),
      values [1+K, 1+K+W), fillers [1+K+W, 1+K+W+F).

    In both, ``value_offset`` starts the value tokens (none in ``"fused"``: it equals
    ``filler_offset``) and ``pair_offset`` the pair tokens (none in ``"pairs"``); the vocabulary
    is the same at every length. Training uses L = ``seq_len`` = n; ``eval_batches`` returns
    ``{"n=<L>": [...]}`` for L in n * ``eval_multipliers`` (default n, 2n, 4n), each from its
    own eval stream. The number of fillers (distractors) grows with L while the answer is one
    position, which is where a fixed 1/sqrt(d) softmax spreads thin ("attention fading": with
    a logit gap g between the answer and m other keys its weight is e^g / (e^g + m)) and
    log-length scaling s·ln(n)·q·k/sqrt(d) is meant to help (Nakanishi 2025, arXiv
    2501.19399). :meth:`answer_positions` says where the answer sits (the pair token, or the
    value token), for :mod:`attnscale.lab.probe`. Causal decoder.

    The model must use positional encodings that extend beyond the training length: RoPE, or
    none (NoPE; causal masking still gives position information, Kazemnejad et al. 2023,
    arXiv 2305.19466). Learned absolute embeddings have no rows for positions >= n.

    Metric: accuracy at the labelled (last) position. Chance (``chance_level``) = 1/P:
    copying a random pair in the context (its token, or its value); uniform guessing over the
    possible targets gives 1/(K·W) (fused) or 1/W (pairs).
    """

    name: ClassVar[str] = "length"
    # learned absolute positions have no rows past the training length; RoPE extends
    model_defaults: ClassVar[dict[str, Any]] = {"pos": "rope"}

    def __init__(self, *, seq_len: int | None = None, seed: int = 0, layout: str = "fused",
                 num_pairs: int = 4, num_keys: int = 16, num_values: int = 16,
                 num_fillers: int = 64, eval_multipliers: tuple[int, ...] = (1, 2, 4),
                 eval_size: int = 512, eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.seq_len = check_int("seq_len", 64 if seq_len is None else seq_len)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.num_pairs = check_int("num_pairs", num_pairs)
        self.num_keys = check_int("num_keys", num_keys)
        self.num_values = check_int("num_values", num_values)
        self.num_fillers = check_int("num_fillers", num_fillers)
        self.eval_multipliers = _multipliers(eval_multipliers)
        if self.num_pairs > self.num_keys or self.num_pairs > self.num_values:
            raise ValueError(
                f"num_pairs={self.num_pairs} needs that many distinct keys and values; got "
                f"num_keys={self.num_keys}, num_values={self.num_values}"
            )
        self.pair_width = 2 if self.layout == "pairs" else 1  # tokens per pair
        need = self.pair_width * self.num_pairs + 1
        if self.seq_len < need:
            raise ValueError(
                f"seq_len={self.seq_len} has too few positions for num_pairs={self.num_pairs} "
                f"in layout {self.layout!r}: need seq_len >= {need}"
            )
        self._set_eval_sizes(eval_size, eval_batch_size)
        fused = self.layout == "fused"
        self.key_offset = 1
        self.value_offset = 1 + self.num_keys
        self.filler_offset = self.value_offset + (0 if fused else self.num_values)
        self.pair_offset = self.filler_offset + self.num_fillers
        self.vocab_size = self.pair_offset + (self.num_keys * self.num_values if fused else 0)
        self.eval_lengths = tuple(self.seq_len * x for x in self.eval_multipliers)
        self.chance_level = 1.0 / self.num_pairs

    def sample(self, length: int, batch_size: int, step: int = 0) -> Batch:
        """A batch at any ``length``, from its own stream (neither train nor eval)."""
        length = check_int("length", length, minimum=self.pair_width * self.num_pairs + 1)
        batch_size = check_int("batch_size", batch_size)
        step = check_int("step", step, minimum=0)
        return self._sample(self.generator(f"sample:n={length}", step), batch_size, length)

    def pair_token(self, key: Tensor, value: Tensor) -> Tensor:
        """Token of the fused pair (key index, value index), both 0-based: pair_offset + k·W + v."""
        if self.layout != "fused":
            raise ValueError(f"pair tokens exist only in layout 'fused', not {self.layout!r}")
        return self.pair_offset + key * self.num_values + value

    def answer_positions(self, batch: Batch) -> Tensor:
        """(B,) int64: the position of the answer in each sequence of ``batch``.

        ``"fused"``: the pair token whose key is the query's (the last token); ``"pairs"``: the
        value token right after the matching key. Decoded from the tokens, so any batch of this
        task works; ValueError if a sequence does not hold exactly one match.
        """
        tokens = batch.tokens
        query = tokens[:, -1:]  # (B, 1) a key token
        ctx = tokens[:, :-1]
        if self.layout == "fused":
            is_pair = ctx >= self.pair_offset
            key_of = torch.div(ctx - self.pair_offset, self.num_values, rounding_mode="floor")
            match = is_pair & (key_of + self.key_offset == query)
        else:
            match = ctx == query
        counts = match.sum(dim=1)
        if not bool((counts == 1).all()):
            raise ValueError("batch must hold exactly one pair with the query's key per sequence")
        return match.long().argmax(dim=1) + (self.pair_width - 1)

    def _sample(self, g: torch.Generator, batch_size: int, length: int) -> Batch:
        b, k, w = batch_size, self.num_pairs, self.pair_width
        rows = torch.arange(b)
        keys = distinct(g, b, self.num_keys, k)  # 0-based indices
        values = distinct(g, b, self.num_values, k)
        tokens = torch.randint(self.filler_offset, self.pair_offset, (b, length), generator=g)
        # Non-overlapping placement: the context holds `free` fillers and k w-token blocks,
        # i.e. free + k units; pick which units are blocks, then block i starts at c_i + (w-1)i.
        free = length - 1 - w * k
        units = distinct(g, b, free + k, k).sort(dim=1).values
        starts = units + (w - 1) * torch.arange(k)
        if self.layout == "fused":
            tokens.scatter_(1, starts, self.pair_token(keys, values))
        else:
            tokens.scatter_(1, starts, keys + self.key_offset)
            tokens.scatter_(1, starts + 1, values + self.value_offset)
        which = torch.randint(0, k, (b,), generator=g)
        tokens[:, -1] = keys[rows, which] + self.key_offset
        targets = torch.full_like(tokens, IGNORE_INDEX)
        if self.layout == "fused":
            targets[:, -1] = self.pair_token(keys[rows, which], values[rows, which])
        else:
            targets[:, -1] = values[rows, which] + self.value_offset
        return Batch(tokens, targets)

    def _make_eval_batches(self) -> dict[str, list[Batch]]:
        return {f"n={n}": self._eval_set(f"eval:n={n}", n) for n in self.eval_lengths}


def _multipliers(value: Any) -> tuple[int, ...]:
    """``eval_multipliers`` checked: a non-empty sequence of distinct positive ints."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"eval_multipliers must be a sequence of positive ints; got {value!r}")
    mults = tuple(check_int("eval_multipliers[]", x) for x in value)
    if not mults or len(set(mults)) != len(mults):
        raise ValueError(
            f"eval_multipliers must be a non-empty sequence of distinct positive ints; "
            f"got {value!r}"
        )
    return mults
