"""train.ema_decay: an exponential moving average of the weights, the model that validation scores and checkpoints
hold (Polyak averaging; Marian's --exponential-smoothing, fairseq's --ema-decay, timm's ModelEmaV3).

After the t-th update since the average began, each averaged weight moves towards the trained one:

    avg <- avg + d_t (w - avg),    d_t = max(1 - ema_decay, 9 / (t + 10))

so early in training the average follows the weights closely (d_1 = 0.82) and settles at 1 - ema_decay once
t > 9 / (1 - ema_decay) - 10 (Marian's src/optimizers/exponential_smoothing.cpp; timm's warm-up is the same).

A checkpoint's `model` is the average: what `translate`, `eval`, `export`, `average` and `train.init_from` read.
The trained weights ride beside it under `TRAINED`, with the average's update count under `EMA_UPDATES`, so that a
resumed run goes on exactly (a run resumed with ema_decay 0 trains on from the trained weights; one resumed with
ema_decay > 0 from a checkpoint without an average starts the average there).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from tformer_cli.run.checkpoints import EMA_UPDATES, TRAINED


class WeightAverage:
    """The exponential moving average of `model`'s trained parameters (fp32 copies, on the model's device)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model, self.decay, self.updates = model, decay, 0
        self.params = [p for p in model.parameters() if p.requires_grad]  # tied weights once
        self.avg = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the weights after an update (one foreach lerp)."""
        self.updates += 1
        weight = max(1.0 - self.decay, 9.0 / (self.updates + 10))
        torch._foreach_lerp_(self.avg, [p.detach().float() for p in self.params], weight)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside the block the model holds the average (validation scores it); the trained weights come back on
        exit, exception or not. In place: a compiled graph of the model stays valid."""
        with torch.no_grad():
            trained = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.data for p in self.params], self.avg)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in self.params], trained)

    def checkpoint(self) -> dict[str, Any]:
        """What a checkpoint stores: `model` the average (every other entry of the state dict as it is), the
        trained weights under TRAINED, the count under EMA_UPDATES."""
        average = {id(p): avg for p, avg in zip(self.params, self.avg, strict=True)}
        trained = self.model.state_dict(keep_vars=True)  # the parameters themselves, to find their averages
        return {
            "model": {name: average.get(id(t), t).detach() for name, t in trained.items()},
            TRAINED: {name: t.detach() for name, t in trained.items()},
            EMA_UPDATES: self.updates,
        }

    def resume(self, state: dict[str, Any]) -> None:
        """Take the average of a checkpoint `checkpoint` wrote; from one without (ema_decay was 0), start it at the
        weights the model was resumed with (`model` already loaded from the checkpoint's trained weights)."""
        if TRAINED not in state:
            return
        names = [name for name, p in self.model.named_parameters() if p.requires_grad]  # self.params' order
        with torch.no_grad():
            for name, avg in zip(names, self.avg, strict=True):
                avg.copy_(state["model"][name])
        self.updates = int(state[EMA_UPDATES])


def trained_weights(state: dict[str, Any]) -> dict[str, Tensor]:
    """The weights a checkpoint's run trained on: TRAINED where it kept an average, else `model`."""
    return state[TRAINED] if TRAINED in state else state["model"]
