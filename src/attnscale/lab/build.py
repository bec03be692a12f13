"""Building a run from its :class:`TrainConfig`: the task, the model, the optimizer and the
learning-rate schedule (linear warmup, then cosine decay to ``min_lr_ratio``·lr).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.lab.config import TrainConfig
from attnscale.lab.models import GPT, GPTConfig
from attnscale.lab.tasks import Task, make_task

__all__ = ["absorb_factor", "build_model", "build_optimizer", "build_task", "lr_at",
           "qk_projections"]


def build_task(config: TrainConfig) -> Task:
    """The task of ``config`` (its options over :data:`attnscale.lab.config.TASK_DEFAULTS`)."""
    return make_task(config.task, seq_len=config.seq_len, seed=config.seed, **config.task_options())


def qk_projections(model: nn.Module) -> list[nn.Parameter]:
    """The query and key projection parameters of every MultiheadSelfAttention in ``model``."""
    return [p for m in model.modules() if isinstance(m, MultiheadSelfAttention)
            for proj in (m.q_proj, m.k_proj) for p in proj.parameters()]


def absorb_factor(config: TrainConfig) -> float:
    """d_k^(−1/4) under ``absorb_scale``, else 1: multiplying both the q and k projections by
    it scales q·k by 1/√d_k, and (Adam's update being invariant to the gradient's scale) their
    LR by the same factor keeps their relative updates those of scaled_dot."""
    return (config.d_model // config.n_heads) ** -0.25 if config.absorb_scale else 1.0


def build_model(config: TrainConfig, task: Task) -> GPT:
    """A :class:`GPT` sized for ``task`` (vocabulary, length, causal), seeded by ``config.seed``
    (q and k projections multiplied by :func:`absorb_factor`)."""
    torch.manual_seed(config.seed)
    model = GPT(
        GPTConfig(
            vocab_size=task.vocab_size,
            seq_len=task.seq_len,
            d_model=config.d_model,
            n_heads=config.n_heads,
            n_kv_heads=config.n_kv_heads,
            n_layers=config.n_layers,
            score=config.score,
            score_params=config.score_kwargs(),
            temperature=config.temperature,
            pos=config.pos,
            causal=task.causal,
            init=config.init,
            init_std=config.init_std,
            tie_embeddings=config.tie_embeddings,
            mlp=config.mlp,
            cue_at=getattr(task, "cue_at", "embedding"),
        )
    )
    factor = absorb_factor(config)
    if factor != 1.0:
        with torch.no_grad():
            for p in qk_projections(model):
                p.mul_(factor)
    return model


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over groups keyed by (decays?, lr factor); weight decay made independent (λ/η).

    Linear and embedding weights decay; everything else (norms, score parameters) does not.
    Learning-rate factors come from ``model.lr_scales()`` if it has one (µP), else 1, times
    :func:`absorb_factor` for the q and k projections.
    """
    scales = model.lr_scales() if hasattr(model, "lr_scales") else {}
    absorbed = {id(p) for p in qk_projections(model)} if config.absorb_scale else set()
    factor = absorb_factor(config)
    decays = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    groups: dict[tuple[bool, float], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        lr_factor = scales.get(name, 1.0) * (factor if id(p) in absorbed else 1.0)
        groups.setdefault((id(p) in decays, lr_factor), []).append(p)
    param_groups = [
        {
            "params": params,
            "lr_scale": factor,
            "weight_decay": config.weight_decay / (config.lr * factor) if decay else 0.0,
        }
        for (decay, factor), params in groups.items()
    ]
    return torch.optim.AdamW(
        param_groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.adam_eps
    )


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio·lr (formula in the module docstring)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = config.lr * config.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - floor)
