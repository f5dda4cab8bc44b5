"""Shared by the training tests: tiny translation corpora, written and prepared for the tests that ask."""

import pytest

from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.run.checkpoints import load_checkpoint
from tformer_cli.train import loop
from tformer_cli.train.store import CheckpointStore


@pytest.fixture(scope="session")
def prepared_pairs(tmp_path_factory):
    """`(pairs, n_train, *overrides) -> (more overrides -> Config)`: the pairs written (the first n_train to
    train, the rest to validate) and prepared for a tiny seq2seq model with `overrides`."""

    def make(pairs: list[tuple[str, str]], n_train: int, *overrides: str):
        tmp = tmp_path_factory.mktemp("pairs")
        for split, part in (("train", pairs[:n_train]), ("valid", pairs[n_train:])):
            for lang, side in (("en", 0), ("de", 1)):
                (tmp / f"{split}.{lang}").write_text("\n".join(pair[side] for pair in part) + "\n")
        base = [
            "data.kind=parallel",
            "model.kind=seq2seq",
            f"data.train={tmp}/train",
            f"data.valid={tmp}/valid",
            f"data.dir={tmp}/out",
            "tokenizer.vocab_size=60",
            "data.workers=1",
            "model.d_model=16",
            "model.n_heads=2",
            "model.n_layers=1",
            "model.d_ff=32",
            *overrides,
        ]
        config = load_config(None, base)
        prepare(config.data, config.tokenizer, log=lambda _: None)
        return lambda *more: load_config(None, [*base, *more])

    return make


def final_weights(run_dir) -> dict:
    """The model weights of a run's latest checkpoint."""
    store = CheckpointStore(run_dir)
    return load_checkpoint(run_dir / "checkpoints" / store.index["latest"])["model"]


@pytest.fixture
def straight_and_resumed(tmp_path, capsys):
    """`(config, *overrides) -> (straight, resumed)`: the final weights of 8 updates straight, and of 4 updates, a
    resume and 4 more (checked to resume mid-epoch, not to train afresh); `config(*overrides) -> Config`."""

    def train_both(config, *overrides: str) -> tuple[dict, dict]:
        loop.train(config(*overrides, "train.max_updates=8"), tmp_path / "straight")
        loop.train(config(*overrides, "train.max_updates=4"), tmp_path / "resumed")
        capsys.readouterr()
        loop.train(config(*overrides, "train.max_updates=8"), tmp_path / "resumed")
        assert "at update 4 (epoch 1" in capsys.readouterr().err
        return final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")

    return train_both
