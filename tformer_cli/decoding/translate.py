"""`tformer translate`: raw text in, raw text out, in input order, one output line per input line.

Long inputs are bounded: a source longer than the positions the model serves (`served`: model.max_len, EOS
included) is cut to its first served - 1 tokens, with a warning on stderr naming its line, and the file
goes on (fairseq's --max-source-positions with truncation, Marian's --max-length-crop: one bad line
does not cost the rest). Outputs end by a * |source| + b tokens and by the served length (decoding/rules.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator

import torch

from tformer_cli.data.batching import pad_rows
from tformer_cli.decoding.api import translate_batch
from tformer_cli.decoding.rules import Hypothesis
from tformer_cli.decoding.search import served_length
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.decoding.static import largest_bucket, use_static
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


def translate_lines(
    model,
    tokenizer: Tokenizer,
    lines: list[str],
    cfg: DecodeConfig,
    served: int | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[list[Hypothesis]]:
    """Translate `lines` with the recipe's decode settings (one `SearchSettings`, decoding/api.py's
    `translate_batch`); an empty (or whitespace) line gets an empty hypothesis list.

    on_done(n): told how many more lines are translated, after each batch (progress; empty lines at once).

    served: the positions the model serves (model.max_len; None: its learned table's length, if any).
    A longer source is cut to its first served - 1 tokens and EOS (`translate_stream` says which), and
    outputs end by that many tokens.
    """
    device = next(model.parameters()).device
    src_limit = served_length(model.encoder, served)
    settings = SearchSettings.from_decode(cfg, served_length(model.decoder, served))
    keep = None if src_limit is None else src_limit - 1  # source tokens kept before EOS
    encoded = [ids[:keep] + [EOS_ID] for ids in tokenizer.encode(lines)]
    real = [i for i, line in enumerate(lines) if line.strip()]
    results: list[list[Hypothesis]] = [[] for _ in lines]
    if on_done is not None:
        on_done(len(lines) - len(real))
    # where the fixed-shape path may decode (decoding/static.py: on CUDA), batches of 2^k or 3 x 2^k sentences,
    # its shapes, so that no row is padding; `translate_batch` decides which path decodes each
    fit = largest_bucket if use_static(cfg.static, device) else None
    for batch in length_sorted_batches([len(encoded[i]) for i in real], cfg.max_tokens, fit):
        index = [real[j] for j in batch]
        src = pad_rows([torch.tensor(encoded[i]).numpy() for i in index]).to(device)
        for i, h in zip(index, translate_batch(model, src, settings), strict=True):
            results[i] = h
        if on_done is not None:
            on_done(len(index))
    return results


def format_output(tokenizer: Tokenizer, hyps: list[Hypothesis], line_no: int, nbest: int) -> list[str]:
    """The detokenized best hypothesis; with nbest > 1: `line<TAB>score<TAB>text` per hypothesis (an empty line,
    which has none: its empty translation nbest times, so that every input line has its block of nbest)."""
    if nbest == 1:
        return [tokenizer.decode(hyps[0].tokens) if hyps else ""]
    return [f"{line_no}\t{h.score:.4f}\t{tokenizer.decode(h.tokens)}" for h in hyps] or [f"{line_no}\t0.0000\t"] * nbest


def translate_stream(
    model,
    tokenizer: Tokenizer,
    lines: Iterable[str],
    cfg: DecodeConfig,
    interactive: bool,
    translate: Callable[..., list[list[Hypothesis]]] | None = None,
    served: int | None = None,
    warn: Callable[[str], None] | None = None,
    on_done: Callable[[int], None] | None = None,
) -> Iterator[str]:
    """Output lines for input lines. Interactive: each line as soon as it is read; else in batches, and
    `on_done(n)` is told after each batch how many more lines are translated (progress).

    `translate`: None, tformer's model (`translate_lines`), which bounds its sources and outputs at the positions
    it serves; or another engine's function of `translate_lines`' first four arguments and `on_done`, with its
    own `model` (decoding/ctranslate2.py), which bounds its outputs itself. served: the positions the model
    serves (model.max_len; None: the native model's learned table, if any): a longer line is cut to its first
    served - 1 tokens, and `warn` (default: stderr) names it.
    """
    if translate is None:
        served = served_length(model.encoder, served)
        translate = _native(served)
    warn = warn or _to_stderr
    if interactive:
        for n, line in enumerate(lines, start=1):
            cut = cut_long_lines(tokenizer, [line], served, n, warn)
            yield from format_output(tokenizer, translate(model, tokenizer, cut, cfg)[0], n, cfg.nbest)
        return
    all_lines = cut_long_lines(tokenizer, list(lines), served, 1, warn)
    for n, hyps in enumerate(translate(model, tokenizer, all_lines, cfg, on_done=on_done), start=1):
        yield from format_output(tokenizer, hyps, n, cfg.nbest)


def cut_long_lines(
    tokenizer: Tokenizer, lines: list[str], served: int | None, first: int, warn: Callable[[str], None]
) -> list[str]:
    """`lines` with each one longer than `served` tokens (EOS included) cut to its first served - 1 tokens'
    text, and a warning naming it (`first`: the first line's number)."""
    if served is None:
        return lines
    out = list(lines)
    for i, ids in enumerate(tokenizer.encode(lines)):
        if len(ids) + 1 > served:
            warn(
                f"warning: line {first + i}: {len(ids) + 1:,} tokens, more than the model serves (model.max_len "
                f"{served:,}): translated from its first {served - 1:,} tokens"
            )
            out[i] = tokenizer.decode(ids[: served - 1])
    return out


def _native(served: int | None) -> Callable[..., list[list[Hypothesis]]]:
    """`translate_lines` at the positions the model serves."""

    def translate(
        model, tokenizer: Tokenizer, lines: list[str], cfg: DecodeConfig, on_done=None
    ) -> list[list[Hypothesis]]:
        return translate_lines(model, tokenizer, lines, cfg, served, on_done)

    return translate


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
