"""The training loss without the whole batch's logits: output projection and cross-entropy in pieces.

`token_loss` (validation.py) takes logits (N, V) and, like every textbook, computes them all first: at
the paper's batch (25k target tokens, a vocabulary of 37k) they are 3.7 GB in fp32, and their
log-softmax and gradient as much again each. `linear_cross_entropy` takes the decoder's last hidden
states (N, D) and the output weight (V, D) instead and goes `train.loss_chunk` tokens at a time: each
piece's logits, fp32 log-softmax, loss sums and gradient, then the gradients of the hidden states and
of the weight (the piece's logits are dropped before the next). The backward pass only scales the
gradients it kept by the loss's upstream gradient (the loss is a scalar). The numbers are token_loss's
(same formula; tested within float tolerance, gradients included); peak memory is one piece's logits.

The same technique as Liger-Kernel's FusedLinearCrossEntropy and Apple's Cut Cross-Entropy, written
here in plain PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tformer_cli.data.batching import PAD_ID
from tformer_cli.schema import TrainConfig
from tformer_cli.validation import Stats, token_loss


def bare_model(net: nn.Module) -> nn.Module:
    """The model inside `net`'s wrappers (DistributedDataParallel's `module`, torch.compile's `_orig_mod`)."""
    while True:
        inner = getattr(net, "_orig_mod", None) or getattr(net, "module", None)
        if inner is None:
            return net
        net = inner


class _LinearCrossEntropy(torch.autograd.Function):
    """loss = mean over real targets of label-smoothed cross-entropy(hidden @ weight.T); gradients made in forward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, smoothing: float, chunk: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        vocab = weight.size(0)
        w = weight.to(hidden.dtype)  # autocast's cast of the weight (a no-op in fp32)
        real = targets != PAD_ID
        count = real.sum()
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if grads else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grads else None
        for start in range(0, hidden.size(0), chunk):
            h, t, r = hidden[start : start + chunk], targets[start : start + chunk], real[start : start + chunk]
            logits = (h @ w.T).float()  # (n, V): the piece's logits, in fp32 as token_loss takes them
            log_p = logits.log_softmax(-1)
            safe = t.masked_fill(~r, 0)[:, None]  # padding rows gather any id, then count 0
            nll = -log_p.gather(1, safe).squeeze(1)
            per_token = (1.0 - smoothing) * nll - smoothing * log_p.mean(-1)
            loss_sum += (per_token * r).sum()
            correct += ((logits.argmax(-1) == t) & r).sum()
            if grads:
                # d(per_token)/d(logits) = softmax - ((1 - eps) one_hot(t) + eps / V), 0 on padding rows
                g = log_p.exp_()
                g.scatter_add_(1, safe, torch.full_like(nll, smoothing - 1.0)[:, None]).sub_(smoothing / vocab)
                g = g.mul_(r[:, None]).to(hidden.dtype)
                grad_hidden[start : start + chunk] = g @ w
                grad_weight += (g.T @ h).float()
            del logits, log_p
        denominator = count.clamp_min(1).to(torch.float32)
        if grads:
            ctx.save_for_backward(grad_hidden, grad_weight, denominator)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(loss_sum, correct, count)
        return loss_sum / denominator, loss_sum, correct, count

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, *_: Any) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        grad_hidden, grad_weight, denominator = ctx.saved_tensors
        scale = grad_loss / denominator
        return (
            (grad_hidden * scale.to(grad_hidden.dtype)) if ctx.needs_input_grad[0] else None,
            (grad_weight * scale).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, smoothing: float, chunk: int
) -> tuple[Tensor, Stats]:
    """token_loss(hidden @ weight.T, targets, smoothing), `chunk` tokens at a time; statistics stay on the device.

    Args:
        hidden: (..., D) the decoder's last hidden states, any float dtype (the loss is taken in fp32).
        weight: (V, D) the output projection (tied to the embedding or not).
        targets: (...) token ids, PAD_ID where there is no token.
        smoothing: label smoothing.
        chunk: tokens per piece (>= 1): one piece's logits (chunk x V in fp32, three times over) is the
            memory this takes beyond the gradients it keeps.

    Returns:
        The mean loss over real targets (differentiable in hidden and weight) and its sums as 0-dim tensors.
    """
    loss, loss_sum, correct, count = _LinearCrossEntropy.apply(
        hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1), smoothing, chunk
    )
    return loss, Stats(loss_sum, correct, count)


def output_loss(out: Tensor, targets: Tensor, model: nn.Module, train: TrainConfig) -> tuple[Tensor, Stats]:
    """The training loss of a token-predicting model's output: `out` is its logits, or with train.loss_chunk its
    last hidden states (the model called with head=False), projected here by its output weight in pieces."""
    if not train.loss_chunk:
        return token_loss(out, targets, train.label_smoothing)
    weight = bare_model(model).output.weight
    return linear_cross_entropy(out, weight, targets, train.label_smoothing, train.loss_chunk)
