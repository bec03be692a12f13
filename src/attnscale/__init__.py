"""attnscale: why attention divides by √d_k, and what the alternatives do.

>>> import torch, attnscale
>>> q = k = v = torch.randn(2, 4, 16, 8)
>>> attnscale.attention(q, k, v, score="cosine", tau=10.0).shape
torch.Size([2, 4, 16, 8])
"""

from attnscale.attention import attention, reference_attention
from attnscale.scores import SCORES, Score, get_score, register

__version__ = "0.1.0"
__all__ = [
    "SCORES",
    "Score",
    "__version__",
    "attention",
    "get_score",
    "reference_attention",
    "register",
]
