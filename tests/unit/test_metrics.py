"""Metrics: sacreBLEU parity with its CLI, perplexity conversions, sliding window = blocks."""

import json
import math
import subprocess
import sys

import pytest
import torch

from tformer_cli.metrics import Perplexity, bleu_chrf, count_words_and_bytes, looks_tokenized, stream_nll
from tformer_cli.model import build_model

HYP = ["The cat sat on the mat.", "A quick brown fox jumps.", "Hello world!", ""]
REF = ["The cat is sitting on the mat.", "The quick brown fox jumps over.", "Hello, world!", "Nothing."]


def test_bleu_equals_the_sacrebleu_command(tmp_path):
    (tmp_path / "hyp").write_text("\n".join(HYP) + "\n")
    (tmp_path / "ref").write_text("\n".join(REF) + "\n")
    ours = bleu_chrf(HYP, REF)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "sacrebleu",
            str(tmp_path / "ref"),
            "-i",
            str(tmp_path / "hyp"),
            "-m",
            "bleu",
            "chrf",
            "-w",
            "2",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    scores = json.loads(cli.stdout)
    assert ours["bleu"] == scores[0]["score"]
    assert ours["bleu_signature"] == scores[0]["signature"]
    assert ours["chrf"] == scores[1]["score"]
    assert ours["chrf_signature"] == scores[1]["signature"]


def test_tokenized_reference_is_detected():
    assert looks_tokenized(["it &apos;s a test .", "the U.S. @-@ based firm , he said ."] * 5)
    assert not looks_tokenized(["It's a test.", "The U.S.-based firm, he said."] * 5)


def test_per_word_perplexity_on_a_hand_made_example():
    words, n_bytes = count_words_and_bytes(["a b c", "d", ""])
    assert (words, n_bytes) == (3 + 1 + 1 + 1 + 0 + 1, 5 + 1 + 1 + 1 + 0 + 1)
    ppl = Perplexity(nll=12.0, tokens=10, words=6, bytes=9)
    assert ppl.per_token == pytest.approx(math.exp(1.2))
    assert ppl.per_word == pytest.approx(math.exp(2.0))
    assert ppl.bits_per_byte == pytest.approx(12.0 / math.log(2) / 9)


@pytest.fixture(scope="module")
def lm(device):
    torch.manual_seed(0)
    return (
        build_model(
            "lm",
            vocab_size=30,
            d_model=32,
            n_heads=4,
            n_layers=2,
            d_ff=64,
            dropout=0.0,
            norm_placement="pre",
            pos="rope",
        )
        .eval()
        .to(device)
    )


def test_sliding_window_with_stride_equal_to_block_is_block_evaluation(lm, device):
    stream = torch.randint(1, 30, (101,))  # on the CPU, as `tformer perplexity` reads it: scored on the model's device
    sliding, n = stream_nll(lm, stream, window=16, stride=16)
    blocks, count = 0.0, 0
    for s in range(0, 100, 16):
        chunk = stream[s : s + 17].to(device)
        logits = lm(chunk[None, :-1])[0]
        blocks += float(torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").detach())
        count += chunk.numel() - 1
    assert n == count == 100 and sliding == pytest.approx(blocks, rel=1e-5)


def test_sliding_window_scores_every_token_once(lm):
    stream = torch.randint(1, 30, (75,))
    for stride in (1, 5, 8, 16):
        _, n = stream_nll(lm, stream, window=16, stride=stride)
        assert n == 74
    full, _ = stream_nll(lm, stream, window=80, stride=80)  # one window sees everything
    one_step, _ = stream_nll(lm, stream, window=80, stride=1)
    assert one_step == pytest.approx(full, rel=1e-5)


def test_a_sliding_window_projects_only_the_positions_it_scores(lm):
    """The output projection (vocabulary-sized) runs once per scored token, not for a window's whole context."""
    rows = []
    hook = lm.output.register_forward_hook(lambda module, inputs, out: rows.append(inputs[0].shape[:-1].numel()))
    try:
        _, n = stream_nll(lm, torch.randint(1, 30, (75,)), window=16, stride=4)
    finally:
        hook.remove()
    assert sum(rows) == n == 74


def test_known_test_sets_must_have_their_size():
    from tformer_cli.errors import DataError
    from tformer_cli.evaluate import evaluate_translation

    lines = ["the cat sat on the mat today"] * 2737
    with pytest.raises(DataError, match="newstest2014-full has 3003 lines, the reference has 2737"):
        evaluate_translation(lines, lines, "newstest2014-full")
    assert evaluate_translation(lines, lines, "newstest2014-filtered")["bleu"] == 100.0


def test_the_sliding_window_runs_on_another_device_than_the_cpu():
    """Its windows go to the model's device in one copy and its sum stays there (tests/unit/meta_device.py)."""
    from meta_device import META, OffTheCpu

    torch.manual_seed(0)
    model = build_model("lm", vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, pos="rope")
    with OffTheCpu() as reads:
        model.to(META)  # moved here: tied weights stay tied
        _, n = stream_nll(model, torch.randint(1, 30, (75,)), window=16, stride=5)
    # 12 windows in 2 batches of 8: each forward's "any padding?" (model/cache.py), then the total, once
    assert n == 74 and reads.reads == 2 + 1
