"""The searches: greedy and beam search for the encoder-decoder, greedy and sampling for language
models, all over the fast KV caches of decoding/cache.py (or, with use_cache=False, recomputing
every prefix: the reference).

Translation conventions (the paper's and fairseq's):
- Every hypothesis starts with BOS; its length counts the generated tokens including EOS.
- The maximum output length is a * source_length + b (the paper: a = 1, b = 50), and never more than
  the positions the model serves (`max_len`: model.max_len; a learned table's length when not given);
  a hypothesis still open at that length is ended there with EOS.
- Length penalty (GNMT, Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6) ** alpha; a finished hypothesis is
  ranked by sum(log p) / lp(Y). alpha = 0 ranks by the raw log-probability.
- Stopping rule: a sentence is done once `beam` hypotheses have finished (ended with EOS), as in
  fairseq; finished sentences leave the batch so that the rest decode faster.

Decoding controls (decode.min_len, decode.no_repeat_ngram, decode.repetition_penalty), Hugging Face's rules
applied where Hugging Face's `generate` applies them, so that the exported model's `generate` (and fairseq's
search) gives the same outputs:
- `min_len`: no EOS while fewer than min_len tokens would have been generated, EOS counted (the searches'
  argument; decode.min_len N, "EOS not before N new tokens" as fairseq's --min-len and HF's min_new_tokens,
  is min_len N + 1: `min_length`); never past a sentence's length limit, where EOS stays the only choice.
- `no_repeat_ngram` (`banned_ngram_tokens`) and `repetition_penalty` (`penalise_repeats`) over the
  hypothesis so far, BOS included (HF's decoder ids start with the decoder start token, tformer's BOS); for a
  language model over prompt + generated tokens. Greedy search and sampling apply them to the raw logits (HF's
  greedy and sampling), beam search to the log-probabilities (HF's beam search): the penalty then multiplies
  every repeated token's log-probability by p. Off (0 and 1.0, the defaults), no search does any extra work.

Shape legend: B sentences (or LM rows), K beam, S source length, T length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer_cli.decoding.cache import search_cache
from tformer_cli.model.cache import DecodeCache
from tformer_cli.model.positions import LearnedPositions
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # generated ids, ending with EOS (BOS not included)
    score: float  # length-penalised log-probability
    logprob: float  # raw sum of log-probabilities


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src: Tensor, a: float, b: int, max_len: int | None = None) -> Tensor:
    """(B,) output length limits a * |source| + b, counting real source tokens, at most `max_len` (None: any)."""
    limits = ((src != PAD_ID).sum(dim=1).float() * a + b).long().clamp_min(1)
    return limits if max_len is None else limits.clamp_max(max_len)


def served_length(stack: Stack, max_len: int | None = None) -> int | None:
    """The positions a stack serves: `max_len` (model.max_len) when given, else its learned table's length
    (it has no position past it), else None (any length: sinusoidal, RoPE, ALiBi and none extend)."""
    if max_len is not None:
        return max_len
    return stack.positions.max_len if isinstance(stack.positions, LearnedPositions) else None


def next_logprobs(logits: Tensor, step: int | Tensor, min_len: int | Tensor) -> Tensor:
    """log p of the next token (., V) in fp32 whatever the model's dtype: never PAD or BOS, and no EOS while
    fewer than `min_len` tokens would have been generated. `step` a tensor on the device (decoding/static.py's
    captured step): the same, without reading it on the host. `min_len` a tensor: one per row (`min_lengths`)."""
    lprobs = torch.log_softmax(logits, -1, dtype=torch.float32)
    lprobs[:, PAD_ID] = float("-inf")
    lprobs[:, BOS_ID] = float("-inf")
    if isinstance(step, Tensor) or isinstance(min_len, Tensor):
        lprobs[:, EOS_ID] = torch.where(step + 1 < min_len, float("-inf"), lprobs[:, EOS_ID])
    elif step + 1 < min_len:
        lprobs[:, EOS_ID] = float("-inf")
    return lprobs


def min_length(min_new_tokens: int) -> int:
    """The searches' `min_len` (a hypothesis' length, EOS counted) for decode.min_len: EOS not before
    `min_new_tokens` new tokens (fairseq's --min-len, Hugging Face's min_new_tokens), so at least
    min_new_tokens + 1 tokens with the EOS; 0 stays 0 (no minimum)."""
    return min_new_tokens + 1 if min_new_tokens > 0 else 0


def min_lengths(limits: Tensor, min_len: int) -> int | Tensor:
    """`min_len` for sentences with these output limits (B,): `min_len` itself where every limit reaches it (no
    per-row work), else one per sentence, capped at its limit: there EOS ends it, the limit winning as in
    Hugging Face's `generate` (max_new_tokens over min_new_tokens)."""
    if min_len <= 1 or min_len <= int(limits.min()):  # every limit is >= 1: no read of the device for these
        return min_len
    return limits.clamp_max(min_len)


