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

import hashlib
import inspect
import math
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "Batch",
    "LengthTask",
    "MQARTask",
    "SalienceTask",
    "Task",
    "TextTask",
    "make_task",
]

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
# Validation and seeding helpers
# --------------------------------------------------------------------------------------------


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}; got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value}")
    return int(value)


def _check_float(name: str, value: Any, *, low: float, high: float = math.inf,
                 low_inclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number; got {type(value).__name__} {value!r}")
    value = float(value)
    ok_low = value >= low if low_inclusive else value > low
    if not (ok_low and value < high and math.isfinite(value)):
        lo = "[" if low_inclusive else "("
        raise ValueError(f"{name} must lie in {lo}{low}, {high}); got {value}")
    return value


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}")
    return value


def _stream_seed(*parts: Any) -> int:
    """A 63-bit seed from a tuple (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _distinct(g: torch.Generator, rows: int, pool: int, k: int) -> Tensor:
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


def _check_logits(logits: Tensor, batch: Batch, vocab_size: int) -> None:
    if logits.dim() != 3 or logits.shape[:2] != batch.targets.shape:
        raise ValueError(
            f"logits must be (B, T, vocab) with (B, T) = {tuple(batch.targets.shape)}; "
            f"got {tuple(logits.shape)}"
        )
    if logits.shape[-1] < vocab_size:
        raise ValueError(
            f"logits last dim {logits.shape[-1]} is smaller than the task vocab_size {vocab_size}"
        )


# --------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------


class Task(ABC):
    """Common interface. Subclasses set the attributes and implement :meth:`_sample`.

    Attributes: ``name``, ``vocab_size``, ``seq_len`` (training length), ``causal`` (True:
    decoder), ``metric_name``, ``higher_is_better``, ``seed``, ``chance_level`` (metric value of
    the trivial baseline described in each task's docstring).
    """

    name: ClassVar[str] = ""
    causal: bool = True
    metric_name: str = "accuracy"
    higher_is_better: bool = True
    vocab_size: int
    seq_len: int
    seed: int
    chance_level: float
    eval_size: int
    eval_batch_size: int

    def __init__(self, *, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int; got {type(seed).__name__} {seed!r}")
        self.seed = int(seed)
        self._eval_cache: dict[str, list[Batch]] | None = None

    # -- seeding --------------------------------------------------------------------------
    def generator(self, split: str, step: int) -> torch.Generator:
        """CPU generator seeded from (task name, seed, split, step)."""
        g = torch.Generator(device="cpu")
        g.manual_seed(_stream_seed("attnscale.lab.tasks", self.name, self.seed, split, int(step)))
        return g

    # -- data -----------------------------------------------------------------------------
    def train_batch(self, step: int, batch_size: int) -> Batch:
        """Training batch number ``step`` (deterministic in (seed, step))."""
        step = _check_int("step", step, minimum=0)
        batch_size = _check_int("batch_size", batch_size)
        return self._sample(self.generator("train", step), batch_size, self.seq_len)

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
        self.eval_size = _check_int("eval_size", eval_size)
        if eval_batch_size is None:
            eval_batch_size = min(64, self.eval_size)
        self.eval_batch_size = _check_int("eval_batch_size", eval_batch_size)
        if self.eval_size % self.eval_batch_size:
            raise ValueError(
                f"eval_size ({self.eval_size}) must be a multiple of eval_batch_size "
                f"({self.eval_batch_size}) so that every eval batch has the same weight"
            )

    # -- metric ---------------------------------------------------------------------------
    def metric_sum(self, logits: Tensor, batch: Batch) -> tuple[float, int]:
        """(sum of per-position scores, number of labelled positions); pools exactly."""
        _check_logits(logits, batch, self.vocab_size)
        mask = batch.targets != IGNORE_INDEX
        count = int(mask.sum())
        if count == 0:
            raise ValueError("batch has no labelled positions (all targets are IGNORE_INDEX)")
        correct = (logits.argmax(dim=-1) == batch.targets) & mask
        return float(correct.sum()), count

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


# --------------------------------------------------------------------------------------------
# MQAR
# --------------------------------------------------------------------------------------------


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

    Defaults follow the Zoology setup in ANCHORS.md: V = 8192, T = 64, K = 8; the paper's sweep
    is (T, K) in {(64, 4), (128, 8), (256, 16)}. A small ``vocab_size`` such as 256 suits CPU
    runs. Needs ``seq_len >= 4 * num_kv_pairs`` and ``vocab_size // 2 - 1 >= num_kv_pairs``.
    """

    name: ClassVar[str] = "mqar"

    def __init__(self, *, seq_len: int | None = None, seed: int = 0, vocab_size: int = 8192,
                 num_kv_pairs: int = 8, power_a: float = 0.01, eval_size: int = 512,
                 eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.seq_len = _check_int("seq_len", 64 if seq_len is None else seq_len)
        self.vocab_size = _check_int("vocab_size", vocab_size, minimum=4)
        self.num_kv_pairs = _check_int("num_kv_pairs", num_kv_pairs)
        self.power_a = _check_float("power_a", power_a, low=0.0)
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
        keys = _distinct(g, batch_size, hi - lo, k) + lo
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


# --------------------------------------------------------------------------------------------
# Character-level text
# --------------------------------------------------------------------------------------------


def default_corpus() -> str:
    """CPython's documentation topics (``pydoc_data.topics``), values joined in key order.

    The text ships with the interpreter, so it needs no download, but it differs between
    Python versions; :attr:`TextTask.sha256` records which text a run used.
    """
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


class TextTask(Task):
    """Character-level language modelling on a UTF-8 text (nanoGPT's shakespeare-char style).

    Data: the whole file (option ``path``) or, by default, the CPython documentation text in
    :mod:`pydoc_data.topics` (values joined in sorted key order; ships with Python, about 465k
    characters and ~100 distinct characters on 3.11). Vocabulary = the sorted set of characters
    of the whole text (``chars``; :meth:`encode` / :meth:`decode`). Contiguous split: the first
    90% of the characters is train, the last 10% is eval. A window of ``seq_len`` + 1 characters
    gives ``tokens = w[:-1]`` and ``targets = w[1:]`` (every position labelled). Train batches are
    windows at uniformly random starts inside the train part; the eval set is ``eval_windows``
    fixed windows at evenly spaced starts inside the eval part (``eval_starts``, absolute
    offsets). Causal decoder.

    Metric: ``bits_per_char`` = mean cross-entropy (nats) / ln 2, lower is better.
    ``chance_level`` = log2(vocab_size) (uniform prediction); ``unigram_bits`` is the entropy of
    the train character distribution, the best context-free predictor.

    Errors: a missing path, an empty file, a binary file (NUL bytes or invalid UTF-8), or a text
    whose train or eval part is shorter than ``seq_len + 1`` raise ValueError naming ``path`` /
    ``seq_len``.
    """

    name: ClassVar[str] = "text"
    metric_name = "bits_per_char"
    higher_is_better = False
    TRAIN_FRACTION: ClassVar[float] = 0.9

    def __init__(self, *, seq_len: int | None = None, seed: int = 0,
                 path: str | os.PathLike[str] | None = None, eval_windows: int = 32,
                 eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.seq_len = _check_int("seq_len", 128 if seq_len is None else seq_len)
        if path is None:
            self.path: str | None = None
            self.source = "pydoc_data.topics"
            text = default_corpus()
        else:
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"path must be a str or os.PathLike; got {type(path).__name__}")
            self.path = os.fspath(path)
            self.source = self.path
            text = self._read(Path(path))
        self.text = text
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()

        codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        uniq, inverse = np.unique(codepoints, return_inverse=True)
        self.chars: list[str] = [chr(int(c)) for c in uniq]
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
        self.data = torch.from_numpy(inverse.astype(np.int64).reshape(-1))
        self.n_train = int(len(text) * self.TRAIN_FRACTION)
        n_eval = len(text) - self.n_train
        need = self.seq_len + 1
        if self.n_train < need or n_eval < need:
            raise ValueError(
                f"text from path={self.source!r} is too short for seq_len={self.seq_len}: "
                f"{len(text)} characters split into {self.n_train} train / {n_eval} eval, and "
                f"both parts need at least seq_len + 1 = {need}; use a longer file or a "
                f"smaller seq_len (at most {min(self.n_train, n_eval) - 1})"
            )
        self.eval_windows = _check_int("eval_windows", eval_windows)
        if eval_batch_size is None:
            eval_batch_size = min(32, self.eval_windows)
        self._set_eval_sizes(self.eval_windows, eval_batch_size)
        last_start = n_eval - need  # relative to the eval part
        rel = torch.linspace(0, last_start, self.eval_windows, dtype=torch.float64).round().long()
        self.eval_starts = rel + self.n_train

        counts = torch.bincount(self.data[: self.n_train], minlength=self.vocab_size).double()
        p = counts[counts > 0] / counts.sum()
        self.unigram_bits = float(-(p * p.log2()).sum())
        self.chance_level = math.log2(self.vocab_size)

    @staticmethod
    def _read(path: Path) -> str:
        if not path.exists():
            raise ValueError(f"path={str(path)!r} does not exist; give a UTF-8 text file")
        if not path.is_file():
            raise ValueError(f"path={str(path)!r} is not a regular file; give a UTF-8 text file")
        raw = path.read_bytes()
        if not raw:
            raise ValueError(f"path={str(path)!r} is empty; give a non-empty UTF-8 text file")
        if b"\x00" in raw:
            raise ValueError(
                f"path={str(path)!r} looks binary (contains NUL bytes); give a UTF-8 text file"
            )
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"path={str(path)!r} is not valid UTF-8 (byte {exc.start}: {exc.reason}); "
                f"give a UTF-8 text file"
            ) from None

    @property
    def config(self) -> dict[str, Any]:
        return {**super().config, "source": self.source, "sha256": self.sha256,
                "num_chars": len(self.text), "n_train": self.n_train,
                "unigram_bits": self.unigram_bits}

    # -- vocabulary -----------------------------------------------------------------------
    def encode(self, text: str) -> Tensor:
        """int64 ids of ``text``; ValueError for characters outside the vocabulary."""
        try:
            return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the task vocabulary") from None

    def decode(self, ids: Tensor | list[int]) -> str:
        """Text of a 1-D sequence of ids."""
        seq = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return "".join(self.chars[i] for i in seq)

    # -- data -----------------------------------------------------------------------------
    def _windows(self, starts: Tensor) -> Batch:
        # index_select on a strided view: same result as data[starts[:, None] + arange], but
        # advanced indexing into the 0.5M-long tensor takes an intra-op parallel path that
        # costs ~12 ms instead of ~10 us when the CPU cores are busy
        w = self.data.unfold(0, self.seq_len + 1, 1).index_select(0, starts)
        return Batch(w[:, :-1].contiguous(), w[:, 1:].contiguous())

    def _sample(self, g: torch.Generator, batch_size: int, length: int) -> Batch:
        # last valid start leaves seq_len + 1 characters inside the train part
        starts = torch.randint(0, self.n_train - self.seq_len, (batch_size,), generator=g)
        return self._windows(starts)

    def _make_eval_batches(self) -> dict[str, list[Batch]]:
        return {"eval": [self._windows(chunk)
                         for chunk in self.eval_starts.split(self.eval_batch_size)]}

    # -- metric ---------------------------------------------------------------------------
    def metric_sum(self, logits: Tensor, batch: Batch) -> tuple[float, int]:
        """(sum of per-position bits, number of labelled positions)."""
        _check_logits(logits, batch, self.vocab_size)
        count = batch.num_labels
        if count == 0:
            raise ValueError("batch has no labelled positions (all targets are IGNORE_INDEX)")
        nats = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               batch.targets.reshape(-1), ignore_index=IGNORE_INDEX,
                               reduction="sum")
        return float(nats) / math.log(2.0), count

    def metric(self, logits: Tensor, batch: Batch) -> float:
        """Bits per character: mean cross-entropy over labelled positions / ln 2."""
        total, count = self.metric_sum(logits, batch)
        return total / count


