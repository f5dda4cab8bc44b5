"""Nothing lost, nothing silently wrong: what `prepare` may replace, what "up to date" means, and the checks
`train` makes on prepared data before its first update. Tiny corpora made here."""

import gzip
import json
import os
import random
import re

import pytest
from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.data.sources import locate
from tformer_cli.errors import ConfigError, DataError, TformerError
from tformer_cli.files import FolderLock
from tformer_cli.schema import TokenizerConfig
from tformer_cli.tokenizer import Tokenizer, train_sentencepiece
from tformer_cli.train.tasks import make_task

QUIET = {"log": lambda _: None}


def _lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(n)]


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def _text_config(train, out, **overrides):
    base = {
        "data.kind": "text",
        "model.kind": "lm",
        "data.train": train,
        "data.dir": out,
        "tokenizer.vocab_size": 40,
        "tokenizer.kind": "unigram",
        "data.workers": 1,
        "data.block_size": 8,
    }
    base.update(overrides)
    return load_config(None, [f"{k}={v}" for k, v in base.items() if v is not None])


@pytest.fixture
def text(tmp_path):
    """A text corpus in tmp_path/corpus and a config preparing it into tmp_path/out."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write(corpus / "train.txt", _lines(200))
    _write(corpus / "valid.txt", _lines(20, seed=1))
    return tmp_path


def _config(tmp_path, **overrides):
    return _text_config(
        tmp_path / "corpus/train.txt", tmp_path / "out", **{"data.valid": tmp_path / "corpus/valid.txt", **overrides}
    )


def _parallel(tmp_path, valid_src, valid_tgt, **overrides):
    for name, lines in (("train.en", _lines(200)), ("train.de", _lines(200, 2))):
        _write(tmp_path / name, lines)
    _write(tmp_path / "valid.en", valid_src)
    _write(tmp_path / "valid.de", valid_tgt)
    base = {
        "data.kind": "parallel",
        "model.kind": "seq2seq",
        "data.train": tmp_path / "train",
        "data.valid": tmp_path / "valid",
        "data.dir": tmp_path / "out",
        "tokenizer.vocab_size": 60,
        "data.max_len_ratio": 9.0,
        "data.workers": 1,
        "model.max_len": 64,
    }
    base.update(overrides)
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


# 1. prepare replaces only its own output


def test_a_data_dir_holding_the_corpus_is_refused_and_kept(text):
    corpus = text / "corpus"
    (corpus / "notes.md").write_text("mine\n")
    before = sorted(p.name for p in corpus.iterdir())
    with pytest.raises(DataError, match=rf"data.dir={corpus} holds the input .*train.txt \(data.train\)"):
        config = _config(text, **{"data.dir": corpus})
        prepare(config.data, config.tokenizer, **QUIET)
    assert sorted(p.name for p in corpus.iterdir()) == before
    assert sorted(p.name for p in text.iterdir()) == ["corpus"]


def test_a_folder_prepare_did_not_make_is_refused_and_kept(text):
    out = text / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine\n")
    with pytest.raises(DataError, match=rf"data.dir={out} is a non-empty folder that tformer prepare did not make"):
        config = _config(text)
        prepare(config.data, config.tokenizer, **QUIET)
    (out / "manifest.json").write_text('{"dataset": "mine", "version": 2}')  # another tool's manifest
    with pytest.raises(DataError, match=rf"data.dir={out} is a non-empty folder that tformer prepare did not make"):
        prepare(config.data, config.tokenizer, **QUIET)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.md"]


def test_an_existing_file_as_data_dir_is_refused_and_kept(text):
    (text / "out").write_text("mine\n")
    with pytest.raises(DataError, match=rf"data.dir={text / 'out'} is an existing file"):
        config = _config(text)
        prepare(config.data, config.tokenizer, **QUIET)
    assert (text / "out").read_text() == "mine\n"
    assert not list(text.glob(".out.*[!k]"))  # nothing moved aside (only the lock file, .out.lock)


def test_an_empty_folder_is_filled_and_prepare_replaces_its_own_output_old_format_included(text):
    (text / "out").mkdir()
    config = _config(text)
    prepare(config.data, config.tokenizer, **QUIET)
    assert (text / "out/spm.model").is_file()
    manifest = json.loads((text / "out/manifest.json").read_text())
    assert manifest["created_by"] == "tformer prepare"
    first_format = {"version": 1, "settings_key": "x", "kind": "text", "splits": {}, "tokenizer": {}}
    (text / "out/manifest.json").write_text(json.dumps(first_format))
    prepare(config.data, config.tokenizer, **QUIET)  # the first format is prepare's too: replaced, not refused
    assert json.loads((text / "out/manifest.json").read_text())["version"] == 2
    assert sorted(p.name for p in text.iterdir()) == [".out.lock", "corpus", "out"]  # the old output is gone


# 2. leftovers and concurrency


def test_leftovers_of_killed_prepares_are_removed_and_nothing_else(text):
    build = text / ".out.abcd1234.tmp"  # a build folder of a killed prepare
    build.mkdir()
    (build / "spm.model").write_bytes(b"half")
    (build / ".manifest.json.k2j3.tmp").write_text("{")
    old = text / ".out.old"  # the previous output, moved aside by a prepare killed before deleting it
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    (old / "train.text.bin").write_bytes(b"x")
    mine = text / ".out.zzzz9999.tmp"  # the right name, but not prepare's content
    mine.mkdir()
    (mine / "notes.md").write_text("mine\n")
    (text / ".out.backup").mkdir()  # not a name prepare makes
    logs = []
    config = _config(text)
    prepare(config.data, config.tokenizer, log=logs.append)
    assert not build.exists() and not old.exists()
    assert mine.is_dir() and (text / ".out.backup").is_dir()
    assert any(f"removed {build}" in line for line in logs)
    assert sorted(p.name for p in text.iterdir() if p.name.startswith(".out.")) == [
        ".out.backup",
        ".out.lock",
        ".out.zzzz9999.tmp",
    ]


def test_a_second_prepare_into_the_same_data_dir_names_the_holder(text):
    with FolderLock(text, "tformer prepare", name=".out.lock"):
        with pytest.raises(TformerError, match=rf"in use by process {os.getpid()} \(tformer prepare\)"):
            config = _config(text)
            prepare(config.data, config.tokenizer, **QUIET)
    assert not (text / "out").exists()
    prepare(config.data, config.tokenizer, **QUIET)  # the lock is free again


# 3. "up to date" means up to date


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda out: (out / "spm.model").unlink(), "spm.model is missing"),
        (lambda out: os.truncate(out / "train.text.bin", 10), "train.text.bin has 10 bytes"),
        (lambda out: os.truncate(out / "valid.text.idx", 0), "valid.text.idx has 0 bytes"),
        (
            lambda out: (out / "spm.model").write_bytes(bytes(reversed((out / "spm.model").read_bytes()))),
            "spm.model is not the tokenizer the data was encoded with",
        ),
    ],
)
def test_damaged_output_is_prepared_again(text, damage, reason):
    config = _config(text)
    first = prepare(config.data, config.tokenizer, **QUIET)
    damage(text / "out")
    logs = []
    prepare(config.data, config.tokenizer, log=logs.append)
    assert f"preparing again: {reason}" in "\n".join(logs)
    assert json.loads((text / "out/manifest.json").read_text())["files"] == first["files"]
    assert (text / "out/spm.model").stat().st_size == first["files"]["spm.model"]


def test_a_damaged_manifest_is_a_warning_in_prepares_folder_and_an_error_elsewhere(text):
    config = _config(text)
    prepare(config.data, config.tokenizer, **QUIET)
    (text / "out/manifest.json").write_text('{"version": 2, ')
    logs = []
    prepare(config.data, config.tokenizer, log=logs.append)
    assert any(line.startswith("warning: ") and "manifest.json: damaged (invalid JSON" in line for line in logs)
    assert json.loads((text / "out/manifest.json").read_text())["version"] == 2
    (text / "out/manifest.json").write_text("[")
    (text / "out/notes.md").write_text("mine\n")
    with pytest.raises(DataError, match=r"manifest.json: damaged .* holds other files: prepare will not replace it"):
        prepare(config.data, config.tokenizer, **QUIET)
    assert (text / "out/notes.md").is_file()


def test_training_on_a_damaged_manifest_is_one_line_naming_it(text):
    config = _config(text)
    prepare(config.data, config.tokenizer, **QUIET)
    (text / "out/manifest.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(DataError, match=r"out/manifest.json: damaged \(not UTF-8 text\)"):
        make_task(_config(text))
    (text / "out/manifest.json").write_text("{")
    with pytest.raises(DataError, match=r"out/manifest.json: damaged \(invalid JSON"):
        make_task(_config(text))


# 4. bad compressed input, through the CLI: one line, not "Aborted." or a traceback


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda data: data[: len(data) // 2], r"train.txt.gz:\d+: cannot read: the compressed stream ends early"),
        (lambda data: b"plain text\n", r"train.txt.gz:1: cannot read: not a valid gzip file"),
    ],
)
def test_bad_gzip_input_is_one_line_naming_the_file(tmp_path, make, message):
    data = gzip.compress(("\n".join(_lines(300)) + "\n").encode())
    (tmp_path / "train.txt.gz").write_bytes(make(data))
    result = CliRunner().invoke(
        app,
        [
            "prepare",
            "recipes/wikitext2_lm.yaml",
            f"data.train={tmp_path}/train.txt.gz",
            f"data.dir={tmp_path}/out",
            "tokenizer.vocab_size=40",
            "data.workers=1",
        ],
    )
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and re.search(message, last), result.stderr


# 5. an empty training split, and SentencePiece's errors


def test_an_empty_training_file_is_named_not_the_vocabulary_size(text):
    _write(text / "corpus/train.txt", ["", "   ", ""])
    with pytest.raises(DataError, match=r"data.train=.*train.txt has no non-empty lines") as err:
        config = _config(text)
        prepare(config.data, config.tokenizer, **QUIET)
    assert "vocab_size" not in str(err.value)


@pytest.mark.parametrize(
    ("setting", "named", "not_named"),
    [
        ({"vocab_size": 5000}, "tokenizer.vocab_size=5000", "character_coverage"),
        ({"character_coverage": 0.5}, "tokenizer.character_coverage=0.5", "vocab_size"),
        ({"input_sentence_size": -1}, "tokenizer.input_sentence_size=-1", None),  # a ValueError, not RuntimeError
    ],
)
def test_sentencepiece_errors_name_the_settings_involved(tmp_path, setting, named, not_named):
    cfg = TokenizerConfig(**{"vocab_size": 40, **setting})
    with pytest.raises(DataError, match="SentencePiece training failed") as err:
        train_sentencepiece(iter(_lines(100)), cfg, tmp_path / "spm.model")
    message = str(err.value)
    assert named in message and "\n" not in message and "src/" not in message
    assert not_named is None or not_named not in message


# 6. an over-long pair in the validation split: recorded by prepare, refused by train before any update


def _long_valid(tmp_path, **overrides):
    src, tgt = _lines(20, 3), _lines(20, 4)
    src[1] = tgt[1] = ""  # an empty pair: dropped, so the pair numbers and the line numbers differ
    src[7] = " ".join(_lines(40, 5))  # line 8: about 200 words
    return _parallel(tmp_path, src, tgt, **overrides)


def test_prepare_records_each_splits_longest_example_by_its_line(tmp_path):
    config = _long_valid(tmp_path)
    manifest = prepare(config.data, config.tokenizer, **QUIET)
    longest = manifest["splits"]["valid"]["longest"]["src"]
    assert longest["example"] == 8 and longest["tokens"] > 64
    assert manifest["splits"]["valid"]["kept"] == 19  # every non-empty pair kept: they are scored


@pytest.mark.parametrize(
    ("overrides", "limit"),
    [({"model.pos": "learned"}, r"model.max_len=64 \(learned positions\)"), ({}, r"train.max_tokens=100")],
)
def test_a_too_long_validation_pair_is_refused_before_training(tmp_path, overrides, limit):
    config = _long_valid(tmp_path)
    prepare(config.data, config.tokenizer, **QUIET)
    config = _long_valid(tmp_path, **{"train.max_tokens": 100, **overrides})
    with pytest.raises(
        DataError, match=rf"data.valid: line 8 of {tmp_path}/valid.en has \d+ tokens, more than {limit}"
    ):
        make_task(config)
    make_task(_long_valid(tmp_path, **{"model.max_len": 4096, "train.max_tokens": 4096}))  # sinusoidal: no limit


def test_locate_counts_lines_across_a_list_of_corpora_and_tsv_headers(tmp_path):
    _write(tmp_path / "a.tsv", ["en\tde", "x\ty", "x\ty"])
    _write(tmp_path / "b.tsv", ["en\tde", "x\ty", "x\ty", "x\ty"])
    config = load_config(
        None,
        [
            "data.kind=parallel",
            "model.kind=seq2seq",
            "data.train=t",
            f"data.valid=[{tmp_path}/a.tsv, {tmp_path}/b.tsv]",
        ],
    )
    assert locate(config.data, "valid", 2, 1) == f"line 3 of {tmp_path}/a.tsv"
    assert locate(config.data, "valid", 4, 0) == f"line 3 of {tmp_path}/b.tsv"
    assert locate(config.data, "valid", 9, 0) == "example 9 of data.valid"


def test_lm_blocks_longer_than_learned_positions_are_refused_before_any_data_is_read(text):
    with pytest.raises(ConfigError, match=r"model.max_len must cover data.block_size \(8\), got 4"):
        _config(text, **{"model.pos": "learned", "model.max_len": 4})


# 7. no validation split


def test_training_without_a_validation_split_says_what_is_missing(text):
    config = _config(text, **{"data.valid": None})
    prepare(config.data, config.tokenizer, **QUIET)
    with pytest.raises(DataError, match=r"^data.valid is not set: training needs a validation split; set data.valid="):
        make_task(_config(text, **{"data.valid": None}))


# 8. prepared data made with other settings


def test_training_refuses_data_prepared_with_other_settings(text):
    config = _config(text)
    prepare(config.data, config.tokenizer, **QUIET)
    no_effect = {"data.workers": 2, "data.block_size": 4, "data.max_len": 50, "data.hub": "other", "run.seed": 7}
    make_task(_config(text, **no_effect))  # speed, training's blocks, parallel-only and hub-only keys, not data
    with pytest.raises(
        DataError, match=r"prepared with other settings: tokenizer.vocab_size=40 there, 50 in the recipe; run"
    ):
        make_task(_config(text, **{"tokenizer.vocab_size": 50}))
    # where the data came from is the prepared folder's to say (tests/unit/data/test_prepared_truth.py)
    make_task(_config(text, **{"data.valid": None}))


def test_training_on_another_manifest_format_asks_to_prepare_again(text):
    config = _config(text)
    prepare(config.data, config.tokenizer, **QUIET)
    manifest = json.loads((text / "out/manifest.json").read_text())
    (text / "out/manifest.json").write_text(json.dumps({**manifest, "version": 3}))  # a newer tformer's
    with pytest.raises(DataError, match=r"manifest format 3, this tformer reads format 2"):
        make_task(_config(text))
    for key in ("created_by", "settings", "files"):
        del manifest[key]
    manifest["version"] = 1
    (text / "out/manifest.json").write_text(json.dumps(manifest))  # the previous format
    with pytest.raises(DataError, match=r"manifest format 1, .*: run `tformer prepare` with this recipe again"):
        make_task(_config(text))


# 9. unreadable inputs


def test_a_directory_as_input_is_named(text):
    with pytest.raises(DataError, match=rf"data.train: {text / 'corpus'} is a directory, not a file"):
        config = _config(text, **{"data.train": text / "corpus"})
        prepare(config.data, config.tokenizer, **QUIET)


def test_an_unreadable_input_is_one_line_naming_it(text, monkeypatch):
    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("tformer_cli.data.sources.sha256_file", denied)  # root reads any file: simulate it
    with pytest.raises(DataError, match=r"train.txt: cannot read: Permission denied"):
        config = _config(text)
        prepare(config.data, config.tokenizer, **QUIET)


def test_a_damaged_tokenizer_model_is_one_line_naming_it(tmp_path):
    (tmp_path / "spm.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match=rf"{tmp_path}/spm.model: not a readable SentencePiece model"):
        Tokenizer(tmp_path / "spm.model")
