"""train.precision=bf16-weights: the forward and backward passes run a bf16 copy of the model, the optimizer steps
an fp32 master copy (fairseq's --bf16, Megatron's bf16 with fp32 main parameters).

Under autocast (train.precision=bf16) the weights stay fp32 and every forward casts each of them to bf16, and
the backward casts each weight's gradient back: per update, two kernels and a full read and write per weight.
What that costs on a GPU is bench/gpu_train.py's to measure (its rows of tformer's step; docs/benchmarks.md).

The fp32 module (`master`) stays the run's model: what is validated, saved, resumed and averaged, so that a
checkpoint is the same whatever the precision. Its bf16 copy (`model`) is what the update runs, with tied weights
still tied and the position tables fp32 (run/load.py's `cast_weights`, as bf16 decoding). Once per update, after
the backward passes: the bf16 gradients become the master parameters' fp32 `.grad` (clipping and the finiteness
check read those), the optimizer steps the masters, and the bf16 weights are copied from them, rounded.

What differs from autocast: activations, layer norms' outputs and the residual stream are bf16 (autocast keeps
the residual stream and the layer norms in fp32); the loss is still taken in fp32 (train/tasks.py, train/loss.py);
with train.update_freq > 1 the micro-batches' gradients add up in fp32 in one process (each is cast and added
after its backward), in bf16 under DDP, which reduces them as they are at the update's last backward (as
fairseq's --bf16 does).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import cast

import torch
from torch import Tensor, nn

from tformer_cli.run.load import cast_weights


class MasterWeights:
    """An fp32 module and the bf16 copy that the passes run: gradients go to the first, weights back to the second."""

    def __init__(self, master: nn.Module) -> None:
        """`master`: the fp32 model, on its device, as built or resumed (its optimizer steps its parameters)."""
        self.master = master
        self.model = copy.deepcopy(master)  # deepcopy keeps tied weights tied
        cast_weights(self.model, torch.bfloat16)
        self.pairs = [
            (fp32, bf16)
            for fp32, bf16 in zip(master.parameters(), self.model.parameters(), strict=True)
            if fp32.requires_grad
        ]

    def parameters(self) -> list[nn.Parameter]:
        """The master parameters the optimizer steps (what clipping measures)."""
        return [fp32 for fp32, _ in self.pairs]

    def gradients_to_master(self) -> None:
        """Add each bf16 gradient, cast to fp32, into its master's `.grad` (made on the first), and clear the bf16
        model's: called after each micro-batch's backward, the micro-batches add up in fp32 (step.py calls it so
        in one process; under DDP the gradients stay in bf16 until the update's last backward has reduced them).
        A parameter without a gradient keeps its master's as it is. Foreach copies and adds: a few kernels, not
        one per parameter."""
        fresh = [(fp32, bf16) for fp32, bf16 in self.pairs if bf16.grad is not None and fp32.grad is None]
        more = [(fp32, bf16) for fp32, bf16 in self.pairs if bf16.grad is not None and fp32.grad is not None]
        if fresh:
            grads = [torch.empty_like(fp32) for fp32, _ in fresh]
            torch._foreach_copy_(grads, _grads(bf16 for _, bf16 in fresh))
            for (fp32, _), grad in zip(fresh, grads, strict=True):
                fp32.grad = grad
        if more:
            torch._foreach_add_(_grads(fp32 for fp32, _ in more), _grads(bf16 for _, bf16 in more))
        for _, bf16 in self.pairs:
            bf16.grad = None

    @torch.no_grad()
    def weights_from_master(self) -> None:
        """The bf16 weights set to the stepped masters, rounded (one foreach copy)."""
        # torch's stub asks for a list[Tensor], which a list[Parameter] is not to mypy (lists are invariant)
        torch._foreach_copy_([bf16 for _, bf16 in self.pairs], self.parameters())  # type: ignore[arg-type]


def _grads(parameters: Iterable[nn.Parameter]) -> list[Tensor]:
    """The gradients of `parameters`, which have one (the callers chose them so)."""
    return cast("list[Tensor]", [p.grad for p in parameters])
