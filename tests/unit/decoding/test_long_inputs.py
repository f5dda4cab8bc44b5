"""Long inputs are bounded: a source longer than the model serves is cut, with a warning
naming its line, and the file goes on; outputs end by model.max_len whatever the positions; a prompt and its
new tokens fit model.max_len."""

from dataclasses import replace

import pytest
import torch
from tiny_models import POSITIONS, WORDS, tiny_translator

from tformer_cli.decoding import api, rules, search, search_state, static, translate
from tformer_cli.decoding.search import beam_search, greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.decoding.static import static_beam_search, static_greedy
from tformer_cli.decoding.stream import stream_generation
from tformer_cli.decoding.translate import translate_stream
from tformer_cli.model import build_model
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID, Tokenizer

SEARCHES = {
    "greedy": lambda m, src, settings: [[h] for h in greedy(m, src, settings)],
    "beam": lambda m, src, settings: beam_search(m, src, replace(settings, beam=3, nbest=3)),
    "static_greedy": lambda m, src, settings: _static(m, src, replace(settings, beam=1)),
    "static_beam": lambda m, src, settings: _static(m, src, replace(settings, beam=3, nbest=3)),
}


def _static(m, src, settings: SearchSettings):
    """decode.static=always through the entry point, which takes the dynamic path where the output does not fit."""
    return api.translate_batch(m, src, replace(settings, static="always"))


LONG = " ".join(WORDS[i % len(WORDS)] for i in range(400))  # a few hundred tokens


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return Tokenizer(tokenizer_dir / "spm.model")


def _built(tokenizer, pos: str, max_len: int):
    torch.manual_seed(0)
    kw = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0, pos=pos, max_len=max_len)
    return build_model("seq2seq", vocab_size=tokenizer.vocab_size, **kw).eval()


@pytest.fixture
def no_early_eos(monkeypatch):
    """EOS almost never chosen before the length limit (a finite, very low log-probability): every hypothesis
    runs to its limit, where the searches end it."""

    def never_eos(logits, step, min_len, _original=rules.next_logprobs):
        lprobs = _original(logits, step, min_len)
        lprobs[:, EOS_ID] = -1e4
        return lprobs

    for module in (search_state,):
        monkeypatch.setattr(module, "next_logprobs", never_eos)


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_outputs_end_by_what_the_model_serves_for_every_position_scheme(pos, name, no_early_eos):
    model = tiny_translator(pos=pos, max_len=64)
    src = torch.randint(4, 24, (2, 40))
    src[1, 30:] = 0  # padding: limits 1 x 40 + 50 and 1 x 30 + 50, both past max_len
    hyps = SEARCHES[name](model, src, SearchSettings(max_len_a=1.0, max_len_b=50, served=24))
    assert {len(h.tokens) for sentence in hyps for h in sentence} == {24}
    if pos == "learned":  # the table's length when no max_len is given: 90 steps were refused before
        hyps = SEARCHES[name](model, src, SearchSettings(max_len_a=1.0, max_len_b=50))
        assert {len(h.tokens) for sentence in hyps for h in sentence} == {64}
        assert all(h.tokens[-1] == EOS_ID for sentence in hyps for h in sentence)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
@pytest.mark.parametrize("beam", [1, 3])
def test_a_long_line_is_cut_with_a_warning_naming_it_and_the_file_goes_on(tokenizer, pos, beam, monkeypatch):
    model = _built(tokenizer, pos, max_len=16)
    seen = []  # each source the search gets: (sentences, tokens)
    for name in ("greedy", "beam_search"):
        original = getattr(search, name)
        monkeypatch.setattr(
            search, name, lambda m, src, *a, _f=original, **kw: seen.append(tuple(src.shape)) or _f(m, src, *a, **kw)
        )
    lines = ["the cat is red", LONG, "", "a small dog", LONG]
    warnings = []
    cfg = DecodeConfig(beam=beam, nbest=1, static="never", max_len_a=3.0, max_len_b=50)
    for interactive in (False, True):
        warnings.clear()
        out = list(translate_stream(model, tokenizer, lines, cfg, interactive, served=16, warn=warnings.append))
        assert len(out) == len(lines)  # one output line per input line, the long ones included
        assert [w.split(":")[0] for w in warnings] == ["warning", "warning"]
        assert [w.split(": ")[1] for w in warnings] == ["line 2", "line 5"]
        assert "more than the model serves (model.max_len 16): translated from its first 15 tokens" in warnings[0]
    assert max(tokens for _, tokens in seen) <= 16  # 15 tokens and EOS
    for text in out:
        assert len(tokenizer.encode([text])[0]) <= 16


