"""Retrieval where the relevant item is marked only by its embedding magnitude (claim C3)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from attnscale.lab.models import CUE_AT
from attnscale.lab.tasks.base import IGNORE_INDEX, Batch, Task, distinct
from attnscale.util.validate import check_choice, check_float, check_int


class SalienceTask(Task):
    """Retrieval where the relevant item is marked only by its embedding magnitude (claim C3).

    Vocabulary (P = ``num_item_tokens``, W = ``num_values``): 0 = PAD, 1 = QUERY,
    items [2, 2+P), "marked" item copies [2+P, 2+2P) (used only by ``cue="token"``),
    values [2+2P, 2+2P+W).

    Layout, with m = ``num_items`` and T = ``seq_len`` (default 2m+1; longer sequences are
    left-padded with PAD)::

        layout="pairs":  PAD.. x1 v1 x2 v2 ... xm vm QUERY   target at QUERY = v_s
        layout="items":  PAD.. x1 x2 ... xm QUERY            target at QUERY = x_s

    The m item tokens are distinct draws from the shared pool, the m values are distinct draws,
    and the salient index s is uniform in [0, m), independent of the tokens; so salient and
    distractor items have the same token distribution and the tokens say nothing about s.
    ``Batch.scale`` is 1 at PAD, value and QUERY positions; at item positions it is
    ``1 + U(-jitter, jitter)`` for distractors and ``salient_scale + U(-jitter, jitter)`` for the
    salient item (``cue="scale"``, default 3.0 vs 1.0, jitter 0.1). Controls: ``cue="token"``
    marks the salient item by identity instead (its token is the marked copy x_s + P, all scales
    drawn like distractors; the target stays v_s, or the unmarked x_s in the items layout), and
    ``cue="none"`` marks nothing (accuracy must stay at chance). The only positions labelled are
    the final QUERY. ``layout="items"`` needs no previous-token/induction circuit (the answer is
    the attended token itself), so it also suits models without learned positions (NoPE).
    Causal decoder (the query at the end sees everything).

    What the model can see (stated so the result is read correctly): the model forms
    ``h = scale * E[token] + P[pos]`` and a pre-LN block reads ``LN(h)``. LayerNorm removes the
    overall norm of ``h``, so the scale survives into the first attention layer only as a change
    of *direction*: ``LN(s*e + p)`` moves from ``LN(p)`` toward ``LN(e)`` as s grows. With a
    dot-product score the logit is ``q . k = |q| |k| cos``, so W_K can turn that change of
    direction into a change of ``|k|`` and the score can use key magnitude directly (logit
    proportional to ``|k|`` for a fixed query direction). A cosine score ``q.k / (|q| |k|)`` is
    invariant to rescaling k, so a pure cosine model can use only the part of the magnitude that
    leaks into the key's direction (through the LayerNorm of ``s*e + p``, and in later layers
    through the unnormalised residual stream, where ``s*e`` is mixed with attention outputs).
    Without positional embeddings ``LN(s*e) = LN(e)`` up to eps, so no first-layer score sees the
    scale at all. That is ``cue_at="embedding"`` (the default). It cannot tell whether a score
    uses ``|k|``: the LayerNorm turns the cue into a direction that any score can read, and the
    value vectors carry it too (uniform attention averages the values, and the salient item's
    value differs from a distractor's).

    ``cue_at="key"`` isolates ``|k|``: the model applies ``Batch.scale`` to every attention
    layer's key after its projection, ``k_t = scale_t * W_K LN(h_t)``, and nowhere else
    (:class:`attnscale.lab.models.GPT`; the batches are the same, only the model reads
    ``scale`` differently). The embedding, q and v are computed without the cue and k is used
    only by the score, so the cue reaches the residual stream (and the values' mixture) only
    through the attention weights. A dot-product logit ``q . k_t`` is multiplied by scale_t,
    while ``tau * cos(q, k_t)`` is exactly invariant to it (scale_t >= 1 - jitter > 0), for a
    fixed or learned per-head tau. So a cosine model's output is independent of the cue and
    its accuracy is at most chance; the dot product can find the salient key if it learns a
    query with a positive, token-independent overlap with every item key, so that the salient
    key's logit is the largest. The margin ``salient_scale - 1 - 2*jitter`` between the
    smallest salient and the largest distractor scale sets how large ``q . k`` must grow; when
    it is negative the ranges overlap and even the best reader of ``|k|`` (the max-scale rule)
    errs: its accuracy is the Bayes ceiling (0.82 for 16 items at 1.3 +- 0.2).

    :meth:`answer_positions` gives the salient item's position (its value's, for "pairs"), so
    evaluation also reports the attention weight the QUERY puts there (``answer_weight``,
    :mod:`attnscale.lab.probe`): 1/T for uniform attention over the T positions.

    Metric: accuracy at the QUERY position. Chance (``chance_level``) = 1/m: any rule that
    ignores ``scale`` (first item, most frequent value, smallest token...) is right with
    probability 1/m, because s is uniform and independent of the tokens. Own design for this
    project; no external source.
    """

    name: ClassVar[str] = "salience"
    PAD: ClassVar[int] = 0
    QUERY: ClassVar[int] = 1

    def __init__(self, *, seq_len: int | None = None, seed: int = 0, num_items: int = 8,
                 num_item_tokens: int = 64, num_values: int = 64, salient_scale: float = 3.0,
                 jitter: float = 0.1, cue: str = "scale", layout: str = "pairs",
                 cue_at: str = "embedding", eval_size: int = 1024,
                 eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.num_items = check_int("num_items", num_items, minimum=2)
        self.num_item_tokens = check_int("num_item_tokens", num_item_tokens)
        self.num_values = check_int("num_values", num_values)
        self.salient_scale = check_float("salient_scale", salient_scale, low=0.0)
        self.jitter = check_float("jitter", jitter, low=0.0, high=1.0, low_inclusive=True)
        self.cue = check_choice("cue", cue, ("scale", "token", "none"))
        self.layout = check_choice("layout", layout, ("pairs", "items"))
        self.cue_at = check_choice("cue_at", cue_at, CUE_AT)
        if self.salient_scale - self.jitter <= 0:
            raise ValueError(
                f"salient_scale - jitter must stay positive; got salient_scale="
                f"{self.salient_scale}, jitter={self.jitter}"
            )
        if self.num_item_tokens < self.num_items:
            raise ValueError(
                f"num_item_tokens={self.num_item_tokens} must be >= num_items={self.num_items} "
                f"(items are distinct within a sequence)"
            )
        if self.layout == "pairs" and self.num_values < self.num_items:
            raise ValueError(
                f"num_values={self.num_values} must be >= num_items={self.num_items} "
                f"(values are distinct within a sequence)"
            )
        self.span = 2 * self.num_items + 1 if self.layout == "pairs" else self.num_items + 1
        self.seq_len = check_int("seq_len", self.span if seq_len is None else seq_len)
        if self.seq_len < self.span:
            raise ValueError(
                f"seq_len={self.seq_len} has too few positions for num_items={self.num_items} "
                f"with layout={self.layout!r}: need seq_len >= {self.span}"
            )
        self._set_eval_sizes(eval_size, eval_batch_size)
        p = self.num_item_tokens
        self.item_offset = 2
        self.marked_offset = 2 + p
        self.value_offset = 2 + 2 * p
        self.vocab_size = 2 + 2 * p + self.num_values
        self.chance_level = 1.0 / self.num_items

    def _sample(self, g: torch.Generator, batch_size: int, length: int) -> Batch:
        b, m = batch_size, self.num_items
        rows = torch.arange(b)
        items = distinct(g, b, self.num_item_tokens, m) + self.item_offset
        values = distinct(g, b, self.num_values, m) + self.value_offset
        salient = torch.randint(0, m, (b,), generator=g)
        item_scale = 1.0 + (2.0 * torch.rand(b, m, generator=g) - 1.0) * self.jitter
        shown = items.clone()
        if self.cue == "scale":
            item_scale[rows, salient] += self.salient_scale - 1.0
        elif self.cue == "token":
            shown[rows, salient] += self.marked_offset - self.item_offset

        tokens = torch.full((b, length), self.PAD, dtype=torch.long)
        scale = torch.ones(b, length, dtype=torch.float32)
        start = length - self.span
        if self.layout == "pairs":
            item_pos = slice(start, length - 1, 2)
            tokens[:, start + 1:length - 1:2] = values
            answer = values[rows, salient]
        else:
            item_pos = slice(start, length - 1)
            answer = items[rows, salient]
        tokens[:, item_pos] = shown
        scale[:, item_pos] = item_scale
        tokens[:, -1] = self.QUERY
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, -1] = answer
        return Batch(tokens, targets, scale)

    def answer_positions(self, batch: Batch) -> Tensor:
        """(B,) int64: the position whose token the answer is read from, for
        :mod:`attnscale.lab.probe` (the attention weight the QUERY puts there).

        ``"items"``: the salient item (shown as its marked copy under ``cue="token"``);
        ``"pairs"``: the salient item's value. Decoded from the tokens and the target, so any
        batch of this task works (``cue="none"`` too: the target still names one item);
        ValueError if a sequence does not hold exactly one match.
        """
        target = batch.targets[:, -1:]  # (B, 1)
        ctx = batch.tokens[:, :-1]  # (B, T-1)
        match = ctx == target
        if self.layout == "items" and self.cue == "token":
            match |= ctx == target + (self.marked_offset - self.item_offset)
        if not bool((match.sum(dim=1) == 1).all()):
            raise ValueError("every sequence must hold its answer exactly once")
        return match.long().argmax(dim=1)


