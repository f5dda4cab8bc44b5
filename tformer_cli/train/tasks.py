"""What the loop trains on: data, batches in a (seed, epoch)-determined order, loss and evaluation.

One task per data kind; the loop in `loop.py` only calls the methods below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.data import pattern
from tformer_cli.errors import ConfigError
from tformer_cli.model import build_model
from tformer_cli.schema import Config


@dataclass
class Stats:
    """Sums over a stretch of batches (loss is summed per example/token so averages are exact)."""

    loss_sum: float = 0.0
    correct: int = 0
    count: int = 0

    def add(self, other: Stats) -> None:
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.count += other.count

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.count, 1)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.count, 1)


class ClassifierTask:
    """PatternSequence classification: examples are (tokens, label), the metric is accuracy."""

    unit = "examples"

    def __init__(self, config: Config) -> None:
        p = config.data.pattern
        self.config = config
        self.data = pattern.generate(p.seed, p.n_examples, p.n_train, p.seq_len, p.vocab_size, p.n_classes, p.pattern_len)
        self.vocab_size, self.n_classes = p.vocab_size, p.n_classes

    def build_model(self) -> nn.Module:
        fields = dataclasses.asdict(self.config.model)
        kind = fields.pop("kind")
        return build_model(kind, vocab_size=self.vocab_size, n_classes=self.n_classes, pad_id=pattern.PAD_ID, **fields)

    def batches(self, epoch: int) -> list[Tensor]:
        """Index batches of the training set: a permutation drawn from (run.seed, epoch) only."""
        gen = torch.Generator().manual_seed(self.config.run.seed * 100_003 + epoch)
        order = torch.randperm(self.data.train_tokens.size(0), generator=gen)
        return list(order.split(self.config.train.batch_size))

    def loss(self, model: nn.Module, batch: Tensor, device: torch.device) -> tuple[Tensor, Stats]:
        """Mean cross-entropy over the batch, and its sums for logging."""
        tokens = self.data.train_tokens[batch].to(device)
        labels = self.data.train_labels[batch].to(device)
        logits = model(tokens)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.config.train.label_smoothing)
        correct = int((logits.argmax(-1) == labels).sum())
        return loss, Stats(float(loss.detach()) * len(batch), correct, len(batch))

    @torch.inference_mode()
    def predict(self, model: nn.Module, device: torch.device, batch_size: int = 500) -> tuple[Tensor, Tensor]:
        """(logits (N_valid, C), labels (N_valid,)) on the validation split."""
        model.eval()
        logits = [model(chunk.to(device)).float().cpu() for chunk in self.data.valid_tokens.split(batch_size)]
        return torch.cat(logits), self.data.valid_labels

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation loss and accuracy."""
        logits, labels = self.predict(model, device)
        return {
            "loss": float(F.cross_entropy(logits, labels)),
            "accuracy": float((logits.argmax(-1) == labels).float().mean()),
        }


def make_task(config: Config) -> ClassifierTask:
    """The task for `data.kind` (a closed set)."""
    match config.data.kind:
        case "pattern":
            return ClassifierTask(config)
        case "text" | "parallel":
            raise ConfigError(
                f"data.kind={config.data.kind} needs `tformer prepare`, which this version does not have yet; "
                "use data.kind=pattern"
            )
    raise ConfigError(f"unknown data.kind {config.data.kind!r}")
