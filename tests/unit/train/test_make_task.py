"""make_task's explicit choice of a task class and the kinds table's `task` column name the same class."""

import pytest

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.train import tasks

MODEL_OF = {"pattern": "classifier", "sessions": "lm", "text": "lm", "parallel": "seq2seq"}


@pytest.mark.parametrize("kind", sorted(DATA_KINDS))
def test_make_task_builds_the_class_the_table_names(kind, monkeypatch):
    built = []
    monkeypatch.setattr(tasks, "read_splits", lambda config: None)  # no data is read
    monkeypatch.setattr(tasks, "validation_from", lambda config, data: None)
    for name in ("ClassifierTask", "SessionTask", "LMTask", "Seq2SeqTask"):  # record instead of building
        monkeypatch.setattr(tasks, name, lambda config, data, valid, name=name: built.append(name))
    tasks.make_task(load_config(None, [f"data.kind={kind}", f"model.kind={MODEL_OF[kind]}"]))
    assert built == [DATA_KINDS[kind].task]


def test_an_unknown_kind_is_a_config_error():
    config = load_config(None, [])
    object.__setattr__(config.data, "kind", "images")  # past the schema's own check, as a new kind would be
    with pytest.raises(ConfigError, match="unknown data.kind 'images'"):
        tasks.make_task(config)
