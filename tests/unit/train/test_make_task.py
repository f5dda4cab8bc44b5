"""make_task's explicit choice of a task class and the kinds table's `task` column name the same class."""

import pytest

from tformer_cli import validation
from tformer_cli.config import load_config
from tformer_cli.data import splits
from tformer_cli.errors import ConfigError
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.train import tasks

MODEL_OF = {kind: row.models[0] for kind, row in DATA_KINDS.items()}  # a model kind each trains


@pytest.mark.parametrize("kind", sorted(DATA_KINDS))
def test_make_task_builds_the_class_the_table_names(kind, monkeypatch):
    built = []
    monkeypatch.setattr(tasks, "read_splits", lambda data, tokenizer: None)  # no data is read
    monkeypatch.setattr(tasks, "validation_from", lambda config, data: None)
    for name in ("ClassifierTask", "SessionTask", "LMTask", "Seq2SeqTask"):  # record instead of building
        monkeypatch.setattr(tasks, name, lambda config, data, valid, name=name: built.append(name))
    tasks.make_task(load_config(None, [f"data.kind={kind}", f"model.kind={MODEL_OF[kind]}"]))
    assert built == [DATA_KINDS[kind].task]


def test_an_unknown_kind_is_a_config_error(monkeypatch):
    """Each of the three choices by kind (the data read, the validation set, the task) refuses a kind it does not
    know, on its own (the earlier ones stubbed out), as a new kind added to the table but not to the code would."""
    config = load_config(None, [])
    object.__setattr__(config.data, "kind", "images")  # past the schema's own check
    with pytest.raises(ConfigError, match="unknown data.kind 'images'"):
        splits.read_splits(config.data, config.tokenizer)
    with pytest.raises(ConfigError, match="unknown data.kind 'images'"):
        validation.validation_from(config, None)
    monkeypatch.setattr(tasks, "read_splits", lambda data, tokenizer: None)
    monkeypatch.setattr(tasks, "validation_from", lambda config, data: None)
    with pytest.raises(ConfigError, match="unknown data.kind 'images'"):
        tasks.make_task(config)
