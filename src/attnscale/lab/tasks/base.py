"""The task interface: :class:`Batch`, :class:`Task` and the sampling helpers the tasks share.

Every batch is a deterministic function of ``(task name, seed, split, step)``: a
:class:`torch.Generator` is seeded from a hash of that tuple, so the same step always gives the
same batch on the same torch version, and the evaluation sets come from a different stream
(split ``"eval"``) than the training batches (split ``"train"``).
"""

from __future__ import annotations

import hashlib
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from attnscale.lab.tasks.cache import BATCHES, task_key
from attnscale.util.validate import check_int

IGNORE_INDEX = -100

# --------------------------------------------------------------------------------------------
# Batch
# --------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One batch of sequences.

    ``tokens``: (B, T) int64 input ids. ``targets``: (B, T) int64, the label for the prediction
    made *at* each position (already aligned, no further shift), :data:`IGNORE_INDEX` where there
    is no loss. ``scale``: (B, T) float32 multiplier of the token embedding (salience task), or
    ``None``.
    """

    tokens: Tensor
    targets: Tensor
    scale: Tensor | None = None

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"Batch.tokens must be (B, T); got shape {tuple(self.tokens.shape)}")
        if self.targets.shape != self.tokens.shape:
            raise ValueError(
                f"Batch.targets shape {tuple(self.targets.shape)} must equal tokens shape "
                f"{tuple(self.tokens.shape)}"
            )
        if self.scale is not None and self.scale.shape != self.tokens.shape:
            raise ValueError(
                f"Batch.scale shape {tuple(self.scale.shape)} must equal tokens shape "
                f"{tuple(self.tokens.shape)} (or be None)"
            )

    @property
    def num_labels(self) -> int:
        """Number of positions that carry a loss."""
        return int((self.targets != IGNORE_INDEX).sum())

    def to(self, device: torch.device | str) -> Batch:
        """Copy of the batch on ``device``."""
        return Batch(
            self.tokens.to(device),
            self.targets.to(device),
            None if self.scale is None else self.scale.to(device),
        )


# --------------------------------------------------------------------------------------------
# Seeding and sampling helpers
# --------------------------------------------------------------------------------------------


# Data streams are seeded by this fixed name, not the module's path, so that moving code never
# changes the batches a seed draws (stored runs stay comparable with new ones).
STREAM_NAME = "attnscale.tasks"


def stream_seed(*parts: Any) -> int:
    """A 63-bit seed from a tuple (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def distinct(g: torch.Generator, rows: int, pool: int, k: int) -> Tensor:
    """(rows, k) int64: k distinct ints from [0, pool) per row, uniform over ordered k-tuples.

    When k*k <= pool a row repeats with probability <= 1/2, so rows are drawn with replacement
    and any row with a repeat is redrawn whole (exact rejection sampling, O(rows * k) work).
    Otherwise the pool is small and the top-k of uniform noise over it is used.
    """
    if k * k <= pool:
        out = torch.randint(pool, (rows, k), generator=g)
        while True:
            srt = out.sort(dim=1).values
            bad = (srt[:, 1:] == srt[:, :-1]).any(dim=1)
            n_bad = int(bad.sum())
            if n_bad == 0:
                return out
            out[bad] = torch.randint(pool, (n_bad, k), generator=g)
    return torch.rand(rows, pool, generator=g).topk(k, dim=1).indices


def check_logits(logits: Tensor, batch: Batch, vocab_size: int) -> None:
    """ValueError unless logits are (B, T, >= vocab_size) for this batch."""
    if logits.dim() != 3 or logits.shape[:2] != batch.targets.shape:
        raise ValueError(
            f"logits must be (B, T, vocab) with (B, T) = {tuple(batch.targets.shape)}; "
            f"got {tuple(logits.shape)}"
        )
    if logits.shape[-1] < vocab_size:
        raise ValueError(
            f"logits last dim {logits.shape[-1]} is smaller than the task vocab_size {vocab_size}"
        )


def check_labelled(logits: Tensor, labels: Tensor, vocab_size: int) -> None:
    """ValueError unless logits are (N, >= vocab_size) for N ≥ 1 labels (N,)."""
    if labels.dim() != 1 or logits.dim() != 2 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits must be (N, vocab) for labels (N,); got logits "
                         f"{tuple(logits.shape)} and labels {tuple(labels.shape)}")
    if labels.numel() == 0:
        raise ValueError("batch has no labelled positions (all targets are IGNORE_INDEX)")
    if logits.shape[-1] < vocab_size:
        raise ValueError(
            f"logits last dim {logits.shape[-1]} is smaller than the task vocab_size {vocab_size}"
        )


# --------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------


