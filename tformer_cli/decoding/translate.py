"""`tformer translate`: raw text in, raw text out, in input order, one output line per input line."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from tformer_cli.data.batching import pad_rows
from tformer_cli.decoding.search import Hypothesis, beam_search, greedy
from tformer_cli.decoding.static import largest_bucket, static_beam_search, static_greedy, use_static
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID, Tokenizer


def length_sorted_batches(
    lengths: list[int], max_tokens: int, fit: Callable[[int], int] | None = None
) -> list[list[int]]:
    """Indices grouped by length so that each batch holds at most max_tokens (with padding).

    fit: a batch of n sentences keeps fit(n) <= n of them, the rest starting the next batch (the last
    batch keeps all): the static path's sentence counts (`largest_bucket`), so that no rows are padding.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * lengths[order[end]] <= max_tokens:
            end += 1
        count = end - start if fit is None or end == len(order) else fit(end - start)
        batches.append(order[start : start + count])
        start += count
    return batches


def translate_lines(model, tokenizer: Tokenizer, lines: list[str], cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """Translate `lines`; an empty (or whitespace) line gets an empty hypothesis list."""
    device = next(model.parameters()).device
    fixed = use_static(cfg.static, device)  # decoding/static.py: on CUDA, fixed shapes and graphs
    search_greedy, search_beam = (static_greedy, static_beam_search) if fixed else (greedy, beam_search)
    encoded = [ids + [EOS_ID] for ids in tokenizer.encode(lines)]
    real = [i for i, line in enumerate(lines) if line.strip()]
    results: list[list[Hypothesis]] = [[] for _ in lines]
    fit = largest_bucket if fixed else None  # static shapes: batches of 2^k or 3 x 2^k sentences, none padding
    for batch in length_sorted_batches([len(encoded[i]) for i in real], cfg.max_tokens, fit):
        index = [real[j] for j in batch]
        src = pad_rows([torch.tensor(encoded[i]).numpy() for i in index]).to(device)
        if cfg.beam == 1:
            hyps = [[h] for h in search_greedy(model, src, cfg.max_len_a, cfg.max_len_b)]
        else:
            hyps = search_beam(model, src, cfg.beam, cfg.len_penalty, cfg.max_len_a, cfg.max_len_b, cfg.nbest)
        for i, h in zip(index, hyps, strict=True):
            results[i] = h
    return results


def format_output(tokenizer: Tokenizer, hyps: list[Hypothesis], line_no: int, nbest: int) -> list[str]:
    """The detokenized best hypothesis; with nbest > 1: `line<TAB>score<TAB>text` per hypothesis."""
    if nbest == 1:
        return [tokenizer.decode(hyps[0].tokens) if hyps else ""]
    return [f"{line_no}\t{h.score:.4f}\t{tokenizer.decode(h.tokens)}" for h in hyps] or [f"{line_no}\t0.0000\t"]


def translate_stream(
    model, tokenizer: Tokenizer, lines: Iterable[str], cfg: DecodeConfig, interactive: bool, translate=translate_lines
) -> Iterator[str]:
    """Output lines for input lines. Interactive: each line as soon as it is read; else in batches.

    `translate` is `translate_lines`, or another engine's function of the same arguments with its own
    `model` (decoding/ctranslate2.py).
    """
    if interactive:
        for n, line in enumerate(lines, start=1):
            yield from format_output(tokenizer, translate(model, tokenizer, [line], cfg)[0], n, cfg.nbest)
        return
    all_lines = list(lines)
    for n, hyps in enumerate(translate(model, tokenizer, all_lines, cfg), start=1):
        yield from format_output(tokenizer, hyps, n, cfg.nbest)
