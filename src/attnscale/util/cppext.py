"""Build and load attnscale's C++ kernels with PyTorch's extension builder, once per machine.

Every kernel is one ``.cpp`` file written against ``at::vec::Vectorized``, which picks its vector
width from ``CPU_CAPABILITY`` at compile time. :func:`target_isa` chooses that capability:

* ``AVX512`` or ``AVX2`` on an x86 CPU that has it (what PyTorch itself dispatches to);
* ``generic`` everywhere else (ARM, other CPUs, or forced): ``CPU_CAPABILITY=DEFAULT``, whose
  ``Vectorized`` is portable C++ (on aarch64 PyTorch's default build maps it onto NEON).

``$ATTNSCALE_NATIVE_ISA`` forces one of ``AVX512``, ``AVX2``, ``generic`` or ``off`` (no native
kernel: every caller takes its Python path). The build lives in PyTorch's extension cache
(``~/.cache/torch_extensions`` or ``$TORCH_EXTENSIONS_DIR``); a build killed halfway can leave a
lock file there that makes the next build wait, and deleting that folder clears it.

Before it blocks, :func:`build` logs one line on the caller's logger: WARNING when no cached
build exists (Python's last-resort handler prints it to stderr, so a user waiting half a minute
sees why), INFO when it loads one (a build older than its source does not count: the builder
recompiles it). A failed build warns once and returns None with the reason.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import sysconfig
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ENV = "ATTNSCALE_NATIVE_ISA"
# Compiler flags per capability; the kernels include ATen's vec headers, which read the macros.
FLAGS: dict[str, list[str]] = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "generic": ["-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"],
}
CHOICES = (*FLAGS, "off")


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


def is_cached(name: str, source: str | Path | None = None) -> bool:
    """Whether an up-to-date build of module ``name`` lies in PyTorch's extension cache
    (directly or in the per-Python folder newer PyTorch adds).

    With ``source`` (the kernel's ``.cpp``) a build counts only if it is not older than the
    source (modification times): that is ninja's own test, so after an edit of the source the
    builder recompiles and this says False. Without it any build counts. Only the log level
    depends on it; the builder itself decides whether to rebuild. Raises ValueError naming
    ``source`` when it is not a file."""
    from torch.utils.cpp_extension import get_default_build_root

    if source is not None and not Path(source).is_file():
        raise ValueError(f"source: no file at {source}")
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    patterns = [f"{name}/{name}.so", f"*/{name}/{name}.so", f"{name}/{name}.pyd"]
    builds = [path for pattern in patterns for path in root.glob(pattern)]
    if source is None:
        return bool(builds)
    edited = Path(source).stat().st_mtime_ns
    return any(path.stat().st_mtime_ns >= edited for path in builds)


def build(stem: str, source: Path, what: str, log: logging.Logger,
          isa: str | None = None) -> tuple[ModuleType | None, str]:
    """Compile (or load from the cache) ``source`` as module ``attnscale_<stem>_<isa>``.

    ``what`` names the kernel in the one log line (e.g. "the monitor's native kernel");
    ``isa`` defaults to :func:`target_isa`. Returns (module, the capability it was built for),
    or (None, why not) when native kernels are off or the build failed."""
    try:
        isa = isa or target_isa()
    except ValueError as err:
        return None, str(err)
    if isa is None:
        return None, f"native kernels are off (${ENV}=off)"
    # The builder runs `ninja` from PATH; a venv's own (the `ninja` dependency) is not on PATH
    # when the venv is not activated. PATH is put back afterwards.
    path = os.environ.get("PATH", "")
    scripts = sysconfig.get_path("scripts")
    if shutil.which("ninja") is None and scripts and (Path(scripts) / "ninja").exists():
        os.environ["PATH"] = f"{scripts}{os.pathsep}{path}"
    name = f"attnscale_{stem}_{isa.lower()}"
    if Path(source).is_file() and is_cached(name, source):
        log.info("attnscale: loading %s %s from PyTorch's extension cache", what, name)
    else:
        log.warning("attnscale: building %s %s with torch.utils.cpp_extension (about 30 s, "
                    "once per machine; cached after)", what, name)
    try:
        from torch.utils.cpp_extension import load

        module = load(name=name, sources=[str(source)],
                      extra_cflags=["-O3", "-fopenmp", *FLAGS[isa]],
                      extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as err:  # any build failure means: use the fallback
        reason = f"{what} did not build ({type(err).__name__}: {err})"
        warnings.warn(f"attnscale: {reason}; using the slower Python path", stacklevel=3)
        return None, reason
    finally:
        os.environ["PATH"] = path
    return module, isa


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
        """Build or load now: {"module", "isa", "reason", "cached"} (cached: whether an
        up-to-date build was found, as :func:`is_cached` reports it)."""
        try:
            isa = target_isa()
        except ValueError:
            isa = None  # build() reports the same error as the reason
        cached = (isa is not None and self.source.is_file()
                  and is_cached(f"attnscale_{self.stem}_{isa.lower()}", self.source))
        module, info = build(self.stem, self.source, self.what, self.log)
        return {"module": module, "isa": info if module is not None else None,
                "reason": None if module is not None else info, "cached": cached}

    def active(self) -> ModuleType | None:
        """The module a qualifying call uses now: None while :meth:`forced_fallback` holds."""
        return None if self.forced else self.module()

    def status(self) -> dict[str, Any]:
        """{"isa": the capability built for or None, "cached", "reason": why there is no kernel
        or None, "path": "native" or the fallback's name (what a qualifying call takes now)}.
        Builds the kernel if needed."""
        native = self.module() is not None and not self.forced
        return {"isa": self.state["isa"], "cached": self.state["cached"],
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
