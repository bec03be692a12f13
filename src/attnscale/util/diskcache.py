"""An on-disk cache for deterministic computations that take seconds and depend only on code.

The explorer's exact theory grids take 25-35 s on a 2-core machine and are the same for every
report and every process until the code that computes them changes; this keeps one JSON file
per key under ``$ATTNSCALE_CACHE`` (default ``~/.cache/attnscale``), so a second process reads
them instead. The key holds what the value depends on -- its arguments, and the hashes of the
source files that compute it (:func:`source_digest`) -- so an edit never serves a stale value.

* Files are written to a private name and renamed into place in one step: a process killed while
  writing leaves no half-written file, only an ignored temporary one.
* Two processes that miss together take turns through the same ``flock`` the kernel builds use
  (:func:`attnscale.util.jitcache.turn`): the second waits (one log line) and reads the first's
  value, instead of computing it again.
* An unreadable file is recomputed and replaced; a folder that cannot be written is no error
  (the value is computed and returned, with one log line).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnscale.util import jitcache

ENV = "ATTNSCALE_CACHE"
WAIT = 600.0  # seconds to wait on another process computing the same value


def folder() -> Path:
    """``$ATTNSCALE_CACHE``, else ``$XDG_CACHE_HOME/attnscale``, else ``~/.cache/attnscale``."""
    given = os.environ.get(ENV, "").strip()
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnscale"


def source_digest(*paths: str | os.PathLike) -> str:
    """sha256 over the bytes of the given files, in order (16 hex digits)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def path_of(name: str, key: dict[str, Any]) -> Path:
    """The file that holds ``name``'s value for ``key`` (sorted-key JSON, hashed)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return folder() / f"{name}-{digest[:16]}.json"


def read(path: Path, log: logging.Logger) -> Any | None:
    """The JSON value stored at ``path``, or None where there is none or it is unreadable."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as err:
        log.warning("attnscale: ignoring the unreadable cache file %s (%s)", path, err)
        return None


def cached_json(name: str, key: dict[str, Any], compute: Callable[[], Any],
                log: logging.Logger) -> Any:
    """``compute()``'s JSON value for ``key``, from the cache when stored there, else computed,
    stored and returned. ``compute`` must return plain JSON (lists, dicts, floats, ...)."""
    path = path_of(name, key)
    value = read(path, log)
    if value is not None:
        return value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("attnscale: cannot cache %s in %s (%s)", name, path.parent, err)
        return compute()
    with jitcache.turn(path.with_suffix(".lock"), f"the cached {name}", log, WAIT):
        value = read(path, log)  # stored by the process this one waited for
        if value is None:
            value = compute()
            write(path, value, log)
    return value


def write(path: Path, value: Any, log: logging.Logger) -> None:
    """Store ``value`` at ``path`` through a private file renamed into place."""
    try:
        handle, private = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                           dir=path.parent)
    except OSError as err:
        log.warning("attnscale: cannot write the cache file %s (%s)", path, err)
        return
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(value, out)
        os.replace(private, path)
    except OSError as err:
        log.warning("attnscale: cannot write the cache file %s (%s)", path, err)
    finally:  # a value json cannot write (a bug) raises, and leaves no private file
        Path(private).unlink(missing_ok=True)
