"""A small GPT whose attention score is one setting.

A pre-LN Transformer (decoder by default, encoder with ``causal=False``), written to read like
nanoGPT's ``model.py``: one plain file, shape comments, GPT-2's initialization. The attention is
:class:`attnscale.core.nn.MultiheadSelfAttention`, so every registered score works, with its
learnable parameters (cosine temperature, QK-norm weights, log-length ``s``).

Block (pre-LN, no biases, as Wortsman et al. 2023 use)::

    x = x + attn(LN(x))
    x = x + mlp(LN(x))          mlp(x) = W₂ GELU(W₁ x), hidden width 4·d_model

``mlp=False`` drops the second line: attention-only blocks, as Zoology's MQAR models use
(Arora et al. 2023, state mixer = identity).

Inputs: ``tokens`` (B, T) int64 and an optional ``scale`` (B, T), the salience task's magnitude
cue (``Batch.scale``). ``cue_at`` says where it acts:

* ``"embedding"`` (default): it multiplies the token embedding before positions are added,
  ``h_t = scale_t·E[x_t] + P[t]``. Every block reads ``LN(h)``, so the first layer sees the cue
  only as a change of direction, and the value vectors and the residual stream carry it too.
* ``"key"``: it multiplies the key of token t in every attention layer after its projection
  (and RoPE), ``k_t = scale_t·W_K LN(h_t)``, and nothing else. The embedding, q and v are
  computed without it, and k is used only by the attention score, so the cue reaches the
  residual stream (and later layers) only through the attention weights. A dot-product logit
  q·k_t grows linearly in scale_t; cosine, τ·q·k/(‖q‖‖k‖), is exactly invariant to a positive
  scale_t (learned τ or not: τ is per head, not per key), so under ``"key"`` a cosine model's
  output does not depend on the cue at all.

Initialization (``init``):

* ``"gpt2"``: every linear and embedding weight ~ N(0, init_std²), init_std = 0.02, and the
  residual projections (attention output, MLP output) ~ N(0, (init_std/√n_res)²) with n_res the
  number of residual branches, 2·n_layers (Radford et al. 2019, GPT-2 §2.3; nanoGPT does the
  same; n_layers for attention-only blocks).
* ``"mup"``: the µP recipe of Yang et al. 2022 (Tensor Programs V, arXiv 2203.03466), relative
  to a base width d₀ = ``mup_base_width`` at which it equals ``"gpt2"``:

  - embeddings keep std init_std (input weights: constant in width);
  - hidden weights get variance ∝ 1/fan_in: std = init_std·√(d₀/fan_in) (the residual
    projections keep the extra 1/√n_res depth factor);
  - the output logits are multiplied by d₀/d_model (µP's 1/width readout multiplier; with tied
    embeddings the shared matrix is read out through the same multiplier, as mup's
    ``MuSharedReadout``), and an untied readout starts at zero;
  - the query projection starts at zero, as the paper recommends, so attention starts uniform.
    Not for scores that normalize q (cosine, qk_layernorm, qk_rmsnorm): the direction of a zero
    vector is undefined and its normalization has gradient ~1/eps, so they keep the hidden init;
  - :meth:`GPT.lr_scales` gives Adam's per-tensor learning-rate factor d₀/fan_in for hidden
    weights (µP's Adam rule); :mod:`attnscale.lab.train` applies it.

  ``init="mup"`` sets the weights' parametrization only; µP's attention logit q·k·c/d is the
  score ``"mup"``, chosen separately so the two effects can be measured apart.
* ``"unit"``: ``"gpt2"``, except that the query and key projections ~ N(0, 1/d_model). Their
  input is a LayerNorm output, whose d_model components have mean 0 and variance 1 per row, so
  each component of q and k has variance d_model·(1/d_model) = 1 at init: the regime of
  Vaswani et al. 2017's footnote 4 (arXiv 1706.03762), where q·k has variance d_k and 1/√d_k
  brings it back to 1. Under ``"gpt2"`` the same variance is d_model·init_std², e.g. 0.05 at
  d_model = 128, and unscaled logits start far below the softmax's saturation scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.core.scores import get_score
from attnscale.util.validate import check_choice, check_float, check_int

POS = ("learned", "rope", "none")
INITS = ("gpt2", "mup", "unit")
CUE_AT = ("embedding", "key")  # where GPT.forward applies ``scale`` (module docstring)


@dataclass
class GPTConfig:
    """Sizes and choices of :class:`GPT`.

    ``seq_len`` is the block size: the number of learned position embeddings (``pos="learned"``)
    and the L of QKNorm's g₀ = log₂(L² − L) (``temperature="qknorm"``). ``score_params`` holds the
    score's fixed parameters (tau, cap, c, s, eps, scale); ``s`` is the initial value of the
    learnable per-head ``s`` for ``log_length``. ``cue_at`` (:data:`CUE_AT`) is where
    :meth:`GPT.forward` applies its ``scale``.
    """

    vocab_size: int = 256
    seq_len: int = 64
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None
    n_layers: int = 2
    score: str = "scaled_dot"
    score_params: dict[str, float] = field(default_factory=dict)
    temperature: str = "fixed"
    pos: str = "learned"
    cue_at: str = "embedding"
    causal: bool = True
    init: str = "gpt2"
    init_std: float = 0.02
    mup_base_width: int = 128
    tie_embeddings: bool = True
    mlp: bool = True
    mlp_ratio: int = 4
    dropout: float = 0.0
    bias: bool = False
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        get_score(self.score)
        for name in ("vocab_size", "seq_len", "d_model", "n_layers", "mlp_ratio", "mup_base_width"):
            check_int(name, getattr(self, name))
        check_choice("pos", self.pos, POS)
        check_choice("cue_at", self.cue_at, CUE_AT)
        check_choice("init", self.init, INITS)
        check_float("init_std", self.init_std, low=0.0)


class MLP(nn.Module):
    """W₂ GELU(W₁ x): (B, T, C) -> (B, T, C), hidden width mlp_ratio·C."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.d_model
        self.fc = nn.Linear(config.d_model, hidden, bias=config.bias)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(hidden, config.d_model, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class KeyScaledAttention(MultiheadSelfAttention):
    """:class:`MultiheadSelfAttention` whose keys can be rescaled per token: k_t ← s_t·k_t.

    ``forward(x, key_scale=s)`` with s (B, N) multiplies each key after its projection and RoPE,
    before the score (so the ``capture`` hook and the monitor see the scaled keys); q and v are
    untouched. ``key_scale=None`` is the plain module.
    """

    key_scale: Tensor | None = None  # set for the duration of one forward call

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """As the parent's, then k (B, Hkv, N, d) times key_scale (B, N) per token."""
        q, k, v = super().split_heads(x)
        if self.key_scale is not None:
            k = k * self.key_scale[:, None, :, None].to(k.dtype)  # (B, Hkv, N, d)
        return q, k, v

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool | None = None,
        key_scale: Tensor | None = None,
    ) -> Tensor:
        """x (B, N, d_model) -> (B, N, d_model), keys scaled by ``key_scale`` (B, N) if given."""
        if key_scale is not None and key_scale.shape != x.shape[:2]:
            raise ValueError(f"key_scale must be (B, N) = {tuple(x.shape[:2])}, "
                             f"got shape {tuple(key_scale.shape)}")
        self.key_scale = key_scale
        try:
            return super().forward(x, attn_mask, is_causal)
        finally:
            self.key_scale = None