class Task(ABC):
    """Common interface. Subclasses set the attributes and implement :meth:`_sample`.

    Attributes: ``name``, ``model_defaults`` (model settings the task needs, applied by the
    trainer where the user left them unset), ``vocab_size``, ``seq_len`` (training length),
    ``causal`` (True: decoder), ``metric_name``, ``higher_is_better``, ``seed``,
    ``chance_level`` (metric value of the trivial baseline described in each task's docstring).
    """

    name: ClassVar[str] = ""
    # attributes the batch cache's key leaves out (lab.tasks.cache.task_key)
    key_skip: ClassVar[tuple[str, ...]] = ()
    # TrainConfig values this task needs unless the user sets them (e.g. RoPE for the length
    # task, whose evaluation runs past the training length); the trainer applies them.
    model_defaults: ClassVar[dict[str, Any]] = {}
    causal: bool = True
    metric_name: str = "accuracy"
    higher_is_better: bool = True
    vocab_size: int
    seq_len: int
    seed: int
    chance_level: float
    eval_size: int
    eval_batch_size: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A task scores by :meth:`labelled_metric_sum` (evaluation calls it); one that
        overrode only :meth:`metric_sum` would be scored by accuracy in evaluation."""
        super().__init_subclass__(**kwargs)
        if "metric_sum" in vars(cls) and "labelled_metric_sum" not in vars(cls):
            raise TypeError(f"{cls.__name__} overrides metric_sum but not labelled_metric_sum, "
                            "which evaluation uses: override labelled_metric_sum instead")

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = check_int("seed", seed, minimum=None)
        self._eval_cache: dict[str, list[Batch]] | None = None

    # -- seeding --------------------------------------------------------------------------
    def generator(self, split: str, step: int) -> torch.Generator:
        """CPU generator seeded from (task name, seed, split, step)."""
        g = torch.Generator(device="cpu")
        g.manual_seed(stream_seed(STREAM_NAME, self.name, self.seed, split, int(step)))
        return g

    # -- data -----------------------------------------------------------------------------
    def train_batch(self, step: int, batch_size: int) -> Batch:
        """Training batch number ``step`` (deterministic in (seed, step)); drawn once per
        process for every task with the same settings and seed (:mod:`.cache`)."""
        step = check_int("step", step, minimum=0)
        batch_size = check_int("batch_size", batch_size)
        return BATCHES.get((task_key(self), "train", step, batch_size), lambda: self._sample(
            self.generator("train", step), batch_size, self.seq_len))

    def eval_batches(self) -> dict[str, list[Batch]]:
        """Fixed held-out set(s), built once and cached (do not modify the tensors in place)."""
        if self._eval_cache is None:
            self._eval_cache = self._make_eval_batches()
        return {k: list(v) for k, v in self._eval_cache.items()}

    def _make_eval_batches(self) -> dict[str, list[Batch]]:
        return {"eval": self._eval_set("eval", self.seq_len)}

    def _eval_set(self, split: str, length: int) -> list[Batch]:
        n = self.eval_size // self.eval_batch_size
        return [self._sample(self.generator(split, i), self.eval_batch_size, length)
                for i in range(n)]

    @abstractmethod
    def _sample(self, g: torch.Generator, batch_size: int, length: int) -> Batch:
        """One batch of ``batch_size`` sequences of ``length`` tokens drawn with ``g``."""

    def _set_eval_sizes(self, eval_size: int, eval_batch_size: int | None) -> None:
        self.eval_size = check_int("eval_size", eval_size)
        if eval_batch_size is None:
            eval_batch_size = min(64, self.eval_size)
        self.eval_batch_size = check_int("eval_batch_size", eval_batch_size)
        if self.eval_size % self.eval_batch_size:
            raise ValueError(
                f"eval_size ({self.eval_size}) must be a multiple of eval_batch_size "
                f"({self.eval_batch_size}) so that every eval batch has the same weight"
            )

    # -- metric ---------------------------------------------------------------------------
    def metric_sum(self, logits: Tensor, batch: Batch) -> tuple[float, int]:
        """(sum of per-position scores, number of labelled positions) of (B, T, V) logits;
        pools exactly. The same as :meth:`labelled_metric_sum` at the labelled positions."""
        check_logits(logits, batch, self.vocab_size)
        keep = batch.targets != IGNORE_INDEX  # (B, T)
        return self.labelled_metric_sum(logits[keep], batch.targets[keep])

    def labelled_metric_sum(self, logits: Tensor, labels: Tensor) -> tuple[float, int]:
        """(number of argmax hits, N) from the logits (N, V) at a batch's N labelled positions
        and their labels (N,): what :meth:`metric_sum` sums, without the unlabelled rows."""
        check_labelled(logits, labels, self.vocab_size)
        return float((logits.argmax(dim=-1) == labels).sum()), labels.numel()

    def metric(self, logits: Tensor, batch: Batch) -> float:
        """Accuracy of the argmax over the positions whose target is not IGNORE_INDEX."""
        total, count = self.metric_sum(logits, batch)
        return total / count

    @property
    def config(self) -> dict[str, Any]:
        """Plain-data description of the task, for run manifests."""
        out: dict[str, Any] = {"name": self.name}
        for key in inspect.signature(type(self).__init__).parameters:
            if key != "self" and hasattr(self, key):
                value = getattr(self, key)
                out[key] = list(value) if isinstance(value, tuple) else value
        out.update(vocab_size=self.vocab_size, causal=self.causal, metric_name=self.metric_name,
                   higher_is_better=self.higher_is_better, chance_level=self.chance_level)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, seq_len={self.seq_len}, " \
               f"seed={self.seed})"


