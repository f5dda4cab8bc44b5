"""decoding/translate.py's batching: length-sorted batches within a token budget, and for the static path
(decoding/static.py) batches of the sentence counts it runs without padded rows; its batches on the model's device."""

import random

import pytest
import torch
from meta_device import off_the_cpu

from tformer_cli.decoding.static import largest_bucket, sentence_bucket
from tformer_cli.decoding.translate import length_sorted_batches, translate_lines
from tformer_cli.model import build_model
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import Tokenizer


def test_largest_bucket_is_the_largest_count_the_static_path_keeps_as_it_is():
    kept = [n for n in range(1, 2049) if sentence_bucket(n) == n]  # 1, 2, 3, 4, 6, 8, 12, ...
    for n in range(1, 2049):
        assert largest_bucket(n) == max(b for b in kept if b <= n), n


def _check(batches, lengths, max_tokens):
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))  # each sentence once
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)  # by length
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens


def test_batches_hold_each_sentence_once_by_length_within_the_budget_and_fit_cuts_them_to_buckets():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 120) for _ in range(rng.randint(1, 400))]
        max_tokens = rng.choice([50, 300, 4096])
        plain = length_sorted_batches(lengths, max_tokens)
        _check(plain, lengths, max_tokens)
        fitted = length_sorted_batches(lengths, max_tokens, fit=largest_bucket)
        _check(fitted, lengths, max_tokens)
        assert all(sentence_bucket(len(b)) == len(b) for b in fitted[:-1])  # no padded rows but the last batch's
        first = plain[0] if len(plain) == 1 else plain[0][: largest_bucket(len(plain[0]))]
        assert fitted[0] == first  # the budget's batch, cut (unless it is the last), not a smaller one


def test_without_fit_a_batch_is_the_most_sentences_the_budget_holds():
    assert length_sorted_batches([3, 1, 2, 2, 5], 6) == [[1, 2, 3], [0], [4]]  # 3 x 2 tokens, then 1 x 3, 1 x 5
    assert length_sorted_batches([4] * 7, 28, fit=largest_bucket) == [list(range(7))]  # the last keeps all 7
    assert length_sorted_batches([4] * 9, 28, fit=largest_bucket) == [list(range(6)), [6, 7, 8]]


@pytest.mark.parametrize("static", ["never", "always"])
@pytest.mark.parametrize("beam", [1, 4])
def test_translating_lines_runs_on_another_device_than_the_cpu(tokenizer_dir, static, beam):
    """`tformer translate`'s batches go to the model's device, each search runs there: on the meta device, which
    refuses a CPU tensor mixed in as CUDA does, the CPU's hypotheses (tests/unit/meta_device.py, `off_the_cpu`)."""
    tokenizer = Tokenizer(tokenizer_dir / "spm.model")
    torch.manual_seed(0)
    model = build_model("seq2seq", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    lines = ["the cat is red", "", "a small dog with we you they and of", "blue"]
    cfg = DecodeConfig(beam=beam, nbest=min(beam, 2), static=static, max_len_b=6)
    on_cpu, on_meta = off_the_cpu(lambda m: translate_lines(m, tokenizer, lines, cfg), model.eval())
    assert [[h.tokens for h in hyps] for hyps in on_meta] == [[h.tokens for h in hyps] for hyps in on_cpu]
    assert [len(hyps) for hyps in on_cpu] == [min(beam, 2), 0, min(beam, 2), min(beam, 2)]
