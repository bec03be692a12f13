"""Where a result came from: package versions, git revision, machine."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("attnscale", "torch", "numpy", "scipy", "transformers", "ray")


@functools.cache
def versions() -> dict[str, str]:
    """Installed versions of attnscale, Python and the packages results depend on."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


@functools.cache
def git_revision() -> str:
    """The git commit of the attnscale checkout ("+dirty" if modified), or "unknown"."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict[str, object]:
    """CPU facts for benchmark records."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
