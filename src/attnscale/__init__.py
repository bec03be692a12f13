"""attnscale: why attention divides by √d_k, and what the alternatives do.

>>> import torch, attnscale
>>> q = k = v = torch.randn(2, 4, 16, 8)
>>> attnscale.attention(q, k, v, score="cosine", tau=10.0).shape
torch.Size([2, 4, 16, 8])

Every public name but ``__version__`` is imported on first use (PEP 562 ``__getattr__``), so
``import attnscale`` (and with it the ``attnscale`` command's start) does not import torch:
``from attnscale import attention`` works as before and imports torch then.
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

# public name -> the module defining it, imported on first use
_LAZY = {
    "attention": "attnscale.core.attention",
    "reference_attention": "attnscale.core.attention",
    "attention_logits": "attnscale.core.reference",
    "SCORES": "attnscale.core.scores",
    "Score": "attnscale.core.scores",
    "get_score": "attnscale.core.scores",
    "register": "attnscale.core.scores",
    "MultiheadSelfAttention": "attnscale.core.nn",
    "Monitor": "attnscale.measure.monitor",
    "attention_stats": "attnscale.measure.stats",
}


def __getattr__(name: str) -> object:
    """A public name of :data:`_LAZY`, imported from its module now and kept in the package's
    namespace, so the second use costs a dictionary look-up."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attnscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's own names and every lazy public name (not yet imported ones included)."""
    return sorted({*globals(), *_LAZY})


__all__ = [
    "SCORES",
    "Monitor",
    "MultiheadSelfAttention",
    "Score",
    "__version__",
    "attention",
    "attention_logits",
    "attention_stats",
    "get_score",
    "reference_attention",
    "register",
]
