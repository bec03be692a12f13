"""What identifies a build of one of attnscale's C++ kernels: its sources, flags and ABI.

Shared by the install-time build (``setup.py`` loads this file by path, so it imports nothing
but the standard library and, inside functions, torch) and by the run-time loader
(:mod:`attnscale.util.cppext`). A kernel is a file ``<layer>/csrc/<stem>.cpp``; its builds are
named ``<stem>_<isa>``, one per vector capability (:data:`FLAGS`):

* ``AVX512`` or ``AVX2`` on an x86 CPU that has it (what PyTorch itself dispatches to);
* ``generic`` everywhere else: ``CPU_CAPABILITY=DEFAULT``, whose ``at::vec::Vectorized`` is
  portable C++ (on aarch64 PyTorch's default build maps it onto NEON).

:func:`identity` lists everything that changes the binary -- torch's version, git revision and
C++ ABI, the Python extension ABI, the platform, the flags and a hash of the source -- and
:func:`key` hashes it with the compiler and the environment. An installed build records its
identity beside it and is used only while the running environment has the same one; a
just-in-time build is cached under a name that ends in its key, so two environments never load
or rebuild each other's builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sysconfig
from pathlib import Path
from typing import Any

# Compiler flags per capability; the kernels include ATen's vec headers, which read the macros.
FLAGS: dict[str, list[str]] = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "generic": ["-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"],
}
LDFLAGS = ("-fopenmp",)  # a tuple: PyTorch's builder appends to the lists it is given
PACKAGE = Path(__file__).resolve().parent.parent  # src/attnscale, or site-packages/attnscale
PREBUILT = "prebuilt"  # the package folder that holds the installed builds


def cflags(isa: str) -> list[str]:
    """The compiler flags of a build for ``isa`` (a key of :data:`FLAGS`)."""
    if isa not in FLAGS:
        raise ValueError(f"isa must be one of {', '.join(FLAGS)}, got {isa!r}")
    return ["-O3", "-fopenmp", *FLAGS[isa]]


def sources(package: Path = PACKAGE) -> dict[str, Path]:
    """{stem: source} for every kernel of the package (``*/csrc/<stem>.cpp``)."""
    found = sorted(package.glob("*/csrc/*.cpp"))
    return {path.stem: path for path in found}


def build_name(stem: str, isa: str) -> str:
    """The installed module's name, e.g. ``row_norms_avx512``."""
    return f"{stem}_{isa.lower()}"


def source_hash(source: Path) -> str:
    """sha256 of the source's bytes (an edit, not a touch, changes it)."""
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


def identity(isa: str, source: Path) -> dict[str, Any]:
    """Everything a build's binary depends on, for this environment (imports torch)."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "cxx11_abi": torch.compiled_with_cxx11_abi(),
        "extension_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": f"{platform.system()}-{platform.machine()}",
        "isa": isa,
        "cflags": cflags(isa),
        "ldflags": list(LDFLAGS),
        "source_sha256": source_hash(source),
    }


def key(identity_: dict[str, Any], environment: str) -> str:
    """A 12-hex-digit hash of a build's identity, the compiler (``$CXX``, as PyTorch's builder
    reads it) and the environment that builds it (the real path of torch's installation: a
    just-in-time build belongs to one environment)."""
    compiler = os.environ.get("CXX", "c++")
    text = json.dumps({**identity_, "compiler": compiler, "environment": environment},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def mismatch(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first field in which an installed build's recorded identity differs from this
    environment's, as a phrase ("torch: built for 2.12.0, running 2.13.0"), or None."""
    for field, value in current.items():
        if recorded.get(field) != value:
            return f"{field}: built for {recorded.get(field)!r}, running {value!r}"
    return None
