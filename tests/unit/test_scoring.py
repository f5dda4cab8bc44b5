"""Scoring given (source, reference) pairs (tformer_cli/scoring.py): teacher-forced log-probabilities that equal
a forward pass by hand and greedy search's own scores, in file order whatever the batches, and one-line errors."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from tiny_models import WORDS

from tformer_cli import scoring
from tformer_cli.config import config_to_dict, load_config
from tformer_cli.decoding.load import load_for_decoding
from tformer_cli.decoding.search import greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.errors import DataError, TformerError
from tformer_cli.files import sha256_file
from tformer_cli.run import build_model_from_config
from tformer_cli.run.checkpoints import save_checkpoint
from tformer_cli.run.layout import step_file
from tformer_cli.scoring import PairScore, score_pairs
from tformer_cli.tokenizer import BOS_ID, EOS_ID, Tokenizer

NAMES = (Path("test.en"), Path("test.de"))
MAX_LEN = 64  # model.max_len of the tiny runs: the over-long lines are longer


def _save_run(folder: Path, tokenizer_dir: Path, kind: str = "seq2seq") -> None:
    """A run directory with one indexed checkpoint of a tiny model with random weights (seed 0)."""
    data = "parallel" if kind == "seq2seq" else "text"
    config = load_config(
        None,
        [
            f"data.kind={data}",
            f"model.kind={kind}",
            f"data.dir={tokenizer_dir}",
            "tokenizer.vocab_size=40",
            "model.d_model=16",
            "model.n_heads=2",
            "model.n_layers=1",
            "model.d_ff=32",
            "model.dropout=0.0",
            f"model.max_len={MAX_LEN}",
        ],
    )
    tokenizer = Tokenizer(tokenizer_dir / "spm.model")
    torch.manual_seed(0)
    model = build_model_from_config(config, tokenizer.vocab_size)
    path = folder / "checkpoints" / step_file(1)
    state = {"model": model.state_dict(), "config": config_to_dict(config)}
    save_checkpoint({**state, "tokenizer_fingerprint": tokenizer.fingerprint}, path)
    index = {"latest": path.name, "files": {path.name: {"step": 1, "sha256": sha256_file(path), "metric": None}}}
    (folder / "checkpoints" / "index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer_dir):
    folder = tmp_path_factory.mktemp("run")
    _save_run(folder, tokenizer_dir)
    return load_for_decoding(folder, device="cpu")


def _lines(n: int, longest: int = 8, seed: int = 0) -> list[str]:
    """`n` lines of 0..longest words, longest first (so that sorting by length reorders them)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = sorted(torch.randint(0, longest + 1, (n,), generator=gen).tolist(), reverse=True)
    return [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (k,), generator=gen)) for k in lengths]


def _by_hand(run, source: str, reference: str) -> float:
    """One pair alone: the model's forward, a log-softmax, the reference's tokens and EOS picked, summed."""
    src = run.tokenizer.encode([source])[0] + [EOS_ID]
    ref = run.tokenizer.encode([reference])[0]
    with torch.no_grad():
        logits = run.model(torch.tensor([src]), torch.tensor([[BOS_ID, *ref]]))[0]  # (T, V)
    logprobs = torch.log_softmax(logits.double(), -1)
    return sum(float(logprobs[t, token]) for t, token in enumerate([*ref, EOS_ID]))


def test_batched_scores_equal_a_forward_by_hand_for_each_pair_in_file_order(run):
    sources, references = _lines(12, seed=1), _lines(12, seed=2)[::-1]  # short references with long sources
    for max_tokens in (1, 40, 4096):  # one pair a batch, a few batches sorted by length, one batch
        scores = list(score_pairs(run, sources, references, names=NAMES, max_tokens=max_tokens))
        assert [s.line for s in scores] == list(range(1, 13))
        for score, source, reference in zip(scores, sources, references, strict=True):
            assert score.logprob == pytest.approx(_by_hand(run, source, reference), abs=1e-5), (max_tokens, score)
            assert score.tokens == len(run.tokenizer.encode([reference])[0]) + 1


def test_bf16_weights_are_scored_with_an_fp32_log_softmax(run):
    bf16 = load_for_decoding(run.run_dir, ["decode.precision=bf16"], device="cpu")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    sources, references = _lines(4, seed=8), _lines(4, seed=9)
    scores = score_pairs(bf16, sources, references, names=NAMES, max_tokens=1)  # each pair alone: the same logits
    expected = [_by_hand(bf16, s, r) for s, r in zip(sources, references, strict=True)]
    assert [s.logprob for s in scores] == pytest.approx(expected, abs=1e-4)  # a bf16 softmax is off by ~1e-2


def test_the_batches_are_sorted_by_length_yet_the_scores_come_in_file_order(run, monkeypatch):
    sources = _lines(10, seed=3)  # longest first: sorted batches visit them in reverse
    references = sources
    batches = []
    score_batch = scoring._batch_logprobs
    monkeypatch.setattr(
        scoring, "_batch_logprobs", lambda model, s, r: batches.append(len(s)) or score_batch(model, s, r)
    )
    scores = list(score_pairs(run, sources, references, names=NAMES, max_tokens=30))
    assert len(batches) > 2  # several batches (the order within the chunk is theirs)
    expected = [_by_hand(run, s, r) for s, r in zip(sources, references, strict=True)]
    assert [s.logprob for s in scores] == pytest.approx(expected, abs=1e-5)
    assert [s.line for s in scores] == list(range(1, 11))


