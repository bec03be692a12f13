"""Compile attnscale's C++ kernels when the package is installed (the metadata is in
pyproject.toml).

Each kernel ``src/attnscale/*/csrc/<stem>.cpp`` becomes ``attnscale/prebuilt/<stem>_<isa>``
with PyTorch's ``CppExtension``/``BuildExtension``, beside a ``.json`` record of what the binary
depends on (:mod:`attnscale.util.kernelspec`), which the run-time loader checks before it uses
it. ``$ATTNSCALE_BUILD_ISA`` chooses the builds: ``native`` (the default: this machine's
capability), a comma-separated list of ``AVX512``, ``AVX2``, ``generic`` and ``native``, or
``none``.

The build needs the torch the package will run with, so install with
``pip install --no-build-isolation .`` (an isolated build environment would hold another
torch, or none). Where torch or a compiler is missing, or a kernel fails to compile, the install
still succeeds, says so in one line, and the kernels are built on first use instead (or the
Python paths run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
ISA_ENV = "ATTNSCALE_BUILD_ISA"


def load_kernelspec():
    """attnscale.util.kernelspec, loaded by path: importing the package would need its
    dependencies, which may not be installed yet."""
    spec = importlib.util.spec_from_file_location(
        "attnscale_kernelspec", HERE / "src" / "attnscale" / "util" / "kernelspec.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def say(line: str) -> None:
    print(f"attnscale setup: {line}", file=sys.stderr)


def install_isas(torch) -> list[str]:
    """The capabilities to build for ($ATTNSCALE_BUILD_ISA; module docstring)."""
    text = os.environ.get(ISA_ENV, "native").strip() or "native"
    if text == "none":
        return []
    detected = torch.backends.cpu.get_cpu_capability()
    native = detected if detected in ("AVX512", "AVX2") else "generic"
    chosen = [native if part.strip() == "native" else part.strip() for part in text.split(",")]
    bad = [isa for isa in chosen if isa not in ("AVX512", "AVX2", "generic")]
    if bad:
        raise SystemExit(f"${ISA_ENV}: unknown capability {bad[0]!r} (AVX512, AVX2, generic, "
                         "native or none)")
    return list(dict.fromkeys(chosen))


def record(library: Path) -> Path:
    """The identity record beside a built library (``row_norms_avx512.json``)."""
    return library.with_name(library.name.split(".")[0] + ".json")


def forget(library: Path) -> None:
    """Remove a library and its record, so that no stale build is packaged."""
    library.unlink(missing_ok=True)
    record(library).unlink(missing_ok=True)


def extensions() -> tuple[list, dict]:
    """(ext_modules, cmdclass) for setup(); both empty where torch is not importable."""
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        say("torch is not importable in this build environment, so the native kernels will be "
            "built on first use (pip install --no-build-isolation . builds them now)")
        return [], {}
    spec = load_kernelspec()
    modules = []
    for isa in install_isas(torch):
        for stem, source in spec.sources(HERE / "src" / "attnscale").items():
            ext = CppExtension(f"attnscale.{spec.PREBUILT}.{spec.build_name(stem, isa)}",
                               [str(source.relative_to(HERE))],
                               extra_compile_args=[*spec.cflags(isa), "-g0"],  # no debug info
                               extra_link_args=list(spec.LDFLAGS), optional=True)
            ext.attnscale = (isa, source)
            modules.append(ext)

    class BuildKernels(BuildExtension):
        """BuildExtension that compiles the kernels in parallel, records each one's identity
        beside it, and lets a failed kernel fall back to the run-time build."""

        def finalize_options(self) -> None:
            super().finalize_options()
            if not self.parallel:
                self.parallel = os.cpu_count() or 1

        def build_extensions(self) -> None:
            try:  # BuildExtension first checks the compiler's ABI by running it
                super().build_extensions()
            except (subprocess.SubprocessError, OSError) as err:
                say(f"no working C++ compiler ({type(err).__name__}: {err}), so the native "
                    "kernels will be built on first use, or the Python paths run")
                for ext in self.extensions:  # a build folder's libraries from an earlier run
                    forget(Path(self.get_ext_fullpath(ext.name)))

        def build_extension(self, ext) -> None:
            isa, source = ext.attnscale
            identity = spec.identity(isa, source)
            target = Path(self.get_ext_fullpath(ext.name))
            # build/kernels/ keeps each library under its identity's key, so an editable
            # install, a wheel and a reinstall of the same sources compile once between them
            kept = HERE / "build" / "kernels" / f"{target.name}-{spec.key(identity, 'install')}"
            if kept.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(kept, target)
            else:
                try:
                    super().build_extension(ext)
                except (RuntimeError, OSError, ValueError) as err:  # compilers raise all three
                    say(f"{ext.name} did not compile ({type(err).__name__}); it will be built "
                        "on first use, or the Python path runs")
                    forget(target)
                    return
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(target, kept)
            record(target).write_text(json.dumps(identity, indent=1, sort_keys=True))

        def copy_extensions_to_source(self) -> None:  # editable installs: the records too
            build_py = self.get_finalized_command("build_py")
            pairs = [[Path(p) for p in self._get_inplace_equivalent(build_py, ext)]
                     for ext in self.extensions]
            for inplace, _ in pairs:  # prebuilt/ holds no Python file, so nothing made it
                inplace.parent.mkdir(parents=True, exist_ok=True)
                # a new file, not the old one overwritten: a running process maps the old one
                inplace.unlink(missing_ok=True)
            super().copy_extensions_to_source()
            for inplace, regular in pairs:
                if record(regular).is_file():
                    self.copy_file(str(record(regular)), str(record(inplace)))

    # Without ninja: BuildExtension's ninja path writes one build.ninja for every extension,
    # which parallel builds would overwrite (each kernel is one file; ninja adds nothing).
    return modules, {"build_ext": BuildKernels.with_options(use_ninja=False)}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
