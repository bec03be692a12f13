"""attnscale: why attention divides by √d_k, and what the alternatives do.

>>> import torch, attnscale
>>> q = k = v = torch.randn(2, 4, 16, 8)
>>> attnscale.attention(q, k, v, score="cosine", tau=10.0).shape
torch.Size([2, 4, 16, 8])
"""

from attnscale.core.attention import attention, reference_attention
from attnscale.core.reference import attention_logits
from attnscale.core.scores import SCORES, Score, get_score, register

__version__ = "0.2.0"

_LAZY = {  # heavier public names, imported on first use
    "MultiheadSelfAttention": "attnscale.core.nn",
    "Monitor": "attnscale.measure.monitor",
    "attention_stats": "attnscale.measure.stats",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnscale' has no attribute {name!r}")


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
