"""Memory-mapped token arrays and the batch orders built over them.

- `TokenArray`: one split/side written by `prepare`, read through `np.memmap` (the loader's memory
  does not grow with the corpus).
- `token_budget_batches`: like fairseq's --max-tokens: each batch holds at most `max_tokens` tokens
  counting padding (n_sentences x longest), sentences grouped by length, the order a function of
  (seed, epoch) only. Resuming at batch k is `batches[k:]`.
- `lm_blocks`: the token stream cut into blocks of block_size + 1 (inputs and shifted targets); `block_offset`:
  where an epoch's cut begins (train.shift_blocks).
- `lm_rows`, `pair_rows`, `pad_rows`: a batch of indices gathered into padded tensors (what training
  and validation feed the model); `multiple` rounds the padded length up to a multiple of it
  (train.pad_to_multiple): fewer distinct batch shapes, sizes that suit tensor cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import overload

import numpy as np
import torch
from torch import Tensor

from tformer_cli.errors import DataError
from tformer_cli.tokenizer import BOS_ID, PAD_ID


class TokenArray:
    """Sequences stored as one flat array plus offsets (n + 1), memory-mapped."""

    def __init__(self, bin_path: Path, idx_path: Path, dtype: str) -> None:
        for path in (bin_path, idx_path):
            if not path.is_file():
                raise DataError(f"prepared data not found: {path} (run `tformer prepare` with this recipe)")
        self.offsets = np.fromfile(idx_path, dtype=np.int64)
        self.tokens: np.ndarray = np.memmap(bin_path, dtype=dtype, mode="r")  # from_rows: an array in memory
        if self.offsets[-1] != self.tokens.size:
            raise DataError(f"{bin_path}: {self.tokens.size} tokens but {idx_path} indexes {self.offsets[-1]}")
        self.lengths = np.diff(self.offsets)

    @classmethod
    def from_rows(cls, rows: Sequence[np.ndarray | list[int]], dtype: np.dtype | str) -> TokenArray:
        """The same structure in memory, from the rows themselves (data/bpe_dropout.py's epochs)."""
        array = cls.__new__(cls)
        array.lengths = np.array([len(row) for row in rows], dtype=np.int64)
        array.offsets = np.concatenate([[0], np.cumsum(array.lengths)]).astype(np.int64)
        array.tokens = np.fromiter((t for row in rows for t in row), dtype=dtype, count=int(array.offsets[-1]))
        return array

    def __len__(self) -> int:
        return self.lengths.size

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]], dtype=np.int64)

    def padded(self, index: np.ndarray, multiple: int = 1, bos: bool = False) -> Tensor:
        """Sequences `index` right-padded with PAD_ID into (B, T), T the longest rounded up to `multiple`; with
        `bos` each shifted right by one, BOS_ID first and its last token dropped (a decoder's input).

        One gather from the memory map for the whole batch: a training step waits for its batch, and a loop
        over its rows is Python per sentence (bench/batch_assembly.py; docs/benchmarks.md, "The host's share
        of an update").
        """
        lengths = self.lengths[index][:, None]  # (B, 1)
        cols = np.arange(int(padded_length(int(lengths.max()), multiple))) - bos  # (T,) where each column reads
        real = (cols >= 0) & (cols < lengths - bos)  # (B, T)
        where = np.where(real, self.offsets[index][:, None] + cols, 0)
        rows = np.where(real, self.tokens[where], PAD_ID).astype(np.int64)
        if bos:
            rows[:, 0] = BOS_ID
        return torch.from_numpy(rows)


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


