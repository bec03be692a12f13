"""A just-in-time build cache for attnscale's kernels that a killed build cannot break.

PyTorch's own ``cpp_extension.load`` builds in a shared folder guarded by a ``lock`` file; a
process killed during the build leaves that file behind and every later process waits on it
forever. Here instead:

* each build has its own folder, ``<root>/<name>`` with ``name`` ending in the build's key
  (:func:`attnscale.util.kernelspec.key`), so no two environments, torch versions or sources
  share one;
* a build compiles in a private temporary folder beside it and is renamed into place in one
  step, so the folder either holds a whole library or does not exist;
* builders of one name take turns through an ``flock`` on ``<root>/<name>.lock``, which the
  operating system releases when its holder dies however it dies: a lock left by a dead process
  is never waited on. Waiting on a live builder logs one line naming it, and after
  ``$ATTNSCALE_BUILD_WAIT`` seconds (300) the waiter builds on its own (the rename keeps that
  safe): nothing waits for ever.

The root is ``$ATTNSCALE_KERNEL_CACHE``, else ``$TORCH_EXTENSIONS_DIR``, else PyTorch's default
extension folder, with ``attnscale/`` appended.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows: no flock; private folders and the rename still keep builds whole
    fcntl = None  # type: ignore[assignment]

WAIT_ENV = "ATTNSCALE_BUILD_WAIT"
DEFAULT_WAIT = 300.0  # seconds; one build takes 20-60 s on 2 cores
POLL = 0.2


def root() -> Path:
    """The cache folder (module docstring)."""
    from torch.utils.cpp_extension import get_default_build_root

    base = (os.environ.get("ATTNSCALE_KERNEL_CACHE") or os.environ.get("TORCH_EXTENSIONS_DIR")
            or get_default_build_root())
    return Path(base) / "attnscale"


def library(name: str) -> Path:
    """Where the library of build ``name`` lies once it is built."""
    return root() / name / f"{name}.so"


def import_library(name: str, path: Path) -> ModuleType:
    """Import the extension module ``name`` from the library file ``path``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_limit() -> float:
    """Seconds to wait on another process's build: ``$ATTNSCALE_BUILD_WAIT``, else 300."""
    text = os.environ.get(WAIT_ENV, "").strip()
    try:
        wait = float(text) if text else DEFAULT_WAIT
    except ValueError:
        raise ValueError(f"${WAIT_ENV} must be a number of seconds, got {text!r}") from None
    if not wait >= 0:
        raise ValueError(f"${WAIT_ENV} must be >= 0, got {text!r}")
    return wait


@contextlib.contextmanager
def turn(lock: Path, what: str, log: logging.Logger, wait: float) -> Iterator[bool]:
    """Hold the build lock ``lock`` for the block; yields whether it is held (False: no flock on
    this system, or ``wait`` seconds passed while a live process held it)."""
    if fcntl is None:
        yield False
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as handle:
        held = try_lock(handle)
        if not held:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            log.warning("attnscale: waiting for %s, which is building %s (giving up after "
                        "%.0f s, $%s)", holder, what, wait, WAIT_ENV)
            deadline = time.monotonic() + wait
            while not held and time.monotonic() < deadline:
                time.sleep(POLL)
                held = try_lock(handle)
            if not held:
                log.warning("attnscale: gave up waiting for %s; building %s on its own",
                            holder, what)
        if held:
            handle.truncate(0)
            handle.write(f"process {os.getpid()}")
            handle.flush()
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


def try_lock(handle: IO[str]) -> bool:
    """Take the exclusive flock on an open file without blocking; whether it was taken."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def clear_leftovers(name: str) -> list[Path]:
    """Remove the private folders that killed builds of ``name`` left (their process is gone);
    returns them."""
    gone = []
    for folder in root().glob(f".{name}.*.tmp"):
        pid = folder.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    return gone


def load_or_build(name: str, source: Path, cflags: Sequence[str], ldflags: Sequence[str],
                  what: str, log: logging.Logger, identity: dict[str, Any]
                  ) -> tuple[ModuleType, str]:
    """The module ``name`` from the cache, built first where it is missing; returns (module,
    "cache" or "built"). Build errors propagate (the caller falls back)."""
    path = library(name)
    if path.is_file():
        return import_library(name, path), "cache"
    with turn(root() / f"{name}.lock", what, log, wait_limit()):
        if path.is_file():  # built by the process this one waited for
            return import_library(name, path), "cache"
        log.warning("attnscale: building %s %s with torch.utils.cpp_extension (about 20 s, "
                    "once per environment; cached after)", what, name)
        return build_into_place(name, source, cflags, ldflags, identity), "built"


def build_into_place(name: str, source: Path, cflags: Sequence[str], ldflags: Sequence[str],
                     identity: dict[str, Any]) -> ModuleType:
    """Compile in a private folder, then rename it to ``<root>/<name>`` in one step."""
    from torch.utils.cpp_extension import load

    clear_leftovers(name)
    root().mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=f".{os.getpid()}.tmp",
                                    dir=root()))
    try:
        module = load(name=name, sources=[str(source)], extra_cflags=list(cflags),
                      extra_ldflags=list(ldflags), build_directory=str(private), verbose=False)
        (private / "build.json").write_text(json.dumps(identity, indent=1, sort_keys=True))
        private.chmod(0o755)  # mkdtemp's 0700 would hide the build from the machine's others
        with contextlib.suppress(OSError):  # another process put a whole build there first
            private.rename(root() / name)
    finally:  # a failed, interrupted or redundant build leaves nothing behind
        shutil.rmtree(private, ignore_errors=True)
    return module
