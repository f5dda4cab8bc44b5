"""The two doors to decoding: `translate_batch` (an encoder-decoder, a batch of sources) and `generate` (a language
model, a prompt). Each takes one `SearchSettings` (decoding/settings.py: built once from the recipe's `decode:`
section) and decides between the fixed-shape path (decoding/static.py: `decode.static`, auto on CUDA, where the
output fits its static cache) and the dynamic one (decoding/search.py: the reference, and the CPU's path). The
searches of both paths take (model, inputs, settings) and give the same answers (tests/unit/decoding/
test_static.py); the fixed-shape one is faster on a GPU. The rules are decoding/rules.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import Tensor, nn

from tformer_cli.decoding import search, static
from tformer_cli.decoding.ensemble import Ensemble
from tformer_cli.decoding.rules import Hypothesis
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.model.seq2seq import Seq2Seq

__all__ = ["SearchSettings", "generate", "translate_batch"]


def translate_batch(model: Seq2Seq | Ensemble, src: Tensor, settings: SearchSettings) -> list[list[Hypothesis]]:
    """Greedy (settings.beam 1) or beam search for a batch of sources (B, S) on the model's device; an ensemble
    (decoding/ensemble.py) on the dynamic path.

    Returns:
        Per sentence, its settings.nbest best hypotheses (greedy: the one).
    """
    if (
        isinstance(model, Seq2Seq)  # the fixed-shape searches take a Seq2Seq alone, not an ensemble
        and static.use_static(settings.static, src.device)
        and static.fits(model, int(search.output_limits(model, src, settings).max()))  # a read of the device
    ):
        return _search(static.static_greedy, static.static_beam_search, model, src, settings)
    return _search(search.greedy, search.beam_search, model, src, settings)


Model = TypeVar("Model", Seq2Seq, Seq2Seq | Ensemble)


def _search(
    greedy: Callable[[Model, Tensor, SearchSettings], list[Hypothesis]],
    beam_search: Callable[[Model, Tensor, SearchSettings], list[list[Hypothesis]]],
    model: Model,
    src: Tensor,
    settings: SearchSettings,
) -> list[list[Hypothesis]]:
    """One path's greedy search (settings.beam 1) or beam search, each sentence's hypotheses in a list."""
    if settings.beam == 1:
        return [[h] for h in greedy(model, src, settings)]
    return beam_search(model, src, settings)


def generate(
    model: nn.Module, prompt: Tensor, settings: SearchSettings, on_token: Callable[[Tensor], None] | None = None
) -> Tensor:
    """Continue `prompt` (B, T) on the model's device by settings.max_new_tokens tokens, each row settings.samples
    times, with the settings' sampling (temperature, top_k, top_p, drawn from settings.seed) and controls; stops
    at settings.eos_id. `on_token` gets each step's new tokens (B,).

    Returns:
        (B * samples, T + n_new) tokens; rows that finished early are padded with eos_id.
    """
    length = prompt.size(1) + settings.max_new_tokens
    if static.use_static(settings.static, prompt.device) and static.fits_lm(model, length):
        assert isinstance(model, static.LanguageModel)  # fits_lm: a Transformer language model
        return static.static_generate(model, prompt, settings, on_token)
    return search.generate(model, prompt, settings, on_token)
