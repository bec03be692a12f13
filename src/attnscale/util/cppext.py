"""Load attnscale's C++ kernels: the installed build, else a just-in-time one, else none.

Each kernel is one ``.cpp`` file written against ``at::vec::Vectorized``, which picks its vector
width from ``CPU_CAPABILITY`` at compile time; :func:`target_isa` chooses that capability
(``AVX512``, ``AVX2`` or the portable ``generic``, :mod:`attnscale.util.kernelspec`), and
``$ATTNSCALE_NATIVE_ISA`` forces one of those or ``off`` (no native kernel: every caller takes
its Python path).

Where :func:`build` finds a kernel, in order:

1. **installed**: ``pip install --no-build-isolation .`` (and ``make``) compile the kernels into
   the package's ``prebuilt/`` folder (``setup.py``), each with a record of its identity
   (torch version and ABI, Python ABI, flags, a hash of its source). It is used only while the
   running environment has that identity; ``$ATTNSCALE_PREBUILT=off`` ignores it.
2. **cache**: a just-in-time build (:mod:`attnscale.util.jitcache`) under a name keyed by
   that identity, the compiler and the environment, made on first use with one WARNING line
   (Python's last-resort handler prints it to stderr, so a user waiting half a minute sees
   why). A killed build leaves nothing that stalls the next process.
3. **none**: no compiler, a failed build or a missing source warns once, and the caller's
   Python path runs; the reason is kept for ``attnscale kernels``.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import sysconfig
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attnscale.util import jitcache, kernelspec

ENV = "ATTNSCALE_NATIVE_ISA"
PREBUILT_ENV = "ATTNSCALE_PREBUILT"
FLAGS = kernelspec.FLAGS
CHOICES = (*FLAGS, "off")
# (stem, isa) -> (where the loaded module came from: "installed", "cache" or "built"; why the
# installed build was not used, or "")
ORIGINS: dict[tuple[str, str], tuple[str, str]] = {}


def constant_to_compile(fn: Callable[[], bool]) -> Callable[[], bool]:
    """``fn`` marked as :func:`torch.compiler.assume_constant_result` marks it: Dynamo calls it
    while tracing and bakes the result in, instead of tracing it.

    The same mark the public decorator sets (torch/_dynamo/decorators.py), set without
    importing Dynamo, which the decorator does and which costs about 1 s of every process's
    start (``attnscale --help``, each sweep worker); tests/core/test_compile.py checks that the
    two marks agree.
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


def target_isa() -> str | None:
    """The capability the kernels are built for (a key of :data:`FLAGS`), or None for "off".

    Raises ValueError naming ``$ATTNSCALE_NATIVE_ISA`` when it holds anything else, or asks for
    an x86 capability this CPU lacks."""
    forced = os.environ.get(ENV, "").strip()
    detected = torch.backends.cpu.get_cpu_capability()
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if forced:
        if forced not in CHOICES:
            raise ValueError(f"${ENV} must be one of {', '.join(CHOICES)}, got {forced!r}")
        if forced in ("AVX512", "AVX2") and not (x86 and (detected == forced or (
                forced == "AVX2" and detected == "AVX512"))):
            raise ValueError(f"${ENV}={forced} but this CPU offers {detected} "
                             f"({platform.machine()})")
        return None if forced == "off" else forced
    return detected if x86 and detected in ("AVX512", "AVX2") else "generic"


def installed(stem: str, isa: str, source: Path) -> tuple[Path | None, str]:
    """(the installed build of kernel ``stem`` for ``isa``, "") when the package holds one made
    for this environment and this source, else (None, why not). Imports nothing."""
    if os.environ.get(PREBUILT_ENV, "").strip() == "off":
        return None, f"installed builds are off (${PREBUILT_ENV}=off)"
    folder = kernelspec.PACKAGE / kernelspec.PREBUILT
    name = kernelspec.build_name(stem, isa)
    libraries = sorted(folder.glob(f"{name}.*.so")) + sorted(folder.glob(f"{name}.so"))
    record = folder / f"{name}.json"
    if not libraries or not record.is_file():
        return None, f"no installed {isa} build"
    try:
        recorded = json.loads(record.read_text())
    except json.JSONDecodeError as err:
        return None, f"the installed build's record {record.name} is unreadable ({err})"
    why = kernelspec.mismatch(recorded, kernelspec.identity(isa, source))
    return (None, f"the installed build does not fit ({why})") if why else (libraries[0], "")


def locate(stem: str, source: Path, isa: str) -> tuple[str | None, str]:
    """Where a call would find kernel ``stem``'s build for ``isa`` without building anything:
    ("installed" or "cache", its path) or (None, why neither has one)."""
    path, why = installed(stem, isa, source)
    if path is not None:
        return "installed", str(path)
    cached = jitcache.library(jit_name(stem, isa, source))
    if cached.is_file():
        return "cache", str(cached)
    return None, f"{why}; not built for this environment yet"


