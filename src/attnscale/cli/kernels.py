"""``attnscale kernels``: which native kernels this machine runs, and building them once."""

from __future__ import annotations

from typing import Annotated

import typer

from attnscale.cli.app import app
from attnscale.cli.tables import print_table
from attnscale.core import native as core_native
from attnscale.core import native_rows
from attnscale.measure import native as monitor_native
from attnscale.util import cppext

COLUMNS = ("kernel", "state", "ISA", "note")


NAMES = {core_native.STEM: "soft-capping attention (core)",
         native_rows.STEM: "q/k row normalization (core)",
         monitor_native.STEM: "monitor statistics (measure)"}
SOURCES = {core_native.STEM: core_native.SOURCE, native_rows.STEM: native_rows.SOURCE,
           monitor_native.STEM: monitor_native.SOURCE}


def cached_rows(target: str) -> list[tuple[str, str, str, str]]:
    """One row per native kernel without building anything: whether its build for ``target``
    lies in PyTorch's extension cache (a call will then load it in about a second)."""
    rows = []
    for stem, what in NAMES.items():
        built = target != "off" and cppext.is_cached(f"attnscale_{stem}_{target.lower()}",
                                                     SOURCES[stem])
        rows.append((what, "built (cached)" if built else "not built yet", target,
                     "-" if built else "builds on first use, or now with --build"))
    return rows


def kernel_rows() -> list[tuple[str, str, str, str]]:
    """One row per native kernel: what it serves, the path calls take, the ISA built for, and
    why it is not native where it is not. Builds (or loads) each kernel."""
    soft = core_native.kernel_status()
    rows = native_rows.kernel_status()
    mon_isa = monitor_native.isa()
    return [
        ("soft-capping attention (core)", soft["path"], soft["isa"] or "-",
         soft["reason"] or "-"),
        ("q/k row normalization (core)", rows["path"], rows["isa"] or "-",
         rows["reason"] or "-"),
        ("monitor statistics (measure)", "native" if mon_isa else "python", mon_isa or "-",
         monitor_native.unavailable_reason() or "-"),
    ]


@app.command()
def kernels(
    build: Annotated[bool, typer.Option(
        "--build", help="Build (or load) every kernel now and say which build is in use.")]
    = False,
) -> None:
    """Which native kernels this machine has built; --build builds (or loads) them now and
    shows the path each takes: native, or the fallback and why.

    ``$ATTNSCALE_NATIVE_ISA`` forces AVX512, AVX2, generic (portable C++) or off."""
    target = cppext.target_isa() or "off"  # a bad $ATTNSCALE_NATIVE_ISA: ValueError naming it
    rows = kernel_rows() if build else cached_rows(target)
    print_table(f"native kernels (target ISA: {target})", COLUMNS, rows, left=COLUMNS)