def token_budget_batches(lengths: np.ndarray, max_tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Split example indices into batches of at most `max_tokens` tokens including padding.

    Args:
        lengths: (N,) the size of each example (for pairs: the longer side).
        max_tokens: budget per batch, counted as n_examples x longest example.
        seed, epoch: the only inputs to the order (shuffle, then stable sort by length, so equal
            lengths are in random order; then the batches themselves are shuffled).

    Returns:
        Index arrays covering every example exactly once.
    """
    if lengths.size and int(lengths.max()) > max_tokens:
        raise DataError(f"an example has {int(lengths.max())} tokens, more than train.max_tokens={max_tokens}")
    rng = _rng(seed, epoch)
    shuffled = rng.permutation(lengths.size)
    order = shuffled[np.argsort(lengths[shuffled], kind="stable")]
    batches, start, longest = [], 0, 0
    for i, index in enumerate(order):
        longest_if_added = max(longest, int(lengths[index]))
        if (i - start + 1) * longest_if_added > max_tokens:
            batches.append(order[start:i])
            start, longest_if_added = i, int(lengths[index])
        longest = longest_if_added
    if start < order.size:
        batches.append(order[start:])
    return [batches[i] for i in rng.permutation(len(batches))]


def lm_blocks(n_tokens: int, block_size: int, offset: int = 0) -> np.ndarray:
    """Start offsets of the non-overlapping blocks of block_size + 1 tokens in a stream of n_tokens, the first
    block at `offset` (the tokens before it are not in any block)."""
    n_blocks = (n_tokens - 1 - offset) // block_size
    if n_blocks < 1:
        raise DataError(f"{n_tokens} tokens are too few for one block of data.block_size={block_size}")
    return offset + np.arange(n_blocks, dtype=np.int64) * block_size


def block_offset(n_tokens: int, block_size: int, seed: int, epoch: int) -> int:
    """Where epoch `epoch`'s blocks begin (train.shift_blocks): a number in [0, block_size) drawn from (seed,
    epoch), so each epoch cuts the stream elsewhere and no block repeats an earlier epoch's; 0 where the stream
    holds one block only."""
    room = min(block_size, n_tokens - block_size)  # an offset up to n_tokens - 1 - block_size keeps one block
    return int(np.random.default_rng([seed, epoch, 1]).integers(room)) if room > 1 else 0


def shuffled_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """A permutation of range(n) from (seed, epoch), cut into batches of batch_size (last may be short)."""
    order = _rng(seed, epoch).permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


@overload
def padded_length(length: np.ndarray, multiple: int) -> np.ndarray: ...
@overload
def padded_length(length: int, multiple: int) -> int: ...
def padded_length(length: np.ndarray | int, multiple: int) -> np.ndarray | int:
    """`length` (a number or an array of them) rounded up to a multiple of `multiple` (1: unchanged)."""
    return -(-length // multiple) * multiple


def pair_sizes(src: TokenArray, tgt: TokenArray, multiple: int = 1) -> np.ndarray:
    """(N,) what each pair counts against train.max_tokens: the longer of source and target + 1, padded.

    Rounded up to `multiple` as `pair_rows` pads, so that a batch's tensors stay within the budget.
    """
    return padded_length(np.maximum(src.lengths, tgt.lengths + 1), multiple)


def pad_rows(rows: list[np.ndarray], multiple: int = 1) -> Tensor:
    """Right-pad 1-D id arrays with PAD_ID into (B, T), T the longest row rounded up to `multiple`."""
    width = int(padded_length(max(len(r) for r in rows), multiple))
    out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.from_numpy(np.asarray(row, dtype=np.int64))
    return out


def lm_rows(stream: np.ndarray, starts: np.ndarray, block_size: int) -> tuple[Tensor, Tensor]:
    """Block starts -> (inputs (B, block), targets (B, block)), targets shifted by one."""
    rows = torch.from_numpy(np.asarray(stream[starts[:, None] + np.arange(block_size + 1)], dtype=np.int64))
    return rows[:, :-1], rows[:, 1:]  # (B, block) each: one gather from the stream for the whole batch


def pair_rows(src: TokenArray, tgt: TokenArray, index: np.ndarray, multiple: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Pair indices -> padded (source (B, S), decoder input (B, T), target (B, T)); S and T multiples of `multiple`.

    The targets end with EOS; the decoder input is the target shifted right, BOS first.
    """
    return src.padded(index, multiple), tgt.padded(index, multiple, bos=True), tgt.padded(index, multiple)
