"""One settings object into decoding: `SearchSettings` carries the recipe's decode section to every search, and the
fixed-shape searches take what the dynamic ones take."""

import dataclasses
import inspect

import pytest

from tformer_cli.decoding import api, search, static
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID

# every decode key a search reads, each away from its default
DECODE = DecodeConfig(
    beam=3,
    len_penalty=1.1,
    max_len_a=1.5,
    max_len_b=7,
    nbest=2,
    max_new_tokens=9,
    temperature=0.7,
    top_k=5,
    top_p=0.8,
    seed=11,
    samples=2,
    min_len=4,
    no_repeat_ngram=3,
    repetition_penalty=1.2,
    static="never",
)


def test_from_decode_carries_every_key_the_searches_read():
    got = SearchSettings.from_decode(DECODE, served=33)
    want = SearchSettings(
        beam=3,
        alpha=1.1,
        nbest=2,
        max_len_a=1.5,
        max_len_b=7,
        served=33,
        max_new_tokens=9,
        temperature=0.7,
        top_k=5,
        top_p=0.8,
        samples=2,
        seed=11,
        eos_id=EOS_ID,
        min_new_tokens=4,
        no_repeat_ngram=3,
        repetition_penalty=1.2,
        use_cache=True,
        static="never",
    )
    assert got == want


def test_min_length_counts_the_eos():
    """decode.min_len N: no EOS before N new tokens, so no hypothesis shorter than N + 1 with its EOS; 0: none."""
    assert SearchSettings(min_new_tokens=0).min_length == 0
    assert SearchSettings(min_new_tokens=1).min_length == 2
    assert SearchSettings.from_decode(DECODE).min_length == 5


def test_the_settings_are_frozen():
    settings = SearchSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.beam = 4  # type: ignore[misc]


def _parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(
    ("dynamic", "fixed"),
    [(search.greedy, static.static_greedy), (search.beam_search, static.static_beam_search)]
    + [(search.generate, static.static_generate), (api.generate, static.static_generate)],
    ids=["greedy", "beam_search", "generate", "api.generate"],
)
def test_static_and_dynamic_searches_share_one_signature(dynamic, fixed):
    assert _parameters(dynamic) == _parameters(fixed)
    names = [name for name, _ in _parameters(dynamic)]
    assert names[2] == "settings" and len(names) <= 4  # (model, inputs, settings), a generation's on_token
    hints = inspect.get_annotations(dynamic, eval_str=True)
    assert hints["settings"] is SearchSettings
