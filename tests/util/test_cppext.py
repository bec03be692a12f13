"""attnscale.util.cppext: a cached build counts only while it is not older than its source, and
build() logs "loading" (INFO) or "building" (WARNING) accordingly. Every build here is a fake:
an empty ``.so`` in a temporary ``$TORCH_EXTENSIONS_DIR``, and a stub for PyTorch's ``load``."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.utils.cpp_extension

from attnscale.util import cppext

NAME = "attnscale_fake_generic"
# The two layouts PyTorch uses: <root>/<name>/ with $TORCH_EXTENSIONS_DIR, and a per-Python
# folder (e.g. py311_cpu) under its default root in newer versions.
LAYOUTS = {"flat": Path(NAME), "per_python": Path("py311_cpu") / NAME}
T0 = 1_700_000_000  # an arbitrary epoch time: every mtime below is set explicitly


def set_mtime(path: Path, seconds: float) -> Path:
    os.utime(path, (seconds, seconds))
    return path


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "extensions"
    folder.mkdir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder))
    return folder


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "kernel.cpp"
    path.write_text("// a kernel\n")
    return set_mtime(path, T0)


def fake_build(root: Path, layout: str, mtime: float) -> Path:
    folder = root / LAYOUTS[layout]
    folder.mkdir(parents=True)
    so = folder / f"{NAME}.so"
    so.write_bytes(b"")
    return set_mtime(so, mtime)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_build_newer_than_its_source_is_cached(root, source, layout):
    fake_build(root, layout, T0 + 60)
    assert cppext.is_cached(NAME, source)
    assert cppext.is_cached(NAME, str(source))  # a str path too


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_touching_the_source_makes_the_build_stale(root, source, layout):
    so = fake_build(root, layout, T0 + 60)
    assert cppext.is_cached(NAME, source)
    set_mtime(source, T0 + 120)  # an edit after the build
    assert not cppext.is_cached(NAME, source)
    assert cppext.is_cached(NAME)  # without the source, any build counts (as before)
    set_mtime(so, T0 + 180)  # rebuilt
    assert cppext.is_cached(NAME, source)


def test_touch_with_the_real_clock(root, source):
    """The same with ``Path.touch`` (the file system's own clock) instead of set times."""
    so = fake_build(root, "flat", T0)
    set_mtime(source, T0 - 60)
    assert cppext.is_cached(NAME, source)
    source.touch()
    assert not cppext.is_cached(NAME, source)
    so.touch()
    assert cppext.is_cached(NAME, source)


def test_same_mtime_counts_as_built(root, source):
    """ninja rebuilds only when an input is newer than its output; equal times are up to date."""
    fake_build(root, "flat", T0)
    assert cppext.is_cached(NAME, source)


def test_no_build_no_cache(root, source):
    assert not cppext.is_cached(NAME, source)
    assert not cppext.is_cached(NAME)
    fake_build(root, "flat", T0 + 60)
    assert not cppext.is_cached("attnscale_other_generic", source)  # another module's name


def test_a_missing_source_is_a_value_error_naming_it(root, tmp_path):
    fake_build(root, "flat", T0)
    with pytest.raises(ValueError, match=r"^source: no file at .*missing\.cpp"):
        cppext.is_cached(NAME, tmp_path / "missing.cpp")
    with pytest.raises(ValueError, match=r"^source: "):
        cppext.is_cached(NAME, tmp_path)  # a folder is not a source file


@pytest.fixture
def loads(monkeypatch) -> list[dict]:
    """PyTorch's ``load`` replaced by a stub that records its arguments: nothing compiles."""
    calls: list[dict] = []

    def load(**kwargs):
        calls.append(kwargs)
        return SimpleNamespace(name=kwargs["name"])

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    return calls


@pytest.mark.parametrize("built_at,level,word", [
    (None, logging.WARNING, "building"),  # never built
    (T0 + 60, logging.INFO, "loading"),  # built after the last edit
    (T0 - 60, logging.WARNING, "building"),  # built, then the source changed
])
def test_build_logs_what_will_happen(root, source, loads, caplog, built_at, level, word):
    if built_at is not None:
        fake_build(root, "flat", built_at)
    log = logging.getLogger("attnscale.test_cppext")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        module, isa = cppext.build("fake", source, "the fake kernel", log, isa="generic")
    assert isa == "generic" and module.name == NAME
    assert [call["name"] for call in loads] == [NAME]
    assert loads[0]["sources"] == [str(source)]
    records = [r for r in caplog.records if r.name == log.name]
    assert [(r.levelno, r.getMessage().split()[1]) for r in records] == [(level, word)]
    assert NAME in records[0].getMessage()


def test_build_of_a_missing_source_warns_and_falls_back(root, tmp_path, caplog, monkeypatch):
    """The log line says "building" (no ValueError from is_cached) and the failure of the
    builder becomes the reason, as for any other failed build."""
    def load(**kwargs):
        raise RuntimeError(f"no file {kwargs['sources'][0]}")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    fake_build(root, "flat", T0)
    log = logging.getLogger("attnscale.test_cppext")
    with caplog.at_level(logging.INFO, logger=log.name), pytest.warns(UserWarning, match="fake"):
        module, reason = cppext.build("fake", tmp_path / "gone.cpp", "the fake kernel", log,
                                      isa="generic")
    assert module is None and "RuntimeError" in reason
    assert [r.levelno for r in caplog.records if r.name == log.name] == [logging.WARNING]


def test_kernel_loads_once_and_its_switch_sends_calls_to_the_fallback(monkeypatch, source):
    """cppext.Kernel: one build per process however often it is asked, the status of a loaded
    and of a failed build, and forced_fallback nesting."""
    calls = []

    def fake(stem, src, what, log, isa=None):
        calls.append(stem)
        return SimpleNamespace(name=stem), "AVX2"

    monkeypatch.setattr(cppext, "build", fake)
    monkeypatch.setattr(cppext, "target_isa", lambda: "AVX2")
    kernel = cppext.Kernel("fake", source, "a fake kernel", logging.getLogger(__name__),
                           fallback="chunked")
    assert kernel.module() is kernel.module() and calls == ["fake"]
    assert kernel.status() == {"isa": "AVX2", "cached": False, "reason": None, "path": "native"}
    with kernel.forced_fallback():
        with kernel.forced_fallback():
            assert kernel.active() is None and kernel.status()["path"] == "chunked"
        assert kernel.forced == 1
    assert kernel.active() is kernel.module() and kernel.forced == 0
    monkeypatch.setattr(cppext, "build", lambda *a, **k: (None, "no compiler"))
    failed = cppext.Kernel("fake", source, "a fake kernel", logging.getLogger(__name__))
    assert failed.module() is None
    assert failed.status() == {"isa": None, "cached": False, "reason": "no compiler",
                               "path": "python"}


def test_kernel_with_a_missing_source_falls_back(monkeypatch, tmp_path):
    """A kernel whose .cpp is gone reports why and takes the fallback; it never raises."""
    monkeypatch.setattr(cppext, "target_isa", lambda: "AVX2")
    monkeypatch.setattr(torch.utils.cpp_extension, "load",
                        lambda **kw: (_ for _ in ()).throw(OSError("no such file")))
    kernel = cppext.Kernel("gone", tmp_path / "gone.cpp", "a missing kernel",
                           logging.getLogger(__name__))
    with pytest.warns(UserWarning, match="did not build"):
        assert kernel.module() is None
    status = kernel.status()
    assert status["path"] == "python" and "no such file" in status["reason"]
    assert status["cached"] is False
