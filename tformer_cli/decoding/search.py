"""The searches: greedy and beam search for the encoder-decoder, greedy and sampling for language
models, all over the fast KV caches of decoding/cache.py (or, with use_cache=False, recomputing
every prefix: the reference).

Translation conventions (the paper's and fairseq's):
- Every hypothesis starts with BOS; its length counts the generated tokens including EOS.
- The maximum output length is a * source_length + b (the paper: a = 1, b = 50), and never more than
  the positions the model serves (`max_len`: model.max_len; a learned table's length when not given);
  a hypothesis still open at that length is ended there with EOS.
- Length penalty, decoding controls: decoding/rules.py. A search's step (the choice of the next tokens and
  the bookkeeping) is decoding/search_state.py's, the same on the fixed-shape path (decoding/static.py).
- Stopping rule: a sentence is done once `beam` hypotheses have finished (ended with EOS), as in
  fairseq; finished sentences leave the batch so that the rest decode faster.

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
from tformer_cli.model.cache import DecodeCache
from tformer_cli.model.positions import LearnedPositions
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack
from tformer_cli.tokenizer import PAD_ID


def max_lengths(src: Tensor, a: float, b: int, max_len: int | None = None) -> Tensor:
    """(B,) output length limits a * |source| + b, counting real source tokens, at most `max_len` (None: any)."""
    limits = ((src != PAD_ID).sum(dim=1).float() * a + b).long().clamp_min(1)
    return limits if max_len is None else limits.clamp_max(max_len)


class Translator(Protocol):
    """What the searches decode: a Seq2Seq, or an Ensemble of them; `decode` takes the cache that `search_cache`
    made for it, or None."""

    @property
    def decoder(self) -> Stack: ...

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]: ...

    def decode(self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: Any = None) -> Tensor: ...


# a translator's cache: a DecodeCache (a BeamDecodeCache for beam search), or an ensemble's
TranslatorCache = DecodeCache | EnsembleCache


def served_length(stack: Stack, max_len: int | None = None) -> int | None:
    """The positions a stack serves: `max_len` (model.max_len) when given, else its learned table's length
    (it has no position past it), else None (any length: sinusoidal, RoPE, ALiBi and none extend)."""
    if max_len is not None:
        return max_len
    return stack.positions.max_len if isinstance(stack.positions, LearnedPositions) else None


@torch.inference_mode()
def greedy(
    model: Seq2Seq | Ensemble,
    src: Tensor,
    a: float = 1.0,
    b: int = 50,
    use_cache: bool = True,
    min_len: int = 0,
    max_len: int | None = None,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[Hypothesis]:
    """Most likely token at each step, for a batch of sources (B, S); EOS is not allowed before min_len
    (EOS counted: `min_length`), no n-gram of `no_repeat_ngram` tokens twice, and the logits of the tokens
    already in the hypothesis (BOS included) penalised by `repetition_penalty` (the module's docstring).

    A sentence leaves the batch once it has produced EOS, so the rest decode faster. Outputs end by
    a * |source| + b tokens and by the positions the decoder serves (`served_length(decoder, max_len)`).
    The cache's buffers are the model's, kept between calls (decoding/cache.py, `pool_for`).
    """
    model.eval()
    limits = max_lengths(src, a, b, served_length(model.decoder, max_len))
    with search_cache(model, int(limits.max()) + 1) if use_cache else nullcontext() as cache:
        return _greedy(
            model, src, limits, cast("TranslatorCache | None", cache), min_len, no_repeat_ngram, repetition_penalty
        )


def _greedy(
    model: Translator,
    src: Tensor,
    limits: Tensor,
    cache: TranslatorCache | None,
    min_len: int,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[Hypothesis]:
    memory, memory_mask = model.encode(src)
    n, limit = src.size(0), int(limits.max())
    state = GreedyState(n, limit, src.device, no_repeat_ngram, repetition_penalty)
    state.begin(limits, n, min_len)
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
def beam_search(
    model: Seq2Seq | Ensemble,
    src: Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    a: float = 1.0,
    b: int = 50,
    nbest: int = 1,
    use_cache: bool = True,
    min_len: int = 0,
    max_len: int | None = None,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[list[Hypothesis]]:
    """Beam search for a batch of sources (B, S); returns the `nbest` best hypotheses per sentence.

    EOS is not allowed before `min_len` generated tokens, EOS counted (`min_length`). No hypothesis holds an
    n-gram of `no_repeat_ngram` tokens twice, and the log-probabilities of the tokens already in a hypothesis
    (BOS included) are multiplied by `repetition_penalty` (the module's docstring). Outputs end by
    a * |source| + b tokens and by the positions the decoder serves (`served_length(decoder, max_len)`).
    The cache's buffers are the model's, kept between calls (decoding/cache.py, `pool_for`).
    """
    model.eval()
    limits = max_lengths(src, a, b, served_length(model.decoder, max_len))  # (B,)
    with search_cache(model, int(limits.max()) + 1, beam) if use_cache else nullcontext() as cache:
        cache = cast("TranslatorCache | None", cache)
        return _beam_search(model, src, limits, beam, alpha, nbest, cache, min_len, no_repeat_ngram, repetition_penalty)


def _beam_search(
    model: Translator,
    src: Tensor,
    limits: Tensor,
    k: int,
    alpha: float,
    nbest: int,
    cache: TranslatorCache | None,
    min_len: int,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[list[Hypothesis]]:
    n, limit = src.size(0), int(limits.max())
    memory, memory_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    if cache is None:  # every hypothesis gets its own copy; the cache shares one per sentence instead
        memory = memory.repeat_interleave(k, dim=0)  # (B*K, S, D)
        memory_mask = memory_mask.repeat_interleave(k, dim=0) if memory_mask is not None else None
    state = BeamState(n, k, limit + 1, src.device, no_repeat_ngram, repetition_penalty)
    state.begin(limits, n, min_len)
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
    return state.finished.hypotheses(n, alpha, nbest)


# Language models (a Transformer `LanguageModel` or the `LSTMLanguageModel`)


def sample_next(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose the next token from logits (B, V).

    temperature 0 is greedy (argmax). Otherwise: divide by the temperature, keep the top_k most
    likely tokens (0 = all), then the smallest set whose probability reaches top_p, and sample.
    """
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
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(
    model: nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_token: Callable[[Tensor], None] | None = None,
    samples: int = 1,
    min_new_tokens: int = 0,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> Tensor:
    """Extend `prompt` (B, T) by up to `max_new_tokens` tokens; each row `samples` times (nanoGPT's num_samples,
    Hugging Face's num_return_sequences: the rows of one prompt next to each other, each its own draws).

    With `use_cache`, the prompt is run once and each new token costs one step over the cached keys
    and values; without it, every step recomputes the whole prefix (the reference, and the baseline
    the benchmark compares with). Stops early once every row has produced `eos_id`.

    The controls (`lm_rules`), on the logits before temperature, top-k and top-p, as Hugging Face's sampling
    and greedy search: no `eos_id` before `min_new_tokens` new tokens, no n-gram of `no_repeat_ngram` tokens
    twice and `repetition_penalty` on the tokens already there, over prompt + generated tokens.

    Returns:
        (B * samples, T + n_new) tokens; rows that finished early are padded with `eos_id`.
    """
    model.eval()
    prompt = prompt.repeat_interleave(samples, dim=0) if samples > 1 else prompt
    tokens = prompt
    done = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)
    rules = lm_rules(eos_id, min_new_tokens, no_repeat_ngram, repetition_penalty)
    with search_cache(model, prompt.size(1) + max_new_tokens) if use_cache else nullcontext() as cache:
        logits = model(prompt, cache=cache)[:, -1]  # (B, V)
        for i in range(max_new_tokens):
            if rules is not None:
                logits = rules(logits, tokens, i)
            next_token = sample_next(logits, temperature, top_k, top_p, generator)  # (B,)
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


def lm_rules(
    eos_id: int | None, min_new_tokens: int, no_repeat_ngram: int, repetition_penalty: float
) -> Callable[[Tensor, Tensor, int], Tensor] | None:
    """A language model's decoding controls as one function (logits (B, V), tokens so far (B, T), new tokens so
    far) -> logits, in Hugging Face's order: `repeat_rules` over prompt + generated, then no `eos_id` before
    `min_new_tokens` new tokens (`MinNewTokensLengthLogitsProcessor`; none without an eos_id). None when all are
    off: the search then does no extra work."""
    min_new = min_new_tokens if eos_id is not None else 0
    if min_new == 0 and no_repeat_ngram == 0 and repetition_penalty == 1.0:
        return None

    def rules(logits: Tensor, tokens: Tensor, new: int) -> Tensor:
        logits = repeat_rules(logits.float(), tokens, no_repeat_ngram, repetition_penalty)
        if new < min_new:
            logits = logits.clone()  # the model's output stays as it was
            logits[:, eos_id] = float("-inf")
        return logits

    return rules
