"""`tformer score`: the log-probability a translation model gives each given (source, reference) pair.

fairseq's `--score-reference` and `marian-scorer`: no search, the reference is fed to the decoder (teacher
forcing, as in training) and each of its tokens' log-probabilities is read off and summed, EOS included. The
log-softmax is taken in fp32 whatever the weights' dtype (decode.precision), with no label smoothing.

Pairs are read as a stream, a chunk at a time: each chunk is sorted by length into batches of at most
`max_tokens` (padding counted) and its scores are yielded in file order. A pair longer than the model serves is
an error, not cut as `translate` cuts: the score of a cut pair is another pair's score, silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from tformer_cli.data.batching import pad_rows
from tformer_cli.decoding.translate import length_sorted_batches
from tformer_cli.errors import DataError, TformerError
from tformer_cli.kinds import MODEL_KINDS
from tformer_cli.run import Run
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID

CHUNK = 10_000  # pairs read, sorted and scored together (larger: fuller batches; the memory is their token ids)


@dataclass(frozen=True)
class PairScore:
    line: int  # 1-based line number in the files
    logprob: float  # sum of log p(reference tokens + EOS | source) under the model, natural log
    tokens: int  # target tokens scored (the reference's pieces + EOS)


def score_pairs(
    run: Run,
    src_lines: Iterable[str],
    ref_lines: Iterable[str],
    *,
    names: tuple[Path, Path],
    max_tokens: int | None = None,
) -> Iterator[PairScore]:
    """Score each reference line given its source line under a translation run's model, in file order.

    Args:
        run: a seq2seq run with its tokenizer (`decoding.load.load_for_decoding`).
        src_lines, ref_lines: the source and reference lines, read as they are needed (a line's newline may stay:
            SentencePiece's normalisation drops it with the other outer whitespace).
        names: the files the lines come from (source, reference), for the errors.
        max_tokens: tokens per batch, padding counted (default decode.max_tokens).

    Yields:
        One PairScore per line pair, in file order.

    Raises:
        TformerError: a run whose model is not seq2seq.
        ValueError: a run loaded without its tokenizer (a caller's bug).
        DataError: the files' line counts differ (raised at the line where one runs out, naming both files and
            their counts), or a source or reference longer than model.max_len tokens (EOS or BOS counted),
            naming its file and line.
    """
    if not MODEL_KINDS[run.kind].has_source:
        raise TformerError(
            f"{run.checkpoint} is of model.kind={run.kind}: scoring pairs needs a seq2seq (translation) model"
        )
    if run.tokenizer is None:
        raise ValueError("score_pairs needs the run loaded with its tokenizer (load_for_decoding)")  # a caller's bug
    budget = max_tokens if max_tokens is not None else run.config.decode.max_tokens
    pairs = _numbered_pairs(src_lines, ref_lines, names)
    while chunk := list(islice(pairs, CHUNK)):
        yield from _score_chunk(run, chunk, budget, names)


def _numbered_pairs(
    src_lines: Iterable[str], ref_lines: Iterable[str], names: tuple[Path, Path]
) -> Iterator[tuple[int, str, str]]:
    """(line number, source, reference), as `zip(strict=True)` but with a one-line error naming the files.

    Raises:
        DataError: one file ends before the other: both files and their line counts (the longer one is read
            to its end to count it).
    """
    sources, references = iter(src_lines), iter(ref_lines)
    line = 0
    while True:
        src, ref = next(sources, None), next(references, None)
        if src is None and ref is None:
            return
        line += 1
        if src is None or ref is None:
            rest = references if src is None else sources
            longer = line + sum(1 for _ in rest)
            counts = (line - 1, longer) if src is None else (longer, line - 1)
            raise DataError(
                f"{names[0]} has {counts[0]:,} lines and {names[1]} {counts[1]:,}: "
                "each source line needs its reference on the same line"
            )
        yield line, src, ref


def _score_chunk(
    run: Run, chunk: list[tuple[int, str, str]], max_tokens: int, names: tuple[Path, Path]
) -> Iterator[PairScore]:
    """The scores of `chunk`'s pairs in its order, computed in length-sorted batches."""
    tokenizer = run.tokenizer
    assert tokenizer is not None  # score_pairs checked it
    sources = [ids + [EOS_ID] for ids in tokenizer.encode([src for _, src, _ in chunk])]  # as `prepare` encodes
    references = tokenizer.encode([ref for _, _, ref in chunk])
    _check_lengths(chunk, sources, references, run.config.model.max_len, names)
    # a pair costs its longer side, decoder input (BOS + reference) and target (reference + EOS) alike
    lengths = [max(len(src), len(ref) + 1) for src, ref in zip(sources, references, strict=True)]
    scores: list[float] = [0.0] * len(chunk)
    for batch in length_sorted_batches(lengths, max_tokens):
        logprobs = _batch_logprobs(run.model, [sources[i] for i in batch], [references[i] for i in batch])
        for i, logprob in zip(batch, logprobs, strict=True):
            scores[i] = logprob
    for (line, _, _), ref, logprob in zip(chunk, references, scores, strict=True):
        yield PairScore(line=line, logprob=logprob, tokens=len(ref) + 1)


def _check_lengths(
    chunk: list[tuple[int, str, str]],
    sources: list[list[int]],
    references: list[list[int]],
    max_len: int,
    names: tuple[Path, Path],
) -> None:
    """Refuse the first pair whose source (with EOS) or reference (with BOS, or EOS) is longer than `max_len`.

    Raises:
        DataError: naming the file, the line, its length and model.max_len.
    """
    for (line, _, _), src, ref in zip(chunk, sources, references, strict=True):
        for name, length in ((names[0], len(src)), (names[1], len(ref) + 1)):
            if length > max_len:
                raise DataError(
                    f"{name}:{line}: {length:,} tokens (EOS or BOS counted), more than the model serves "
                    f"(model.max_len {max_len:,}); a cut line would get another pair's score: shorten or remove it"
                )


@torch.inference_mode()
def _batch_logprobs(model: torch.nn.Module, sources: list[list[int]], references: list[list[int]]) -> list[float]:
    """Teacher-forced sum of log p(reference + EOS | source) of each pair, in fp32."""
    device = next(model.parameters()).device
    src = pad_rows([np.asarray(ids) for ids in sources]).to(device)  # (B, S)
    tgt_in = pad_rows([np.asarray([BOS_ID, *ids]) for ids in references]).to(device)  # (B, T): BOS, reference
    tgt_out = pad_rows([np.asarray([*ids, EOS_ID]) for ids in references]).to(device)  # (B, T): reference, EOS
    logprobs = torch.log_softmax(model(src, tgt_in), dim=-1, dtype=torch.float32)  # (B, T, V)
    picked = logprobs.gather(-1, tgt_out[..., None]).squeeze(-1)  # (B, T); padding rows pick PAD, masked next
    return picked.masked_fill(tgt_out == PAD_ID, 0.0).sum(-1, dtype=torch.float64).tolist()  # long lines: fp64 sums
