"""`$TFORMER_DATA` in a recipe's local data paths (tformer_cli/data/root.py): the local files where it is set,
the recipe's hub dataset where it is not, and one line saying what to set where the recipe has neither."""

from pathlib import Path

import pytest

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError

RECIPE = """
data:
  kind: parallel
  {hub}
  train: $TFORMER_DATA/corpus/train
  valid: [$TFORMER_DATA/corpus/val, $TFORMER_DATA/corpus/val2]
model: {{kind: seq2seq}}
"""


def _recipe(tmp_path: Path, hub: bool) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.format(hub="hub: someone/corpus" if hub else ""))
    return path


@pytest.mark.parametrize("hub", [True, False])
def test_the_data_root_names_the_local_files(tmp_path, monkeypatch, hub):
    monkeypatch.setenv("TFORMER_DATA", "/data/root/")
    config = load_config(_recipe(tmp_path, hub))
    assert config.data.train == "/data/root/corpus/train"
    assert config.data.valid == ("/data/root/corpus/val", "/data/root/corpus/val2")
    assert config.data.test is None


def test_without_a_data_root_the_recipe_reads_its_hub_dataset(tmp_path, monkeypatch):
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    config = load_config(_recipe(tmp_path, hub=True))
    assert (config.data.train, config.data.valid, config.data.hub) == (None, None, "someone/corpus")


def test_without_a_data_root_or_a_hub_dataset_the_error_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    with pytest.raises(
        ConfigError,
        match=r"data\.train is '\$TFORMER_DATA/corpus/train' and TFORMER_DATA is not "
        r"set: export TFORMER_DATA=FOLDER \(the folder that holds corpus/\)",
    ):
        load_config(_recipe(tmp_path, hub=False))


def test_a_path_given_in_full_is_read_and_the_rooted_splits_are_not(tmp_path, monkeypatch):
    """data.train given by the user, data.valid still under the unset root: the user's file, not the hub's."""
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    config = load_config(_recipe(tmp_path, hub=True), ["data.train=/elsewhere/train"])
    assert (config.data.train, config.data.valid, config.data.test) == ("/elsewhere/train", None, None)


def test_paths_without_the_placeholder_are_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_DATA", "/data/root")
    config = load_config(_recipe(tmp_path, hub=False), ["data.train=rel/train", "data.valid=rel/val"])
    assert (config.data.train, config.data.valid) == ("rel/train", "rel/val")
