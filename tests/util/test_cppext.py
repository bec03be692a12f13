"""attnscale.util.cppext: an installed build is used only while its record fits; a just-in-time
build is named by everything that changes its binary; build() logs "loading" (INFO) or "building"
(WARNING). Every build here is a fake (an empty library, a stub for PyTorch's ``load``); the real
builds are in test_kernel_builds.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.utils.cpp_extension

from attnscale.util import cppext, jitcache, kernelspec


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """An empty just-in-time cache, and no installed builds."""
    folder = tmp_path / "extensions"
    folder.mkdir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder))
    monkeypatch.delenv("ATTNSCALE_KERNEL_CACHE", raising=False)
    monkeypatch.setattr(kernelspec, "PACKAGE", tmp_path / "package")
    return folder / "attnscale"


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "kernel.cpp"
    path.write_text("// a kernel\n")
    return path


def install_fake(package: Path, stem: str, isa: str, identity: dict) -> Path:
    """What setup.py leaves in prebuilt/: a library and its identity record."""
    folder = package / kernelspec.PREBUILT
    folder.mkdir(parents=True, exist_ok=True)
    name = kernelspec.build_name(stem, isa)
    (folder / f"{name}.json").write_text(json.dumps(identity))
    library = folder / f"{name}.cpython-311-x86_64-linux-gnu.so"
    library.write_bytes(b"")
    return library


def test_an_installed_build_is_used_only_while_it_fits(root, source, monkeypatch):
    """The record must match this environment field for field; an edit of the source, another
    torch, a corrupt record or $ATTNSCALE_PREBUILT=off each send the call elsewhere, saying
    why."""
    identity = kernelspec.identity("generic", source)
    library = install_fake(kernelspec.PACKAGE, "fake", "generic", identity)
    assert cppext.installed("fake", "generic", source) == (library, "")
    assert cppext.locate("fake", source, "generic") == ("installed", str(library))
    assert cppext.installed("fake", "AVX2", source) == (None, "no installed AVX2 build")
    monkeypatch.setenv(cppext.PREBUILT_ENV, "off")
    assert "ATTNSCALE_PREBUILT=off" in cppext.installed("fake", "generic", source)[1]
    monkeypatch.delenv(cppext.PREBUILT_ENV)
    source.write_text("// an edited kernel\n")
    path, why = cppext.installed("fake", "generic", source)
    assert path is None and why.startswith("the installed build does not fit (source_sha256")
    install_fake(kernelspec.PACKAGE, "fake", "generic", {**kernelspec.identity(
        "generic", source), "torch": "1.0.0"})
    path, why = cppext.installed("fake", "generic", source)
    assert path is None and "torch: built for '1.0.0'" in why
    (kernelspec.PACKAGE / kernelspec.PREBUILT / "fake_generic.json").write_text("{")
    assert "unreadable" in cppext.installed("fake", "generic", source)[1]


def test_a_just_in_time_name_changes_with_everything_that_changes_the_binary(source, monkeypatch):
    """The key: torch's version, the ISA, the source's bytes, the compiler, the environment."""
    base = cppext.jit_name("fake", "generic", source)
    assert base.startswith("attnscale_fake_generic_") and len(base.rsplit("_", 1)[1]) == 12
    assert cppext.jit_name("fake", "generic", source) == base  # deterministic
    assert cppext.jit_name("fake", "AVX2", source) != base
    identity = kernelspec.identity("generic", source)
    assert kernelspec.key(identity, "/env/a") != kernelspec.key(identity, "/env/b")
    assert kernelspec.key({**identity, "torch": "9.9"}, "/env/a") != kernelspec.key(
        identity, "/env/a")
    monkeypatch.setenv("CXX", "clang++")
    assert cppext.jit_name("fake", "generic", source) != base
    monkeypatch.delenv("CXX")
    source.touch()  # a touch is no edit
    assert cppext.jit_name("fake", "generic", source) == base
    source.write_text("// edited\n")
    assert cppext.jit_name("fake", "generic", source) != base


def test_every_kernel_source_is_found():
    """setup.py builds what kernelspec.sources lists: each Kernel's source is among them."""
    from attnscale.core import native, native_rows
    from attnscale.measure import native as monitor_native

    found = kernelspec.sources()
    for module in (native, native_rows, monitor_native):
        assert found[module.STEM] == module.SOURCE.resolve()



