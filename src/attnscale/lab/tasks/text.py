"""Character-level language modelling on a UTF-8 text (nanoGPT's shakespeare-char style)."""

from __future__ import annotations

import functools
import hashlib
import math
import os
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnscale.lab.tasks.base import Batch, Task, check_labelled
from attnscale.util.validate import check_int


def default_corpus() -> str:
    """CPython's documentation topics (``pydoc_data.topics``), values joined in key order.

    The text ships with the interpreter, so it needs no download, but it differs between
    Python versions; :attr:`TextTask.sha256` records which text a run used.
    """
    return "".join(topics[key] for key in sorted(topics))


@functools.lru_cache(maxsize=4)
def encoded(text: str) -> tuple[str, tuple[str, ...], Tensor]:
    """(SHA-256 of the UTF-8 text, its distinct characters in code-point order, the int64 id of
    every character): the vocabulary and data of a :class:`TextTask`. Cached per process, since
    a sweep builds one task per run (np.unique over the default corpus took 20 ms); the tensor
    is shared, so it is read-only by convention (windows are copied out of it)."""
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    uniq, inverse = np.unique(codepoints, return_inverse=True)
    return sha, tuple(chr(int(c)) for c in uniq), torch.from_numpy(
        inverse.astype(np.int64).reshape(-1))


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
    ``chance_level`` = log2(vocab_size) (uniform prediction); ``unigram_bits`` and
    ``bigram_bits`` are the eval part's cross-entropy under the train part's add-one-smoothed
    unigram and bigram models: how far a model got beyond context-free and pair statistics.

    Errors: a missing path, an empty file, a binary file (NUL bytes or invalid UTF-8), or a text
    whose train or eval part is shorter than ``seq_len + 1`` raise ValueError naming ``path`` /
    ``seq_len``.
    """

    name: ClassVar[str] = "text"
    metric_name = "bits_per_char"
    higher_is_better = False
    TRAIN_FRACTION: ClassVar[float] = 0.9
    # the batch cache keys a task by its settings (lab.tasks.cache.task_key): the corpus by its
    # SHA-256, not by the text itself
    key_skip: ClassVar[tuple[str, ...]] = ("text",)

    def __init__(self, *, seq_len: int | None = None, seed: int = 0,
                 path: str | os.PathLike[str] | None = None, eval_windows: int = 32,
                 eval_batch_size: int | None = None) -> None:
        super().__init__(seed=seed)
        self.seq_len = check_int("seq_len", 128 if seq_len is None else seq_len)
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
        self.sha256, chars, self.data = encoded(text)
        self.chars: list[str] = list(chars)
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
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
        self.eval_windows = check_int("eval_windows", eval_windows)
        if eval_batch_size is None:
            eval_batch_size = min(32, self.eval_windows)
        self._set_eval_sizes(self.eval_windows, eval_batch_size)
        last_start = n_eval - need  # relative to the eval part
        rel = torch.linspace(0, last_start, self.eval_windows, dtype=torch.float64).round().long()
        self.eval_starts = rel + self.n_train

        self.unigram_bits, self.bigram_bits = self._ngram_bits(1), self._ngram_bits(2)
        self.chance_level = math.log2(self.vocab_size)

    def _ngram_bits(self, order: int) -> float:
        """The unigram (``order`` 1) or bigram (2) level: the cross-entropy in bits/char of the
        eval part under the train part's n-gram model with add-one smoothing,
        H = −mean log₂ P(x_t | x_{t−1}) (bigram) or −mean log₂ P(x_t) (unigram). A model that
        ends near the bigram level has learned character pairs and little beyond."""
        v, train, held = self.vocab_size, self.data[: self.n_train], self.data[self.n_train:]
        if order == 1:
            counts = torch.bincount(train, minlength=v).double() + 1.0
            return float(-(counts / counts.sum()).log2()[held].mean())
        counts = torch.zeros(v * v, dtype=torch.float64)
        counts.index_add_(0, train[:-1] * v + train[1:], torch.ones(len(train) - 1,
                                                                     dtype=torch.float64))
        counts = counts.view(v, v) + 1.0
        logp = (counts / counts.sum(1, keepdim=True)).log2()
        return float(-logp[held[:-1], held[1:]].mean())

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
                "unigram_bits": self.unigram_bits, "bigram_bits": self.bigram_bits}

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
    def labelled_metric_sum(self, logits: Tensor, labels: Tensor) -> tuple[float, int]:
        """(sum of per-position bits, N) from the logits (N, V) at the N labelled positions."""
        check_labelled(logits, labels, self.vocab_size)
        nats = F.cross_entropy(logits.float(), labels, reduction="sum")
        return float(nats) / math.log(2.0), labels.numel()

    def metric(self, logits: Tensor, batch: Batch) -> float:
        """Bits per character: mean cross-entropy over labelled positions / ln 2."""
        total, count = self.metric_sum(logits, batch)
        return total / count


