"""tformer's translation search for an exported model: `custom_generate/generate.py` of a Hugging Face export.

Loaded with `AutoModelForSeq2SeqLM.from_pretrained(DIR, trust_remote_code=True)`, the model's
`generate(**ids)` gives the translations `tformer translate` gives, with the settings of the recipe
(`tformer_decode` in generation_config.json), where the stock `generate` cannot:

- length penalty: tformer ranks finished hypotheses by logprob / ((5 + length) / 6) ** alpha (GNMT);
  Hugging Face's `length_penalty` divides by length ** alpha. This searches with raw log-probabilities
  (length_penalty 0: the same beams and the same stopping rule as tformer's) and ranks the `num_beams`
  finished hypotheses with tformer's penalty.
- length limit: tformer's is per sentence, min(a * source_length + b, model.max_len), where it ends an
  open hypothesis with EOS scored by its own log-probability; `generate` has one limit per call and
  scores a forced EOS 0. This forces EOS, keeping its log-probability, at each sentence's own limit.
- min_new_tokens (decode.min_len): no EOS before that many new tokens, except at a sentence's own limit, where
  tformer's limit wins; applied here with the limit (`generate`'s own would leave a sentence whose limit comes
  first no token at all). no_repeat_ngram_size and repetition_penalty are `generate`'s own (the same rules).

What remains: with more than one best (`num_return_sequences` > 1), a hypothesis that ended before the
step where the beam filled up can be left out where tformer keeps it (as with CTranslate2,
decoding/ctranslate2.py); the best one is never affected (for alpha >= 0).

This file runs in the user's environment: it imports only torch (and is given the model by transformers).
"""

from __future__ import annotations

import torch


class SentenceLimits:
    """A logits processor: at each row's own output limit, EOS is the only choice and keeps its log-probability;
    before it, no EOS while fewer than `min_new_tokens` tokens have been generated."""

    def __init__(self, limits: torch.Tensor, eos_id: int, prompt_len: int, min_new_tokens: int = 0) -> None:
        self.limits, self.eos_id, self.prompt_len = limits, eos_id, prompt_len  # limits: (rows,)
        self.min_new_tokens = min_new_tokens

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_len  # tokens after the decoder's start token
        at_limit = generated + 1 >= self.limits.to(scores.device)
        if generated < self.min_new_tokens:
            eos = scores[:, self.eos_id].masked_fill(~at_limit, float("-inf"))
            scores = scores.clone()
            scores[:, self.eos_id] = eos
        if bool(at_limit.any()):
            eos = scores[:, self.eos_id].clone()
            scores = scores.masked_fill(at_limit[:, None], float("-inf"))
            scores[:, self.eos_id] = torch.where(at_limit, eos, scores[:, self.eos_id])
        return scores


def generate(model, input_ids=None, attention_mask=None, generation_config=None, **kwargs):
    """`tformer translate`'s outputs for a batch of sources: (rows, length) token ids, padded, `<s>` first; with
    `num_return_sequences` n, n rows per source, best first (the stock `generate`'s layout)."""
    from transformers import GenerationMixin

    config = generation_config if generation_config is not None else model.generation_config
    settings = config.tformer_decode  # the recipe's decode settings, written by `tformer export --format hf`
    beams = kwargs.pop("num_beams", config.num_beams)
    nbest = kwargs.pop("num_return_sequences", config.num_return_sequences)
    min_new = kwargs.pop("min_new_tokens", config.min_new_tokens) or 0  # SentenceLimits applies it
    if attention_mask is None:
        attention_mask = (input_ids != config.pad_token_id).long()
    source_lengths = attention_mask.sum(1).float()  # `</s>` included, as tformer counts
    limits = (source_lengths * settings["max_len_a"] + settings["max_len_b"]).long().clamp(1, settings["max_len"])
    search = {  # arguments, not a config: a None in a config is filled in from the model's
        "num_beams": beams,
        "forced_eos_token_id": None,  # SentenceLimits ends every hypothesis by its own limit
        "min_new_tokens": 0,  # and keeps EOS off before min_new tokens, up to that limit
        "max_new_tokens": int(limits.max()),
        "return_dict_in_generate": True,
        "output_scores": True,
    }
    if beams > 1:  # every finished hypothesis, scored by its raw log-probability
        search.update(num_return_sequences=beams, length_penalty=0.0, early_stopping=True)
    rows = SentenceLimits(limits.repeat_interleave(beams), config.eos_token_id, prompt_len=1, min_new_tokens=min_new)
    out = GenerationMixin.generate(
        model,
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=generation_config,
        logits_processor=[rows],
        **search,
        **kwargs,
    )
    if beams == 1:
        return out.sequences
    return _ranked(out.sequences, out.sequences_scores, beams, nbest, settings["len_penalty"], config.eos_token_id)


def _ranked(sequences, logprobs, beams: int, nbest: int, alpha: float, eos_id: int) -> torch.Tensor:
    """Each source's `beams` hypotheses ranked by logprob / ((5 + length) / 6) ** alpha; the best `nbest` of each."""
    ended = sequences[:, 1:] == eos_id  # every hypothesis has ended (SentenceLimits)
    lengths = (ended.float().argmax(1) + 1).float()  # generated tokens, `</s>` included
    scores = logprobs / ((5.0 + lengths) / 6.0) ** alpha
    best = scores.view(-1, beams).argsort(dim=1, descending=True, stable=True)[:, :nbest]  # (sources, nbest)
    rows = (best + torch.arange(best.size(0), device=best.device)[:, None] * beams).flatten()
    picked = sequences[rows]
    keep = (picked[:, 1:] == eos_id).float().argmax(1).max() + 2  # `<s>`, the longest's tokens and its `</s>`
    return picked[:, : int(keep)]
