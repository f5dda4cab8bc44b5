"""The decoding controls (decode.min_len, decode.no_repeat_ngram, decode.repetition_penalty, decode.samples): each
rule against a hand computation, in greedy and beam search (translate) and in generate (language models), Hugging
Face's rules and placement (greedy and sampling: the logits; beam search: the log-probabilities), the static path
equal to the dynamic one, and what refuses them.

The hand-computed cases use scripted models whose next-token probabilities depend only on the last token (a table),
so that every expected output below is worked out in its comment.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from tiny_models import tiny_lm, tiny_translator
from torch import nn

from tformer_cli.config import config_from_dict
from tformer_cli.decoding.ctranslate2 import check_controls
from tformer_cli.decoding.rules import banned_ngram_tokens, penalise_repeats
from tformer_cli.decoding.search import beam_search, generate, greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.decoding.static import static_beam_search, static_generate, static_greedy
from tformer_cli.decoding.stream import SAMPLE_SEPARATOR, stream_generation
from tformer_cli.errors import ConfigError, TformerError
from tformer_cli.model import build_model
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import BOS_ID, EOS_ID, Tokenizer

V = 8  # PAD 0, UNK 1, BOS 2, EOS 3, words 4..7
SHIFT = 10.0  # the scripted logits are log p + SHIFT: positive, so that a penalty on logits divides them


def _table(rows: dict[int, dict[int, float]]) -> torch.Tensor:
    """(V, V) logits by last token: log p + SHIFT for the probabilities given, -inf elsewhere; a row not given
    ends at once (EOS: 1)."""
    table = torch.full((V, V), float("-inf"))
    table[:, EOS_ID] = SHIFT
    for last, probs in rows.items():
        table[last, EOS_ID] = float("-inf")
        for token, p in probs.items():
            table[last, token] = math.log(p) + SHIFT
    return table


# After BOS: 4 (0.7) or 5 (0.3); after 4: 4 (0.5), 5 (0.3) or EOS (0.2); after 5: EOS (0.6) or 4 (0.4).
REPEATER = _table({BOS_ID: {4: 0.7, 5: 0.3}, 4: {4: 0.5, 5: 0.3, EOS_ID: 0.2}, 5: {EOS_ID: 0.6, 4: 0.4}})
# Ends early: after BOS 6; after 6 EOS (0.6) or 7; after 7 EOS or 4; after 4 EOS or 5.
SHORT = _table({BOS_ID: {6: 0.9, 4: 0.1}, 6: {EOS_ID: 0.6, 7: 0.4}, 7: {EOS_ID: 0.6, 4: 0.4}, 4: {EOS_ID: 0.6, 5: 0.4}})


class ScriptedTranslator(nn.Module):
    """A stand-in for a Seq2Seq: the next token's logits are `table[last token]`, whatever the source."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.decoder = SimpleNamespace(positions=None)  # serves any length

    def encode(self, src):
        return torch.zeros(src.size(0), 1, 1), None

    def decode(self, tokens, memory, memory_mask, cache):
        return self.table[tokens]


