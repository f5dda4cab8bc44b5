"""`tformer check`'s data report and the config it shows: only the sections the recipe's kinds use (the same
rule in model cards and sweep.json), the local files found or missing, the hub dataset named without a
download, and whether data.dir is prepared and matches the recipe."""

import json
import random
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import config_to_dict, load_config, relevant_dict
from tformer_cli.data import sources
from tformer_cli.data.prepare import prepare
from tformer_cli.export.model_card import model_card
from tformer_cli.files import write_json
from tformer_cli.run.layout import SWEEP_RECORD
from tformer_cli.sweep import WHERE_KEYS, _what_trains, is_finished, plan

ROOT = Path(__file__).parents[2]
MULTI30K = str(ROOT / "recipes" / "multi30k_en_de.yaml")
PATTERN = str(ROOT / "recipes" / "pattern_classifier.yaml")
STREAMREC = str(ROOT / "recipes" / "streamrec_transformer.yaml")
runner = CliRunner()


def _check(*args: str):
    return runner.invoke(app, ["check", *args])


def _shown_config(stdout: str) -> dict:
    """The YAML `check` prints before its parameter table."""
    return yaml.safe_load(stdout.split("parameters by component")[0])


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: the report names the hub dataset without contacting it."""

    def refuse(*args, **kwargs):
        raise AssertionError("check opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(sources, "_hub_split", refuse)  # the one way to the hub (conftest sets it offline)


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(0)
    for split, n in (("train", 200), ("valid", 20)):
        for lang in ("en", "de"):
            lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(n)]
            (tmp_path / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    return tmp_path


def _local(corpus: Path) -> list[str]:
    return [
        f"data.train={corpus}/train",
        f"data.valid={corpus}/valid",
        f"data.dir={corpus}/out",
        "tokenizer.vocab_size=40",
        "model.d_model=16",
        "model.n_heads=2",
        "model.d_ff=32",
        "model.n_layers=1",
    ]


def test_a_translation_recipe_shows_no_generator_sections_and_the_hub_keys_only(tmp_path, monkeypatch, no_network):
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    result = _check(MULTI30K, f"data.dir={tmp_path}/none")
    assert result.exit_code == 0, result.output
    assert "pattern:" not in result.stdout and "sessions:" not in result.stdout
    data = _shown_config(result.stdout)["data"]
    assert data["hub"] == "bentrevett/multi30k" and data["src_lang"] == "en"
    assert not {"train", "valid", "test", "text_field", "block_size", "pattern", "sessions"} & data.keys()
    assert "tokenizer" in _shown_config(result.stdout)


def test_a_recipe_reading_local_files_shows_the_local_keys_only(corpus):
    result = _check(MULTI30K, *_local(corpus))
    assert result.exit_code == 0, result.output
    data = _shown_config(result.stdout)["data"]
    assert data["train"] == f"{corpus}/train"
    assert not {"hub", "hub_config", "train_split"} & data.keys()


@pytest.mark.parametrize("recipe, kind", [(PATTERN, "pattern"), (STREAMREC, "sessions")])
def test_generated_data_shows_its_own_section_only_and_says_it_is_generated(recipe, kind):
    result = _check(recipe)
    assert result.exit_code == 0, result.output
    shown = _shown_config(result.stdout)
    assert set(shown["data"]) == {"kind", kind} and "tokenizer" not in shown
    seed = shown["data"][kind]["seed"]
    assert f"data: {kind}, generated from data.{kind}.seed={seed} when training starts" in result.stdout


def test_a_hub_recipe_names_its_dataset_without_the_network(tmp_path, monkeypatch, no_network):
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    result = _check(MULTI30K, f"data.dir={tmp_path}/none")
    assert result.exit_code == 0, result.output
    assert "data: parallel, hub dataset bentrevett/multi30k (default config), splits train, validation, test" in (
        result.stdout
    )
    assert f"data.dir {tmp_path}/none: not prepared: run `tformer prepare {MULTI30K} data.dir={tmp_path}/none`" in (
        result.stdout
    )


def test_local_files_found_are_listed(corpus):
    result = _check(MULTI30K, *_local(corpus))
    assert result.exit_code == 0, result.output
    assert f"data.train: {corpus}/train.en (found), {corpus}/train.de (found)" in result.stdout
    assert f"data.valid: {corpus}/valid.en (found), {corpus}/valid.de (found)" in result.stdout


def test_a_missing_local_file_fails_check_in_one_line_naming_the_key(corpus):
    (corpus / "valid.de").unlink()
    result = _check(MULTI30K, *_local(corpus))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: data.valid: file not found: {corpus}/valid.de; `tformer prepare` reads it"
    ]
    assert f"{corpus}/valid.de (MISSING)" in result.stdout
    dry = runner.invoke(app, ["train", MULTI30K, *_local(corpus), "--dry-run"])
    assert dry.exit_code == 1 and dry.stderr.splitlines() == result.stderr.splitlines()


def test_prepared_matching_data_is_reported_and_a_stale_one_needs_prepare(corpus):
    overrides = _local(corpus)
    config = load_config(MULTI30K, overrides)
    prepare(config.data, config.tokenizer, log=lambda _: None)
    result = _check(MULTI30K, *overrides)
    assert result.exit_code == 0, result.output
    assert f"data.dir {corpus}/out: prepared and matches the recipe" in result.stdout

    (corpus / "train.en").write_text((corpus / "train.en").read_text().replace("the", "a", 1))
    changed = _check(MULTI30K, *overrides)
    assert changed.exit_code == 0, changed.output
    assert f"data.dir {corpus}/out: prepared, but inputs or settings changed: run `tformer prepare {MULTI30K}" in (
        changed.stdout
    )

    other = _check(MULTI30K, *overrides, "tokenizer.vocab_size=41")
    assert (
        f"data.dir {corpus}/out: prepared with other settings: tokenizer.vocab_size=40 there, 41 in the recipe: "
        f"prepare it again with `tformer prepare {MULTI30K}" in other.stdout
    )
    assert f"or train on it as prepared with `tformer train {MULTI30K}" in other.stdout


def test_a_missing_input_does_not_fail_check_when_data_dir_already_holds_it(corpus):
    """Training reads data.dir only: inputs removed after `prepare` are reported, not an error."""
    config = load_config(MULTI30K, _local(corpus))
    prepare(config.data, config.tokenizer, log=lambda _: None)
    (corpus / "train.de").unlink()
    result = _check(MULTI30K, *_local(corpus))
    assert result.exit_code == 0, result.output
    assert f"{corpus}/train.de (MISSING)" in result.stdout
    assert f"data.dir {corpus}/out: prepared and matches the recipe" in result.stdout


def test_the_model_card_shows_the_sections_the_model_uses(tmp_path, monkeypatch):
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    config = load_config(MULTI30K, [f"data.dir={tmp_path}/none"])
    run = SimpleNamespace(
        config=config,
        kind="seq2seq",
        checkpoint=tmp_path / "best.pt",
        average=0,
        run_dir=tmp_path,
        tokenizer_fingerprint="0" * 64,
    )
    card = model_card(run, "marian", [])
    recipe = yaml.safe_load(card.split("```yaml")[1].split("```")[0])
    shown = relevant_dict(config)
    shown["data"]["dir"] = "none"  # local folders and files by name (model_card._named)
    assert recipe == shown
    assert "pattern" not in recipe["data"] and "sessions" not in recipe["data"] and "train" not in recipe["data"]


def test_sweep_json_records_the_sections_the_recipe_uses(tmp_path, monkeypatch):
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    recorded = _what_trains(load_config(MULTI30K, [f"data.dir={tmp_path}/none"]))
    assert "pattern" not in recorded["data"] and "sessions" not in recorded["data"] and "train" not in recorded["data"]
    assert recorded["data"]["hub"] == "bentrevett/multi30k" and "tokenizer" in recorded
    pattern = _what_trains(load_config(PATTERN))
    assert set(pattern["data"]) == {"kind", "pattern"} and "tokenizer" not in pattern


def test_a_sweep_record_of_the_whole_config_still_counts_as_finished(tmp_path):
    """Records written before sweep.json left out the unused sections hold every key: those runs are not retrained,
    and a changed value of a used key still is."""
    point = plan(PATTERN, [f"run.out_dir={tmp_path}"]).points[0]
    whole = json.loads(json.dumps(config_to_dict(point.config)))
    for key in WHERE_KEYS:
        section, name = key.split(".")
        del whole[section][name]
    point.run_dir.mkdir(parents=True)
    record = {"status": "finished", "exit_code": 0, "seconds": 1.0, "parameters": 1, "config": whole}
    write_json(point.run_dir / SWEEP_RECORD, record)
    assert is_finished(point)
    whole["data"]["pattern"]["seed"] += 1
    write_json(point.run_dir / SWEEP_RECORD, record)
    assert not is_finished(point)
