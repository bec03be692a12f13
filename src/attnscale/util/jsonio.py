"""One JSON helper: plain Python values from numpy, torch, dataclasses and paths, NaN-free.

Non-finite floats become ``None`` so that every file parses as strict JSON (browsers and
``jsonschema`` reject ``NaN``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """A JSON-ready copy of ``obj``: containers recursed, arrays listed, NaN/inf -> None."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "model_dump"):  # pydantic models
        return jsonable(obj.model_dump())
    if hasattr(obj, "detach") and hasattr(obj, "tolist"):  # torch tensors
        return jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(jsonable(obj))``, strict (``allow_nan=False``)."""
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)