class ScriptedLM(nn.Module):
    """A stand-in for a LanguageModel: the next token's logits are `table[last token]`."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, tokens, cache=None):
        return self.table[tokens]


SRC = torch.tensor([[4, 5, EOS_ID]])


def _greedy(table, **kw) -> list[int]:
    return greedy(ScriptedTranslator(table), SRC, SearchSettings(max_len_a=0.0, max_len_b=3, use_cache=False, **kw))[
        0
    ].tokens


def _beam(table, **kw) -> list[tuple[list[int], float]]:
    hyps = beam_search(
        ScriptedTranslator(table),
        SRC,
        SearchSettings(beam=2, alpha=0.0, max_len_a=0.0, max_len_b=3, nbest=2, use_cache=False, **kw),
    )
    return [(h.tokens, pytest.approx(h.score, abs=1e-4)) for h in hyps[0]]


def ln(*probabilities: float) -> float:
    return sum(math.log(p) for p in probabilities)


# The rules themselves


def test_banned_ngram_tokens_by_hand():
    tokens = torch.tensor([[5, 6, 7, 5, 6]])
    banned = lambda n, t=tokens, length=None: banned_ngram_tokens(t, n, V, length)[0].nonzero().flatten().tolist()  # noqa: E731
    assert banned(2) == [7]  # last 1 token (6): the bigram (6, 7) is there, so 7 would repeat it
    assert banned(3) == [7]  # last 2 (5, 6): (5, 6, 7)
    assert banned(1) == [5, 6, 7]  # every token there
    assert banned(4) == []  # (7, 5, 6) never started an earlier 4-gram
    assert banned(6) == []  # fewer tokens than n
    assert banned_ngram_tokens(torch.tensor([[4, 4]]), 2, V)[0].nonzero().flatten().tolist() == [4]
    # the static path's buffers: only the first `length` tokens are the sequence
    buffer = torch.tensor([[5, 6, 7, 5, 6, 7, 7], [5, 6, 7, 5, 6, 7, 7]])
    assert banned(2, buffer, torch.tensor([5, 3])) == [7]  # row 0: as above; row 1 (5, 6, 7): nothing
    assert banned_ngram_tokens(buffer, 2, V, torch.tensor([5, 3]))[1].sum() == 0
    assert banned(1, buffer[:1], torch.tensor(2)) == [5, 6]


def test_penalise_repeats_by_hand():
    scores = torch.tensor([[2.0, -1.0, 3.0, -4.0, 0.5]])
    tokens = torch.tensor([[0, 1, 1, 3]])  # 1 twice: penalised once
    got = penalise_repeats(scores, tokens, 2.0)
    assert got.tolist() == [[1.0, -2.0, 3.0, -8.0, 0.5]]  # > 0: / 2; <= 0: * 2; tokens 2 and 4 not there
    assert penalise_repeats(scores, tokens, 0.5).tolist() == [[4.0, -0.5, 3.0, -2.0, 0.5]]  # < 1 rewards repeats
    buffer = torch.tensor([[0, 1, 2, 4]])
    assert penalise_repeats(scores, buffer, 2.0, torch.tensor(2)).tolist() == [[1.0, -2.0, 3.0, -4.0, 0.5]]


def test_the_rules_are_hugging_faces():
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 9, (16, 12), generator=gen)  # few distinct tokens: many repeated n-grams
    scores = torch.randn(16, 10, generator=gen) * 3
    for n in (1, 2, 3, 4):
        theirs = NoRepeatNGramLogitsProcessor(n)(tokens, scores.clone()) == float("-inf")
        assert torch.equal(banned_ngram_tokens(tokens, n, 10), theirs)
    for penalty in (0.7, 1.3):
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(tokens, scores.clone())
        assert torch.equal(penalise_repeats(scores, tokens, penalty), theirs)


# Greedy and beam search (translate)


def test_greedy_by_hand():
    assert _greedy(REPEATER) == [4, 4, EOS_ID]  # 4 (0.7), 4 (0.5), then EOS at the limit (3 tokens)
    assert _greedy(REPEATER, no_repeat_ngram=1) == [4, 5, EOS_ID]  # 4 again is banned: 5 (0.3) beats EOS (0.2)
    assert _greedy(REPEATER, no_repeat_ngram=2) == [4, 4, EOS_ID]  # (4, 4) is not there yet
    # Hugging Face's greedy search penalises the logits (log p + 10 here): after [BOS, 4], 4's logit 9.307 / 1.1 =
    # 8.461 < 5's 8.796: 5. On log-probabilities it would be -0.693 * 1.1 = -0.762 > 5's -1.204: 4 again.
    assert _greedy(REPEATER, repetition_penalty=1.1) == [4, 5, EOS_ID]
    assert _greedy(REPEATER, repetition_penalty=1.02) == [4, 4, EOS_ID]  # 9.307 / 1.02 = 9.125 > 8.796


def test_min_len_by_hand():
    """decode.min_len N: no EOS before N new tokens (fairseq's --min-len, HF's min_new_tokens)."""
    model = ScriptedTranslator(SHORT)

    def tokens(n: int, b: int = 9) -> list[int]:
        return greedy(model, SRC, SearchSettings(max_len_a=0.0, max_len_b=b, use_cache=False, min_new_tokens=n))[
            0
        ].tokens

    assert tokens(0) == tokens(1) == [6, EOS_ID]  # EOS after 6 (0.6): one new token before it
    assert tokens(2) == [6, 7, EOS_ID]  # EOS banned after 6: 7, then EOS
    assert tokens(3) == [6, 7, 4, EOS_ID]
    assert tokens(8, b=3) == [6, 7, EOS_ID]  # the limit (3 tokens) wins: EOS ends it there
    hyps = beam_search(
        model, SRC, SearchSettings(beam=2, alpha=0.0, max_len_a=0.0, max_len_b=3, use_cache=False, min_new_tokens=8)
    )[0]
    assert [h.tokens for h in hyps] == [[6, 7, EOS_ID]]  # at the limit EOS keeps its log-probability:
    assert hyps[0].score == pytest.approx(math.log(0.9 * 0.4 * 0.6), abs=1e-4)  # not -inf
    beams = beam_search(
        model,
        SRC,
        SearchSettings(beam=2, alpha=0.0, max_len_a=0.0, max_len_b=9, nbest=2, use_cache=False, min_new_tokens=2),
    )
    assert all(len(h.tokens) >= 3 for h in beams[0])


def test_beam_by_hand():
    """Beam 2, raw log-probabilities, limit 3 tokens.

    No control: step 0 keeps [4] (ln .7 = -0.357) and [5] (-1.204); step 1's best: 44 (-1.050), 45 (-1.561),
    5E (-1.715), 4E (-1.966): no EOS among the best 2, 44 and 45 go on; at the limit 45E (-2.072) and 44E (-2.659).
    """
    assert _beam(REPEATER) == [([4, 5, EOS_ID], ln(0.7, 0.3, 0.6)), ([4, 4, EOS_ID], ln(0.7, 0.5, 0.2))]


def test_no_repeat_ngram_in_beam_search_by_hand():
    """Beam search bans after the log-softmax, as Hugging Face's (the others keep their log-probabilities).

    With 4 banned after [4]: 45 (-1.561), 5E (-1.715, finished: EOS among the best 2), 4E (-1.966), 54 (-2.120);
    45 and 54 go on; at the limit 45E (-2.072) finishes the second. Banning before the softmax (CTranslate2)
    would give 45 -0.868 and 4E -1.273 instead, and [4, EOS] first.
    """
    assert _beam(REPEATER, no_repeat_ngram=1) == [([5, EOS_ID], ln(0.3, 0.6)), ([4, 5, EOS_ID], ln(0.7, 0.3, 0.6))]


def test_repetition_penalty_in_beam_search_by_hand():
    """Beam search penalises log-probabilities, as Hugging Face's: after [4], 4's ln .5 * 2 = -1.386, so 44 is
    -1.743: 45 (-1.561), 5E (-1.715, finished), 44 (-1.743), 4E; 45 and 44 go on; 45E (-2.072) finishes the second.
    On the logits (then renormalised) 45 and 44 would lead and [4, 5, EOS] be first.
    """
    expected = [([5, EOS_ID], ln(0.3, 0.6)), ([4, 5, EOS_ID], ln(0.7, 0.3, 0.6))]  # EOS, 5 and 4 only once each
    assert _beam(REPEATER, repetition_penalty=2.0) == expected


def test_defaults_leave_the_searches_as_they_were():
    model = ScriptedTranslator(REPEATER)
    plain = greedy(model, SRC, SearchSettings(max_len_a=0.0, max_len_b=3, use_cache=False))
    assert _greedy(REPEATER, no_repeat_ngram=0, repetition_penalty=1.0, min_new_tokens=0) == plain[0].tokens
    assert _beam(REPEATER, no_repeat_ngram=0, repetition_penalty=1.0) == _beam(REPEATER)


# Language models: generate


def _generate(prompt, table=REPEATER, new=3, **kw) -> list[int]:
    out = generate(
        ScriptedLM(table),
        torch.tensor([prompt]),
        SearchSettings(max_new_tokens=new, eos_id=EOS_ID, use_cache=False, **kw),
    )
    return out[0, len(prompt) :].tolist()


def test_generate_by_hand():
    assert _generate([EOS_ID, 4]) == [4, 4, 4]
    assert _generate([EOS_ID, 4], no_repeat_ngram=2) == [4, 5, EOS_ID]  # 4; then (4, 4) is there: 5; then EOS
    assert _generate([4], no_repeat_ngram=1, new=2) == [5, EOS_ID]  # over prompt + generated: the prompt's 4
    # the penalty on the logits, prompt included: after [EOS, 4], 4: 9.307 / 1.1 = 8.461, 5: 8.796, EOS (in the
    # prompt): 8.391 / 1.1 = 7.628 -> 5; after 5, EOS: 9.489 / 1.1 = 8.627 beats 4's 9.084 / 1.1 = 8.258: the end
    assert _generate([EOS_ID, 4], repetition_penalty=1.1) == [5, EOS_ID]
    # 5 in the prompt too: 5's 8.796 / 1.1 = 7.996 < 4's 8.461: 4 every time
    assert _generate([EOS_ID, 5, 4], repetition_penalty=1.1) == [4, 4, 4]


def test_min_new_tokens_in_generate_by_hand():
    assert _generate([EOS_ID, 5]) == [EOS_ID]  # EOS (0.6) at once
    assert _generate([EOS_ID, 5], min_new_tokens=1) == [4, 4, 4]  # 4 (0.4), then 4 (0.5) ...
    assert _generate([EOS_ID, 6], table=SHORT, min_new_tokens=2, new=4) == [7, 4, EOS_ID]  # EOS from the 3rd on


def test_sampling_never_draws_a_banned_token(device):
    lm = tiny_lm("rope").to(device)
    prompt = torch.tensor([[EOS_ID, 7, 8]], device=device)
    for seed in range(5):
        settings = SearchSettings(max_new_tokens=30, temperature=1.5, seed=seed, no_repeat_ngram=1)
        out = generate(lm, prompt, settings)[0].tolist()
        assert len(set(out)) == len(out)  # no token twice, the prompt's included
        plain = generate(lm, prompt, SearchSettings(max_new_tokens=30, temperature=1.5, seed=seed))
        assert len(set(plain[0].tolist())) < len(out)  # without the rule, tokens do repeat


def test_sampling_draws_from_the_penalised_logits():
    """Hugging Face's order: the penalty on the logits, then the temperature: p(4) after [4] with penalty 2 and
    temperature 1: softmax over 4: 9.307 / 2 = 4.653, 5: 8.796, EOS: 8.391."""
    lm = ScriptedLM(REPEATER)
    draws = generate(
        lm,
        torch.tensor([[4]] * 2000),
        SearchSettings(max_new_tokens=1, temperature=1.0, seed=0, repetition_penalty=2.0, use_cache=False),
    )[:, 1]
    logits = torch.tensor([9.307 / 2, 8.796, 8.391])
    expected = (logits.softmax(0) * 2000).tolist()
    counts = [int((draws == t).sum()) for t in (4, 5, EOS_ID)]
    assert counts == pytest.approx(expected, abs=100)
    assert counts[0] < 60  # unpenalised, 4 would take half


# The static path equals the dynamic one, the controls included


CONTROLS = [
    {"no_repeat_ngram": 2},
    {"no_repeat_ngram": 1, "repetition_penalty": 0.7},
    {"repetition_penalty": 1.8, "min_new_tokens": 5},
    {"no_repeat_ngram": 3, "repetition_penalty": 1.3, "min_new_tokens": 29},  # past every limit: the limit wins
]


@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_static_searches_apply_the_controls_as_the_dynamic_ones(device, controls):
    model = tiny_translator(device, share_all_embeddings=True, norm_placement="pre")
    torch.manual_seed(1)
    src = torch.randint(4, 24, (5, 7))
    src[1, 5:] = 0
    src[3, 3:] = 0
    src = src.to(device)
    want = greedy(model, src, SearchSettings(max_len_b=12, **controls))
    got = static_greedy(model, src, SearchSettings(max_len_b=12, **controls))
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
    assert [h.tokens for h in greedy(model, src, SearchSettings(max_len_b=12, use_cache=False, **controls))] == [
        h.tokens for h in want
    ]
    assert all(math.isfinite(h.score) for h in want)
    assert [h.tokens for h in want] != [
        h.tokens for h in greedy(model, src, SearchSettings(max_len_b=12))
    ]  # the controls acted
    beams = beam_search(model, src, SearchSettings(beam=4, nbest=2, max_len_b=12, **controls))
    static = static_beam_search(model, src, SearchSettings(beam=4, nbest=2, max_len_b=12, **controls))
    assert [[h.tokens for h in hyps] for hyps in static] == [[h.tokens for h in hyps] for hyps in beams]
    for got, wanted in zip(static, beams, strict=True):
        assert [h.score for h in got] == pytest.approx([h.score for h in wanted], abs=1e-4)
    assert [[h.tokens for h in hyps] for hyps in beams] != [
        [h.tokens for h in hyps] for hyps in beam_search(model, src, SearchSettings(beam=4, nbest=2, max_len_b=12))
    ]
    if "no_repeat_ngram" in controls:
        n = controls["no_repeat_ngram"]
        for h in [*want, *(h for hyps in beams for h in hyps)]:
            seq = [BOS_ID, *h.tokens]
            grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
            assert len(grams) == len(set(grams))


def test_a_static_session_without_controls_is_not_reused_with_them(device):
    """The controls are part of a static session's captured step: the same shape with them is another session."""
    model = tiny_translator(device, share_all_embeddings=True, norm_placement="pre")
    src = torch.randint(4, 24, (2, 6), generator=torch.Generator().manual_seed(3)).to(device)
    plain = static_greedy(model, src, SearchSettings(max_len_b=12))
    ruled = static_greedy(model, src, SearchSettings(max_len_b=12, no_repeat_ngram=1))
    assert [h.tokens for h in ruled] == [
        h.tokens for h in greedy(model, src, SearchSettings(max_len_b=12, no_repeat_ngram=1))
    ]
    assert [h.tokens for h in ruled] != [h.tokens for h in plain]
    assert [h.tokens for h in static_greedy(model, src, SearchSettings(max_len_b=12))] == [h.tokens for h in plain]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_generate_applies_the_controls_as_generate(device, temperature):
    lm = tiny_lm("rope").to(device)
    start = torch.randint(4, 50, (2, 3), generator=torch.Generator().manual_seed(2)).to(device)
    # what the model would write next is in the prompt: the controls act on it
    prompt = generate(lm, start, SearchSettings(max_new_tokens=5))
    for controls in ({"no_repeat_ngram": 2}, {"repetition_penalty": 1.5, "min_new_tokens": 8}):
        kw = dict(eos_id=EOS_ID, temperature=temperature, **controls)
        want = generate(lm, prompt, SearchSettings(max_new_tokens=16, seed=0, **kw))
        got = static_generate(lm, prompt, SearchSettings(max_new_tokens=16, seed=0, **kw))
        assert torch.equal(got, want)
        plain = generate(lm, prompt, SearchSettings(max_new_tokens=16, seed=0, eos_id=EOS_ID, temperature=temperature))
        assert not torch.equal(plain, want)


