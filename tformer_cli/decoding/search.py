"""The searches: greedy and beam search for the encoder-decoder, greedy and sampling for language
models, all over the fast KV caches of decoding/cache.py (or, with `use_cache` False, recomputing
every prefix: the reference). Each takes (model, inputs, settings), the settings one `SearchSettings`
(decoding/settings.py); the fixed-shape searches of decoding/static.py take the same, and decoding/api.py
chooses between them.

The rules (output lengths, length penalty, beam search's finishing and stopping, the decoding controls) are
decoding/rules.py's; a search's step (the choice of the next tokens and the bookkeeping) is
decoding/search_state.py's. Here a finished sentence leaves the batch so that the rest decode faster.

Shape legend: B sentences (or LM rows), K beam, S source length, T length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from tformer_cli.decoding.cache import search_cache
from tformer_cli.decoding.ensemble import Ensemble, EnsembleCache
from tformer_cli.decoding.rules import Hypothesis, repeat_rules
from tformer_cli.decoding.search_state import BeamState, GreedyState
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.model.cache import DecodeCache
from tformer_cli.model.positions import LearnedPositions
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack
from tformer_cli.tokenizer import PAD_ID


def max_lengths(src: Tensor, a: float, b: int, served: int | None = None) -> Tensor:
    """(B,) output length limits a * |source| + b, counting real source tokens, at most `served` (None: any)."""
    limits = ((src != PAD_ID).sum(dim=1).float() * a + b).long().clamp_min(1)
    return limits if served is None else limits.clamp_max(served)


class Translator(Protocol):
    """What the searches decode: a Seq2Seq, or an Ensemble of them; `decode` takes the cache that `search_cache`
    made for it, or None."""

    @property
    def decoder(self) -> Stack: ...

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]: ...

    def decode(self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: Any = None) -> Tensor: ...


# a translator's cache: a DecodeCache (a BeamDecodeCache for beam search), or an ensemble's
TranslatorCache = DecodeCache | EnsembleCache


def served_length(stack: Stack, served: int | None = None) -> int | None:
    """The positions a stack serves: `served` (model.max_len) when given, else its learned table's length
    (it has no position past it), else None (any length: sinusoidal, RoPE, ALiBi and none extend)."""
    if served is not None:
        return served
    return stack.positions.max_len if isinstance(stack.positions, LearnedPositions) else None


def output_limits(model: Translator, src: Tensor, settings: SearchSettings) -> Tensor:
    """(B,) each sentence's output limit: max_lengths at the positions the decoder serves (decoding/rules.py)."""
    served = served_length(model.decoder, settings.served)
    return max_lengths(src, settings.max_len_a, settings.max_len_b, served)


@torch.inference_mode()
def greedy(model: Seq2Seq | Ensemble, src: Tensor, settings: SearchSettings) -> list[Hypothesis]:
    """The most likely token at each step, for a batch of sources (B, S), by decoding/rules.py's rules with
    `settings` (beam, alpha and nbest aside). The cache's buffers are the model's, kept between calls
    (decoding/cache.py, `pool_for`).
    """
    model.eval()
    limits = output_limits(model, src, settings)
    with search_cache(model, int(limits.max()) + 1) if settings.use_cache else nullcontext() as cache:
        return _greedy(model, src, limits, cast("TranslatorCache | None", cache), settings)


def _greedy(
    model: Translator, src: Tensor, limits: Tensor, cache: TranslatorCache | None, settings: SearchSettings
) -> list[Hypothesis]:
    memory, memory_mask = model.encode(src)
    n, limit = src.size(0), int(limits.max())
    state = GreedyState(n, limit, src.device, *settings.repeats)
    state.begin(limits, n, settings.min_length)
    active = torch.arange(n, device=src.device)  # sentence ids still decoding, in batch order
    out: list[Hypothesis | None] = [None] * n
    for step in range(limit):
        tokens = state.token[:, None] if cache is not None else state.prefix(step)
        done = state.choose(model.decode(tokens, memory, memory_mask, cache)[:, -1])
        if not bool(done.any()):
            continue
        finished = done.nonzero().flatten()
        for sentence, hyp in zip(active[finished].tolist(), state.hypotheses(finished), strict=True):
            out[sentence] = hyp
        keep = (~done).nonzero().flatten()
        if keep.numel() == 0:
            break
        state.keep(keep)
        active = active[keep]
        memory_mask = memory_mask.index_select(0, keep) if memory_mask is not None else None
        if cache is None:
            memory = memory.index_select(0, keep)
        else:  # the encoder's keys and values are already in the cache
            cache.reorder(keep)
    assert all(h is not None for h in out), "every sentence ends with EOS by its length limit"
    return [h for h in out if h is not None]


@torch.inference_mode()
def beam_search(model: Seq2Seq | Ensemble, src: Tensor, settings: SearchSettings) -> list[list[Hypothesis]]:
    """Beam search of `settings.beam` hypotheses for a batch of sources (B, S), by decoding/rules.py's rules;
    returns each sentence's `settings.nbest` best. The cache's buffers are the model's, kept between calls
    (decoding/cache.py, `pool_for`).
    """
    model.eval()
    limits = output_limits(model, src, settings)  # (B,)
    with search_cache(model, int(limits.max()) + 1, settings.beam) if settings.use_cache else nullcontext() as cache:
        return _beam_search(model, src, limits, cast("TranslatorCache | None", cache), settings)


