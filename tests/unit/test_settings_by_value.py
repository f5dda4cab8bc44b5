"""A sweep compares its points by value, as the resolved config holds them: 1e-3 and 0.001 are one learning rate,
and two points that would train the same config are refused before anything runs."""

from pathlib import Path

import pytest

from tformer_cli.errors import ConfigError
from tformer_cli.sweep import plan

TINY = Path(__file__).parents[2] / "recipes" / "tiny_classifier.yaml"


@pytest.mark.parametrize(
    "args",
    [
        ["train.lr=1e-3,0.001"],
        ["train.lr=1e-3,1.0e-3,3e-3"],
        ["train.epochs=1,2", "train.lr=0.003,3e-3"],
        ["model.dropout=0.1,1e-1"],
        ["train.epochs=2,+2"],
    ],
)
def test_a_sweep_refuses_two_points_of_one_value_however_written(args):
    with pytest.raises(ConfigError, match="the same config"):
        plan(TINY, args)


def test_an_ablation_refuses_a_later_value_equal_to_the_first():
    with pytest.raises(ConfigError, match="the same config"):
        plan(TINY, ["train.lr=3e-3,0.003"], ablation=True)


def test_different_values_still_make_different_points():
    assert len(plan(TINY, ["train.lr=1e-3,0.0011", "run.threads=1,2"]).points) == 4  # threads: the same model, timed