# decode.samples


@pytest.fixture(scope="module")
def lm40(tokenizer_dir):
    torch.manual_seed(0)
    model = build_model("lm", vocab_size=40, d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0, max_len=64)
    return model.eval(), Tokenizer(tokenizer_dir / "spm.model")


def _stream(lm40, **decode):
    model, tokenizer = lm40
    written: list[str] = []
    cfg = DecodeConfig(**{"max_new_tokens": 12, "static": "never", **decode})
    shown = stream_generation(model, tokenizer, "the house", cfg, written.append, served=64)
    return shown, written


def test_samples_are_n_whole_continuations_reproducible_and_different(lm40):
    shown, written = _stream(lm40, samples=3, temperature=1.0, seed=5)
    assert written == [shown]  # written once, whole
    texts = shown.split(SAMPLE_SEPARATOR)
    assert len(texts) == 3 and len(set(texts)) == 3  # three different samples
    assert all(text.startswith("the house") for text in texts)  # each the prompt continued
    assert _stream(lm40, samples=3, temperature=1.0, seed=5)[0] == shown  # decode.seed: the same samples
    assert _stream(lm40, samples=3, temperature=1.0, seed=6)[0] != shown
    one, pieces = _stream(lm40, temperature=1.0, seed=5)  # samples 1: streamed piece by piece, as before
    assert len(pieces) > 2 and "".join(pieces) == one and SAMPLE_SEPARATOR not in one


