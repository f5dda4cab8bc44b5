"""train.optimizer=muon: Muon on the Transformer blocks' weight matrices, AdamW on every other parameter.

Muon (Jordan et al., 2024, "Muon: An optimizer for hidden layers in neural networks") keeps a Nesterov momentum
of each matrix's gradient, like SGD, and steps along that momentum orthogonalised: the matrix with the same
singular vectors and every singular value near 1, so that the rare directions of the gradient move as far as the
common ones. Five steps of a quintic Newton-Schulz iteration approximate it with matrix products alone.

Where it goes: the linear layers inside the blocks (attention's projections, the feed-forward layers; the fused
query-key-value projection is one matrix, orthogonalised whole, as torch.optim.Muon would take it). The token
embedding, the output projection (tied to it or not), norms and biases take AdamW, as in the method's own
recipe. The step of a matrix of shape (A, B) is scaled by 0.2 * sqrt(max(A, B)) (Liu et al., 2025, "Muon is
Scalable for LLM Training"; torch.optim.Muon's adjust_lr_fn="match_rms_adamw"): its size is then that of an
AdamW step, so one train.lr and one schedule drive both parts, and a rate tuned for AdamW is the place to
start. Weight decay is decoupled in both parts (the parameter shrinks by lr * weight_decay each update).

Written here in plain PyTorch (torch.optim.Muon exists from 2.9 only, for matrices alone); each part's update
equals PyTorch's own (torch.optim.AdamW, torch.optim.Muon): tests/unit/train/test_muon.py checks both, value
for value. Parameters are stepped one by one (no foreach kernels): on a GPU, a cost per parameter.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)  # the quintic's coefficients (Jordan et al.)
MOMENTUM = 0.95  # Muon's Nesterov momentum (the method's default; train.betas are AdamW's)


def orthogonalise(matrix: Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """`matrix` with its singular values pushed towards 1 (to within about 0.5 to 1.5), by `steps` quintic
    Newton-Schulz steps.

    X / ||X|| (all singular values <= 1), then X <- a X + (b X X^T + c (X X^T)^2) X, each step raising the small
    singular values towards 1; computed on the wide orientation (X X^T the smaller product), in `dtype`
    (bf16 where the device multiplies it natively: the iteration tolerates its rounding).
    """
    a, b, c = NEWTON_SCHULZ
    x = matrix.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over two kinds of parameter group: `muon: True` groups (2-D matrices) step by Muon, the
    others by AdamW; every group has lr, betas, eps and weight_decay (the training loop sets lr on all of them).
    """

    def __init__(
        self,
        groups: list[dict[str, Any]],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        ns_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "muon": False}
        super().__init__(groups, defaults)
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            if group["muon"] and any(p.ndim != 2 for p in group["params"]):
                raise ValueError("Muon steps 2-D weight matrices only")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: ARG002 - the Optimizer signature; no closure is used
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    (self._muon if group["muon"] else self._adamw)(p, group)
        return None

    def _muon(self, p: Tensor, group: dict[str, Any]) -> None:
        grad, lr = p.grad, group["lr"]
        assert grad is not None
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p)
        momentum = state["momentum_buffer"]
        momentum.lerp_(grad, 1 - MOMENTUM)
        direction = orthogonalise(grad.lerp(momentum, MOMENTUM), dtype=self.ns_dtype)  # Nesterov
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(direction.to(p.dtype), alpha=-lr * 0.2 * math.sqrt(max(p.shape)))

    def _adamw(self, p: Tensor, group: dict[str, Any]) -> None:
        grad, lr = p.grad, group["lr"]
        assert grad is not None
        (beta1, beta2), state = group["betas"], self.state[p]
        if not state:
            state["step"] = 0  # a number, not a tensor: reading it costs no device sync
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        step = state["step"]
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        p.mul_(1 - lr * group["weight_decay"])
        denominator = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2**step)).add_(group["eps"])
        p.addcdiv_(state["exp_avg"], denominator, value=-lr / (1 - beta1**step))
