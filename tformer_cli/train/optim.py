"""Optimiser and learning-rate schedules (a pure function of the update number, and of the time spent where
train.fit_schedule_to_time fits the schedule to train.max_minutes)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tformer_cli.errors import ConfigError
from tformer_cli.model.layers import Block
from tformer_cli.precision import fast_bf16
from tformer_cli.schema import TrainConfig
from tformer_cli.train.muon import MuonAdamW


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam or AdamW over all trainable parameters, with the recipe's betas, eps and weight decay; or Muon on the
    weight matrices of the Transformer blocks and AdamW on the rest (train/muon.py).

    On CUDA the fused implementation (one kernel for every parameter's update, instead of a handful of
    kernels per parameter group: the same rule); elsewhere PyTorch's default (foreach).
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    fused = bool(trainable) and all(p.is_cuda for p in trainable)
    groups: list[dict[str, Any]] = [{"params": trainable}]
    if not cfg.decay_norms_biases_embeddings:  # decay only the weight matrices of linear layers
        matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        decay = [p for p in trainable if id(p) in matrices and id(p) not in embeddings]
        groups = [
            {"params": decay},
            {"params": [p for p in trainable if id(p) not in {id(q) for q in decay}], "weight_decay": 0.0},
        ]
    match cfg.optimizer:
        case "muon":
            return _muon_adamw(model, groups, cfg)
        case "adam":
            return torch.optim.Adam(
                groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused or None
            )
        case "adamw":
            return torch.optim.AdamW(
                groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused or None
            )
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def _muon_adamw(model: nn.Module, groups: list[dict[str, Any]], cfg: TrainConfig) -> MuonAdamW:
    """AdamW's `groups` less the weights of the blocks' linear layers, which form a Muon group of their own."""
    in_blocks = [m for block in model.modules() if isinstance(block, Block) for m in block.modules()]
    matrices = {id(m.weight) for m in in_blocks if isinstance(m, nn.Linear) and m.weight.requires_grad}
    if not matrices:
        raise ConfigError("train.optimizer=muon steps the weight matrices of Transformer blocks: this model has none")
    muon = [p for g in groups for p in g["params"] if id(p) in matrices]
    adamw = [{**g, "params": [p for p in g["params"] if id(p) not in matrices]} for g in groups]
    native, _ = fast_bf16(muon[0].device)
    return MuonAdamW(
        [{"params": muon, "muon": True}, *(g for g in adamw if g["params"])],
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        ns_dtype=torch.bfloat16 if native else torch.float32,
    )


IMPLEMENTATION = ("fused", "foreach", "capturable")  # how an update runs, not what it computes


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a checkpoint's optimizer state, keeping this optimizer's implementation (fused on CUDA, foreach
    elsewhere): every parameter group of a checkpoint carries the flags of the device that wrote it.

    The flags are this optimizer's before PyTorch reads the state, since they place the step counters: on the
    parameters' device for the fused update, on the CPU otherwise (a CPU run resumed on CUDA would otherwise
    keep its counters on the CPU, which the fused kernel refuses).
    """
    groups = state["param_groups"]
    if len(groups) == len(optimizer.param_groups):  # else PyTorch refuses the checkpoint, in its own words
        groups = [
            {**saved, **{key: group.get(key) for key in IMPLEMENTATION}}
            for saved, group in zip(groups, optimizer.param_groups, strict=True)
        ]
    optimizer.load_state_dict({**state, "param_groups": groups})


def lr_at(step: int, cfg: TrainConfig, d_model: int, total_steps: int, time_spent: float = 0.0) -> float:
    """Learning rate for update `step` (1-based).

    - inverse_sqrt: the paper's lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
      (train.lr is not used: the formula sets the scale).
    - cosine: linear warm-up to train.lr over warmup_steps, then half a cosine down to
      min_lr_ratio * lr at total_steps, or sooner: `time_spent` is the fraction of the decay's time budget spent
      (train.fit_schedule_to_time; 0 otherwise), and the decay follows whichever fraction is the larger.
    - constant: linear warm-up, then train.lr.
    """
    step = max(step, 1)
    warmup = cfg.warmup_steps
    match cfg.schedule:
        case "inverse_sqrt":
            return cfg.lr_scale * d_model**-0.5 * min(step**-0.5, step * max(warmup, 1) ** -1.5)
        case "constant":
            return cfg.lr * min(1.0, step / warmup) if warmup else cfg.lr
        case "cosine":
            if warmup and step <= warmup:
                return cfg.lr * step / warmup
            progress = min(1.0, max((step - warmup) / max(1, total_steps - warmup), time_spent))
            floor = cfg.min_lr_ratio * cfg.lr
            return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {cfg.schedule!r}")
