"""The `generation_config.json` of a Hugging Face export: the recipe's `decode:` settings, in `generate`'s terms.

A translation model's `model.generate(**ids)` then searches as `tformer translate` does, as far as
`generate`'s own settings reach:

| tformer (`decode:`)          | Hugging Face `GenerationConfig`                                           |
|------------------------------|---------------------------------------------------------------------------|
| beam: 1                      | num_beams 1 (greedy)                                                      |
| beam: K                      | num_beams K, early_stopping True (done once K hypotheses have ended)      |
| nbest                        | num_return_sequences                                                      |
| len_penalty (alpha)          | length_penalty alpha: the same ranking only for alpha 0 (see below)       |
| limit a * source_length + b  | max_new_tokens: the limit of the longest source (model.max_len tokens)    |
| PAD and BOS never generated  | suppress_tokens [PAD, BOS] (-inf after the log-softmax, as tformer)       |
| EOS forced at the limit      | forced_eos_token_id                                                       |
| min_len N (when set)         | min_new_tokens N: no EOS before N new tokens                              |
| no_repeat_ngram n (when set) | no_repeat_ngram_size n                                                    |
| repetition_penalty p (set)   | repetition_penalty p                                                      |

Both beam searches follow the rules of decoding/rules.py ("Beam search"; transformers' `_beam_search`); both
count a hypothesis' length as its generated tokens, EOS included. The decoding controls are Hugging Face's own
rules, applied where `generate` applies them (greedy search: the logits; beam search: the log-probabilities),
over the decoder's ids from the start token (tformer's BOS), so they give the same outputs; the length limit wins
over min_new_tokens in both. What cannot be matched:

- The length penalty. tformer ranks finished hypotheses by logprob / ((5 + L) / 6) ** alpha (GNMT),
  Hugging Face by logprob / L ** length_penalty. No length_penalty gives GNMT's ranking for alpha != 0;
  both are the raw log-probability for alpha = 0 (`decode.len_penalty=0` in tformer equals
  `length_penalty=0.0` in Hugging Face). For alpha != 0, length_penalty is alpha, the same knob: the
  two rank hypotheses of lengths L and L + 1 alike when length_penalty = alpha * L / (5 + L), so they
  agree more often on long outputs than on short ones. Greedy decoding is unaffected.
- The length limit. tformer's is per sentence, a * source_length + b (EOS and the source's EOS
  counted), at most model.max_len; `generate` has one for the whole call. The config's `max_new_tokens`
  is the limit of the longest source (model.max_len tokens); for tformer's own limit, pass
  `max_new_tokens=min(int(a * ids["input_ids"].shape[1] + b), max_len)` for a single sentence. At the
  limit Hugging Face's forced EOS scores 0 where tformer adds the EOS log-probability, so hypotheses
  that reach it can rank differently.

With `from_pretrained(DIR, trust_remote_code=True)`, `generate` is the export's
`custom_generate/generate.py` (hf_custom_generate.py), which matches both: it searches with raw
log-probabilities, forces EOS at each sentence's own limit, and ranks with GNMT's penalty; the
settings it needs beyond `generate`'s are the config's `tformer_decode`.

A language model's config holds `tformer generate`'s settings: max_new_tokens, and sampling with
temperature, top_k and top_p when decode.temperature > 0 (greedy otherwise); the controls above, over prompt
+ new tokens (the tokenizer puts `</s>` before the prompt, as tformer does); decode.samples N > 1 as
num_return_sequences N (sampling only: greedy with N > 1 is refused, as `tformer generate` refuses it).
"""

from __future__ import annotations

from typing import Any

from tformer_cli.run import Run
from tformer_cli.schema import DecodeConfig, ModelConfig, check_samples
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID


def generation_config(run: Run, transformers: Any) -> Any:
    """The `GenerationConfig` that decodes as `tformer translate` (seq2seq) or `tformer generate` (lm) would."""
    decode = run.config.decode
    if run.kind == "seq2seq":
        return transformers.GenerationConfig(
            decoder_start_token_id=BOS_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            forced_eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            suppress_tokens=[PAD_ID, BOS_ID],
            **search_settings(decode, run.config.model),
            **control_settings(decode),
            tformer_decode=tformer_search(decode, run.config.model),
        )
    check_samples(decode)
    sampling = decode.temperature > 0.0 and decode.top_k != 1  # tformer's sample_next: otherwise argmax
    return transformers.GenerationConfig(
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        max_new_tokens=decode.max_new_tokens,
        do_sample=sampling,
        **({"temperature": decode.temperature, "top_k": decode.top_k, "top_p": decode.top_p} if sampling else {}),
        **({"num_return_sequences": decode.samples} if decode.samples > 1 else {}),
        **control_settings(decode),
    )


def control_settings(decode: DecodeConfig) -> dict[str, Any]:
    """`generate`'s arguments for the recipe's decoding controls that are set (none when all are off): the same
    rules under Hugging Face's names (decode.min_len is min_new_tokens: no EOS before that many new tokens)."""
    settings: dict[str, Any] = {}
    if decode.min_len > 0:
        settings["min_new_tokens"] = decode.min_len
    if decode.no_repeat_ngram > 0:
        settings["no_repeat_ngram_size"] = decode.no_repeat_ngram
    if decode.repetition_penalty != 1.0:
        settings["repetition_penalty"] = decode.repetition_penalty
    return settings


def search_settings(decode: DecodeConfig, model: ModelConfig) -> dict[str, Any]:
    """`generate`'s search arguments for tformer's translation search (see the module's table)."""
    beam = {
        "num_beams": decode.beam,
        "early_stopping": True,
        "length_penalty": decode.len_penalty,
        "num_return_sequences": decode.nbest,
    }
    return {
        **(beam if decode.beam > 1 else {"num_beams": 1}),
        "max_new_tokens": longest_limit(decode, model),
        "do_sample": False,
    }


def longest_limit(decode: DecodeConfig, model: ModelConfig) -> int:
    """tformer's output limit for the longest source (model.max_len tokens): a * max_len + b, at most max_len.

    tformer ends every output by model.max_len tokens (decoding/rules.py), and so must Marian and
    Pegasus: their decoder's position table (`max_position_embeddings`) is model.max_len long.
    """
    return min(int(decode.max_len_a * model.max_len + decode.max_len_b), model.max_len)


def tformer_search(decode: DecodeConfig, model: ModelConfig) -> dict[str, float | int]:
    """What the export's `custom_generate/generate.py` (hf_custom_generate.py) needs beyond `generate`'s own
    settings to search exactly as tformer: the GNMT alpha and the per-sentence length limit."""
    return {
        "len_penalty": decode.len_penalty,
        "max_len_a": decode.max_len_a,
        "max_len_b": decode.max_len_b,
        "max_len": model.max_len,
    }