class Block(nn.Module):
    """Pre-LN Transformer block: x + attn(LN(x)), then x + mlp(LN(x)) (skipped if mlp=False)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.attn = KeyScaledAttention(
            config.d_model,
            config.n_heads,
            config.n_kv_heads,
            score=config.score,
            causal=config.causal,
            bias=config.bias,
            dropout=config.dropout,
            temperature=config.temperature,
            seq_len=config.seq_len,
            rotary=config.pos == "rope",
            rope_base=config.rope_base,
            **config.score_params,
        )
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.mlp:
            self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias)
            self.mlp = MLP(config)
        else:
            self.ln_2 = self.mlp = None

    def forward(self, x: Tensor, key_scale: Tensor | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); ``key_scale`` (B, T) multiplies the attention's keys."""
        x = x + self.resid_dropout(self.attn(self.ln_1(x), key_scale=key_scale))  # (B, T, C)
        if self.mlp is None:
            return x
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


class GPT(nn.Module):
    """Token embedding (+ positions) -> n_layers pre-LN blocks -> LN -> readout to vocab."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.wte = nn.Embedding(c.vocab_size, c.d_model)
        self.wpe = nn.Embedding(c.seq_len, c.d_model) if c.pos == "learned" else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model, bias=c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        # µP's readout multiplier 1/width, relative to the base width (1 under GPT-2 init).
        self.readout_mult = c.mup_base_width / c.d_model if c.init == "mup" else 1.0
        self.reset_parameters()

    # -- initialization ---------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """Initialize as in the module docstring (GPT-2, µP or unit-variance q/k)."""
        c = self.config
        residual_std = c.init_std / math.sqrt((2 if c.mlp else 1) * c.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=c.init_std)
            elif isinstance(module, nn.Linear) and module is not self.lm_head:
                is_residual = name.endswith(("attn.out_proj", "mlp.proj"))
                std = residual_std if is_residual else c.init_std
                nn.init.normal_(module.weight, std=std * self._width_factor(module))
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if not c.tie_embeddings:
            readout = nn.init.zeros_ if c.init == "mup" else self._normal_init
            readout(self.lm_head.weight)
        if c.init == "mup" and not get_score(c.score).normalizes_q:
            for block in self.blocks:
                nn.init.zeros_(block.attn.q_proj.weight)
        if c.init == "unit":  # unit-variance q and k components (module docstring)
            for block in self.blocks:
                for proj in (block.attn.q_proj, block.attn.k_proj):
                    nn.init.normal_(proj.weight, std=1.0 / math.sqrt(c.d_model))

    def _normal_init(self, weight: Tensor) -> None:
        nn.init.normal_(weight, std=self.config.init_std)

    def _width_factor(self, linear: nn.Linear) -> float:
        """√(d₀/fan_in) under µP (variance ∝ 1/fan_in), 1 under GPT-2."""
        if self.config.init != "mup":
            return 1.0
        return math.sqrt(self.config.mup_base_width / linear.in_features)

    def lr_scales(self) -> dict[str, float]:
        """Per-parameter Adam learning-rate factor by name: d₀/fan_in for µP hidden weights.

        Empty under GPT-2 init (every factor 1). Yang et al. 2022, Table 3 (Adam, hidden weights).
        """
        if self.config.init != "mup":
            return {}
        d0 = self.config.mup_base_width
        return {
            f"{name}.weight": d0 / module.in_features
            for name, module in self.named_modules()
            if isinstance(module, nn.Linear) and module is not self.lm_head
        }

    def attention_modules(self) -> list[MultiheadSelfAttention]:
        """The attention module of each layer, in order."""
        return [block.attn for block in self.blocks]

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (tied weights once); without position embeddings by default."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.wpe is not None:
            n -= self.wpe.weight.numel()
        return n

    # -- forward ----------------------------------------------------------------------------
    def forward(self, tokens: Tensor, scale: Tensor | None = None,
                at: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> logits (B, T, vocab); ``scale`` (B, T) multiplies the token
        embeddings (``cue_at="embedding"``) or every layer's keys (``cue_at="key"``).

        ``at`` (B, T) bool: the readout (final LayerNorm, vocabulary projection) only at those
        positions, logits (N, vocab) in row-major order. Positions are independent after the
        last block, so this is ``forward(tokens, scale)[at]`` up to float rounding; a task that
        labels one position in 33-65 (retrieval) skips most of the (B·T, vocab) projection and
        its gradient."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, T), got shape {tuple(tokens.shape)}")
        t = tokens.shape[1]
        if self.wpe is not None and t > self.config.seq_len:
            raise ValueError(
                f"sequence length {t} exceeds seq_len={self.config.seq_len} of the learned "
                f"position embeddings; use pos='rope' or 'none' for longer sequences"
            )
        if scale is not None and scale.shape != tokens.shape:
            raise ValueError(f"scale must be (B, T) = {tuple(tokens.shape)}, "
                             f"got shape {tuple(scale.shape)}")
        on_key = scale is not None and self.config.cue_at == "key"
        x = self.wte(tokens)  # (B, T, C)
        if scale is not None and not on_key:
            x = x * scale.unsqueeze(-1).to(x.dtype)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t, device=tokens.device))  # (B, T, C) + (T, C)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, scale if on_key else None)  # (B, T, C)
        if at is not None:
            if at.shape != tokens.shape or at.dtype != torch.bool:
                raise ValueError(f"at must be a bool (B, T) = {tuple(tokens.shape)} mask, "
                                 f"got {at.dtype} of shape {tuple(at.shape)}")
            x = x[at]  # (N, C)
        x = self.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab) or (N, vocab)
        return logits if self.readout_mult == 1.0 else logits * self.readout_mult