def test_samples_are_generates_rows(lm40):
    model, tokenizer = lm40
    shown, _ = _stream(lm40, samples=2, temperature=0.9, top_p=0.9, seed=1, no_repeat_ngram=2)
    ids = [EOS_ID, *tokenizer.encode(["the house"])[0]]
    settings = SearchSettings(
        max_new_tokens=12, temperature=0.9, top_p=0.9, eos_id=EOS_ID, samples=2, seed=1, no_repeat_ngram=2
    )
    rows = generate(model, torch.tensor([ids]), settings)
    texts = []
    for row in rows.tolist():
        new = row[len(ids) :]
        texts.append(tokenizer.decode(ids + (new[: new.index(EOS_ID)] if EOS_ID in new else new)))
    assert shown == SAMPLE_SEPARATOR.join(texts)


@pytest.mark.parametrize(
    "decode, named", [({}, "decode.temperature 0.0"), ({"temperature": 0.8, "top_k": 1}, "top_k 1")]
)
def test_samples_with_greedy_decoding_are_refused_in_one_line(lm40, decode, named):
    with pytest.raises(ConfigError) as info:
        _stream(lm40, samples=4, **decode)
    message = str(info.value)
    assert "\n" not in message and "decode.samples 4" in message and named in message


def test_generate_with_samples_repeats_each_prompt_row():
    lm = tiny_lm("rope")
    prompt = torch.tensor([[EOS_ID, 5, 6], [EOS_ID, 7, 8]])
    out = generate(lm, prompt, SearchSettings(max_new_tokens=10, temperature=1.0, seed=0, samples=3))
    assert out.shape == (6, 13)
    assert torch.equal(out[:, :3], prompt.repeat_interleave(3, 0))
    assert len({tuple(r) for r in out[:3].tolist()}) == 3


