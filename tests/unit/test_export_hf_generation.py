"""The generation_config.json of a Hugging Face export (export/hf_generation.py): the recipe's decode settings."""

from types import SimpleNamespace

import pytest

from tformer_cli.config import config_from_dict
from tformer_cli.export.hf_generation import generation_config

transformers = pytest.importorskip("transformers")


def _config(kind: str, decode: dict):
    tree = {"data": {"kind": "text" if kind == "lm" else "parallel"}, "model": {"kind": kind, "max_len": 64}}
    run = SimpleNamespace(kind=kind, config=config_from_dict({**tree, "decode": decode}, "test"))
    return generation_config(run, transformers)


def test_a_language_model_generates_as_tformer_generate():
    greedy = _config("lm", {"max_new_tokens": 30})
    assert (greedy.max_new_tokens, greedy.do_sample, greedy.eos_token_id) == (30, False, 3)
    sampled = _config("lm", {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "max_new_tokens": 12})
    assert (sampled.do_sample, sampled.temperature, sampled.top_p, sampled.max_new_tokens) == (True, 0.7, 0.9, 12)
    assert sampled.top_k == 0  # tformer's 0: no top-k filter (Hugging Face's default would be 50)
    assert not _config("lm", {"temperature": 0.7, "top_k": 1}).do_sample  # tformer's top_k 1 is argmax


def test_a_greedy_translation_recipe_sets_no_beam_settings_and_beam_ones_all_of_them():
    greedy = _config("seq2seq", {"beam": 1})
    assert greedy.num_beams == 1 and greedy.max_new_tokens == 64  # a * 64 + 50, at most model.max_len
    assert greedy.length_penalty == transformers.GenerationConfig().length_penalty  # left at the default
    beam = _config("seq2seq", {"beam": 5, "len_penalty": 1.0, "nbest": 3, "max_len_a": 0.5, "max_len_b": 3})
    assert (beam.num_beams, beam.early_stopping, beam.length_penalty, beam.num_return_sequences) == (5, True, 1.0, 3)
    assert beam.max_new_tokens == 35 and beam.do_sample is False
    assert beam.tformer_decode == {"len_penalty": 1.0, "max_len_a": 0.5, "max_len_b": 3, "max_len": 64}
