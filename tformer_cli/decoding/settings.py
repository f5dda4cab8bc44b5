"""How a search decodes, given once: `SearchSettings`, built from the recipe's `decode:` section and the positions
the model serves (`from_decode`), then handed to every search as it is (fairseq's SequenceGenerator takes its
settings in its constructor for the same reason). The searches' rules are decoding/rules.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID


@dataclass(frozen=True)
class SearchSettings:
    """One search's settings; every search takes (model, inputs, settings) and reads only what applies to it.

    Translation (greedy when beam is 1, else beam search):
        beam, alpha (decode.len_penalty), nbest: beam search's width, length penalty and hypotheses returned.
        max_len_a, max_len_b: an output ends by max_len_a * |source| + max_len_b tokens, EOS included.
        served: the positions the model serves (model.max_len); None: the decoder's learned table's length, if
            any (`search.served_length`). Outputs end there too.
    Language models (`generate`):
        max_new_tokens, temperature, top_k, top_p, samples (rows per prompt); seed: the draws' generator
        (None: PyTorch's global one); eos_id: the token that ends a row (None: rows never end early; the
        recipe's settings end them at EOS).
    Both (decoding/rules.py):
        min_new_tokens: no EOS before this many new tokens (decode.min_len, the recipe's name, kept: fairseq's
            --min-len; a hypothesis' length counts its EOS, so the searches' minimum is `min_length`).
        no_repeat_ngram, repetition_penalty: the repeat controls (0 and 1.0: off).
    Paths:
        use_cache: False recomputes every prefix (the reference; the dynamic searches only).
        static: decode.static, which decoding/api.py reads to choose the fixed-shape path.
    """

    beam: int = 1
    alpha: float = 0.6
    nbest: int = 1
    max_len_a: float = 1.0
    max_len_b: int = 50
    served: int | None = None
    max_new_tokens: int = 200
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    samples: int = 1
    seed: int | None = None
    eos_id: int | None = None
    min_new_tokens: int = 0
    no_repeat_ngram: int = 0
    repetition_penalty: float = 1.0
    use_cache: bool = True
    static: Literal["auto", "always", "never"] = "auto"

    @classmethod
    def from_decode(cls, decode: DecodeConfig, served: int | None = None) -> SearchSettings:
        """The settings of a recipe's `decode:` section, for a model serving `served` positions (model.max_len)."""
        return cls(
            beam=decode.beam,
            alpha=decode.len_penalty,
            nbest=decode.nbest,
            max_len_a=decode.max_len_a,
            max_len_b=decode.max_len_b,
            served=served,
            max_new_tokens=decode.max_new_tokens,
            temperature=decode.temperature,
            top_k=decode.top_k,
            top_p=decode.top_p,
            samples=decode.samples,
            seed=decode.seed,
            min_new_tokens=decode.min_len,
            no_repeat_ngram=decode.no_repeat_ngram,
            repetition_penalty=decode.repetition_penalty,
            static=decode.static,
            eos_id=EOS_ID,
        )

    @property
    def min_length(self) -> int:
        """The shortest hypothesis the translation searches end, EOS counted: min_new_tokens + 1 (EOS not before
        min_new_tokens new tokens), or 0 when there is no minimum."""
        return self.min_new_tokens + 1 if self.min_new_tokens > 0 else 0

    @property
    def repeats(self) -> tuple[int, float]:
        """(no_repeat_ngram, repetition_penalty): what a search state holds from the start."""
        return self.no_repeat_ngram, self.repetition_penalty
