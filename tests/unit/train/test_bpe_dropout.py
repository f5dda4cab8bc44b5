"""train.bpe_dropout (data/bpe_dropout.py): each epoch's training pairs segmented anew, the same sentences in other
pieces, drawn from (run.seed, epoch) only; pairs that cannot be resegmented or would not fit keep their prepared
ids; the translation task trains on the epoch's pairs, and a run resumed across epochs ends bit for bit where the
straight run does."""

import random

import numpy as np
import pytest
import torch
from tiny_models import GERMAN, WORDS

from tformer_cli.config import load_config
from tformer_cli.data.batching import TokenArray
from tformer_cli.data.bpe_dropout import BpeDropout
from tformer_cli.data.prepared import PreparedData
from tformer_cli.errors import ConfigError
from tformer_cli.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer
from tformer_cli.train import tasks
from tformer_cli.train.resume import recipe_changes


@pytest.fixture(scope="module")
def translation(prepared_pairs):
    """`overrides -> Config` for 120 prepared pairs (100 to train) of 3-12 words, a word-for-word 'German'."""
    rng = random.Random(1)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(120)]
    pairs = [(s, " ".join(GERMAN[w] for w in s.split())) for s in sentences]
    return prepared_pairs(pairs, 100, "tokenizer.vocab_size=80", "train.max_tokens=1024", "train.log_every=1")


def _rows(array: TokenArray) -> list[list[int]]:
    return [array[i].tolist() for i in range(len(array))]


def _all_fit(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    return np.ones(len(src_lengths), dtype=bool)


def _sampler(
    config, p: tuple[float, float] = (0.1, 0.1), seed: int = 0, fits=_all_fit
) -> tuple[BpeDropout, PreparedData]:
    prepared = PreparedData(config.data, config.tokenizer)
    src, tgt = prepared.split("train")
    return BpeDropout(prepared.tokenizer_path, src, tgt, p, seed, fits), prepared


def test_an_epoch_is_the_same_sentences_in_other_pieces(translation):
    sampler, prepared = _sampler(translation())
    tokenizer = Tokenizer(prepared.tokenizer_path)
    for prepared_side, side in zip(prepared.split("train"), sampler.epoch(0), strict=True):
        before, after = _rows(prepared_side), _rows(side)
        assert len(after) == len(before) and all(row[-1] == EOS_ID for row in after)
        assert [tokenizer.decode(row) for row in after] == [tokenizer.decode(row) for row in before]
        changed = sum(a != b for a, b in zip(after, before, strict=True))
        assert changed > len(before) // 2  # most sentences of 3-12 words lose a merge somewhere at p = 0.1
        assert sum(map(len, after)) > sum(map(len, before))  # skipped merges: more, shorter pieces


def test_an_epoch_is_drawn_from_the_seed_and_the_epoch_only(translation):
    sampler, _ = _sampler(translation())
    first = [_rows(side) for side in sampler.epoch(3)]
    sampler.epoch(4)  # other draws in between do not change epoch 3
    assert [_rows(side) for side in sampler.epoch(3)] == first
    again, _ = _sampler(translation())  # nor does a new sampler (a resumed run)
    assert [_rows(side) for side in again.epoch(3)] == first
    assert [_rows(side) for side in sampler.epoch(4)] != first
    other_seed, _ = _sampler(translation(), seed=1)
    assert [_rows(side) for side in other_seed.epoch(3)] != first


def test_p_zero_is_the_prepared_segmentation(translation):
    sampler, prepared = _sampler(translation(), p=(0.0, 0.0))
    assert [_rows(side) for side in sampler.epoch(0)] == [_rows(side) for side in prepared.split("train")]


def test_a_side_whose_p_is_zero_keeps_its_prepared_ids(translation):
    sampler, prepared = _sampler(translation(), p=(0.1, 0.0))
    (src, tgt), (prepared_src, prepared_tgt) = sampler.epoch(0), prepared.split("train")
    assert _rows(tgt) == _rows(prepared_tgt) and _rows(src) != _rows(prepared_src)


def test_pairs_that_do_not_fit_or_do_not_encode_back_keep_their_prepared_ids(translation):
    config = translation()
    prepared = PreparedData(config.data, config.tokenizer)
    src, tgt = prepared.split("train")
    src_rows, tgt_rows = _rows(src), _rows(tgt)
    src_rows[0] = [src_rows[0][0], UNK_ID, EOS_ID]  # decodes to a ⁇, which does not encode back to UNK_ID
    src = TokenArray.from_rows(src_rows, src.tokens.dtype)
    sampler = BpeDropout(prepared.tokenizer_path, src, tgt, (0.1, 0.1), 0, lambda s, t: np.arange(len(s)) % 2 == 0)
    new_src, new_tgt = (_rows(side) for side in sampler.epoch(0))
    assert new_src[0] == src_rows[0] and new_tgt[0] == tgt_rows[0]  # the pair of the unknown piece: both sides
    odd = range(1, len(src_rows), 2)  # `fits` refused these
    assert [new_src[i] for i in odd] == [src_rows[i] for i in odd] and [new_tgt[i] for i in odd] == [
        tgt_rows[i] for i in odd
    ]
    even = range(2, len(src_rows), 2)
    assert sum(new_src[i] != src_rows[i] for i in even) > len(even) // 2


def test_the_task_trains_on_each_epochs_pairs(translation):
    """batches(epoch) covers every pair once; inputs() and count() read that epoch's segmentation."""
    task = tasks.make_task(translation("train.bpe_dropout=[0.1,0.1]"))
    plain = tasks.make_task(translation())
    sampler, _ = _sampler(translation(), seed=translation().run.seed)
    for epoch in (0, 1):
        batches = task.batches(epoch)
        src, tgt = (_rows(side) for side in sampler.epoch(epoch))
        assert sorted(np.concatenate(batches).tolist()) == list(range(100))
        for batch in batches:
            source, decoder_in, target = task.inputs(batch, torch.device("cpu"))
            for row, i in enumerate(batch):
                assert [t for t in source[row].tolist() if t != PAD_ID] == src[i]
                assert [t for t in target[row].tolist() if t != PAD_ID] == tgt[i]
            assert task.count(batch) == sum(len(tgt[i]) for i in batch)
    prepared_tokens = sum(plain.count(b) for b in plain.batches(0))
    assert sum(task.count(b) for b in task.batches(0)) > prepared_tokens


def test_a_run_resumed_across_epochs_ends_bit_for_bit_where_the_straight_run_does(translation, straight_and_resumed):
    """4 updates, a resume in the first epoch, 4 more = 8 straight, over two epochs (each resegmented)."""
    overrides = ("train.bpe_dropout=[0.1,0.1]", "train.max_tokens=400")
    assert 4 < len(tasks.make_task(translation(*overrides)).batches(0)) < 8  # the 8 updates cross into epoch 2
    straight, resumed = straight_and_resumed(translation, *overrides)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["data.kind=text", "model.kind=lm", "train.bpe_dropout=[0.1,0.1]"],
            "train.bpe_dropout needs data.kind=parallel",
        ),
        (
            ["data.kind=parallel", "model.kind=seq2seq", "tokenizer.kind=unigram", "train.bpe_dropout=[0.1,0.1]"],
            "tokenizer.kind=bpe",
        ),
        (
            ["data.kind=parallel", "model.kind=seq2seq", "train.bpe_dropout=[0.1,1]"],
            r"train.bpe_dropout must be in \[0, 1\) each",
        ),
    ],
)
def test_a_recipe_it_cannot_apply_to_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_it_cannot_change_inside_an_epoch():
    from tformer_cli.config import config_to_dict

    saved = config_to_dict(load_config(None, ["data.kind=parallel", "model.kind=seq2seq"]))
    current = config_to_dict(
        load_config(None, ["data.kind=parallel", "model.kind=seq2seq", "train.bpe_dropout=[0.1,0.1]"])
    )
    with pytest.raises(Exception, match="cannot change mid-run: train.bpe_dropout"):
        recipe_changes(saved, current, update=41, mid_epoch=True)
    assert [c["key"] for c in recipe_changes(saved, current, update=41, mid_epoch=False)] == ["train.bpe_dropout"]


