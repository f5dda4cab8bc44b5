"""PatternSequence: the textbook's synthetic classification task.

Each class c owns a 5-token pattern. A sequence is `seq_len` tokens drawn uniformly from
{first_token .. vocab_size - 1} (0 is padding, 1 is reserved), with its class's pattern written over
it at a uniformly random position. A model must find the pattern, wherever it is, to name the class.

Everything comes from one seeded `torch.Generator`, so (seed, sizes) fixes the data set exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tformer_cli.schema import PatternConfig

PAD_ID = 0  # the same id as tokenizer.PAD_ID: every model reserves 0 for padding


@dataclass(frozen=True)
class PatternData:
    """The generated examples, already split."""

    train_tokens: Tensor  # (N_train, T) int64
    train_labels: Tensor  # (N_train,) int64
    valid_tokens: Tensor  # (N_valid, T)
    valid_labels: Tensor  # (N_valid,)
    patterns: Tensor  # (n_classes, pattern_len)
    positions: Tensor  # (N,) where each example's pattern starts (train rows, then valid rows)


def make_patterns(gen: torch.Generator, n_classes: int, pattern_len: int, vocab_size: int, first_token: int) -> Tensor:
    """`n_classes` distinct patterns of distinct-looking random tokens (redrawn on collision)."""
    patterns: list[tuple[int, ...]] = []
    while len(patterns) < n_classes:
        candidate = tuple(torch.randint(first_token, vocab_size, (pattern_len,), generator=gen).tolist())
        if candidate not in patterns:
            patterns.append(candidate)
    return torch.tensor(patterns, dtype=torch.long)


def generate(
    seed: int,
    n_examples: int = 10_000,
    n_train: int = 8_000,
    seq_len: int = 64,
    vocab_size: int = 100,
    n_classes: int = 10,
    pattern_len: int = 5,
    first_token: int = 2,
) -> PatternData:
    """Generate the data set; the first `n_train` examples are training, the rest validation.

    Args:
        seed: the only source of randomness.
        n_examples: training plus validation examples.
        n_train: how many of them are for training.
        seq_len: tokens per sequence.
        vocab_size: tokens are drawn from first_token .. vocab_size - 1.
        n_classes: number of classes (and patterns).
        pattern_len: tokens per pattern.
        first_token: smallest ordinary token id (0 = padding, 1 = reserved).

    Returns:
        The split data, the patterns and the planted positions.
    """
    gen = torch.Generator().manual_seed(seed)
    patterns = make_patterns(gen, n_classes, pattern_len, vocab_size, first_token)
    tokens = torch.randint(first_token, vocab_size, (n_examples, seq_len), generator=gen)
    labels = torch.randint(0, n_classes, (n_examples,), generator=gen)
    starts = torch.randint(0, seq_len - pattern_len + 1, (n_examples,), generator=gen)
    columns = starts[:, None] + torch.arange(pattern_len)[None, :]  # (N, pattern_len)
    tokens.scatter_(1, columns, patterns[labels])
    return PatternData(
        train_tokens=tokens[:n_train],
        train_labels=labels[:n_train],
        valid_tokens=tokens[n_train:],
        valid_labels=labels[n_train:],
        patterns=patterns,
        positions=starts,
    )


def generate_from(p: PatternConfig) -> PatternData:
    """The data set a recipe's `data.pattern` section describes."""
    return generate(p.seed, p.n_examples, p.n_train, p.seq_len, p.vocab_size, p.n_classes, p.pattern_len)
