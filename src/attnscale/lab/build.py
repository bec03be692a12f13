"""Building a run from its :class:`TrainConfig`: the task, the model, the optimizer, gradient
clipping and the learning-rate schedule (linear warmup, then cosine decay to ``min_lr_ratio``·lr).

``absorb_scale`` is an exact reparametrization, not an approximation. With c = d_k^(−1/4), train
an unscaled score on W_q' = c·W_q, W_k' = c·W_k: the logits are q'·k' = (q·k)/√d_k, and the
gradients are g' = g/c. AdamW then reproduces scaled attention step for step when, for the q
and k projections only, (1) the init is multiplied by c, (2) the LR by c (Adam's m/√v is
invariant to the gradient's scale, so Δ W' = c·Δ W), (3) Adam's ε by 1/c (m'/(√v' + ε') =
m/(√v + c·ε')), (4) weight decay is independent of the LR (W' and W decay by the same factor,
as here), and (5) gradient clipping reads the norm the scaled model would see (each q, k
gradient times c), so both clip by the same coefficient. Without (3) and (5) the arms drift
apart: ε matters where √v is small and a global clip sees a different norm.
"""

from __future__ import annotations

import math
from dataclasses import fields

import torch
from torch import nn

from attnscale.core.nn import MultiheadSelfAttention
from attnscale.lab.config import TrainConfig
from attnscale.lab.models import GPT, GPTConfig
from attnscale.lab.tasks import Task, make_task

__all__ = ["absorb_factor", "build_model", "build_optimizer", "build_task", "clip_gradients",
           "gpt_config", "lr_at", "qk_projections"]


def build_task(config: TrainConfig) -> Task:
    """The task of ``config`` (its options over :data:`attnscale.lab.config.TASK_DEFAULTS`)."""
    return make_task(config.task.name, seq_len=config.task.seq_len, seed=config.seed,
                     **config.task_options())


def qk_projections(model: nn.Module) -> list[nn.Parameter]:
    """The query and key projection parameters of every MultiheadSelfAttention in ``model``."""
    return [p for m in model.modules() if isinstance(m, MultiheadSelfAttention)
            for proj in (m.q_proj, m.k_proj) for p in proj.parameters()]


def absorb_factor(config: TrainConfig) -> float:
    """c = d_k^(−1/4) under ``absorb_scale``, else 1: the q and k projections' init and LR are
    multiplied by c and their Adam ε divided by it (module docstring: exactly scaled_dot)."""
    m = config.model
    return (m.d_model // m.n_heads) ** -0.25 if m.absorb_scale else 1.0


def build_model(config: TrainConfig, task: Task) -> GPT:
    """A :class:`GPT` sized for ``task`` (vocabulary, length, causal), seeded by ``config.seed``
    (q and k projections multiplied by :func:`absorb_factor`)."""
    torch.manual_seed(config.seed)
    model = GPT(gpt_config(config, task))
    factor = absorb_factor(config)
    if factor != 1.0:
        with torch.no_grad():
            for p in qk_projections(model):
                p.mul_(factor)
    return model


def gpt_config(config: TrainConfig, task: Task) -> GPTConfig:
    """The :class:`GPTConfig` of ``config`` on ``task``: every field of the model section that
    GPTConfig has, by name; the score's parameters (:meth:`TrainConfig.score_kwargs`); the
    sizes and the cue from the task."""
    shared = ({f.name for f in fields(GPTConfig)} & set(type(config.model).model_fields)
              - {"score_params"})
    return GPTConfig(**{name: getattr(config.model, name) for name in shared},
                     score_params=config.score_kwargs(), vocab_size=task.vocab_size,
                     seq_len=task.seq_len, causal=task.causal,
                     cue_at=getattr(task, "cue_at", "embedding"))


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over groups keyed by (decays?, lr factor); weight decay made independent (λ/η);
    torch's fused implementation where every parameter is a float on CPU or CUDA.

    Linear and embedding weights decay; everything else (norms, score parameters) does not.
    Learning-rate factors come from ``model.lr_scales()`` if it has one (µP), else 1, times
    :func:`absorb_factor` for the q and k projections.
    """
    scales = model.lr_scales() if hasattr(model, "lr_scales") else {}
    absorbed = {id(p) for p in qk_projections(model)} if config.model.absorb_scale else set()
    c, opt = absorb_factor(config), config.optim
    decays = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    groups: dict[tuple[bool, float, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        qk = id(p) in absorbed
        lr_factor = scales.get(name, 1.0) * (c if qk else 1.0)
        groups.setdefault((id(p) in decays, lr_factor, qk), []).append(p)
    param_groups = [
        {
            "params": params,
            "lr_scale": factor,
            "weight_decay": opt.weight_decay / (opt.lr * factor) if decay else 0.0,
            "eps": opt.adam_eps / c if qk else opt.adam_eps,
        }
        for (decay, factor, qk), params in groups.items()
    ]
    # torch's fused kernel: one pass over each group instead of a dozen ops per tensor (5% of
    # a small run's time on CPU); the same update up to float rounding
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point
                for p in model.parameters())
    return torch.optim.AdamW(
        param_groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.adam_eps,
        fused=fused or None)


def clip_gradients(model: nn.Module, config: TrainConfig) -> float:
    """Clip the gradients to norm ``config.optim.grad_clip`` (0: off) and return the norm before.

    Under ``absorb_scale`` the norm is the one the scaled model would see (the q and k
    gradients times c = :func:`absorb_factor`), and every gradient is multiplied by the same
    coefficient min(1, clip/(norm + 1e-6)) as :func:`torch.nn.utils.clip_grad_norm_` uses."""
    max_norm = config.optim.grad_clip if config.optim.grad_clip > 0 else math.inf
    c = absorb_factor(config)
    if c == 1.0:
        return float(nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    qk = {id(p) for p in qk_projections(model)}
    grads = [(p.grad, c if id(p) in qk else 1.0) for p in model.parameters()
             if p.grad is not None]
    if not grads:
        return 0.0
    norm = float(torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(g.detach()) * k for g, k in grads])))
    coef = max_norm / (norm + 1e-6)
    coef = min(1.0, coef) if math.isfinite(norm) else coef  # torch's: a NaN norm spreads NaN
    if not coef >= 1.0:
        for g, _ in grads:
            g.detach().mul_(coef)
    return norm


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio·lr (formula in the module docstring)."""
    opt = config.optim
    if step < opt.warmup_steps:
        return opt.lr * (step + 1) / opt.warmup_steps
    span = max(1, opt.steps - opt.warmup_steps)
    progress = min(1.0, (step - opt.warmup_steps) / span)
    floor = opt.lr * opt.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (opt.lr - floor)
