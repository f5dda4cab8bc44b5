"""Token-budget batching: budget, coverage, determinism, resumption; LM blocks."""

import numpy as np
import pytest

from tformer_cli.data.batching import lm_blocks, shuffled_batches, token_budget_batches
from tformer_cli.errors import DataError


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