def test_pairs_are_streamed_a_chunk_at_a_time_with_the_same_scores(run, monkeypatch):
    sources, references = _lines(7, seed=4), _lines(7, seed=5)
    whole = list(score_pairs(run, sources, references, names=NAMES))
    monkeypatch.setattr(scoring, "CHUNK", 3)
    streamed = list(score_pairs(run, iter(sources), iter(references), names=NAMES))
    assert [s.line for s in streamed] == list(range(1, 8))
    assert [s.logprob for s in streamed] == pytest.approx([s.logprob for s in whole], abs=1e-5)


def test_an_empty_reference_scores_just_eos(run):
    (score,) = score_pairs(run, ["the red house"], [""], names=NAMES)
    src = torch.tensor([run.tokenizer.encode(["the red house"])[0] + [EOS_ID]])
    with torch.no_grad():
        logits = run.model(src, torch.tensor([[BOS_ID]]))[0, 0]
    assert score == PairScore(line=1, logprob=score.logprob, tokens=1)
    assert score.logprob == pytest.approx(float(torch.log_softmax(logits.double(), -1)[EOS_ID]), abs=1e-5)


def test_lines_read_from_a_file_with_their_newlines_score_as_their_text(run):
    plain = list(score_pairs(run, ["the cat", "a dog"], ["we you", "red"], names=NAMES))
    read = list(score_pairs(run, ["the cat\n", "a dog\r\n"], ["we you\n", "red\n"], names=NAMES))
    assert read == plain


class _IdTokenizer:
    """Text that is token ids written out ("5 17 9"): every id sequence survives the way to text and back."""

    vocab_size = 40

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[int(t) for t in text.split()] for text in texts]


def test_the_score_of_greedys_own_output_is_greedys_logprob(run):
    ids = dataclasses.replace(run, tokenizer=_IdTokenizer())
    torch.manual_seed(6)
    sources = [torch.randint(4, 40, (n,)).tolist() for n in (3, 9, 5, 12, 1)]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s + [EOS_ID]) for s in sources], batch_first=True)
    hypotheses = greedy(run.model, src, SearchSettings(max_len_b=8, served=MAX_LEN))
    references = [" ".join(map(str, h.tokens[:-1])) for h in hypotheses]  # the output without its EOS
    assert len({len(h.tokens) for h in hypotheses}) > 1  # outputs of several lengths, in one batch
    scores = list(score_pairs(ids, [" ".join(map(str, s)) for s in sources], references, names=NAMES))
    assert [s.logprob for s in scores] == pytest.approx([h.logprob for h in hypotheses], abs=1e-5)
    assert [s.tokens for s in scores] == [len(h.tokens) for h in hypotheses]


@pytest.mark.parametrize("n_src, n_ref", [(5, 3), (3, 5)])
def test_files_of_different_line_counts_are_refused_at_the_line_where_one_ends(run, monkeypatch, n_src, n_ref):
    monkeypatch.setattr(scoring, "CHUNK", 2)
    lines = _lines(5, seed=7)
    scores = score_pairs(run, iter(lines[:n_src]), iter(lines[:n_ref]), names=NAMES)
    assert [next(scores).line, next(scores).line] == [1, 2]  # the first chunk came before the end was known
    with pytest.raises(DataError) as refused:
        next(scores)
    message = str(refused.value)
    assert message == (
        f"test.en has {n_src} lines and test.de {n_ref}: each source line needs its reference on the same line"
    )


@pytest.mark.parametrize("side", [0, 1])
def test_a_line_longer_than_the_model_serves_is_refused_naming_its_file_and_line(run, side):
    long = " ".join(WORDS * 2)  # far more than MAX_LEN tokens
    pairs = [["the cat", "a dog", "red"], ["we", "you", "they"]]
    pairs[side][1] = long
    with pytest.raises(DataError) as refused:
        list(score_pairs(run, *pairs, names=NAMES))
    message = str(refused.value)
    assert message.startswith(f"{NAMES[side]}:2: ") and f"model.max_len {MAX_LEN}" in message
    assert "\n" not in message


@pytest.mark.parametrize("side", [0, 1])
def test_a_line_exactly_as_long_as_the_model_serves_is_scored(run, side):
    fits = " ".join(["5"] * (MAX_LEN - 1))  # with EOS (or BOS), MAX_LEN tokens
    ids = dataclasses.replace(run, tokenizer=_IdTokenizer())
    pair = ["5 6", "7"]
    pair[side] = fits
    (score,) = score_pairs(ids, [pair[0]], [pair[1]], names=NAMES)
    with pytest.raises(DataError, match=f":1: {MAX_LEN + 1} tokens"):
        pair[side] = fits + " 5"
        list(score_pairs(ids, [pair[0]], [pair[1]], names=NAMES))
    assert score.tokens == (MAX_LEN if side == 1 else 2)


def test_a_model_that_does_not_translate_is_refused(tmp_path, tokenizer_dir):
    _save_run(tmp_path, tokenizer_dir, kind="lm")
    lm = load_for_decoding(tmp_path, device="cpu")
    with pytest.raises(TformerError, match=r"model.kind=lm: scoring pairs needs a seq2seq \(translation\) model"):
        list(score_pairs(lm, ["the cat"], ["we"], names=NAMES))
