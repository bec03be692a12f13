"""The on-disk cache of deterministic values: computed once, read after, never stale, never
half-written, and two processes that miss together compute once."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from attnscale.util import diskcache

log = logging.getLogger(__name__)


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(diskcache.ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def counting(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


def test_a_value_is_computed_once_then_read(folder):
    compute, calls = counting({"a": [1.5, 2.0]})
    assert diskcache.cached_json("v", {"n": 1}, compute, log) == {"a": [1.5, 2.0]}
    assert diskcache.cached_json("v", {"n": 1}, compute, log) == {"a": [1.5, 2.0]}
    assert len(calls) == 1
    assert diskcache.path_of("v", {"n": 1}).parent == folder
    assert diskcache.cached_json("v", {"n": 2}, compute, log) and len(calls) == 2  # new key


def test_the_default_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(diskcache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert diskcache.folder() == tmp_path / "attnscale"


def test_an_unreadable_file_is_recomputed_and_replaced(folder, caplog):
    compute, calls = counting([3.0])
    path = diskcache.path_of("v", {"k": 0})
    folder.mkdir(parents=True)
    path.write_text('{"trunc')
    with caplog.at_level(logging.WARNING):
        assert diskcache.cached_json("v", {"k": 0}, compute, log) == [3.0]
    assert len(calls) == 1 and "unreadable" in caplog.text
    assert json.loads(path.read_text()) == [3.0]


def test_an_unwritable_folder_still_returns_the_value(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(diskcache.ENV, str(blocker / "cache"))  # a folder under a file
    compute, calls = counting([1.0])
    with caplog.at_level(logging.WARNING):
        assert diskcache.cached_json("v", {}, compute, log) == [1.0]
    assert len(calls) == 1 and "cannot cache" in caplog.text


def test_a_value_json_cannot_hold_raises_and_leaves_no_file(folder):
    with pytest.raises(TypeError):
        diskcache.cached_json("v", {}, lambda: {"x": object()}, log)
    assert not [p for p in folder.iterdir() if p.suffix in (".json", ".tmp")]


def test_the_code_digest_changes_with_the_source(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    before = diskcache.source_digest(a, b)
    assert diskcache.source_digest(a, b) == before
    a.write_text("x = 2\n")
    assert diskcache.source_digest(a, b) != before


CHILD = """
import logging, sys, time
from attnscale.util import diskcache
def compute():
    with open(sys.argv[1], "a") as f:
        f.write("computed\\n")
    time.sleep(1.5)
    return [42]
print(diskcache.cached_json("shared", {"k": 1}, compute, logging.getLogger("t")))
"""


def test_two_processes_that_miss_together_compute_once(folder, tmp_path):
    counter = tmp_path / "count.txt"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(counter)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["[42]", "[42]"]
    assert counter.read_text().count("computed") == 1