# --------------------------------------------------------------------------------------------
# Salience (magnitude-marked retrieval)
# --------------------------------------------------------------------------------------------


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
    scale at all. Whether the leak is enough for cosine attention is what the data decides.

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
                 eval_size: int = 1024, eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.num_items = _check_int("num_items", num_items, minimum=2)
        self.num_item_tokens = _check_int("num_item_tokens", num_item_tokens)
        self.num_values = _check_int("num_values", num_values)
        self.salient_scale = _check_float("salient_scale", salient_scale, low=0.0)
        self.jitter = _check_float("jitter", jitter, low=0.0, high=1.0, low_inclusive=True)
        self.cue = _check_choice("cue", cue, ("scale", "token", "none"))
        self.layout = _check_choice("layout", layout, ("pairs", "items"))
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
        self.seq_len = _check_int("seq_len", self.span if seq_len is None else seq_len)
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
        items = _distinct(g, b, self.num_item_tokens, m) + self.item_offset
        values = _distinct(g, b, self.num_values, m) + self.value_offset
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


# --------------------------------------------------------------------------------------------
# Length generalisation
# --------------------------------------------------------------------------------------------


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

    def __init__(self, *, seq_len: int | None = None, seed: int = 0, num_pairs: int = 4,
                 num_keys: int = 64, num_values: int = 64, num_fillers: int = 128,
                 eval_multipliers: tuple[int, ...] = (1, 2, 4), eval_size: int = 512,
                 eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.seq_len = _check_int("seq_len", 64 if seq_len is None else seq_len)
        self.num_pairs = _check_int("num_pairs", num_pairs)
        self.num_keys = _check_int("num_keys", num_keys)
        self.num_values = _check_int("num_values", num_values)
        self.num_fillers = _check_int("num_fillers", num_fillers)
        if isinstance(eval_multipliers, (str, bytes)) or not hasattr(eval_multipliers, "__iter__"):
            raise TypeError(
                f"eval_multipliers must be a sequence of positive ints; got {eval_multipliers!r}"
            )
        mults = tuple(_check_int("eval_multipliers[]", x) for x in eval_multipliers)
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
        length = _check_int("length", length, minimum=2 * self.num_pairs + 1)
        batch_size = _check_int("batch_size", batch_size)
        step = _check_int("step", step, minimum=0)
        return self._sample(self.generator(f"sample:n={length}", step), batch_size, length)

    def _sample(self, g: torch.Generator, batch_size: int, length: int) -> Batch:
        b, k = batch_size, self.num_pairs
        rows = torch.arange(b)
        keys = _distinct(g, b, self.num_keys, k) + self.key_offset
        values = _distinct(g, b, self.num_values, k) + self.value_offset
        tokens = torch.randint(self.filler_offset, self.vocab_size, (b, length), generator=g)
        # Non-overlapping placement: the context holds `free` fillers and k two-token blocks,
        # i.e. free + k units; pick which units are blocks, then block i starts at unit c_i + i.
        free = length - 1 - 2 * k
        units = _distinct(g, b, free + k, k).sort(dim=1).values
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


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

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