def _pair_sizes(src: TokenArray, tgt: TokenArray, limit: str) -> np.ndarray:
    """What each limit counts: positions the longer side, a batch the longer of source and target + 1."""
    return np.maximum(src.lengths, tgt.lengths + (limit == "max_tokens"))


@pytest.mark.parametrize("limit", ["positions", "max_tokens"])
def test_the_task_keeps_the_prepared_ids_of_pairs_that_would_outgrow_a_limit(translation, limit):
    """A sampled segmentation has more pieces; where that would pass model.max_len (learned positions) or
    train.max_tokens, which the prepared pairs fit, the pair keeps its prepared ids."""
    config = translation()
    longest = int(_pair_sizes(*PreparedData(config.data, config.tokenizer).split("train"), limit).max())
    setting = f"model.pos=learned model.max_len={longest}" if limit == "positions" else f"train.max_tokens={longest}"
    task = tasks.make_task(translation("train.bpe_dropout=[0.1,0.1]", *setting.split()))
    task.batches(0)
    assert _pair_sizes(task.train_src, task.train_tgt, limit).max() <= longest
    free = tasks.make_task(translation("train.bpe_dropout=[0.1,0.1]"))
    free.batches(0)
    grown = np.flatnonzero(_pair_sizes(free.train_src, free.train_tgt, limit) > longest)  # what the limit stopped
    assert grown.size
    prepared_src, prepared_tgt = PreparedData(config.data, config.tokenizer).split("train")
    assert [task.train_src[i].tolist() for i in grown] == [prepared_src[i].tolist() for i in grown]
    assert [task.train_tgt[i].tolist() for i in grown] == [prepared_tgt[i].tolist() for i in grown]
