"""The entry points (decoding/api.py): `translate_batch` and `generate` take the settings made from the recipe's
decode section, decide once between the fixed-shape path and the dynamic one, and give what the searches give when
called directly."""

import dataclasses

import pytest
import torch
from tiny_models import tiny_lm, tiny_translator

from tformer_cli.decoding import api, static_graphs
from tformer_cli.decoding.search import beam_search, generate, greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID

pytestmark = pytest.mark.filterwarnings("error:decoding without CUDA graphs:RuntimeWarning")


def _tokens(hyps):
    """The hypotheses' tokens, and their scores to within rounding (the static path's kernels on CUDA are not the
    dynamic one's)."""
    return [[(h.tokens, pytest.approx(h.score, abs=1e-4)) for h in sentence] for sentence in hyps]


@pytest.mark.parametrize("fixed", ["never", "always"])
def test_translate_batch_runs_the_search_its_settings_name(fixed, device):
    m = tiny_translator(device)
    torch.manual_seed(3)
    src = torch.randint(4, 24, (5, 7), device=device)
    src[2, 4:] = 0
    decode = DecodeConfig(static=fixed, max_len_a=1.5, max_len_b=4, min_len=2, no_repeat_ngram=2)
    settings = SearchSettings.from_decode(decode)
    greedy_got = api.translate_batch(m, src, dataclasses.replace(settings, beam=1))
    assert _tokens(greedy_got) == _tokens([[h] for h in greedy(m, src, dataclasses.replace(settings, static="never"))])
    beams = dataclasses.replace(settings, beam=3, nbest=2, alpha=1.0)
    assert _tokens(api.translate_batch(m, src, beams)) == _tokens(beam_search(m, src, beams))
    assert bool(static_graphs._graphs.get(m)) == (fixed == "always")  # the path the settings named


@pytest.mark.parametrize("fixed", ["never", "always"])
def test_generate_samples_as_its_settings_say(fixed, device):
    lm = tiny_lm("rope").to(device)
    prompt = torch.randint(1, 50, (1, 5), device=device)
    decode = DecodeConfig(static=fixed, temperature=0.9, top_k=20, seed=7, samples=3, repetition_penalty=1.3)
    settings = SearchSettings.from_decode(dataclasses.replace(decode, max_new_tokens=12))
    got = api.generate(lm, prompt, settings)
    want = generate(
        lm,
        prompt,
        SearchSettings(
            max_new_tokens=12, temperature=0.9, top_k=20, eos_id=EOS_ID, seed=7, samples=3, repetition_penalty=1.3
        ),
    )
    assert torch.equal(got, want)
    assert api.generate(lm, prompt, dataclasses.replace(settings, max_new_tokens=4, samples=1)).size(1) <= 5 + 4
    assert bool(static_graphs._graphs.get(lm)) == (fixed == "always")