def _beam_search(
    model: Translator, src: Tensor, limits: Tensor, cache: TranslatorCache | None, settings: SearchSettings
) -> list[list[Hypothesis]]:
    n, k, limit = src.size(0), settings.beam, int(limits.max())
    memory, memory_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    if cache is None:  # every hypothesis gets its own copy; the cache shares one per sentence instead
        memory = memory.repeat_interleave(k, dim=0)  # (B*K, S, D)
        memory_mask = memory_mask.repeat_interleave(k, dim=0) if memory_mask is not None else None
    state = BeamState(n, k, limit + 1, src.device, *settings.repeats)
    state.begin(limits, n, settings.min_length)
    for step in range(limit):
        tokens = state.token[:, None] if cache is not None else state.prefix(step)
        rows = state.choose(model.decode(tokens, memory, memory_mask, cache)[:, -1])  # (B*K,) rows extended
        shrunk = not bool(state.active.all())
        if shrunk:  # a sentence finished: its rows leave the batch
            sentences = state.active.nonzero().flatten()
            if sentences.numel() == 0:
                break
            rows = rows[state.keep(sentences)]
        if cache is None:
            memory = memory.index_select(0, rows)
            if memory_mask is not None and shrunk:
                memory_mask = memory_mask.index_select(0, rows)
        else:  # the encoder's keys and values are in the cache, one copy per sentence
            if memory_mask is not None and shrunk:
                memory_mask = memory_mask.index_select(0, sentences)
            cache.reorder(rows)
    return state.finished.hypotheses(n, settings.alpha, settings.nbest)


# Language models (a Transformer `LanguageModel` or the `LSTMLanguageModel`)


def sample_next(logits: Tensor, settings: SearchSettings, generator: torch.Generator | None = None) -> Tensor:
    """Choose the next token from logits (B, V) by `settings`' temperature, top_k and top_p.

    temperature 0 (or top_k 1) is greedy (argmax). Otherwise: divide by the temperature, keep the top_k most
    likely tokens (0 = all), then the smallest set whose probability reaches top_p, and sample.
    """
    temperature, top_k, top_p = settings.temperature, settings.top_k, settings.top_p
    if temperature <= 0.0 or top_k == 1:
        return logits.argmax(-1)
    logits = logits.float() / max(temperature, 1e-30)  # a float32 temperature: below that it rounds to 0 (nan)
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p (the first one always stays)
        drop = probs.cumsum(-1) - probs >= top_p
        drop[..., 0] = False  # explicitly: a top_p below float32's smallest number would compare 0 >= 0
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def draws(settings: SearchSettings, device: torch.device) -> torch.Generator | None:
    """Sampling's generator on `device`, seeded with settings.seed (None: PyTorch's global one)."""
    return None if settings.seed is None else torch.Generator(device=device).manual_seed(settings.seed)


@torch.inference_mode()
def generate(
    model: nn.Module, prompt: Tensor, settings: SearchSettings, on_token: Callable[[Tensor], None] | None = None
) -> Tensor:
    """Extend `prompt` (B, T) by up to settings.max_new_tokens tokens; each row settings.samples times
    (nanoGPT's num_samples, Hugging Face's num_return_sequences: the rows of one prompt next to each other, each
    its own draws). `on_token` gets each step's new tokens (B,).

    With settings.use_cache, the prompt is run once and each new token costs one step over the cached keys
    and values; without it, every step recomputes the whole prefix (the reference, and the baseline
    the benchmark compares with). Stops early once every row has produced settings.eos_id.

    The controls (`lm_rules`, decoding/rules.py) act on the logits before temperature, top-k and top-p, as
    Hugging Face's sampling and greedy search do, over prompt + generated tokens.

    Returns:
        (B * samples, T + n_new) tokens; rows that finished early are padded with eos_id.
    """
    model.eval()
    prompt = prompt.repeat_interleave(settings.samples, dim=0) if settings.samples > 1 else prompt
    tokens, eos_id, generator = prompt, settings.eos_id, draws(settings, prompt.device)
    done = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)
    rules, length = lm_rules(settings), prompt.size(1) + settings.max_new_tokens
    with search_cache(model, length) if settings.use_cache else nullcontext() as cache:
        logits = model(prompt, cache=cache)[:, -1]  # (B, V)
        for i in range(settings.max_new_tokens):
            if rules is not None:
                logits = rules(logits, tokens, i)
            next_token = sample_next(logits, settings, generator)  # (B,)
            if eos_id is not None:
                next_token = next_token.masked_fill(done, eos_id)
                done |= next_token == eos_id
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            if on_token is not None:
                on_token(next_token)
            if eos_id is not None and bool(done.all()):
                break
            step_input = next_token[:, None] if cache is not None else tokens
            logits = model(step_input, cache=cache)[:, -1]
    return tokens


def lm_rules(settings: SearchSettings) -> Callable[[Tensor, Tensor, int], Tensor] | None:
    """A language model's decoding controls as one function (logits (B, V), tokens so far (B, T), new tokens so
    far) -> logits, in Hugging Face's order: `repeat_rules` over prompt + generated, then no eos_id before
    min_new_tokens new tokens (`MinNewTokensLengthLogitsProcessor`; none without an eos_id). None when all are
    off: the search then does no extra work."""
    eos_id, (no_repeat_ngram, repetition_penalty) = settings.eos_id, settings.repeats
    min_new = settings.min_new_tokens if eos_id is not None else 0
    if min_new == 0 and no_repeat_ngram == 0 and repetition_penalty == 1.0:
        return None

    def rules(logits: Tensor, tokens: Tensor, new: int) -> Tensor:
        logits = repeat_rules(logits.float(), tokens, no_repeat_ngram, repetition_penalty)
        if new < min_new:
            logits = logits.clone()  # the model's output stays as it was
            logits[:, eos_id] = float("-inf")
        return logits

    return rules