def penalise_repeats(scores: Tensor, tokens: Tensor, penalty: float, length: Tensor | None = None) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019), Hugging Face's `RepetitionPenaltyLogitsProcessor` and
    CTranslate2's `repetition_penalty`: the score of every token that already occurs in the row's `tokens`
    becomes score / penalty where it is > 0, else score * penalty (once per token, however often it occurs).
    penalty > 1 makes repeats less likely, < 1 more.

    Args:
        scores: (R, V) float scores of the next token (logits, or log-probabilities in beam search).
        tokens: (R, T) each row's sequence so far.
        length: (R,) or 0-d: only each row's first `length` tokens are its sequence (decoding/static.py's
            fixed buffers, the rest not written yet); None: all T.
    """
    vocab = scores.size(-1)
    if length is not None:  # the steps not taken yet name the spare column past the vocabulary
        tokens = tokens.masked_fill(torch.arange(tokens.size(1), device=tokens.device) >= length.view(-1, 1), vocab)
    seen = torch.zeros(scores.size(0), vocab + 1, dtype=torch.bool, device=scores.device)
    seen = seen.scatter_(1, tokens, True)[:, :vocab]
    return torch.where(seen, torch.where(scores > 0, scores / penalty, scores * penalty), scores)


def banned_ngram_tokens(tokens: Tensor, n: int, vocab: int, length: Tensor | None = None) -> Tensor:
    """(R, V) bool: the tokens that would complete, after each row of `tokens` (R, T), an n-gram the row already
    holds: no n-gram twice in one output, the rule of fairseq (--no-repeat-ngram-size), Hugging Face
    (`NoRepeatNGramLogitsProcessor`, no_repeat_ngram_size) and CTranslate2 (no_repeat_ngram_size). The row's
    last n - 1 tokens are matched against the first n - 1 of each n-gram in it; every match bans its last token
    (n = 1: every token already there).

    Args:
        length: (R,) or 0-d: only each row's first `length` tokens are its sequence (decoding/static.py's fixed
            buffers); None: all T.
    """
    rows, width = tokens.shape
    banned = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=tokens.device)  # + 1: where no match writes
    if width < n:
        return banned[:, :vocab]
    windows = tokens.unfold(1, n, 1)  # (R, W, n): every n-gram, by its first position
    if length is None:
        prefix = tokens[:, width - n + 1 :]  # (R, n - 1)
        matches = (windows[..., :-1] == prefix[:, None]).all(-1)
    else:
        length = length.view(-1, 1).expand(rows, 1)
        at = (length - n + 1 + torch.arange(n - 1, device=tokens.device)).clamp(0, width - 1)
        prefix = tokens.gather(1, at)
        inside = torch.arange(windows.size(1), device=tokens.device) <= length - n  # n-grams within the sequence
        matches = (windows[..., :-1] == prefix[:, None]).all(-1) & inside
    return banned.scatter_(1, torch.where(matches, windows[..., -1], vocab), True)[:, :vocab]


def repeat_rules(
    scores: Tensor, tokens: Tensor, no_repeat_ngram: int, repetition_penalty: float, length: Tensor | None = None
) -> Tensor:
    """`scores` (R, V) with decode.repetition_penalty (`penalise_repeats`), then decode.no_repeat_ngram
    (`banned_ngram_tokens`: -inf) over `tokens`, in Hugging Face's order; `scores` itself when both are off."""
    if repetition_penalty != 1.0:
        scores = penalise_repeats(scores, tokens, repetition_penalty, length)
    if no_repeat_ngram > 0:
        banned = banned_ngram_tokens(tokens, no_repeat_ngram, scores.size(-1), length)
        scores = scores.masked_fill(banned, float("-inf"))
    return scores