def jit_name(stem: str, isa: str, source: Path) -> str:
    """The just-in-time build's module name, ``attnscale_<stem>_<isa>_<key>``."""
    import torch

    environment = str(Path(torch.__file__).resolve().parent)
    key = kernelspec.key(kernelspec.identity(isa, source), environment)
    return f"attnscale_{stem}_{isa.lower()}_{key}"


def build(stem: str, source: Path, what: str, log: logging.Logger,
          isa: str | None = None) -> tuple[ModuleType | None, str]:
    """The module of kernel ``stem`` for ``isa`` (default :func:`target_isa`): the installed
    build where it fits this environment, else the just-in-time cache's (built first where
    missing, about 20 s, with one log line). ``what`` names the kernel in the log lines.
    Returns (module, the capability it was built for), or (None, why not) when native kernels
    are off or the build failed; :data:`ORIGINS` records where each module came from."""
    try:
        isa = isa or target_isa()
    except ValueError as err:
        return None, str(err)
    if isa is None:
        return None, f"native kernels are off (${ENV}=off)"
    if not Path(source).is_file():
        return failed(what, f"its source {source} is missing")
    path, why = installed(stem, isa, Path(source))
    if path is not None:
        log.info("attnscale: loading %s from the installed build %s", what, path.name)
        module = jitcache.import_library(f"attnscale.prebuilt.{path.name.split('.')[0]}", path)
        ORIGINS[(stem, isa)] = ("installed", "")
        return module, isa
    path_env = os.environ.get("PATH", "")
    with_ninja(path_env)
    try:
        name = jit_name(stem, isa, Path(source))
        if jitcache.library(name).is_file():
            log.info("attnscale: loading %s %s from the kernel cache (%s)", what, name, why)
        module, origin = jitcache.load_or_build(
            name, Path(source), kernelspec.cflags(isa), kernelspec.LDFLAGS, what, log,
            kernelspec.identity(isa, Path(source)))
    except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as err:
        return failed(what, f"{type(err).__name__}: {err}")  # any build failure: the fallback
    finally:
        os.environ["PATH"] = path_env
    ORIGINS[(stem, isa)] = (origin, why)
    return module, isa


def with_ninja(path_env: str) -> None:
    """Put the environment's own ``ninja`` (the ``ninja`` dependency) on PATH: PyTorch's
    builder runs it from PATH, which lacks it when the environment is not activated."""
    scripts = sysconfig.get_path("scripts")
    if shutil.which("ninja") is None and scripts and (Path(scripts) / "ninja").exists():
        os.environ["PATH"] = f"{scripts}{os.pathsep}{path_env}"


def failed(what: str, reason: str) -> tuple[None, str]:
    """Warn once that ``what`` did not build and return (None, the reason)."""
    reason = f"{what} did not build ({reason})"
    warnings.warn(f"attnscale: {reason}; using the slower Python path", stacklevel=3)
    return None, reason


class Kernel:
    """One native kernel, built (or loaded) by :func:`build` on first use, once per process and
    thread-safely, with a switch that sends callers to their fallback path (tests).

    ``fallback`` names the path a qualifying call takes without the kernel (e.g. "chunked"),
    for :meth:`status`."""

    def __init__(self, stem: str, source: Path, what: str, log: logging.Logger,
                 fallback: str = "python") -> None:
        self.stem, self.source, self.what, self.log = stem, Path(source), what, log
        self.fallback = fallback
        self.forced = 0  # > 0 inside forced_fallback()
        self.state: dict[str, Any] = {}
        self.lock = threading.Lock()

    def module(self) -> ModuleType | None:
        """The compiled module, or None where it cannot be built (:meth:`status` says why)."""
        if "module" not in self.state:
            with self.lock:
                if "module" not in self.state:
                    self.state = self.load()
        return self.state["module"]

    def load(self) -> dict[str, Any]:
        """Build or load now: {"module", "isa", "reason", "origin"} (origin: "installed",
        "cache" or "built", where the module came from; None without one)."""
        module, info = build(self.stem, self.source, self.what, self.log)
        origin = ORIGINS.get((self.stem, info), (None, ""))[0] if module is not None else None
        return {"module": module, "isa": info if module is not None else None,
                "reason": None if module is not None else info, "origin": origin}

    def active(self) -> ModuleType | None:
        """The module a qualifying call uses now: None while :meth:`forced_fallback` holds."""
        return None if self.forced else self.module()

    def status(self) -> dict[str, Any]:
        """{"isa": the capability built for or None, "origin": "installed", "cache", "built" or
        None, "reason": why there is no kernel or None, "path": "native" or the fallback's name
        (what a qualifying call takes now)}. Builds the kernel if needed."""
        native = self.module() is not None and not self.forced
        return {"isa": self.state["isa"], "origin": self.state["origin"],
                "reason": self.state["reason"], "path": "native" if native else self.fallback}

    @contextmanager
    def forced_fallback(self) -> Iterator[None]:
        """Inside the block every call takes the fallback path."""
        with self.lock:
            self.forced += 1
        try:
            yield
        finally:
            with self.lock:
                self.forced -= 1
