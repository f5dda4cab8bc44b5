"""Pieces of the training loop (train/loop.py): which validation is a new best."""

import pytest

from tformer_cli.train import loop


@pytest.mark.parametrize(
    "metric,value,best,improved",
    [
        ("loss", 0.4, 0.5, True),  # a loss improves downwards
        ("loss", 0.6, 0.5, False),
        ("loss", 0.5, 0.5, False),  # a tie is not a new best (early stopping counts it as stale)
        ("accuracy", 0.6, 0.5, True),  # accuracy and BLEU improve upwards
        ("accuracy", 0.4, 0.5, False),
        ("accuracy", 0.5, 0.5, False),
        ("bleu", 21.0, 20.0, True),
        ("bleu", 19.0, 20.0, False),
        ("loss", 9.9, None, True),  # the first validation is always the best so far
        ("accuracy", 0.0, None, True),
    ],
)
def test_improved_compares_each_metric_in_its_own_direction(metric, value, best, improved):
    assert loop._improved(metric, value, best) is improved
