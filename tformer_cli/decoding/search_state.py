"""Greedy and beam search's state and step, one for every decoding path: the bookkeeping in tensors, the step
number a tensor on the device, the choice of the next tokens by the rules of decoding/rules.py.

The fixed-shape path (decoding/static.py) allocates a state once per batch shape and never moves it, so that a
search's whole step (the decoder step, then `choose`) reads and writes only fixed tensors and a CUDA graph can
hold it; a finished sentence stays in the batch, masked. The dynamic path (decoding/search.py) runs the same
`choose`, then lets finished sentences leave the batch (`keep`) so that the rest decode faster.

The rules (which token, which hypothesis finishes, when a sentence is done) are decoding/rules.py's. The decoding
controls: the minimum length one per row (`begin`: `SearchSettings.min_length`); decode.no_repeat_ngram and
decode.repetition_penalty given when the state is made, so that a graph captured without them does no extra
work, and one with them holds them (tests/unit/test_decoding_controls.py compares the paths).

Shape legend: B sentences, K beam, R = B x K rows (greedy: R = B), L the state's length in steps, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tformer_cli.decoding.rules import Hypothesis, length_penalty, next_logprobs, repeat_rules, top_candidates
from tformer_cli.tokenizer import BOS_ID, EOS_ID


class GreedyState:
    """Greedy search's state (R rows, L steps), and its step after the decoder's: the next token and the
    bookkeeping, reading and writing only these tensors (the step number too is a tensor)."""

    def __init__(
        self, rows: int, steps: int, device: torch.device, no_repeat_ngram: int = 0, repetition_penalty: float = 1.0
    ) -> None:
        self.no_repeat_ngram, self.repetition_penalty = no_repeat_ngram, repetition_penalty
        self.step = torch.zeros((), dtype=torch.long, device=device)  # tokens chosen so far
        self.min_length = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) each row's, at most its limit
        self.limits = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) each row's output limit
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.token = torch.zeros(rows, dtype=torch.long, device=device)  # the last chosen (BOS at first)
        self.out = torch.zeros(rows, steps, dtype=torch.long, device=device)  # the chosen, EOS after the end
        self.logprob = torch.zeros(rows, device=device)
        self.length = torch.zeros(rows, dtype=torch.long, device=device)  # tokens with the EOS

    def state(self) -> list[Tensor]:
        """What `choose` changes in place (the rest is set by `begin`)."""
        return [self.step, self.done, self.token, self.out, self.logprob, self.length]

    def begin(self, limits: Tensor, n: int, min_length: int) -> None:
        """A new batch of `n` real sentences (the rows past them are padding: done from the start); `min_length`
        (`SearchSettings.min_length`, EOS counted) is capped at each sentence's limit, where EOS ends it (Hugging Face's
        max_new_tokens over min_new_tokens)."""
        self.step.zero_()
        self.limits.fill_(1)  # a padded sentence ends at once
        self.limits[:n] = limits
        self.min_length.copy_(self.limits.clamp_max(min_length))
        self.done.copy_(torch.arange(self.done.numel(), device=self.done.device) >= n)
        self.token.fill_(BOS_ID)
        self.out.fill_(EOS_ID)
        self.logprob.zero_()
        self.length.zero_()

    def prefix(self, steps: int) -> Tensor:
        """(R, steps + 1) BOS and the tokens chosen so far: the decoder's input without a cache."""
        return torch.cat([torch.full_like(self.out[:, :1], BOS_ID), self.out[:, :steps]], dim=1)

    def choose(self, logits: Tensor) -> Tensor:
        """The most likely next token of each row from the logits (R, V) (EOS at the row's limit; a finished row
        repeats EOS, uncounted); returns `done`."""
        if self.no_repeat_ngram > 0 or self.repetition_penalty != 1.0:  # greedy search: on the logits
            tokens = self.prefix(self.out.size(1))  # BOS, then the tokens chosen: step + 1 of them so far
            logits = repeat_rules(logits.float(), tokens, self.no_repeat_ngram, self.repetition_penalty, self.step + 1)
        lprobs = next_logprobs(logits, self.step, self.min_length)
        token = torch.where(self.step + 1 >= self.limits, EOS_ID, lprobs.argmax(-1))
        self.logprob += lprobs.gather(1, token[:, None]).squeeze(1).masked_fill(self.done, 0.0)
        token = token.masked_fill(self.done, EOS_ID)
        self.out.index_copy_(1, self.step.view(1), token[:, None])
        ended = (token == EOS_ID) & ~self.done
        self.length.copy_(torch.where(ended, self.step + 1, self.length))
        self.done |= ended
        self.token.copy_(token)
        self.step += 1
        return self.done

    def hypotheses(self, rows: Tensor) -> list[Hypothesis]:
        """The hypotheses of `rows` (finished), read to the host once."""
        tokens, lengths = self.out[rows].tolist(), self.length[rows].tolist()
        logprobs = self.logprob[rows].tolist()
        return [Hypothesis(t[:k], lp, lp) for t, k, lp in zip(tokens, lengths, logprobs, strict=True)]

    def keep(self, rows: Tensor) -> None:
        """Only `rows` decode on (the dynamic path; new tensors, so never under a captured graph)."""
        self.min_length, self.limits, self.done = self.min_length[rows], self.limits[rows], self.done[rows]
        self.token, self.out = self.token[rows], self.out[rows]
        self.logprob, self.length = self.logprob[rows], self.length[rows]


