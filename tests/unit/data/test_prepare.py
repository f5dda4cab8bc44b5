"""`prepare` on tiny corpora made here: counts, drops, idempotence, atomicity, offline hub."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest
from tiny_models import WORDS

from tformer_cli.config import load_config
from tformer_cli.data.batching import TokenArray
from tformer_cli.data.prepare import prepare
from tformer_cli.errors import DataError


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(0)
    src = [_sentence(rng, rng.randint(3, 8)) for _ in range(300)]
    tgt = [_sentence(rng, rng.randint(3, 8)) for _ in range(300)]
    src[5], tgt[7] = "", "   "  # empty sides
    src[9] = _sentence(rng, 200)  # over-long (and over the length ratio)
    tgt[11] = _sentence(rng, 1)
    src[11] = _sentence(rng, 25)  # ratio only
    (tmp_path / "train.en").write_text("\n".join(src) + "\n")
    (tmp_path / "train.de").write_text("\n".join(tgt) + "\n")
    (tmp_path / "valid.en").write_text("\n".join(src[:20]) + "\n")
    (tmp_path / "valid.de").write_text("\n".join(tgt[:20]) + "\n")
    return tmp_path


def _overrides(tmp_path, **overrides) -> list[str]:
    base = {
        "data.kind": "parallel",
        "model.kind": "seq2seq",
        "data.train": f"{tmp_path}/train",
        "data.valid": f"{tmp_path}/valid",
        "data.dir": f"{tmp_path}/out",
        "tokenizer.vocab_size": 40,
        "data.max_len": 100,
        "data.max_len_ratio": 9.0,
        "data.workers": 2,
    }
    base.update(overrides)
    return [f"{k}={v}" for k, v in base.items()]


def _config(tmp_path, **overrides):
    return load_config(None, _overrides(tmp_path, **overrides))


def test_prepare_counts_drops_and_writes_arrays(corpus):
    config = _config(corpus)
    manifest = prepare(config.data, config.tokenizer, log=lambda _: None)
    train = manifest["splits"]["train"]
    assert train["read"] == 300 and train["dropped_empty"] == 2
    assert train["dropped_too_long"] == 1 and train["dropped_ratio"] == 1
    assert train["kept"] == 296
    src = TokenArray(corpus / "out/train.src.bin", corpus / "out/train.src.idx", manifest["dtype"])
    assert len(src) == 296 and src.lengths.max() <= 100
    assert manifest["tokenizer"]["fingerprint"] and manifest["inputs"]["train"]
    assert json.loads((corpus / "out/manifest.json").read_text())["splits"]["valid"]["read"] == 20


def test_prepare_is_idempotent_and_rebuilds_on_change(corpus):
    logs = []
    config = _config(corpus)
    prepare(config.data, config.tokenizer, log=logs.append)
    stamp = (corpus / "out/train.src.bin").stat().st_mtime_ns
    prepare(config.data, config.tokenizer, log=logs.append)
    assert "up to date" in logs[-1]
    assert (corpus / "out/train.src.bin").stat().st_mtime_ns == stamp
    (corpus / "train.en").write_text((corpus / "train.en").read_text().replace("house", "mouse", 1))
    prepare(config.data, config.tokenizer, log=logs.append)
    assert "up to date" not in logs[-1]


def test_a_list_of_training_corpora_is_read_as_one_split(corpus):
    (corpus / "news.en").write_text("a small house\nthe red cat\n")
    (corpus / "news.de").write_text("ein kleines haus\ndie rote katze\n")
    config = _config(corpus, **{"data.train": f"[{corpus}/train, {corpus}/news]"})
    manifest = prepare(config.data, config.tokenizer, log=lambda _: None)
    assert manifest["splits"]["train"]["read"] == 302 and manifest["splits"]["train"]["kept"] == 298
    assert sorted(manifest["inputs"]["train"]) == sorted(
        str(corpus / f) for f in ("train.en", "train.de", "news.en", "news.de")
    )
    with pytest.raises(DataError, match=r"data.train: file not found: .*nope.en"):
        config = _config(corpus, **{"data.train": f"[{corpus}/train, {corpus}/nope]"})
        prepare(config.data, config.tokenizer, log=lambda _: None)


def test_the_tokenizer_depends_on_the_recipe_not_on_the_core_count(corpus):
    def fingerprint(workers: int, threads: int) -> str:
        config = _config(
            corpus,
            **{"data.workers": workers, "tokenizer.threads": threads, "data.dir": corpus / f"o{workers}{threads}"},
        )
        return prepare(config.data, config.tokenizer, log=lambda _: None)["tokenizer"]["fingerprint"]

    fingerprints = {(workers, threads): fingerprint(workers, threads) for workers, threads in ((1, 1), (2, 1), (2, 4))}
    assert fingerprints[(1, 1)] == fingerprints[(2, 1)]  # encoding processes do not matter
    assert fingerprints[(2, 1)] != fingerprints[(2, 4)]  # SentencePiece's threads do: a recipe setting


def test_error_leaves_nothing_half_written(corpus):
    config = _config(corpus)
    prepare(config.data, config.tokenizer, log=lambda _: None)
    before = {p.name: p.read_bytes() for p in (corpus / "out").iterdir()}
    (corpus / "valid.de").write_text("only one line\n")  # now mismatched
    with pytest.raises(DataError, match="parallel files differ in length"):
        prepare(config.data, config.tokenizer, log=lambda _: None)
    assert {p.name: p.read_bytes() for p in (corpus / "out").iterdir()} == before
    assert not [p for p in corpus.iterdir() if p.name.startswith(".out") and p.is_dir()]  # no temporary folder left


def test_invalid_utf8_in_training_data_is_reported(corpus):
    (corpus / "train.de").write_bytes((corpus / "train.de").read_bytes().replace(b"house", b"h\xffuse", 1))
    with pytest.raises(DataError, match=r"train.de:\d+: invalid UTF-8 at byte offset \d+"):
        config = _config(corpus)
        prepare(config.data, config.tokenizer, log=lambda _: None)
    assert not (corpus / "out").exists()


def test_missing_file_is_reported(corpus):
    with pytest.raises(DataError, match=r"data.valid: file not found: .*nope.en"):
        config = _config(corpus, **{"data.valid": f"{corpus}/nope"})
        prepare(config.data, config.tokenizer, log=lambda _: None)


def test_unknown_dataset_offline_is_one_line_with_the_local_override(tmp_path):
    pytest.importorskip("datasets", reason="the hub path needs `datasets`, which GPU images often lack")
    config = load_config(
        None, ["data.kind=parallel", "model.kind=seq2seq", "data.hub=no_such_dataset_xyz", f"data.dir={tmp_path}/out"]
    )
    with pytest.raises(DataError) as err:
        prepare(config.data, config.tokenizer, log=lambda _: None)
    message = str(err.value)
    assert "no_such_dataset_xyz" in message and "data.train=" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_text_corpus_for_language_models(tmp_path):
    rng = random.Random(1)
    lines = [_sentence(rng, rng.randint(2, 12)) if i % 7 else "" for i in range(200)]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    config = load_config(
        None,
        [
            "data.kind=text",
            "model.kind=lm",
            f"data.train={tmp_path}/train.txt",
            f"data.dir={tmp_path}/lm",
            "tokenizer.vocab_size=36",
            "tokenizer.kind=unigram",
        ],
    )
    manifest = prepare(config.data, config.tokenizer, log=lambda _: None)
    assert manifest["splits"]["train"]["dropped_empty"] == 29 and manifest["splits"]["train"]["kept"] == 171
    text = TokenArray(tmp_path / "lm/train.text.bin", tmp_path / "lm/train.text.idx", manifest["dtype"])
    assert int(np.asarray(text.tokens).size) == manifest["splits"]["train"]["tokens"]["text"]


def test_the_encoding_workers_are_not_forks_of_the_calling_process(corpus):
    """A process forked from the caller inherits its threads' locks as they were at the fork (PyTorch's, a tokenizer
    library's): a worker that hangs or dies on one leaves the pool waiting forever. Here every fork of the caller
    dies at birth; `prepare` must still finish (its workers come from a clean process)."""
    script = """
import os, sys
os.register_at_fork(after_in_child=lambda: os._exit(3))
from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
overrides = sys.argv[1:]
config = load_config(None, overrides)
manifest = prepare(config.data, config.tokenizer, log=lambda _: None)
print("kept", manifest["splits"]["train"]["kept"])
"""
    result = subprocess.run(
        [sys.executable, "-c", script, *_overrides(corpus)], capture_output=True, text=True, timeout=60, cwd=corpus
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["kept", "296"]
