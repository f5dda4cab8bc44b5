"""What a resumed run's recipe may change (train/resume.py): recorded with the update it starts at, or refused."""

from pathlib import Path

import pytest

from tformer_cli.config import config_to_dict, load_config
from tformer_cli.errors import TformerError
from tformer_cli.train.resume import config_header, recipe_changes

TINY = Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml"


def _dicts(*overrides: str) -> tuple[dict, dict]:
    return config_to_dict(load_config(TINY, [])), config_to_dict(load_config(TINY, list(overrides)))


def test_an_unchanged_recipe_changes_nothing():
    assert recipe_changes(*_dicts(), update=41, mid_epoch=True) == []


def test_a_changed_learning_rate_is_recorded_from_the_next_update():
    changes = recipe_changes(*_dicts("train.lr=1e-3", "train.max_updates=80"), update=41, mid_epoch=True)
    assert changes == [
        {"update": 41, "key": "train.lr", "from": 3e-3, "to": 1e-3},
        {"update": 41, "key": "train.max_updates", "from": None, "to": 80},
    ]
    header = config_header(changes)
    assert header.splitlines()[2:] == [
        "#   train.lr 0.003 -> 0.001 from update 41",
        "#   train.max_updates None -> 80 from update 41",
    ]
    assert all(line.startswith("#") for line in header.splitlines())  # YAML comments: config.yaml still loads


def test_config_yaml_says_that_it_holds_every_key_and_which_sections_other_kinds_read():
    for changes in ([], [{"update": 3, "key": "train.lr", "from": 1e-3, "to": 2e-3}]):
        first = config_header(changes).splitlines()[0]
        assert first.startswith("# Every key") and "data.pattern and data.sessions" in first


@pytest.mark.parametrize("key,value", [("train.best_metric", "loss"), ("train.decay_norms_biases_embeddings", "false")])
def test_keys_that_cannot_change_mid_run_are_refused_by_name(key, value):
    with pytest.raises(TformerError, match=f"cannot change mid-run: {key} "):
        recipe_changes(*_dicts(f"{key}={value}"), update=41, mid_epoch=False)


@pytest.mark.parametrize("key,value", [("train.batch_size", "16"), ("run.seed", "7")])
def test_the_batches_of_an_epoch_under_way_cannot_change_but_those_of_the_next_can(key, value):
    with pytest.raises(TformerError, match=f"cannot change mid-run: {key} \\(it decides the batches"):
        recipe_changes(*_dicts(f"{key}={value}"), update=41, mid_epoch=True)
    assert [c["key"] for c in recipe_changes(*_dicts(f"{key}={value}"), update=41, mid_epoch=False)] == [key]


def test_every_refused_key_is_named_at_once():
    with pytest.raises(TformerError) as refused:
        recipe_changes(*_dicts("train.best_metric=loss", "train.batch_size=16"), update=41, mid_epoch=True)
    assert "train.best_metric" in str(refused.value) and "train.batch_size" in str(refused.value)
