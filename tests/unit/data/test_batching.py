"""Token-budget batching: budget, coverage, determinism, resumption; LM blocks; batches gathered into tensors."""

import numpy as np
import pytest
import torch

from tformer_cli.data.batching import (
    TokenArray,
    lm_blocks,
    lm_rows,
    pair_rows,
    shuffled_batches,
    token_budget_batches,
)
from tformer_cli.errors import DataError
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture
def lengths():
    return np.random.default_rng(0).integers(1, 60, size=2000)


def test_batches_never_exceed_the_budget(lengths):
    for epoch in range(3):
        for batch in token_budget_batches(lengths, 500, seed=1, epoch=epoch):
            assert len(batch) * lengths[batch].max() <= 500


def test_every_example_exactly_once_per_epoch(lengths):
    for epoch in range(3):
        batches = token_budget_batches(lengths, 500, seed=1, epoch=epoch)
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(lengths.size))


def test_order_is_a_function_of_seed_and_epoch_only(lengths):
    def flat(seed, epoch):
        return np.concatenate(token_budget_batches(lengths, 500, seed, epoch))

    assert np.array_equal(flat(1, 2), flat(1, 2))
    assert not np.array_equal(flat(1, 2), flat(1, 3))
    assert not np.array_equal(flat(1, 2), flat(2, 2))


def test_resuming_at_batch_k_continues_unchanged(lengths):
    full = token_budget_batches(lengths, 500, seed=1, epoch=4)
    resumed = token_budget_batches(lengths.copy(), 500, seed=1, epoch=4)[7:]
    assert all(np.array_equal(a, b) for a, b in zip(full[7:], resumed, strict=True))


def test_batches_group_similar_lengths(lengths):
    batches = token_budget_batches(lengths, 500, seed=1, epoch=0)
    padding = sum(len(b) * lengths[b].max() - lengths[b].sum() for b in batches)
    assert padding / lengths.sum() < 0.1


def test_example_longer_than_budget_is_an_error():
    with pytest.raises(DataError, match="more than train.max_tokens=10"):
        token_budget_batches(np.array([3, 11]), 10, seed=0, epoch=0)


def test_lm_blocks_and_example_batches():
    starts = lm_blocks(1001, 100)
    assert starts.tolist() == list(range(0, 1000, 100))  # each block reads start .. start + 100 inclusive
    batches = shuffled_batches(10, 4, seed=0, epoch=0)
    assert [len(b) for b in batches] == [4, 4, 2] and sorted(np.concatenate(batches).tolist()) == list(range(10))


def _token_array(tmp_path, name: str, rows: list[list[int]], dtype: str = "uint16") -> TokenArray:
    """`rows` written as `prepare` writes a split's side: the tokens back to back, and n + 1 offsets."""
    (tmp_path / f"{name}.bin").write_bytes(np.concatenate([np.asarray(r, dtype=dtype) for r in rows]).tobytes())
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    (tmp_path / f"{name}.idx").write_bytes(offsets.tobytes())
    return TokenArray(tmp_path / f"{name}.bin", tmp_path / f"{name}.idx", dtype)


def _rows_one_by_one(rows: list[list[int]], index, multiple: int, bos: bool) -> torch.Tensor:
    """The batch as written out row by row: each row padded with PAD_ID (and shifted right, BOS first)."""
    picked = [([BOS_ID, *rows[i][:-1]] if bos else rows[i]) for i in index]
    width = -(-max(len(r) for r in picked) // multiple) * multiple
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in picked], dtype=torch.long)


@pytest.mark.parametrize("multiple", [1, 8])
def test_pair_rows_gather_each_pair_padded_and_the_decoder_input_shifted(tmp_path, multiple):
    rng = np.random.default_rng(0)
    src_rows = [rng.integers(4, 60_000, size=rng.integers(1, 30)).tolist() for _ in range(50)]
    tgt_rows = [[*rng.integers(4, 60_000, size=rng.integers(0, 30)).tolist(), EOS_ID] for _ in range(50)]
    src, tgt = _token_array(tmp_path, "src", src_rows), _token_array(tmp_path, "tgt", tgt_rows)
    for index in (np.array([7]), rng.permutation(50)[:13], np.arange(50)):
        got = pair_rows(src, tgt, index, multiple)
        expected = (
            _rows_one_by_one(src_rows, index, multiple, False),
            _rows_one_by_one(tgt_rows, index, multiple, True),
            _rows_one_by_one(tgt_rows, index, multiple, False),
        )
        for tensor, want in zip(got, expected, strict=True):
            assert tensor.dtype == torch.long and torch.equal(tensor, want)


def test_lm_rows_are_blocks_of_the_stream_and_their_shift():
    stream = np.random.default_rng(0).integers(0, 60_000, size=1001).astype(np.uint16)
    starts = lm_blocks(stream.size, 100)[[3, 0, 7]]
    inputs, targets = lm_rows(stream, starts, 100)
    assert inputs.dtype == targets.dtype == torch.long
    for row, start in enumerate(starts):
        assert inputs[row].tolist() == stream[start : start + 100].tolist()
        assert targets[row].tolist() == stream[start + 1 : start + 101].tolist()
