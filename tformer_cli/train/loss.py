"""The training loss without the whole batch's logits: output projection and cross-entropy in pieces.

`token_loss` (metrics.py) takes logits (N, V) and, like every textbook, computes them all first: at
the paper's batch (25k target tokens, a vocabulary of 37k) they are 3.7 GB in fp32, and their
log-softmax and gradient as much again each. `linear_cross_entropy` takes the decoder's last hidden
states (N, D) and the output weight (V, D) instead and goes `train.loss_chunk` tokens at a time: each
piece's logits, fp32 log-softmax, loss sums and gradient, then the gradients of the hidden states and
of the weight (the piece's logits are dropped before the next). The backward pass only scales the
gradients it kept by the loss's upstream gradient (the loss is a scalar). The numbers are token_loss's
(same formula; tested within float tolerance, gradients included); peak memory is one piece's logits.

The same technique as Liger-Kernel's FusedLinearCrossEntropy and Apple's Cut Cross-Entropy, written
here in plain PyTorch. With train.compile, each piece's softmax, sums and gradient (`_piece`) go through
torch.compile (a few fused kernels instead of a pass over the piece's fp32 values per line); the products
with the weight stay matmuls.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from tformer_cli.data.batching import PAD_ID
from tformer_cli.errors import first_line
from tformer_cli.log import console
from tformer_cli.metrics import Stats, token_loss
from tformer_cli.schema import TrainConfig


def bare_model(net: nn.Module) -> nn.Module:
    """The model inside `net`'s wrappers (DistributedDataParallel's `module`, torch.compile's `_orig_mod`)."""
    while True:
        inner = getattr(net, "_orig_mod", None) or getattr(net, "module", None)
        if inner is None:
            return net
        net = inner


def _piece(logits: Tensor, targets: Tensor, real: Tensor, smoothing: float, grads: bool) -> tuple[Tensor, ...]:
    """One piece of the loss from its logits (n, V) in the model's dtype: (loss sum, correct, and with `grads`
    d(loss sum)/d(logits) (n, V) in the logits' dtype), in fp32 as token_loss computes it.

    Eagerly each line is a pass over the piece's fp32 values (in place where it can be); train.compile
    compiles it (`_compiled_piece`) into a few kernels that read the logits once or twice.
    """
    log_p = logits.float().log_softmax(-1)  # (n, V)
    safe = targets.masked_fill(~real, 0)[:, None]  # padding rows gather any id, then count 0
    nll = -log_p.gather(1, safe).squeeze(1)
    per_token = (1.0 - smoothing) * nll - smoothing * log_p.mean(-1)
    loss_sum = (per_token * real).sum()
    correct = ((logits.argmax(-1) == targets) & real).sum()
    if not grads:
        return loss_sum, correct
    # d(per_token)/d(logits) = softmax - ((1 - eps) one_hot(t) + eps / V), 0 on padding rows
    g = log_p.exp_()
    g.scatter_add_(1, safe, torch.full_like(nll, smoothing - 1.0)[:, None]).sub_(smoothing / logits.size(-1))
    return loss_sum, correct, g.mul_(real[:, None]).to(logits.dtype)


class _CompiledPiece:
    """`_piece` through torch.compile, one graph for every piece size (the rows marked dynamic) and smoothing
    (a constant of the graph); where compiling fails, `_piece` itself from then on, with a warning (as
    train.compile's own check falls back to the eager model).

    The smoothing is specialized on purpose: as a symbolic float input (torch.compile's default for floats, and
    what dynamic=True does), inductor's CPU code gets the gradient wrong (torch 2.13: wrong at smoothing 0 in a
    fresh graph, and at any value once a graph made for another value is reused; the compiled cases of
    tests/unit/train/test_chunked_loss.py fail that way).
    """

    def __init__(self) -> None:
        self.compiled: Any = None
        self.failed = False

    def __call__(self, logits: Tensor, *args: Any) -> tuple[Tensor, ...]:
        if not self.failed:
            try:
                if self.compiled is None:
                    self.compiled = torch.compile(_piece)
                for rows in (logits, *args[:2]):  # logits, targets, real
                    torch._dynamo.maybe_mark_dynamic(rows, 0)
                with torch._dynamo.config.patch(specialize_float=True):
                    return self.compiled(logits, *args)
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:  # compilers fail in many ways; a real error raises again below, eagerly
                self.failed = True
                console.print(
                    f"[yellow]warning:[/] train.loss_chunk: torch.compile failed ({first_line(exc)}); "
                    "pieces run eagerly"
                )
        return _piece(logits, *args)