@torch.inference_mode()
def greedy(
    model: Seq2Seq,
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
    """
    model.eval()
    limits = max_lengths(src, a, b, served_length(model.decoder, max_len))
    with search_cache(model, int(limits.max()) + 1) if use_cache else nullcontext() as cache:
        return _greedy(model, src, limits, cache, min_len, no_repeat_ngram, repetition_penalty)


def _greedy(
    model: Seq2Seq,
    src: Tensor,
    limits: Tensor,
    cache: DecodeCache | None,
    min_len: int,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[Hypothesis]:
    memory, memory_mask = model.encode(src)
    n, limit, device = src.size(0), int(limits.max()), src.device
    tokens = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
    logprob = torch.zeros(n, device=device)
    active = torch.arange(n, device=device)  # sentence ids still decoding, in batch order
    out: list[Hypothesis | None] = [None] * n
    floor = min_lengths(limits, min_len)  # an int, or one per sentence
    repeats = no_repeat_ngram > 0 or repetition_penalty != 1.0
    for step in range(limit):
        logits = model.decode(tokens[:, -1:] if cache is not None else tokens, memory, memory_mask, cache)[:, -1]
        if repeats:  # Hugging Face's greedy search: on the logits
            logits = repeat_rules(logits.float(), tokens, no_repeat_ngram, repetition_penalty)
        lprobs = next_logprobs(logits, step, floor[active] if isinstance(floor, Tensor) else floor)
        next_token = lprobs.argmax(-1)
        next_token = torch.where(step + 1 >= limits[active], torch.full_like(next_token, EOS_ID), next_token)
        logprob += lprobs.gather(1, next_token[:, None]).squeeze(1)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished = next_token == EOS_ID
        if not bool(finished.any()):
            continue
        for row in finished.nonzero().flatten().tolist():
            total = float(logprob[row])
            out[int(active[row])] = Hypothesis(tokens[row, 1:].tolist(), total, total)
        keep = (~finished).nonzero().flatten()
        if keep.numel() == 0:
            break
        tokens, logprob, active = tokens[keep], logprob[keep], active[keep]
        memory_mask = memory_mask.index_select(0, keep) if memory_mask is not None else None
        if cache is None:
            memory = memory.index_select(0, keep)
        else:  # the encoder's keys and values are already in the cache
            cache.reorder(keep)
    assert all(h is not None for h in out), "every sentence ends with EOS by its length limit"
    return [h for h in out if h is not None]


@torch.inference_mode()
def beam_search(
    model: Seq2Seq,
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
    """
    model.eval()
    limits = max_lengths(src, a, b, served_length(model.decoder, max_len))  # (B,)
    with search_cache(model, int(limits.max()) + 1, beam) if use_cache else nullcontext() as cache:
        return _beam_search(model, src, limits, beam, alpha, nbest, cache, min_len, no_repeat_ngram, repetition_penalty)


def top_candidates(lprobs: Tensor, scores: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each sentence's best 2K continuations (2K: enough to keep K that are not EOS), best first.

    Args:
        lprobs: (n*K, V) the next token's log-probabilities for each of the n sentences' K hypotheses.
        scores: (n, K) the hypotheses' scores so far (-inf: an empty slot).

    Returns:
        (scores, tokens, beams), each (n, 2K): a continuation's total score, its token, and which of its
        sentence's K hypotheses it extends.
    """
    # The best 2K of a sentence's K*V continuations are among each hypothesis' own best 2K:
    # rank those K*2K instead of all K*V (same result, a fraction of the work).
    n = scores.size(0)
    row_top, row_ids = lprobs.topk(min(2 * k, lprobs.size(-1)), dim=1)  # (n*K, 2K)
    width = row_top.size(1)
    candidates = (scores.view(-1, 1) + row_top).view(n, k * width)  # (n, K*2K)
    top_scores, top_pos = candidates.topk(2 * k, dim=1)
    return top_scores, row_ids.view(n, k * width).gather(1, top_pos), top_pos // width


def _beam_search(
    model: Seq2Seq,
    src: Tensor,
    limits: Tensor,
    k: int,
    alpha: float,
    nbest: int,
    cache: DecodeCache | None,
    min_len: int,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[list[Hypothesis]]:
    n_sent, device = src.size(0), src.device
    memory, memory_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    if cache is None:  # every hypothesis gets its own copy; the cache shares one per sentence instead
        memory = memory.repeat_interleave(k, dim=0)  # (B*K, S, D)
        memory_mask = memory_mask.repeat_interleave(k, dim=0) if memory_mask is not None else None
    tokens = torch.full((n_sent * k, 1), BOS_ID, dtype=torch.long, device=device)
    scores = torch.full((n_sent, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(n_sent)]
    active = torch.arange(n_sent, device=device)  # sentence ids still decoding, in batch order
    floor = min_lengths(limits, min_len)  # an int, or one per sentence
    repeats = no_repeat_ngram > 0 or repetition_penalty != 1.0

    for step in range(int(limits.max())):
        logits = model.decode(tokens[:, -1:] if cache is not None else tokens, memory, memory_mask, cache)[:, -1]
        row_floor = floor[active].repeat_interleave(k) if isinstance(floor, Tensor) else floor
        lprobs = next_logprobs(logits, step, row_floor)  # (n*K, V)
        if repeats:  # Hugging Face's beam search: on the log-probabilities
            lprobs = repeat_rules(lprobs, tokens, no_repeat_ngram, repetition_penalty)
        at_limit = (step + 1 >= limits[active]).repeat_interleave(k)  # must end now: only EOS allowed
        if bool(at_limit.any()):
            eos_only = torch.full_like(lprobs[0], float("-inf"))
            eos_only[EOS_ID] = 0.0
            lprobs[at_limit] = eos_only + lprobs[at_limit][:, EOS_ID : EOS_ID + 1]
        top_scores, top_tokens, top_beams = top_candidates(lprobs, scores, k)
        beam_of, token_of = top_beams.tolist(), top_tokens.tolist()
        top_list = top_scores.tolist()

        keep_rows, new_scores, new_tokens, still_active = [], [], [], []
        for row, sent in enumerate(active.tolist()):
            kept = 0
            for j in range(2 * k):
                src_beam = row * k + beam_of[row][j]
                token, total = token_of[row][j], top_list[row][j]
                if total == float("-inf"):
                    break
                if token == EOS_ID:
                    if j < k and len(finished[sent]) < k:  # only EOS among the top K count (fairseq)
                        hyp = tokens[src_beam, 1:].tolist() + [EOS_ID]
                        finished[sent].append(Hypothesis(hyp, total / length_penalty(len(hyp), alpha), total))
                    continue
                if kept < k:
                    keep_rows.append(src_beam)
                    new_scores.append(total)
                    new_tokens.append(token)
                    kept += 1
            if len(finished[sent]) < k and kept == k:
                still_active.append(row)
            else:  # done: drop the rows just added for it
                del (
                    keep_rows[len(keep_rows) - kept :],
                    new_scores[len(new_scores) - kept :],
                    new_tokens[len(new_tokens) - kept :],
                )
        if not still_active:
            break
        index = torch.tensor(keep_rows, device=device)
        tokens = torch.cat([tokens.index_select(0, index), torch.tensor(new_tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(new_scores, device=device).view(len(still_active), k)
        shrunk = len(still_active) < active.numel()  # a sentence finished: its rows leave the batch
        sentences = torch.tensor(still_active, device=device)
        active = active[sentences]
        if cache is None:
            memory = memory.index_select(0, index)
            if memory_mask is not None and shrunk:
                memory_mask = memory_mask.index_select(0, index)
        else:  # the encoder's keys and values are in the cache, one copy per sentence
            if memory_mask is not None and shrunk:
                memory_mask = memory_mask.index_select(0, sentences)
            cache.reorder(index)
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]


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
