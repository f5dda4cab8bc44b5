"""The kinds table's columns hold what the code does: each column is checked against the code that acts on it."""

import re
from pathlib import Path

import pytest

from tformer_cli.config import load_config
from tformer_cli.data.sources import local_files
from tformer_cli.errors import ConfigError
from tformer_cli.kinds import DATA_KINDS, MODEL_KINDS, refusal
from tformer_cli.model import build_model
from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.schema import vocabulary

MODEL_OF = {kind: row.models[0] for kind, row in DATA_KINDS.items()}  # a model kind each trains
PREPARED = sorted(kind for kind, row in DATA_KINDS.items() if not row.generated)
GENERATED = sorted(kind for kind, row in DATA_KINDS.items() if row.generated)


def _config(kind: str, *overrides: str):
    return load_config(None, [f"data.kind={kind}", f"model.kind={MODEL_OF[kind]}", *overrides])


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_has_source_is_whether_a_layer_attends_to_a_source(kind):
    model = build_model(kind, vocab_size=20, n_classes=2, d_model=16, n_heads=2, d_ff=32, n_layers=1)
    cross = any(isinstance(module, MultiHeadAttention) and module.cross for module in model.modules())
    assert MODEL_KINDS[kind].has_source == cross


@pytest.mark.parametrize("kind", PREPARED)
def test_paired_data_reads_a_source_and_a_target_file(kind, tmp_path: Path):
    config = _config(kind, f"data.train={tmp_path / 'train'}", "data.src_lang=en", "data.tgt_lang=de")
    expected = [tmp_path / "train.en", tmp_path / "train.de"] if DATA_KINDS[kind].paired else [tmp_path / "train"]
    assert local_files(config.data)["train"] == expected


@pytest.mark.parametrize("kind", GENERATED)
def test_vocabulary_names_the_setting_that_sets_a_generated_vocabulary(kind):
    setting = DATA_KINDS[kind].vocabulary.split()[0]  # "data.pattern.vocab_size and n_classes": the first
    assert setting.startswith(f"data.{kind}.")
    assert vocabulary(_config(kind, f"{setting}=40")) != vocabulary(_config(kind, f"{setting}=41"))


@pytest.mark.parametrize("kind", PREPARED)
def test_vocabulary_of_prepared_data_is_the_tokenizer_s(kind):
    assert DATA_KINDS[kind].vocabulary == "the tokenizer"
    assert vocabulary(_config(kind), 123) == (123, 0)
    assert vocabulary(_config(kind, "tokenizer.vocab_size=77")) == (77, 0)  # not prepared yet: what prepare trains


@pytest.mark.parametrize(
    ("kind", "model", "setting", "problem"),
    [
        ("pattern", "classifier", "data.pattern.seq_len=30", "must cover data.pattern.seq_len (30), got 20"),
        ("sessions", "lm", "data.sessions.session_len=31", "must cover data.sessions.session_len - 1 (30), got 20"),
        ("sessions", "lstm", "data.sessions.session_len=31", None),  # no positions to cover
        ("text", "lm", "data.block_size=30", "must cover data.block_size (30), got 20"),
        ("parallel", "seq2seq", "data.max_len=30", None),  # pairs: their task checks their real lengths
    ],
)
def test_rows_the_recipe_fixes_must_fit_learned_positions(kind, model, setting, problem):
    overrides = [f"data.kind={kind}", f"model.kind={model}", "model.pos=learned", "model.max_len=20", setting]
    if problem is None:
        load_config(None, overrides)
        return
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(None, overrides)


@pytest.mark.parametrize("kind", sorted(DATA_KINDS))
def test_a_refusal_that_points_to_a_command_points_to_one_that_serves_the_run(kind):
    """ "use `tformer generate`" on a run that generate refuses too sends the user in a circle."""
    for model in DATA_KINDS[kind].models:
        for command, reason in DATA_KINDS[kind].refusals.items():
            if refusal(kind, model, command) != reason:
                continue  # another reason wins for this model kind (no attention to show)
            for named in re.findall(r"`tformer (\w+)", reason):
                served = [c for c in (*DATA_KINDS[kind].serves, "eval --split") if c.split()[0] == named]
                assert served, f"{kind}/{model}: {command} says {reason!r}, but {named} serves no run of it"


@pytest.mark.parametrize("kind", sorted(DATA_KINDS))
def test_every_text_command_serves_or_refuses_each_kind(kind):
    for command in ("eval --src", "perplexity", "translate", "score", "generate", "attention --text"):
        for model in DATA_KINDS[kind].models:
            assert (command in DATA_KINDS[kind].serves) != (refusal(kind, model, command) is not None) or (
                command.startswith("attention") and not MODEL_KINDS[model].attention
            )
