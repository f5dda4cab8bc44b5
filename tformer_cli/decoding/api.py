"""The two doors to decoding: `translate_batch` (an encoder-decoder, a batch of sources) and `generate` (a language
model, a prompt). Each takes the recipe's `decode:` settings and decides once between the fixed-shape path
(decoding/static.py: `decode.static`, auto on CUDA, where the output fits its static cache) and the dynamic one
(decoding/search.py: the reference, and the CPU's path). Both give the same answers (tests/unit/decoding/
test_static.py); the fixed-shape one is faster on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from tformer_cli.decoding import search, static
from tformer_cli.decoding.ensemble import Ensemble
from tformer_cli.decoding.rules import Hypothesis, min_length
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID


def translate_batch(
    model: Seq2Seq | Ensemble, src: Tensor, settings: DecodeConfig, max_len: int | None = None
) -> list[list[Hypothesis]]:
    """Greedy (decode.beam 1) or beam search for a batch of sources (B, S) on the model's device; an ensemble
    (decoding/ensemble.py) on the dynamic path.

    Outputs end by decode.max_len_a * |source| + decode.max_len_b tokens and by `max_len`, the positions the
    model serves (model.max_len; None: its learned table's length, if any); decode.min_len,
    decode.no_repeat_ngram and decode.repetition_penalty apply (decoding/rules.py).

    Returns:
        Per sentence, its decode.nbest best hypotheses (greedy: the one).
    """
    kw: dict[str, Any] = {
        "a": settings.max_len_a,
        "b": settings.max_len_b,
        "min_len": min_length(settings.min_len),
        "max_len": max_len,
        "no_repeat_ngram": settings.no_repeat_ngram,
        "repetition_penalty": settings.repetition_penalty,
    }
    fixed = (
        not isinstance(model, Ensemble)
        and static.use_static(settings.static, src.device)
        and static.fits(model, _limit(model, src, settings, max_len))
    )
    # the fixed-shape searches take a Seq2Seq alone: `fixed` is False for an ensemble
    greedy, beam_search = cast(
        "tuple[Callable[..., list[Hypothesis]], Callable[..., list[list[Hypothesis]]]]",
        (static.static_greedy, static.static_beam_search) if fixed else (search.greedy, search.beam_search),
    )
    if settings.beam == 1:
        return [[h] for h in greedy(model, src, **kw)]
    return beam_search(model, src, settings.beam, settings.len_penalty, nbest=settings.nbest, **kw)


def _limit(model: Seq2Seq, src: Tensor, settings: DecodeConfig, max_len: int | None) -> int:
    """The batch's longest output limit (a read of the device)."""
    served = search.served_length(model.decoder, max_len)
    return int(search.max_lengths(src, settings.max_len_a, settings.max_len_b, served).max())


def generate(
    model: nn.Module,
    prompt: Tensor,
    settings: DecodeConfig,
    max_new_tokens: int | None = None,
    on_token: Callable[[Tensor], None] | None = None,
) -> Tensor:
    """Continue `prompt` (B, T) on the model's device by `max_new_tokens` tokens (None: decode.max_new_tokens),
    each row decode.samples times, with the settings' sampling (decode.temperature, top_k, top_p, from
    decode.seed) and controls; stops at EOS. `on_token` gets each step's new tokens (B,).

    Returns:
        (B * samples, T + n_new) tokens; rows that finished early are padded with EOS.
    """
    new_tokens = settings.max_new_tokens if max_new_tokens is None else max_new_tokens
    fixed = static.use_static(settings.static, prompt.device) and static.fits_lm(model, prompt.size(1) + new_tokens)
    run: Callable[..., Tensor] = static.static_generate if fixed else search.generate  # fixed: a LanguageModel
    return run(
        model,
        prompt,
        new_tokens,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        eos_id=EOS_ID,
        generator=torch.Generator(device=prompt.device).manual_seed(settings.seed),
        on_token=on_token,
        samples=settings.samples,
        min_new_tokens=settings.min_len,
        no_repeat_ngram=settings.no_repeat_ngram,
        repetition_penalty=settings.repetition_penalty,
    )
