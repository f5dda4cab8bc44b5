"""train.shift_blocks: each epoch of a language model cuts its token stream at a new offset."""

from types import SimpleNamespace

import numpy as np
import pytest

from tformer_cli.config import load_config
from tformer_cli.data.batching import block_offset, lm_blocks
from tformer_cli.errors import ConfigError
from tformer_cli.train.tasks import LMTask

BLOCK = 16


def _task(n_tokens: int, *overrides: str) -> LMTask:
    config = load_config(
        None, ["data.kind=text", "model.kind=lm", f"data.block_size={BLOCK}", "train.batch_size=4", *overrides]
    )
    prepared = SimpleNamespace(manifest={}, vocab_size=100, tokenizer_fingerprint="")
    stream = np.arange(n_tokens, dtype=np.int64)
    data = SimpleNamespace(prepared=prepared, train=(SimpleNamespace(tokens=stream),))
    return LMTask(config, data, valid=None)  # type: ignore[arg-type]


def _starts(task: LMTask, epoch: int) -> list[int]:
    return sorted(np.concatenate(task.batches(epoch)).tolist())


def test_each_epoch_cuts_the_stream_at_its_own_offset():
    task = _task(1000, "train.shift_blocks=true")
    epochs = [_starts(task, e) for e in range(6)]
    offsets = [s[0] for s in epochs]
    assert len(set(offsets)) > 1 and all(0 <= o < BLOCK for o in offsets)
    for starts, offset in zip(epochs, offsets, strict=True):
        assert starts == list(range(offset, 1000 - BLOCK, BLOCK))  # every block whole: start .. start + BLOCK
        assert 1000 - 1 - (starts[-1] + BLOCK) < BLOCK  # at most one block's tokens left at the end
    assert _starts(task, 3) == epochs[3]  # drawn from (seed, epoch): a resumed epoch gets the same blocks
    other_seed = _task(1000, "train.shift_blocks=true", "run.seed=2")
    assert [_starts(other_seed, e)[0] for e in range(6)] != offsets


def test_without_it_every_epoch_has_the_same_blocks():
    task = _task(1000)
    assert _starts(task, 0) == _starts(task, 1) == list(range(0, 1000 - BLOCK, BLOCK))
    assert task.batches(0)[0].tolist() != task.batches(1)[0].tolist()  # in another order


def test_a_stream_of_one_block_keeps_it():
    assert block_offset(BLOCK + 1, BLOCK, seed=0, epoch=0) == 0
    assert lm_blocks(BLOCK + 1, BLOCK, 0).tolist() == [0]
    assert all(o <= 30 - 1 - BLOCK for o in (block_offset(30, BLOCK, 0, e) for e in range(50)))


def test_only_a_token_stream_takes_it():
    with pytest.raises(ConfigError, match="train.shift_blocks needs data.kind=text"):
        load_config(None, ["data.kind=parallel", "model.kind=seq2seq", "train.shift_blocks=true"])
