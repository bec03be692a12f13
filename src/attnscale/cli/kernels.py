"""``attnscale kernels``: which native kernels this machine runs, and building them once.

The kernel modules (torch) are imported when the command runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from attnscale.cli.app import app
from attnscale.cli.tables import print_table

COLUMNS = ("kernel", "path", "build", "ISA", "note")
BUILDS = {"installed": "installed (built at install)", "cache": "just-in-time (cached)",
          "built": "just-in-time (built now)"}


def kernel_names() -> dict[str, tuple[str, str]]:
    """Each native kernel's stem -> (what it serves, its C++ source)."""
    from attnscale.core import native as core_native
    from attnscale.core import native_rows
    from attnscale.measure import native as monitor_native

    return {core_native.STEM: ("soft-capping attention (core)", core_native.SOURCE),
            native_rows.STEM: ("q/k row normalization (core)", native_rows.SOURCE),
            monitor_native.STEM: ("monitor statistics (measure)", monitor_native.SOURCE)}


def cached_rows(target: str) -> list[tuple[str, ...]]:
    """One row per native kernel without building or loading anything: whether an installed
    build fits this environment, or the just-in-time cache holds one for it."""
    from attnscale.util import cppext

    rows = []
    for stem, (what, source) in kernel_names().items():
        if target == "off":
            rows.append((what, "python", "-", "off", f"${cppext.ENV}=off"))
            continue
        origin, where = cppext.locate(stem, source, target)
        if origin is None:
            rows.append((what, "-", "not built", target, f"{where}: builds on first use, "
                         "or now with --build"))
        else:
            rows.append((what, "native", BUILDS[origin], target, where))
    return rows


def kernel_rows() -> list[tuple[str, ...]]:
    """One row per native kernel: what it serves, the path calls take, where its build came
    from, the ISA built for, and why it is not native where it is not. Builds (or loads)
    each kernel."""
    from attnscale.core import native as core_native
    from attnscale.core import native_rows
    from attnscale.measure import native as monitor_native
    from attnscale.util import cppext

    names = kernel_names()
    rows = []
    for what, status in ((names[core_native.STEM][0], core_native.kernel_status()),
                         (names[native_rows.STEM][0], native_rows.kernel_status())):
        rows.append((what, status["path"], BUILDS.get(status["origin"], "-"),
                     status["isa"] or "-", status["reason"] or "-"))
    mon_isa = monitor_native.isa()
    origin = cppext.ORIGINS.get((monitor_native.STEM, mon_isa or ""), (None, ""))[0]
    rows.append((names[monitor_native.STEM][0], "native" if mon_isa else "python",
                 BUILDS.get(origin, "-"), mon_isa or "-",
                 monitor_native.unavailable_reason() or "-"))
    return rows


@app.command()
def kernels(
    build: Annotated[bool, typer.Option(
        "--build", help="Build (or load) every kernel now and say which build is in use.")]
    = False,
) -> None:
    """Which native kernels this machine has: the installed build, a just-in-time one, or none;
    --build loads (or builds) them now and shows the path each takes: native, or the fallback
    and why.

    ``$ATTNSCALE_NATIVE_ISA`` forces AVX512, AVX2, generic (portable C++) or off;
    ``$ATTNSCALE_PREBUILT=off`` ignores the installed builds."""
    from attnscale.util import cppext

    target = cppext.target_isa() or "off"  # a bad $ATTNSCALE_NATIVE_ISA: ValueError naming it
    rows = kernel_rows() if build else cached_rows(target)
    print_table(f"native kernels (target ISA: {target})", COLUMNS, rows, left=COLUMNS)