_compiled_piece = _CompiledPiece()


class _LinearCrossEntropy(torch.autograd.Function):
    """loss = mean over real targets of label-smoothed cross-entropy(hidden @ weight.T); gradients made in forward."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, smoothing: float, chunk: int, compiled: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        w = weight.to(hidden.dtype)  # autocast's cast of the weight (a no-op in fp32)
        real = targets != PAD_ID
        count = real.sum()
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if grads else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grads else None
        piece = _compiled_piece if compiled else _piece
        for start in range(0, hidden.size(0), chunk):
            h, t, r = hidden[start : start + chunk], targets[start : start + chunk], real[start : start + chunk]
            piece_sum, piece_correct, *g = piece(h @ w.T, t, r, smoothing, grads)  # the piece's logits (n, V)
            loss_sum += piece_sum
            correct += piece_correct
            if grad_hidden is not None and grad_weight is not None:  # made when grads
                grad_hidden[start : start + chunk] = g[0] @ w
                grad_weight += (g[0].T @ h).float()
            del g
        denominator = count.clamp_min(1).to(torch.float32)
        if grads:
            ctx.save_for_backward(grad_hidden, grad_weight, denominator)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(loss_sum, correct, count)
        return loss_sum / denominator, loss_sum, correct, count

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, *_: Any) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight, denominator = ctx.saved_tensors
        scale = grad_loss / denominator
        return (
            (grad_hidden * scale.to(grad_hidden.dtype)) if ctx.needs_input_grad[0] else None,
            (grad_weight * scale).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None,
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, smoothing: float, chunk: int, compiled: bool = False
) -> tuple[Tensor, Stats]:
    """token_loss(hidden @ weight.T, targets, smoothing), `chunk` tokens at a time; statistics stay on the device.

    Args:
        hidden: (..., D) the decoder's last hidden states, any float dtype (the loss is taken in fp32).
        weight: (V, D) the output projection (tied to the embedding or not).
        targets: (...) token ids, PAD_ID where there is no token.
        smoothing: label smoothing.
        chunk: tokens per piece (>= 1): one piece's logits (chunk x V in fp32, three times over) is the
            memory this takes beyond the gradients it keeps.
        compiled: each piece's softmax, sums and gradient through torch.compile (train.compile); the products
            with the weight are matmuls either way.

    Returns:
        The mean loss over real targets (differentiable in hidden and weight) and its sums as 0-dim tensors.
    """
    loss, loss_sum, correct, count = _LinearCrossEntropy.apply(
        hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1), smoothing, chunk, compiled
    )
    return loss, Stats(loss_sum, correct, count)


_outside: Any = None  # linear_cross_entropy behind torch.compiler.disable, once made (`outside_graphs`)


def outside_graphs() -> Any:
    """`linear_cross_entropy` as a compiled training step (train.compile) calls it: torch.compile leaves its graph
    at the hidden states and runs this after it, eagerly, its pieces compiled on their own. Its pieces are counted
    in Python from the token count: traced, every new count would recompile.

    Made at the first call, not by a decorator at import: torch.compiler.disable imports torch._dynamo, which would
    slow the start of every command (tests/unit/test_import_cost.py). step.compiled makes it before torch.compile
    traces a step (made while tracing, it would be traced itself)."""
    global _outside
    if _outside is None:
        _outside = torch.compiler.disable(
            linear_cross_entropy, reason="train.loss_chunk's pieces run after the compiled forward"
        )
    return _outside


def output_loss(out: Tensor, targets: Tensor, model: nn.Module, train: TrainConfig) -> tuple[Tensor, Stats]:
    """The training loss of a token-predicting model's output: `out` is its logits, or with train.loss_chunk its
    last hidden states (the model called with head=False), projected here by its output weight in pieces
    (compiled with train.compile)."""
    if not train.loss_chunk:
        return token_loss(out, targets, train.label_smoothing)
    weight = cast(nn.Linear, bare_model(model).output).weight  # a token-predicting model's output layer
    loss = outside_graphs() if train.compile else linear_cross_entropy
    return loss(out, weight, targets, train.label_smoothing, train.loss_chunk, train.compile)