def test_translate_lines_cuts_the_encoded_source_itself(tokenizer, monkeypatch):
    """`tformer eval` and other callers of translate_lines without translate_stream's text cut are bounded too."""
    seen = []
    spy = lambda m, src, settings: seen.append(src.size(1)) or greedy(m, src, settings)  # noqa: E731
    monkeypatch.setattr(search, "greedy", spy)
    model = _built(tokenizer, "rope", max_len=16)
    hyps = translate.translate_lines(model, tokenizer, [LONG], DecodeConfig(beam=1, static="never"), served=16)
    assert seen == [16] and len(hyps[0][0].tokens) <= 16


def test_another_engine_gets_the_cut_lines_too(tokenizer):
    got = []

    def engine(model, tok, lines, cfg, on_done=None):
        got.extend(lines)
        return [[] for _ in lines]

    warnings = []
    out = list(
        translate_stream(object(), tokenizer, ["a cat", LONG], DecodeConfig(), False, engine, 16, warnings.append)
    )
    assert len(out) == 2 and len(warnings) == 1 and "line 2" in warnings[0]
    assert got[0] == "a cat" and len(tokenizer.encode([got[1]])[0]) <= 15


def test_a_learned_model_without_max_len_uses_its_table(tokenizer):
    """`tformer eval --src` calls translate_stream without max_len: the learned table bounds both sides."""
    model = _built(tokenizer, "learned", max_len=16)
    warnings = []
    cfg = DecodeConfig(beam=1, static="never", max_len_a=3.0)
    out = list(translate_stream(model, tokenizer, [LONG, "a cat"], cfg, False, warn=warnings.append))
    assert len(out) == 2 and len(warnings) == 1 and "line 1" in warnings[0]


def test_a_static_search_capped_by_max_len_gives_the_dynamic_answer(no_early_eos):
    model = tiny_translator(pos="sinusoidal", max_len=64)
    src = torch.randint(4, 24, (3, 30))
    settings = SearchSettings(max_len_a=2.0, max_len_b=10, served=20)
    greedy_pair = ([[h] for h in static_greedy(model, src, settings)], [[h] for h in greedy(model, src, settings)])
    beams = replace(settings, beam=3)
    beam_pair = (static_beam_search(model, src, beams), beam_search(model, src, beams))
    for fixed, dynamic in (greedy_pair, beam_pair):
        assert [[h.tokens for h in s] for s in fixed] == [[h.tokens for h in s] for s in dynamic]
        assert {len(h.tokens) for s in fixed for h in s} == {20}


def _lm(tokenizer, pos: str, max_len: int):
    torch.manual_seed(0)
    kw = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0, pos=pos, max_len=max_len)
    return build_model("lm", vocab_size=tokenizer.vocab_size, **kw).eval()


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("fixed", ["never", "always"])
def test_a_prompt_and_its_new_tokens_fit_what_the_model_serves(tokenizer, pos, fixed, monkeypatch):
    model = _lm(tokenizer, pos, max_len=16)
    calls = []
    for module in (search, static):
        for name in ("generate", "static_generate"):
            if hasattr(module, name):
                original = getattr(module, name)
                spy = lambda m, p, s, *rest, _f=original: (
                    calls.append(p.size(1) + s.max_new_tokens) or _f(m, p, s, *rest)
                )  # noqa: E731
                monkeypatch.setattr(module, name, spy)
    cfg = DecodeConfig(max_new_tokens=50, temperature=1.0, static=fixed)
    warnings = []
    text = stream_generation(model, tokenizer, LONG, cfg, lambda piece: None, served=16, warn=warnings.append)
    assert isinstance(text, str) and calls and max(calls) <= 16
    assert len(warnings) == 2 and "continuing its last 8" in warnings[0] and "capped at 8" in warnings[1]
    warnings.clear()
    stream_generation(model, tokenizer, "a cat", DecodeConfig(max_new_tokens=5), lambda _: None, 16, warnings.append)
    assert warnings == []  # within the bound: nothing said, nothing cut


def test_a_recurrent_model_serves_any_length(tokenizer):
    torch.manual_seed(0)
    model = build_model("lstm", vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1).eval()
    warnings = []
    cfg = DecodeConfig(max_new_tokens=20)
    stream_generation(model, tokenizer, LONG, cfg, lambda _: None, served=16, warn=warnings.append)
    assert warnings == []