class BeamState:
    """Beam search's state (B sentences x K hypotheses, L steps), and its step after the decoder's: ranking the
    candidates, finishing and continuing hypotheses, reading and writing only these tensors (the step number
    too is a tensor).

    The rules are decoding/rules.py's ("Beam search").
    """

    def __init__(
        self,
        n_sent: int,
        k: int,
        steps: int,
        device: torch.device,
        no_repeat_ngram: int = 0,
        repetition_penalty: float = 1.0,
    ) -> None:
        self.k = k
        self.no_repeat_ngram, self.repetition_penalty = no_repeat_ngram, repetition_penalty
        self.step = torch.zeros((), dtype=torch.long, device=device)  # tokens chosen so far
        self.min_length = torch.zeros(n_sent * k, dtype=torch.long, device=device)  # (R,) at most the sentence's limit
        self.limits = torch.zeros(n_sent, dtype=torch.long, device=device)  # (B,) each sentence's output limit
        self.active = torch.zeros(n_sent, dtype=torch.bool, device=device)  # (B,) still decoding
        self.sentences = torch.arange(n_sent, device=device)  # (B,) each sentence's place in `finished`
        self.first_row = torch.arange(n_sent, device=device)[:, None] * k  # (B, 1) each sentence's first hypothesis
        self.scores = torch.zeros(n_sent, k, device=device)  # (B, K) the hypotheses' scores so far
        self.history = torch.zeros(n_sent * k, steps, dtype=torch.long, device=device)  # BOS, then the tokens
        self.token = torch.zeros(n_sent * k, dtype=torch.long, device=device)  # (R,) the last chosen
        self.finished = Finished(n_sent, k, steps, device)

    def state(self) -> list[Tensor]:
        """What `choose` changes in place (the rest is set by `begin`)."""
        return [self.step, self.active, self.scores, self.history, self.token, *self.finished.state()]

    def begin(self, limits: Tensor, n: int, min_length: int) -> None:
        """A new batch of `n` real sentences (the rows past them are padding: done from the start)."""
        self.step.zero_()
        self.limits.fill_(1)
        self.limits[:n] = limits
        self.min_length.copy_(self.limits.clamp_max(min_length).repeat_interleave(self.k))  # the limit wins
        self.active.copy_(torch.arange(self.active.numel(), device=self.active.device) < n)
        self.scores.fill_(float("-inf"))
        self.scores[:, 0] = 0.0  # all beams start identical: expand only the first
        self.history.fill_(BOS_ID)
        self.token.fill_(BOS_ID)
        self.finished.reset()

    def prefix(self, steps: int) -> Tensor:
        """(R, steps + 1) BOS and the tokens chosen so far: the decoder's input without a cache."""
        return self.history[:, : steps + 1]

    def choose(self, logits: Tensor) -> Tensor:
        """The next step's K hypotheses of each sentence from the logits (R, V). Returns the rows (R,) they
        extend: the cache follows them (`reorder`). `active` says which sentences go on."""
        k = self.k
        lprobs = next_logprobs(logits, self.step, self.min_length)
        if self.no_repeat_ngram > 0 or self.repetition_penalty != 1.0:  # beam search: on the log-probabilities
            lprobs = repeat_rules(lprobs, self.history, self.no_repeat_ngram, self.repetition_penalty, self.step + 1)
        at_limit = (self.step + 1 >= self.limits).repeat_interleave(k)  # (R,) must end now: only EOS allowed
        top_scores, top_tokens, top_beams = top_candidates(lprobs, self.scores, k, at_limit)  # (B, 2K), best first
        top_rows = self.first_row + top_beams  # the hypothesis each candidate extends
        real = top_scores > float("-inf")
        is_eos = (top_tokens == EOS_ID) & real
        self.finished.add(self.history, top_rows, top_scores, is_eos & self.active[:, None], self.step, self.sentences)
        chosen, n_going_on = first_k(~is_eos & real, k)  # the first K candidates that are not EOS continue
        self.active &= (self.finished.count.index_select(0, self.sentences) < k) & (n_going_on >= k)
        self.scores.copy_(top_scores.gather(1, chosen))
        self.token.copy_(top_tokens.gather(1, chosen).flatten())
        index = top_rows.gather(1, chosen).flatten()
        self.history.copy_(self.history.index_select(0, index))
        self.history.index_copy_(1, self.step.view(1) + 1, self.token[:, None])
        self.step += 1
        return index

    def keep(self, kept: Tensor) -> Tensor:
        """Only sentences `kept` (B',) decode on (the dynamic path; new tensors, so never under a captured
        graph); returns their rows (B' x K,)."""
        k = self.k
        rows = (kept[:, None] * k + torch.arange(k, device=kept.device)).flatten()
        self.min_length, self.history, self.token = self.min_length[rows], self.history[rows], self.token[rows]
        self.limits, self.active, self.scores = self.limits[kept], self.active[kept], self.scores[kept]
        self.sentences = self.sentences[kept]
        self.first_row = torch.arange(kept.numel(), device=kept.device)[:, None] * k
        return rows


