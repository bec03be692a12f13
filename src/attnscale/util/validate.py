"""One home for argument checks: each raises ``TypeError`` or ``ValueError`` naming the argument.

Scalars go through pydantic (strict types, so ``True`` is not an int and ``"3"`` is not a
number); arrays (the theory functions accept numpy broadcasting) through numpy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from numpy.typing import ArrayLike
from pydantic import AllowInfNan, Strict, StrictInt, TypeAdapter, ValidationError

_INT = TypeAdapter(StrictInt)
_NUMBER = TypeAdapter(Annotated[float, Strict(), AllowInfNan(True)] | StrictInt)


def _plain(value: Any) -> Any:
    """numpy scalars count as Python numbers."""
    return value.item() if isinstance(value, (np.integer, np.floating)) else value


def check_int(name: str, value: Any, minimum: int | None = 1, maximum: int | None = None) -> int:
    """``value`` as an int in [minimum, maximum] (either bound may be None)."""
    try:
        out = _INT.validate_python(_plain(value))
    except ValidationError:
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}") from None
    if (minimum is not None and out < minimum) or (maximum is not None and out > maximum):
        raise ValueError(f"{name} must be an int in [{minimum}, {maximum}]; got {out}")
    return out


def check_float(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_inclusive: bool = False,
    high_inclusive: bool = False,
) -> float:
    """``value`` as a finite float in the interval (low, high), ends included when asked."""
    try:
        out = float(_NUMBER.validate_python(_plain(value)))
    except ValidationError:
        raise TypeError(f"{name} must be a number; got {type(value).__name__} {value!r}") from None
    ok_low = out >= low if low_inclusive else out > low
    ok_high = out <= high if high_inclusive else out < high
    if not (math.isfinite(out) and ok_low and ok_high):
        lo, hi = "[" if low_inclusive else "(", "]" if high_inclusive else ")"
        raise ValueError(f"{name} must be finite and lie in {lo}{low}, {high}{hi}; got {out}")
    return out


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``."""
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {value!r}")
    return value


def check_array(
    name: str,
    value: ArrayLike,
    *,
    minimum: float | None = None,
    strict: bool = False,
    integer: bool = False,
) -> np.ndarray:
    """``value`` as a finite float array, each entry >= minimum (> minimum if ``strict``) and
    integral if ``integer``."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number or array; got {value!r}") from None
    bad = ~np.isfinite(arr)
    if minimum is not None:
        bad |= (arr <= minimum) if strict else (arr < minimum)
    if integer:
        bad |= arr != np.round(arr)
    if bad.any():
        kind = "an integer" if integer else "finite"
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise ValueError(f"{name} must be {kind}{bound}; got {value!r}")
    return arr


def check_input_file(name: str, path: str | os.PathLike) -> Path:
    """``path`` if it is an existing regular file, else ValueError naming ``name``."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{name}: {path} is a directory, not a file")
    if not p.is_file():
        raise ValueError(f"{name}: no file at {path}")
    return p


def check_output_folder(name: str, path: str | os.PathLike) -> Path:
    """``path`` created if needed and writable, else ValueError naming ``name``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{name}: {path} is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{name}: cannot create the folder {path} ({e.strerror})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: the folder {path} is not writable")
    return p


def check_output_file(name: str, path: str | os.PathLike) -> Path:
    """``path`` if a file can be written there (its folder is created), else ValueError."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{name}: {path} is a directory, not a file")
    check_output_folder(name, p.parent)
    return p
