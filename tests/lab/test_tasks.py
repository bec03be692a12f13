"""Tests for attnscale.lab.tasks: labels by independent brute-force decoding, layout, ranges,
reproducibility, train/eval separation, metrics, input errors and generation speed."""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
import torch

from attnscale.lab.sections import ModelSection
from attnscale.lab.tasks import (
    IGNORE_INDEX,
    TASKS,
    Batch,
    LengthTask,
    MQARTask,
    SalienceTask,
    TextTask,
    distinct,
    make_task,
)
from attnscale.lab.train import TrainConfig

SMALL = {
    "mqar": {"vocab_size": 256},
    "text": {},
    "salience": {},
    "length": {},
}


def perfect_logits(batch: Batch, vocab: int) -> torch.Tensor:
    """Logits whose argmax is the target wherever there is one."""
    tgt = batch.targets.clamp(min=0)
    return torch.nn.functional.one_hot(tgt, vocab).float() * 50.0


def in_context_guess(batch: Batch, candidates_of_row, gen: torch.Generator) -> torch.Tensor:
    """Logits that pick, per labelled position, a uniformly random candidate of that row."""
    b, t = batch.tokens.shape
    vocab = int(batch.tokens.max()) + int(batch.targets.max()) + 2
    logits = torch.zeros(b, t, vocab)
    for r in range(b):
        cands = candidates_of_row(r)
        for pos in (batch.targets[r] != IGNORE_INDEX).nonzero().flatten().tolist():
            pick = cands[int(torch.randint(len(cands), (1,), generator=gen))]
            logits[r, pos, pick] = 1.0
    return logits


def seq_set(batches: list[Batch]) -> set[bytes]:
    return {row.numpy().tobytes() for b in batches for row in b.tokens}


# ------------------------------------------------------------------------------------------
# Registry, contract, generic properties
# ------------------------------------------------------------------------------------------


def test_registry_and_contract_attributes():
    assert set(TASKS) == {"mqar", "text", "salience", "length"}
    assert IGNORE_INDEX == -100
    for name, opts in SMALL.items():
        task = make_task(name, **opts)
        assert task.name == name
        assert isinstance(task.vocab_size, int) and task.vocab_size > 0
        assert isinstance(task.seq_len, int) and task.seq_len > 0
        assert task.causal is True
        assert task.metric_name in ("accuracy", "bits_per_char")
        assert task.higher_is_better == (task.metric_name == "accuracy")
        batch = task.train_batch(0, 8)
        assert batch.tokens.dtype == torch.int64 and batch.targets.dtype == torch.int64
        assert batch.tokens.shape == (8, task.seq_len)
        assert int(batch.tokens.min()) >= 0 and int(batch.tokens.max()) < task.vocab_size
        lab = batch.targets[batch.targets != IGNORE_INDEX]
        assert lab.numel() > 0 and int(lab.min()) >= 0 and int(lab.max()) < task.vocab_size
        if name == "salience":
            assert batch.scale is not None and batch.scale.dtype == torch.float32
        else:
            assert batch.scale is None
        assert isinstance(task.config, dict) and task.config["name"] == name


def test_defaults_follow_published_setups():
    m = make_task("mqar")
    assert (m.vocab_size, m.seq_len, m.num_kv_pairs, m.power_a) == (8192, 64, 8, 0.01)
    length = make_task("length", seq_len=32)
    assert set(length.eval_batches()) == {"n=32", "n=64", "n=128"}


def test_model_defaults_name_train_config_fields():
    """Each task class states the model settings it needs; the trainer applies them."""
    for name, cls in TASKS.items():
        assert isinstance(cls.model_defaults, dict), name
        assert set(cls.model_defaults) <= set(ModelSection.model_fields), name
    assert TASKS["mqar"].model_defaults == {}
    # the length task evaluates past its training length: learned positions cannot reach there
    assert TASKS["length"].model_defaults.get("pos") in ("rope", "none")


@pytest.mark.parametrize("name", sorted(SMALL))
def test_reproducible_and_seed_dependent(name):
    a = make_task(name, seed=3, **SMALL[name])
    b = make_task(name, seed=3, **SMALL[name])
    c = make_task(name, seed=4, **SMALL[name])
    for step in (0, 7):
        x, y, z = a.train_batch(step, 16), b.train_batch(step, 16), c.train_batch(step, 16)
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.targets, y.targets)
        assert not torch.equal(x.tokens, z.tokens)
        if x.scale is not None:
            assert torch.equal(x.scale, y.scale)
    assert not torch.equal(a.train_batch(0, 16).tokens, a.train_batch(1, 16).tokens)
    # train_batch does not depend on call order (a function of seed and step only)
    assert torch.equal(a.train_batch(0, 16).tokens, b.train_batch(0, 16).tokens)
    ea, eb = a.eval_batches(), b.eval_batches()
    assert ea.keys() == eb.keys()
    for key in ea:
        for u, v in zip(ea[key], eb[key], strict=True):
            assert torch.equal(u.tokens, v.tokens) and torch.equal(u.targets, v.targets)