class Finished:
    """Beam search's finished hypotheses on the device: K slots per sentence, and one more (slot K) where
    the candidates that finish nothing write, so that every step writes the same shapes."""

    def __init__(self, n_sent: int, k: int, steps: int, device: torch.device) -> None:
        self.k = k
        self.tokens = torch.zeros(n_sent * (k + 1), steps, dtype=torch.long, device=device)  # BOS, tokens, EOS
        self.logprob = torch.zeros(n_sent * (k + 1), device=device)
        self.length = torch.zeros(n_sent * (k + 1), dtype=torch.long, device=device)  # tokens with the EOS
        self.count = torch.zeros(n_sent, dtype=torch.long, device=device)  # (B,) finished so far

    def state(self) -> list[Tensor]:
        return [self.tokens, self.logprob, self.length, self.count]

    def reset(self) -> None:
        for tensor in self.state():
            tensor.zero_()

    def add(
        self, history: Tensor, top_rows: Tensor, top_scores: Tensor, eos: Tensor, step: Tensor, sentences: Tensor
    ) -> None:
        """Finish the hypotheses that end with EOS, by decoding/rules.py's rule. `eos`: (B', 2K) the candidates
        that are EOS, of sentences still decoding; `step` (0-d) the tokens chosen before this one;
        `sentences` (B',) the batch's sentences, by their place here."""
        k = self.k
        count = self.count.index_select(0, sentences)[:, None]  # (B', 1)
        finishing = eos[:, :k]
        rank = finishing.long().cumsum(1)  # 1 for the first finishing candidate, 2 for the second ...
        finishing = finishing & (count + rank <= k)
        slot = torch.where(finishing, count + rank - 1, k)
        target = (sentences[:, None] * (k + 1) + slot).flatten()
        ended = history.index_select(0, top_rows[:, :k].flatten())
        ended.index_fill_(1, step.view(1) + 1, EOS_ID)
        self.tokens.index_copy_(0, target, ended)
        self.logprob.index_copy_(0, target, top_scores[:, :k].flatten())
        self.length.index_copy_(0, target, (step + 1).expand(target.numel()))  # index_fill_ would read the step
        self.count.index_add_(0, sentences, finishing.sum(1))

    def hypotheses(self, n: int, alpha: float, nbest: int) -> list[list[Hypothesis]]:
        """The first `n` sentences' best `nbest` (length-normalised scores), read to the host once."""
        k = self.k
        rows = n * (k + 1)  # the padded sentences' slots are not read
        counts, lengths = self.count[:n].tolist(), self.length[:rows].tolist()
        tokens, logprobs = self.tokens[:rows].tolist(), self.logprob[:rows].tolist()
        results = []
        for s, count in enumerate(counts):
            hyps = []
            for j in range(s * (k + 1), s * (k + 1) + count):
                length, total = lengths[j], logprobs[j]
                hyps.append(Hypothesis(tokens[j][1 : 1 + length], total / length_penalty(length, alpha), total))
            results.append(sorted(hyps, key=lambda h: -h.score)[:nbest])
        return results


def first_k(going_on: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(B, 2K) the candidates that may continue -> the positions of the first K of them (B, K), and how many
    there are (B,); where fewer than K, the rest point at candidate 0 (their sentence is done)."""
    place = going_on.long().cumsum(1) - 1
    place = torch.where(going_on & (place < k), place, k)  # column K: not chosen
    chosen = torch.zeros(going_on.size(0), k + 1, dtype=torch.long, device=going_on.device)
    chosen.scatter_(1, place, torch.arange(going_on.size(1), device=going_on.device).expand_as(place))
    return chosen[:, :k], going_on.sum(1)