# What refuses them, and what carries them


def test_ctranslate2_takes_the_controls_with_greedy_search_and_refuses_them_with_beam_search():
    check_controls(DecodeConfig(beam=1, min_len=3, no_repeat_ngram=2, repetition_penalty=1.2))
    check_controls(DecodeConfig(beam=4))
    for key, value in (("min_len", 3), ("no_repeat_ngram", 2), ("repetition_penalty", 1.2)):
        with pytest.raises(TformerError) as info:
            check_controls(DecodeConfig(beam=4, **{key: value}))
        assert f"decode.{key} {value}" in str(info.value) and "\n" not in str(info.value)


def _generation_config(kind: str, decode: dict):
    transformers = pytest.importorskip("transformers")
    from tformer_cli.export.hf_generation import generation_config

    tree = {"data": {"kind": "text" if kind == "lm" else "parallel"}, "model": {"kind": kind, "max_len": 64}}
    run = SimpleNamespace(kind=kind, config=config_from_dict({**tree, "decode": decode}, "test"))
    return generation_config(run, transformers)


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_the_hf_generation_config_carries_the_controls_when_set(kind):
    plain = _generation_config(kind, {}).to_diff_dict()
    assert not {"min_new_tokens", "no_repeat_ngram_size", "repetition_penalty"} & plain.keys()
    config = _generation_config(kind, {"min_len": 4, "no_repeat_ngram": 3, "repetition_penalty": 1.3})
    assert (config.min_new_tokens, config.no_repeat_ngram_size, config.repetition_penalty) == (4, 3, 1.3)


def test_the_hf_generation_config_carries_samples_and_refuses_them_greedy():
    config = _generation_config("lm", {"samples": 3, "temperature": 0.8})
    assert config.num_return_sequences == 3 and config.do_sample
    with pytest.raises(ConfigError, match="decode.samples 3"):
        _generation_config("lm", {"samples": 3})


def test_the_ctranslate2_readme_carries_the_controls_when_set():
    from tformer_cli.export.ctranslate2_card import snippet

    plain = "\n".join(snippet(DecodeConfig(beam=1), 64))
    assert "min_decoding_length=0," in plain and "no_repeat_ngram_size" not in plain
    assert "repetition_penalty" not in plain
    code = "\n".join(snippet(DecodeConfig(beam=1, min_len=4, no_repeat_ngram=3, repetition_penalty=1.3), 64))
    assert "min_decoding_length=min(4, limit, 64)," in code
    assert "no_repeat_ngram_size=3," in code and "repetition_penalty=1.3," in code