@pytest.mark.parametrize("name", ["mqar", "salience", "length"])
def test_eval_disjoint_from_train(name):
    task = make_task(name, **SMALL[name])
    evals = task.eval_batches()
    for key, batches in evals.items():
        assert len(batches) > 0
        sizes = {b.tokens.shape[0] for b in batches}
        labels = {b.num_labels for b in batches}
        assert len(sizes) == 1 and len(labels) == 1, key  # equal weights per batch
    eval_seqs = set().union(*(seq_set(v) for v in evals.values()))
    train_seqs = seq_set([task.train_batch(s, 64) for s in range(200)])
    assert len(train_seqs) > 12000  # the generator itself barely repeats
    assert not eval_seqs & train_seqs
    # the eval stream is not the train stream shifted: first eval batch != any train batch
    first = next(iter(evals.values()))[0]
    assert not torch.equal(first.tokens, task.train_batch(0, first.tokens.shape[0]).tokens)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_metric_perfect_and_baseline(name):
    task = make_task(name, **SMALL[name])
    batch = next(iter(task.eval_batches().values()))[0]
    perfect = perfect_logits(batch, task.vocab_size)
    uniform = torch.zeros_like(perfect)
    if name == "text":
        assert task.metric(perfect, batch) < 1e-6
        assert task.metric(uniform, batch) == pytest.approx(math.log2(task.vocab_size), rel=1e-5)
        assert task.chance_level == pytest.approx(math.log2(task.vocab_size))
    else:
        assert task.metric(perfect, batch) == 1.0
        g = torch.Generator().manual_seed(0)
        rand = torch.randn(perfect.shape, generator=g)
        assert task.metric(rand, batch) < 3.0 / task.vocab_size + 0.02
    _, count = task.metric_sum(perfect, batch)
    assert count == batch.num_labels


def test_metric_input_errors():
    task = make_task("mqar", vocab_size=256)
    batch = task.train_batch(0, 4)
    with pytest.raises(ValueError, match="logits"):
        task.metric(torch.zeros(4, 10, 256), batch)
    with pytest.raises(ValueError, match="vocab_size"):
        task.metric(torch.zeros(4, 64, 100), batch)
    empty = Batch(batch.tokens, torch.full_like(batch.targets, IGNORE_INDEX))
    with pytest.raises(ValueError, match="labelled"):
        task.metric(torch.zeros(4, 64, 256), empty)
    # padded vocabularies (logits wider than the vocab) are accepted
    assert task.metric(perfect_logits(batch, 320), batch) == 1.0


def test_make_task_errors():
    with pytest.raises(ValueError, match=r"'length', 'mqar', 'salience', 'text'"):
        make_task("copying")
    with pytest.raises(TypeError, match="name"):
        make_task(3)
    with pytest.raises(TypeError, match="accepted"):
        make_task("mqar", num_pairs=3)
    with pytest.raises(ValueError, match="seq_len"):
        make_task("mqar", seq_len=0)
    with pytest.raises(TypeError, match="seq_len"):
        make_task("mqar", seq_len=64.0)
    with pytest.raises(TypeError, match="seed"):
        make_task("mqar", seed="a")
    task = make_task("length")
    with pytest.raises(ValueError, match="batch_size"):
        task.train_batch(0, 0)
    with pytest.raises(ValueError, match="step"):
        task.train_batch(-1, 4)
    with pytest.raises(TypeError, match="batch_size"):
        task.train_batch(0, True)


@pytest.mark.parametrize(("name", "opts"), [
    ("mqar", {"vocab_size": 256}),
    ("mqar", {}),  # Zoology's V = 8192
    ("text", {}),
    ("salience", {}),
    ("length", {}),
])
def test_generation_is_cheap(name, opts):
    task = make_task(name, seq_len=64, **opts)
    task.train_batch(0, 64)  # warm-up
    times = []
    for step in range(21):
        t0 = time.perf_counter()
        task.train_batch(step, 64)
        times.append(time.perf_counter() - t0)
    median = sorted(times)[10]
    # vectorised generation takes ~0.3 ms; a Python loop over the 4096 tokens takes >5 ms
    assert median < 0.003, f"{name}: {median * 1e3:.2f} ms per batch of 64 x 64"