@pytest.fixture
def loads(monkeypatch) -> list[dict]:
    """PyTorch's ``load`` replaced by a stub that records its arguments and leaves an empty
    library in its build folder; importing a library returns a stand-in. Nothing compiles."""
    calls: list[dict] = []

    def load(**kwargs):
        calls.append(kwargs)
        kwargs["extra_ldflags"].append("-ltorch")  # as PyTorch's own load does
        (Path(kwargs["build_directory"]) / f"{kwargs['name']}.so").write_bytes(b"")
        return SimpleNamespace(name=kwargs["name"])

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    monkeypatch.setattr(jitcache, "import_library",
                        lambda name, path: SimpleNamespace(name=name, path=path))
    return calls


@pytest.mark.parametrize("where,level,word,origin", [
    (None, logging.WARNING, "building", "built"),  # never built
    ("cache", logging.INFO, "loading", "cache"),  # built before, for this environment
    ("installed", logging.INFO, "loading", "installed"),  # built at install
])
def test_build_logs_what_will_happen(root, source, loads, caplog, where, level, word, origin):
    """One line before anything blocks, and the module's origin is recorded."""
    name = cppext.jit_name("fake", "generic", source)
    if where == "cache":
        (root / name).mkdir(parents=True)
        (root / name / f"{name}.so").write_bytes(b"")
    if where == "installed":
        install_fake(kernelspec.PACKAGE, "fake", "generic",
                     kernelspec.identity("generic", source))
    log = logging.getLogger("attnscale.test_cppext")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        module, isa = cppext.build("fake", source, "the fake kernel", log, isa="generic")
    assert isa == "generic" and cppext.ORIGINS[("fake", "generic")][0] == origin
    assert [call["name"] for call in loads] == ([name] if where is None else [])
    records = [r for r in caplog.records if r.name == log.name]
    assert [(r.levelno, r.getMessage().split()[1]) for r in records] == [(level, word)]
    if where is None:
        assert loads[0]["sources"] == [str(source)] and module.name == name
        assert (root / name / f"{name}.so").is_file()  # renamed into place
        assert json.loads((root / name / "build.json").read_text())["isa"] == "generic"
        assert not list(root.glob(".*.tmp"))  # no private folder left
        assert cppext.locate("fake", source, "generic")[0] == "cache"
        assert cppext.jit_name("fake", "generic", source) == name  # the flags were not changed


def test_a_failed_build_leaves_nothing_and_falls_back(root, source, caplog, monkeypatch):
    """The builder's error becomes the reason; the private folder is gone; a missing source is
    reported without calling the builder."""
    def load(**kwargs):
        (Path(kwargs["build_directory"]) / "half.o").write_bytes(b"")
        raise RuntimeError("Error building extension")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    log = logging.getLogger("attnscale.test_cppext")
    with pytest.warns(UserWarning, match="the fake kernel did not build"):
        module, reason = cppext.build("fake", source, "the fake kernel", log, isa="generic")
    assert module is None and "RuntimeError: Error building extension" in reason
    assert list(root.iterdir()) == [root / f"{cppext.jit_name('fake', 'generic', source)}.lock"]
    with pytest.warns(UserWarning, match="did not build"):
        module, reason = cppext.build("fake", source.with_name("gone.cpp"), "the fake kernel",
                                      log, isa="generic")
    assert module is None and "gone.cpp is missing" in reason


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
    assert kernel.status() == {"isa": "AVX2", "origin": None, "reason": None, "path": "native"}
    with kernel.forced_fallback():
        with kernel.forced_fallback():
            assert kernel.active() is None and kernel.status()["path"] == "chunked"
        assert kernel.forced == 1
    assert kernel.active() is kernel.module() and kernel.forced == 0
    monkeypatch.setattr(cppext, "build", lambda *a, **k: (None, "no compiler"))
    failed = cppext.Kernel("fake", source, "a fake kernel", logging.getLogger(__name__))
    assert failed.module() is None
    assert failed.status() == {"isa": None, "origin": None, "reason": "no compiler",
                               "path": "python"}


def test_kernel_with_a_missing_source_falls_back(monkeypatch, tmp_path):
    """A kernel whose .cpp is gone reports why and takes the fallback; it never raises."""
    monkeypatch.setattr(cppext, "target_isa", lambda: "AVX2")
    kernel = cppext.Kernel("gone", tmp_path / "gone.cpp", "a missing kernel",
                           logging.getLogger(__name__))
    with pytest.warns(UserWarning, match="did not build"):
        assert kernel.module() is None
    status = kernel.status()
    assert status["path"] == "python" and "is missing" in status["reason"]
    assert status["origin"] is None
