"""`tformer generate`'s output: a prompt continued, its text written as the tokens are produced (or, with
decode.samples > 1, several continuations, each written whole)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from tformer_cli.decoding.api import generate
from tformer_cli.decoding.search import served_length
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.schema import DecodeConfig, check_samples
from tformer_cli.tokenizer import EOS_ID, Tokenizer

SAMPLE_SEPARATOR = "\n" + "-" * 15 + "\n"  # between samples: nanoGPT's line of dashes


def stream_generation(
    model: nn.Module,
    tokenizer: Tokenizer,
    text: str,
    cfg: DecodeConfig,
    write: Callable[[str], None],
    served: int | None = None,
    warn: Callable[[str], None] | None = None,
) -> str:
    """Continue `text` with `cfg`'s sampling settings; `write` gets the prompt, then each new piece of text.

    Prompt and continuation are detokenized together and only the new characters are written, so a
    piece's leading space (SentencePiece's "▁") survives. The stream starts after an end-of-line (the
    prompt follows EOS, as each line does in training) and stops at the next EOS or after
    `cfg.max_new_tokens` tokens. The controls decode.min_len (no EOS before that many new tokens),
    decode.no_repeat_ngram and decode.repetition_penalty act over prompt + new tokens (decoding/rules.py).

    decode.samples N > 1 (nanoGPT's num_samples, Hugging Face's num_return_sequences): N continuations of the
    prompt, drawn together (reproducible with decode.seed), each written whole once all are done, the prompt
    and its continuation, in order, with a line of 15 dashes between two (as nanoGPT prints them):
    "sample 1\n---------------\nsample 2". Greedy decoding (decode.temperature 0, or decode.top_k 1) would
    give N identical samples: refused (`check_samples`), as Hugging Face refuses num_return_sequences > 1
    without sampling.

    Long inputs are bounded by the positions a Transformer serves (served: model.max_len; None: its
    learned table's length, if any; a recurrent model serves any length): a longer prompt keeps its last
    tokens (the text to continue), and the new tokens are capped at what is left; `warn` (default:
    stderr) says so.

    Returns:
        The whole text written.

    Raises:
        ConfigError: decode.samples > 1 with greedy decoding.
    """
    check_samples(cfg)
    ids = [EOS_ID] + tokenizer.encode([text])[0]
    decoder = getattr(model, "decoder", None)  # a Transformer's stack; the LSTM has none
    limit = served_length(decoder, served) if decoder is not None else None
    ids, new_tokens = bounded(ids, cfg.max_new_tokens, limit, warn or _to_stderr)
    settings = replace(SearchSettings.from_decode(cfg, limit), max_new_tokens=new_tokens)
    prompt = torch.tensor([ids], device=next(model.parameters()).device)
    if cfg.samples > 1:
        rows = generate(model, prompt, settings)
        texts = [tokenizer.decode(ids + _until_eos(row[len(ids) :].tolist())) for row in rows]
        shown = SAMPLE_SEPARATOR.join(texts)
        write(shown)
        return shown
    produced = list(ids)
    shown = tokenizer.decode(produced)
    write(shown)

    def show(token: torch.Tensor) -> None:
        nonlocal shown
        produced.append(int(token[0]))
        decoded = tokenizer.decode(produced)
        write(decoded[len(shown) :])
        shown = decoded

    generate(model, prompt, settings, on_token=show)
    return shown


def _until_eos(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens


def bounded(
    ids: list[int], max_new_tokens: int, limit: int | None, warn: Callable[[str], None]
) -> tuple[list[int], int]:
    """(prompt ids, new tokens) within `limit` positions (None: any length). The new tokens keep room for
    themselves, up to half the positions: a longer prompt keeps its last tokens (the text to continue);
    then the new tokens are capped at what is left."""
    if limit is None or len(ids) + max_new_tokens <= limit:
        return ids, max_new_tokens
    room = limit - min(max_new_tokens, limit // 2)  # prompt tokens kept at most (at least 1)
    if len(ids) > room:
        warn(
            f"warning: the prompt has {len(ids):,} tokens, more than fit the {limit:,} positions the model serves "
            f"(model.max_len) with the new ones: continuing its last {room:,}"
        )
        ids = ids[-room:]
    new_tokens = min(max_new_tokens, limit - len(ids))
    if new_tokens < max_new_tokens:
        warn(
            f"warning: decode.max_new_tokens {max_new_tokens:,} capped at {new_tokens:,}: the prompt's {len(ids):,} "
            f"tokens and the new ones fill the {limit:,} positions the model serves (model.max_len)"
        )
    return ids, new_tokens


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