@pytest.mark.parametrize(("pool", "k"), [(5, 2), (4, 3)])  # rejection path, top-k path
def test_distinct_sampler_is_uniform_over_ordered_tuples(pool, k):
    g = torch.Generator().manual_seed(0)
    draws = distinct(g, 60000, pool, k)
    assert all(len(set(row)) == k for row in draws.tolist())
    counts = Counter(map(tuple, draws.tolist()))
    n_tuples = math.perm(pool, k)
    assert len(counts) == n_tuples
    expected = 60000 / n_tuples
    assert all(abs(c - expected) < 5 * math.sqrt(expected) for c in counts.values())


# ------------------------------------------------------------------------------------------
# MQAR
# ------------------------------------------------------------------------------------------


def mqar_decode(row: list[int], num_kv: int) -> list[int]:
    """Brute-force expected targets: look every later nonzero token up in the kv prefix."""
    table = {}
    for i in range(num_kv):
        key, value = row[2 * i], row[2 * i + 1]
        assert key not in table, "keys must be distinct"
        table[key] = value
    out = [IGNORE_INDEX] * len(row)
    for t in range(2 * num_kv, len(row)):
        if row[t] != 0:
            out[t] = table[row[t]]
    return out


@pytest.mark.parametrize("opts", [
    {"vocab_size": 256},
    {"vocab_size": 64, "seq_len": 128, "num_kv_pairs": 16},
    {"vocab_size": 8192, "seq_len": 32, "num_kv_pairs": 8},  # tight: 8 slots for 8 queries
])
def test_mqar_labels_by_brute_force(opts):
    task = MQARTask(**opts)
    kv, v = task.num_kv_pairs, task.vocab_size
    batch = task.train_batch(5, 64)
    for toks, tgts in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        assert tgts == mqar_decode(toks, kv)
        keys, values = toks[0:2 * kv:2], toks[1:2 * kv:2]
        assert all(1 <= k < v // 2 for k in keys)
        assert all(v // 2 <= x < v for x in values)
        queries = [x for x in toks[2 * kv:] if x != 0]
        assert sorted(queries) == sorted(keys)  # every key queried exactly once
        qpos = [t for t in range(2 * kv, len(toks)) if toks[t] != 0]
        assert all((t - 2 * kv) % 2 == 0 for t in qpos)
        assert sum(x != IGNORE_INDEX for x in tgts) == kv


def test_mqar_power_law_gaps():
    task = MQARTask(vocab_size=256, seq_len=256, num_kv_pairs=4)
    counts = Counter()
    for step in range(20):
        b = task.train_batch(step, 64)
        pos = (b.targets != IGNORE_INDEX).nonzero()[:, 1]
        counts.update(((pos - 8) // 2).tolist())
    slots = task.num_slots
    first = sum(counts[s] for s in range(slots // 4))
    last = sum(counts[s] for s in range(3 * slots // 4, slots))
    assert counts[0] > 4 * counts[slots - 1] + 1
    assert first > 1.3 * last  # a uniform slot choice gives first ~= last
    # with power_a = 1 the density is flat
    flat = MQARTask(vocab_size=256, seq_len=256, num_kv_pairs=4, power_a=1.0)
    assert torch.allclose(flat.gap_probs, torch.full_like(flat.gap_probs, 1 / slots))


def test_mqar_in_context_guess_is_chance():
    task = MQARTask(vocab_size=256, eval_size=1024)
    g = torch.Generator().manual_seed(1)
    accs = []
    for batch in task.eval_batches()["eval"]:
        rows = batch.tokens
        logits = in_context_guess(batch, lambda r, rows=rows: rows[r, 1:16:2].tolist(), g)
        logits = torch.nn.functional.pad(logits, (0, task.vocab_size - logits.shape[-1]))
        accs.append(task.metric(logits, batch))
    assert sum(accs) / len(accs) == pytest.approx(task.chance_level, abs=0.03)


def test_mqar_errors():
    with pytest.raises(ValueError, match=r"seq_len=20.*num_kv_pairs=8"):
        MQARTask(seq_len=20, num_kv_pairs=8)
    with pytest.raises(ValueError, match="vocab_size"):
        MQARTask(vocab_size=16, num_kv_pairs=8)
    with pytest.raises(ValueError, match="power_a"):
        MQARTask(power_a=0.0)
    with pytest.raises(ValueError, match="num_kv_pairs"):
        MQARTask(num_kv_pairs=0)
    with pytest.raises(ValueError, match="eval_batch_size"):
        MQARTask(eval_size=100, eval_batch_size=64)


# ------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pydoc_task():
    return TextTask(seq_len=64)


def test_text_default_corpus_and_vocab(pydoc_task):
    from pydoc_data.topics import topics

    text = "".join(topics[k] for k in sorted(topics))
    task = pydoc_task
    assert task.text == text
    assert task.chars == sorted(set(text))
    assert task.vocab_size == len(set(text))
    sample = text[1000:1300]
    assert task.decode(task.encode(sample)) == sample
    assert task.decode(task.data[:500]) == text[:500]
    assert len(task.data) == len(text)
    assert 0 < task.bigram_bits < task.unigram_bits < task.chance_level
    with pytest.raises(ValueError, match="vocabulary"):
        task.encode("\x07")


def test_text_windows_respect_split(pydoc_task):
    task = pydoc_task
    n_train = int(0.9 * len(task.text))
    assert task.n_train == n_train
    train_text, eval_text = task.text[:n_train], task.text[n_train:]
    for step in range(3):
        b = task.train_batch(step, 16)
        assert torch.equal(b.tokens[:, 1:], b.targets[:, :-1])
        assert (b.targets != IGNORE_INDEX).all()
        for toks, tgts in zip(b.tokens, b.targets, strict=True):
            assert task.decode(toks) + task.decode(tgts[-1:]) in train_text
    batches = task.eval_batches()["eval"]
    assert sum(b.tokens.shape[0] for b in batches) == 32
    assert (task.eval_starts >= n_train).all()
    assert (task.eval_starts + task.seq_len < len(task.text)).all()
    starts = task.eval_starts.tolist()
    rows = [r for b in batches for r in zip(b.tokens, b.targets, strict=True)]
    for start, (toks, tgts) in zip(starts, rows, strict=True):
        window = task.decode(toks) + task.decode(tgts[-1:])
        assert window == task.text[start:start + task.seq_len + 1]
        assert window in eval_text


def test_text_any_utf8_file(tmp_path):
    path = tmp_path / "snow.txt"
    text = ("héllo ☃ wörld, " * 40) + "ß"
    path.write_text(text, encoding="utf-8")
    task = make_task("text", path=path, seq_len=16, eval_windows=4)
    assert "☃" in task.chars and task.vocab_size == len(set(text))
    assert task.decode(task.encode(text)) == text
    b = task.train_batch(0, 4)
    assert b.tokens.shape == (4, 16)
    assert task.config["source"] == str(path)


def test_text_file_errors(tmp_path):
    with pytest.raises(ValueError, match=r"path=.*does not exist"):
        TextTask(path=tmp_path / "missing.txt")
    with pytest.raises(ValueError, match=r"path=.*not a regular file"):
        TextTask(path=tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"path=.*empty"):
        TextTask(path=empty)
    nul = tmp_path / "nul.bin"
    nul.write_bytes(b"abc\x00def" * 100)
    with pytest.raises(ValueError, match=r"path=.*binary"):
        TextTask(path=nul)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 100)
    with pytest.raises(ValueError, match=r"path=.*UTF-8"):
        TextTask(path=latin)
    short = tmp_path / "short.txt"
    short.write_text("x" * 200, encoding="utf-8")  # eval part: 20 chars
    with pytest.raises(ValueError, match=r"seq_len=32"):
        TextTask(path=short, seq_len=32)
    TextTask(path=short, seq_len=19, eval_windows=2)  # exactly enough
    with pytest.raises(TypeError, match="path"):
        TextTask(path=123)


# ------------------------------------------------------------------------------------------
# Salience
# ------------------------------------------------------------------------------------------


def salience_decode(task: SalienceTask, toks: list[int], scale: list[float]) -> int:
    """Brute force: find the salient item from the cue, return the token it points at."""
    item_pos = [t for t, x in enumerate(toks) if 2 <= x < task.value_offset]
    if task.cue == "scale":
        pos = max(item_pos, key=lambda t: abs(scale[t] - 1.0))  # the odd one out
    else:  # token cue: the one marked copy
        marked = [t for t in item_pos if toks[t] >= task.marked_offset]
        assert len(marked) == 1
        pos = marked[0]
    if task.layout == "pairs":
        return toks[pos + 1]
    x = toks[pos]
    return x - task.num_item_tokens if x >= task.marked_offset else x


@pytest.mark.parametrize("opts", [
    {},
    {"cue": "token"},
    {"layout": "items"},
    {"layout": "items", "cue": "token", "seq_len": 20},
    {"num_items": 4, "seq_len": 16, "salient_scale": 0.3, "jitter": 0.05},
])
def test_salience_labels_by_brute_force(opts):
    task = SalienceTask(**opts)
    m = task.num_items
    b = task.train_batch(2, 64)
    assert b.scale is not None
    for toks, tgts, sc in zip(b.tokens.tolist(), b.targets.tolist(), b.scale.tolist(),
                              strict=True):
        assert toks[-1] == task.QUERY
        assert all(x == IGNORE_INDEX for x in tgts[:-1])
        assert tgts[-1] == salience_decode(task, toks, sc)
        pad = task.seq_len - task.span
        assert toks[:pad] == [task.PAD] * pad
        step = 2 if task.layout == "pairs" else 1
        items = toks[pad:task.seq_len - 1:step]
        base = [x - task.num_item_tokens if x >= task.marked_offset else x for x in items]
        assert len(items) == m and len(set(base)) == m
        assert all(2 <= x < task.marked_offset for x in base)
        if task.layout == "pairs":
            values = toks[pad + 1:task.seq_len - 1:2]
            assert len(set(values)) == m
            assert all(task.value_offset <= x < task.vocab_size for x in values)
        item_idx = set(range(pad, task.seq_len - 1, step))
        assert all(sc[t] == 1.0 for t in range(task.seq_len) if t not in item_idx)
        item_scales = sorted(sc[t] for t in item_idx)
        j = task.jitter + 1e-6
        if task.cue == "scale":
            odd = item_scales[-1] if task.salient_scale > 1 else item_scales[0]
            rest = item_scales[:-1] if task.salient_scale > 1 else item_scales[1:]
            assert abs(odd - task.salient_scale) <= j
            assert all(abs(s - 1.0) <= j for s in rest)
        else:
            assert all(abs(s - 1.0) <= j for s in item_scales)


def salience_baselines(task: SalienceTask, n_batches: int = 16) -> dict[str, float]:
    """Accuracy of rules that ignore or use the scale, over many train batches."""
    hits = Counter()
    total = 0
    value_counts = Counter()
    for step in range(n_batches):
        b = task.train_batch(1000 + step, 256)
        step_ = 2 if task.layout == "pairs" else 1
        pos = torch.arange(task.seq_len - task.span, task.seq_len - 1, step_)
        items, sc = b.tokens[:, pos], b.scale[:, pos]
        answers = b.tokens[:, pos + 1] if task.layout == "pairs" else items
        target = b.targets[:, -1]
        rows = torch.arange(len(target))
        rules = {
            "first": answers[:, 0],
            "last": answers[:, -1],
            "min_token": answers[rows, items.argmin(1)],
            "max_scale": answers[rows, sc.argmax(1)],
        }
        if value_counts:
            rules["majority"] = torch.full_like(target, value_counts.most_common(1)[0][0])
        for key, pred in rules.items():
            hits[key] += int((pred == target).sum())
        value_counts.update(target.tolist())
        total += len(target)
    out = {k: v / total for k, v in hits.items()}
    out["majority"] = hits["majority"] / (total - 256)
    return out


def test_salience_only_magnitude_carries_signal():
    task = SalienceTask()
    acc = salience_baselines(task)
    assert acc["max_scale"] == 1.0
    for rule in ("first", "last", "min_token"):
        assert acc[rule] == pytest.approx(task.chance_level, abs=0.025), rule
    assert acc["majority"] < task.chance_level
    # controls: with the token cue or no cue, the scale says nothing
    for cue in ("token", "none"):
        control = salience_baselines(SalienceTask(cue=cue), n_batches=8)
        assert control["max_scale"] == pytest.approx(1 / 8, abs=0.035), cue


def test_salient_item_is_uniform_and_identically_distributed():
    task = SalienceTask(num_item_tokens=16, num_items=4, seq_len=9)
    where = Counter()
    salient_tok, other_tok = Counter(), Counter()
    for step in range(10):
        b = task.train_batch(step, 256)
        items = b.tokens[:, 0:8:2]
        s = b.scale[:, 0:8:2].argmax(1)
        where.update(s.tolist())
        mask = torch.nn.functional.one_hot(s, 4).bool()
        salient_tok.update(items[mask].tolist())
        other_tok.update(items[~mask].tolist())
    n = sum(where.values())
    assert all(abs(where[i] / n - 0.25) < 0.04 for i in range(4))
    ns, no = sum(salient_tok.values()), sum(other_tok.values())
    tv = 0.5 * sum(abs(salient_tok[x] / ns - other_tok[x] / no) for x in range(2, 18))
    assert tv < 0.08  # total-variation distance; a biased pool would give ~0.5+


def test_salience_errors():
    with pytest.raises(ValueError, match=r"seq_len=10.*num_items=8"):
        SalienceTask(seq_len=10)
    with pytest.raises(ValueError, match="num_item_tokens"):
        SalienceTask(num_item_tokens=4)
    with pytest.raises(ValueError, match="num_values"):
        SalienceTask(num_values=4)
    with pytest.raises(ValueError, match="cue"):
        SalienceTask(cue="color")
    with pytest.raises(ValueError, match="layout"):
        SalienceTask(layout="grid")
    with pytest.raises(ValueError, match="salient_scale"):
        SalienceTask(salient_scale=-1.0)
    with pytest.raises(ValueError, match="jitter"):
        SalienceTask(jitter=1.5)
    with pytest.raises(ValueError, match="num_items"):
        SalienceTask(num_items=1)
    with pytest.raises(ValueError, match="cue_at"):
        SalienceTask(cue_at="value")


@pytest.mark.parametrize("layout", ["items", "pairs"])
def test_salience_cue_at_changes_where_not_what(layout):
    """cue_at only tells the model where to apply Batch.scale: the batches are identical."""
    plain = SalienceTask(layout=layout)
    keyed = SalienceTask(layout=layout, cue_at="key")
    assert plain.cue_at == "embedding" and keyed.config["cue_at"] == "key"
    for step in (0, 7):
        a, b = plain.train_batch(step, 32), keyed.train_batch(step, 32)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
        assert torch.equal(a.scale, b.scale)
    config = TrainConfig(task="salience", cue_at="key", num_items=16, salient_scale=1.3,
                         jitter=0.2)
    assert config.task_options()["cue_at"] == "key"
    with pytest.raises(ValueError, match="cue_at is not an option of task 'mqar'"):
        TrainConfig(task="mqar", cue_at="key")


@pytest.mark.parametrize("opts", [{}, {"layout": "items", "cue_at": "key", "num_items": 16}])
def test_salience_no_cue_marks_nothing(opts):
    """cue="none": no marked token, and every item scale is drawn as a distractor's (1 ± jitter),
    so the batch carries no information about which item the target is."""
    task = SalienceTask(cue="none", salient_scale=1.3, jitter=0.2, **opts)
    b = task.train_batch(3, 256)
    step = 2 if task.layout == "pairs" else 1
    pos = torch.arange(task.seq_len - task.span, task.seq_len - 1, step)
    items, scale = b.tokens[:, pos], b.scale[:, pos]
    assert bool((items < task.marked_offset).all())
    assert bool(((scale - 1.0).abs() <= task.jitter + 1e-6).all())
    assert scale.max() > 1.0 + 0.9 * task.jitter  # the jitter is drawn, not switched off


@pytest.mark.parametrize("opts", [
    {"layout": "items"},
    {"layout": "items", "cue": "token", "seq_len": 20},
    {"layout": "items", "cue": "none"},
    {"layout": "pairs"},
    {"layout": "pairs", "cue": "token", "seq_len": 20},
])
def test_salience_answer_positions(opts):
    """The probe's answer position: the salient item (items) or its value (pairs), found here
    from the cue itself (brute force), and from the target alone under cue="none"."""
    task = SalienceTask(**opts)
    b = task.train_batch(5, 64)
    got = task.answer_positions(b).tolist()
    for row, (toks, sc) in enumerate(zip(b.tokens.tolist(), b.scale.tolist(), strict=True)):
        if task.cue == "none":  # no cue to decode: the answer token is the target itself
            assert toks[got[row]] == b.targets[row, -1]
            continue
        item_pos = [t for t, x in enumerate(toks) if 2 <= x < task.value_offset]
        if task.cue == "scale":
            item = max(item_pos, key=lambda t: sc[t])
        else:
            item = next(t for t in item_pos if toks[t] >= task.marked_offset)
        assert got[row] == item + (1 if task.layout == "pairs" else 0)
    broken = Batch(b.tokens, torch.full_like(b.targets, IGNORE_INDEX), b.scale)
    broken.targets[:, -1] = task.PAD
    with pytest.raises(ValueError, match="exactly once"):
        task.answer_positions(broken)


# ------------------------------------------------------------------------------------------
# Length
# ------------------------------------------------------------------------------------------


def length_decode(task: LengthTask, toks: list[int]) -> tuple[int, int, list[int]]:
    """Brute force: (target, answer position, pair positions) of one sequence. ``pairs``: the
    earlier occurrence of the final key, its next token is the answer; ``fused``: the pair token
    whose key index (token - pair_offset) // W is the final key's."""
    ctx = toks[:-1]
    if task.layout == "pairs":
        pair_pos = [t for t, x in enumerate(ctx) if task.key_offset <= x < task.value_offset]
        matches = [t for t in pair_pos if ctx[t] == toks[-1]]
        assert len(matches) == 1
        return ctx[matches[0] + 1], matches[0] + 1, pair_pos
    pair_pos = [t for t, x in enumerate(ctx) if x >= task.pair_offset]
    query_key = toks[-1] - task.key_offset
    matches = [t for t in pair_pos if (ctx[t] - task.pair_offset) // task.num_values == query_key]
    assert len(matches) == 1
    return ctx[matches[0]], matches[0], pair_pos


@pytest.mark.parametrize("layout", ["fused", "pairs"])
def test_length_labels_and_answer_positions_by_brute_force_at_every_length(layout):
    task = LengthTask(seq_len=32, num_pairs=3, layout=layout)
    evals = task.eval_batches()
    assert list(evals) == ["n=32", "n=64", "n=128"]
    checks = {32: task.train_batch(0, 64)}
    checks.update({int(k[2:]): v[0] for k, v in evals.items()})
    width = 2 if layout == "pairs" else 1
    for length, batch in checks.items():
        assert batch.tokens.shape[1] == length
        answers = task.answer_positions(batch).tolist()
        for toks, tgts, pos in zip(batch.tokens.tolist(), batch.targets.tolist(), answers,
                                   strict=True):
            answer, answer_pos, pair_pos = length_decode(task, toks)
            assert tgts[-1] == answer and pos == answer_pos
            assert toks[pos] == answer  # the token at the reported position is the answer
            assert all(x == IGNORE_INDEX for x in tgts[:-1])
            assert len(pair_pos) == task.num_pairs
            assert len({toks[t] for t in pair_pos}) == task.num_pairs
            if layout == "pairs":
                val_pos = [t + 1 for t in pair_pos]
                assert len({toks[t] for t in val_pos}) == task.num_pairs
                assert all(task.value_offset <= toks[t] < task.filler_offset for t in val_pos)
            else:  # distinct keys and distinct values inside the fused tokens
                kv = [divmod(toks[t] - task.pair_offset, task.num_values) for t in pair_pos]
                assert len({k for k, _ in kv}) == len({v for _, v in kv}) == task.num_pairs
                assert all(toks[t] < task.vocab_size for t in pair_pos)
            special = {t + j for t in pair_pos for j in range(width)}
            others = [toks[t] for t in range(length - 1) if t not in special]
            assert all(task.filler_offset <= x < task.pair_offset for x in others)
            assert task.key_offset <= toks[-1] < task.value_offset


@pytest.mark.parametrize("layout", ["fused", "pairs"])
def test_length_vocabulary_is_the_same_at_every_length(layout):
    task = LengthTask(seq_len=16, num_pairs=2, num_keys=5, num_values=7, num_fillers=11,
                      layout=layout)
    size = 1 + 5 + 11 + (5 * 7 if layout == "fused" else 7)
    assert task.vocab_size == size
    assert LengthTask(seq_len=64, num_pairs=2, num_keys=5, num_values=7, num_fillers=11,
                      layout=layout).vocab_size == size
    for batches in task.eval_batches().values():
        for b in batches:
            assert int(b.tokens.min()) >= 1 and int(b.tokens.max()) < size
            assert int(b.targets.max()) < size


def test_length_layouts_are_deterministic_and_differ():
    fused, pairs = LengthTask(seq_len=16, seed=5), LengthTask(seq_len=16, seed=5, layout="pairs")
    again = LengthTask(seq_len=16, seed=5)
    for split_batch in (lambda t: t.train_batch(3, 8), lambda t: t.sample(40, 8, step=2),
                        lambda t: t.eval_batches()["n=32"][1]):
        a, b = split_batch(fused), split_batch(again)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
        assert not torch.equal(a.tokens, split_batch(pairs).tokens)
    assert not torch.equal(fused.sample(40, 8, step=2).tokens, fused.sample(40, 8, step=3).tokens)


@pytest.mark.parametrize("layout", ["fused", "pairs"])
def test_length_pairs_cover_positions_and_chance(layout):
    task = LengthTask(seq_len=16, num_pairs=2, eval_size=2048, layout=layout)
    seen = Counter()
    hits = total = 0
    for batch in task.eval_batches()["n=16"]:
        for toks, tgts in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
            _, _, pair_pos = length_decode(task, toks)
            seen.update(pair_pos)
            # "copy the first pair": its value (pairs) or its token (fused)
            hits += toks[pair_pos[0] + (1 if layout == "pairs" else 0)] == tgts[-1]
            total += 1
    last_start = 13 if layout == "pairs" else 14  # a pair fits before the final query
    assert set(seen) == set(range(0, last_start + 1))
    assert hits / total == pytest.approx(task.chance_level, abs=0.04)
    assert task.chance_level == 1 / 2


def test_length_extra_sample_and_errors():
    task = LengthTask(seq_len=16)
    b = task.sample(48, 8, step=1)
    assert b.tokens.shape == (8, 48)
    assert torch.equal(b.tokens, task.sample(48, 8, step=1).tokens)
    assert LengthTask(seq_len=5, num_pairs=4).seq_len == 5  # fused: 4 one-token pairs + query
    with pytest.raises(ValueError, match=r"seq_len=4.*num_pairs=4"):
        LengthTask(seq_len=4, num_pairs=4)
    with pytest.raises(ValueError, match=r"seq_len=8.*num_pairs=4"):
        LengthTask(seq_len=8, num_pairs=4, layout="pairs")
    with pytest.raises(ValueError, match="layout"):
        LengthTask(layout="items")
    with pytest.raises(ValueError, match="pair tokens"):
        LengthTask(layout="pairs").pair_token(torch.tensor(0), torch.tensor(0))
    with pytest.raises(ValueError, match="num_pairs"):
        LengthTask(num_pairs=10, num_keys=5)
    with pytest.raises(ValueError, match="eval_multipliers"):
        LengthTask(eval_multipliers=())
    with pytest.raises(ValueError, match="eval_multipliers"):
        LengthTask(eval_multipliers=(1, 0))
    with pytest.raises(TypeError, match="eval_multipliers"):
        LengthTask(eval_multipliers=2)
    bad = b.tokens.clone()
    bad[:, -1] = task.filler_offset  # the query is no key: no pair matches
    with pytest.raises(ValueError, match="exactly one pair"):
        task.answer_positions(Batch(bad, b.targets))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_labelled_metric_is_the_metric_at_the_labelled_positions(name):
    task = make_task(name, **SMALL[name])
    batch = next(iter(task.eval_batches().values()))[0]
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(*batch.targets.shape, task.vocab_size, generator=g) * 3.0  # (B, T, V)
    keep = batch.targets != IGNORE_INDEX
    total, count = task.metric_sum(logits, batch)
    picked, n = task.labelled_metric_sum(logits[keep], batch.targets[keep])
    assert n == count == batch.num_labels
    assert picked == pytest.approx(total, rel=1e-6)
    if name == "text":  # bits: the cross-entropy of the full logits, unlabelled ones ignored
        nats = torch.nn.functional.cross_entropy(logits.reshape(-1, task.vocab_size),
                                                 batch.targets.reshape(-1), reduction="sum")
        assert picked == pytest.approx(float(nats) / math.log(2.0), rel=1e-6)
    else:  # accuracy: the argmax hits, counted by hand
        hits = (logits.argmax(-1) == batch.targets)[keep].sum()
        assert picked == float(hits)


def test_labelled_metric_input_errors():
    task = make_task("mqar", vocab_size=256)
    with pytest.raises(ValueError, match="labels"):
        task.labelled_metric_sum(torch.zeros(4, 256), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        task.labelled_metric_sum(torch.zeros(2, 4, 256), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size"):
        task.labelled_metric_sum(torch.zeros(4, 100), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="labelled"):
        task.labelled_metric_sum(torch.zeros(0, 256), torch.zeros(0, dtype=torch.long))


def test_the_text_encoding_is_computed_once_per_text(tmp_path):
    from attnscale.lab.tasks.text import encoded

    a, b = make_task("text", seq_len=16), make_task("text", seq_len=32, seed=3)
    assert a.data is b.data and a.chars == b.chars  # one encoding of the default corpus
    other = tmp_path / "t.txt"
    other.write_text("abcab" * 400, encoding="utf-8")
    c = make_task("text", seq_len=8, path=str(other))
    assert c.chars == ["a", "b", "c"] and c.decode(c.data[:5]) == "abcab"
    assert encoded("abcab" * 400)[2] is c.data
