"""Fixtures shared by unit tests of several modules."""

from pathlib import Path

import pytest

from tformer_cli.config import load_config
from tformer_cli.tokenizer import train_sentencepiece


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A folder holding a 40-piece SentencePiece model (spm.model) trained on a few made-up English lines."""
    folder = tmp_path_factory.mktemp("data")
    words = "the house cat dog is red blue green small big a on in with and of to we you they".split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(6)) for i in range(200)]
    train_sentencepiece(lines, load_config(None, ["tokenizer.vocab_size=40"]).tokenizer, folder / "spm.model")
    return folder
