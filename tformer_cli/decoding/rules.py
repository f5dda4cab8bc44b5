"""The searches' rules, specified here once and run as tensor code on every decoding path: the next token's
log-probabilities, the decoding controls, and the ranking of beam search's candidates. The searches' state and step
(decoding/search_state.py) call them, on the dynamic path (decoding/search.py) and the fixed-shape one
(decoding/static.py) alike; the settings come in one `SearchSettings` (decoding/settings.py). Other docstrings
link here instead of restating the rules.

Conventions (the paper's and fairseq's):
- Every hypothesis starts with BOS; its length counts the generated tokens including EOS.
- Output length: a sentence's outputs end by max_len_a * |source| + max_len_b tokens (the paper: a = 1, b = 50,
  counting real source tokens: `search.max_lengths`) and by the positions the decoder serves
  (`search.served_length`); a hypothesis still open at that length is ended there with EOS, the only choice.
- Length penalty (GNMT, Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6) ** alpha; a finished hypothesis is
  ranked by sum(log p) / lp(Y). alpha = 0 ranks by the raw log-probability.

Beam search (K the beam; fairseq's rules, which CTranslate2 and Hugging Face's early_stopping follow):
- Each step ranks every sentence's best 2K continuations by their total log-probability (`top_candidates`; at
  first only the first of the K identical beams is expanded).
- An EOS among the first K candidates finishes its hypothesis while the sentence has fewer than K finished, in
  candidate order; the first K candidates that are not EOS continue.
- A sentence is done once K hypotheses have finished (or fewer than K continue); its finished hypotheses are
  ranked by the length-penalised score and the best `nbest` returned. On the dynamic path a done sentence leaves
  the batch so that the rest decode faster; on the fixed-shape path it stays, masked.
Greedy search is the most likely token at each step, under the same length and control rules.

Decoding controls (decode.min_len, decode.no_repeat_ngram, decode.repetition_penalty), Hugging Face's rules
applied where Hugging Face's `generate` applies them, so that the exported model's `generate` (and fairseq's
search) gives the same outputs:
- decode.min_len N (`SearchSettings.min_new_tokens`): no EOS before N new tokens (fairseq's --min-len, HF's
  min_new_tokens). A hypothesis' length counts its EOS, so the translation searches end none shorter than
  N + 1 tokens (`SearchSettings.min_length`, `next_logprobs`'s `min_length`); never past a sentence's length
  limit, where EOS stays the only choice.
- `no_repeat_ngram` (`banned_ngram_tokens`) and `repetition_penalty` (`penalise_repeats`) over the
  hypothesis so far, BOS included (HF's decoder ids start with the decoder start token, tformer's BOS); for a
  language model over prompt + generated tokens. Greedy search and sampling apply them to the raw logits (HF's
  greedy and sampling), beam search to the log-probabilities (HF's beam search): the penalty then multiplies
  every repeated token's log-probability by p. Off (0 and 1.0, the defaults), no search does any extra work.

Shape legend: R rows (sentences, or a sentence's hypotheses), K beam, T length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast, overload

import torch
from torch import Tensor

from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # generated ids, ending with EOS (BOS not included)
    score: float  # length-penalised log-probability
    logprob: float  # raw sum of log-probabilities


@overload
def length_penalty(length: int, alpha: float) -> float: ...
@overload
def length_penalty(length: Tensor, alpha: float) -> Tensor: ...
def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def next_logprobs(logits: Tensor, step: int | Tensor, min_length: int | Tensor) -> Tensor:
    """log p of the next token (., V) in fp32 whatever the model's dtype: never PAD or BOS, and no EOS while
    fewer than `min_length` tokens (EOS counted) would have been generated. `step` a tensor on the device (the
    searches' states, decoding/search_state.py): the same, without reading it on the host. `min_length` a
    tensor: one per row."""
    lprobs = torch.log_softmax(logits, -1, dtype=torch.float32)
    lprobs[:, PAD_ID] = float("-inf")
    lprobs[:, BOS_ID] = float("-inf")
    if isinstance(step, Tensor) or isinstance(min_length, Tensor):
        too_early = cast(Tensor, step + 1 < min_length)  # a tensor: one side is
        lprobs[:, EOS_ID] = torch.where(too_early, float("-inf"), lprobs[:, EOS_ID])
    elif step + 1 < min_length:
        lprobs[:, EOS_ID] = float("-inf")
    return lprobs


def penalise_repeats(scores: Tensor, tokens: Tensor, penalty: float, length: Tensor | None = None) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019), Hugging Face's `RepetitionPenaltyLogitsProcessor` and
    CTranslate2's `repetition_penalty`: the score of every token that already occurs in the row's `tokens`
    becomes score / penalty where it is > 0, else score * penalty (once per token, however often it occurs).
    penalty > 1 makes repeats less likely, < 1 more.

    Args:
        scores: (R, V) float scores of the next token (logits, or log-probabilities in beam search).
        tokens: (R, T) each row's sequence so far.
        length: (R,) or 0-d: only each row's first `length` tokens are its sequence (the states' fixed
            buffers, the rest not written yet); None: all T.
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
        length: (R,) or 0-d: only each row's first `length` tokens are its sequence (the states' fixed
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


def top_candidates(
    lprobs: Tensor, scores: Tensor, k: int, eos_only: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Each sentence's best 2K continuations (2K: enough to keep K that are not EOS), best first.

    Args:
        lprobs: (n*K, V) the next token's log-probabilities for each of the n sentences' K hypotheses.
        scores: (n, K) the hypotheses' scores so far (-inf: an empty slot).
        eos_only: (n*K,) the hypotheses at their length limit: EOS is their one continuation (the others -inf).

    Returns:
        (scores, tokens, beams), each (n, 2K): a continuation's total score, its token, and which of its
        sentence's K hypotheses it extends.
    """
    # The best 2K of a sentence's K*V continuations are among each hypothesis' own best 2K:
    # rank those K*2K instead of all K*V (same result, a fraction of the work).
    n = scores.size(0)
    row_top, row_ids = lprobs.topk(min(2 * k, lprobs.size(-1)), dim=1)  # (n*K, 2K)
    if eos_only is not None:  # here, not on lprobs: (n*K, 2K) values instead of (n*K, V)
        ends = torch.full_like(row_top, float("-inf"))
        ends[:, 0] = lprobs[:, EOS_ID]
        row_top = torch.where(eos_only[:, None], ends, row_top)
        row_ids = row_ids.masked_fill(eos_only[:, None], EOS_ID)
    width = row_top.size(1)
    candidates = (scores.view(-1, 1) + row_top).view(n, k * width)  # (n, K*2K)
    top_scores, top_pos = candidates.topk(2 * k, dim=1)
    return top_scores, row_ids.view(n, k * width).gather(1, top_pos), top_pos // width
