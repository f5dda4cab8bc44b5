"""Ensemble decoding (decoding/ensemble.py): the mean of the members' probabilities, through the searches' caches."""

import math

import pytest
import torch
from tiny_models import padded_sources, tiny_translator

from tformer_cli.decoding.api import translate_batch
from tformer_cli.decoding.ensemble import Ensemble
from tformer_cli.decoding.search import beam_search, greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.model import build_model
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID


def _other(device, seed: int, d_model: int = 32):
    """A member unlike tiny_translator's: its own random weights (seed `seed`) and width `d_model`, EOS likely
    enough that hypotheses end at different lengths."""
    torch.manual_seed(seed)
    m = build_model("seq2seq", vocab_size=24, d_model=d_model, n_heads=4, n_layers=2, d_ff=2 * d_model, dropout=0.0)
    with torch.no_grad():
        m.lm_head.weight[EOS_ID] *= 2.0
    return m.eval().to(device)


@pytest.fixture(scope="module")
def members(device):
    return [tiny_translator(device), _other(device, 1), _other(device, 2, d_model=48)]


@pytest.fixture
def src(device):
    return padded_sources(device, seed=3)


def test_a_step_is_the_log_of_the_members_mean_probability(members, src):
    tgt = torch.cat([torch.full((5, 1), BOS_ID, device=src.device), src[:, :4].clamp_min(4)], dim=1)
    with torch.inference_mode():
        memory, mask = Ensemble(members).encode(src)
        got = Ensemble(members).decode(tgt, memory, mask)
        mean = torch.stack([m(src, tgt).float().softmax(-1) for m in members]).mean(0)
    torch.testing.assert_close(got, mean.log(), atol=1e-5, rtol=1e-5)
    assert got.exp().sum(-1).sub(1).abs().max() < 1e-5  # a distribution


def test_the_cached_searches_equal_the_recomputing_reference(members, src):
    # the members' caches follow the same rows as sentences finish and leave the batch, and as beams reorder
    ens = Ensemble(members)
    cached = beam_search(ens, src, SearchSettings(beam=3, nbest=3, max_len_b=6))
    uncached = beam_search(ens, src, SearchSettings(beam=3, nbest=3, max_len_b=6, use_cache=False))
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]
    assert [h.score for hyps in cached for h in hyps] == pytest.approx(
        [h.score for hyps in uncached for h in hyps], abs=1e-4
    )
    assert len({len(hyps[0].tokens) for hyps in cached}) > 1  # the batch did shrink midway
    g_cached, g_uncached = (
        greedy(ens, src, SearchSettings(max_len_b=6)),
        greedy(ens, src, SearchSettings(max_len_b=6, use_cache=False)),
    )
    assert [h.tokens for h in g_cached] == [h.tokens for h in g_uncached]
    assert len({len(h.tokens) for h in g_cached}) > 1


def test_greedy_follows_the_mixture_not_one_member(members, src):
    """Greedy by hand over the mean of the members' probabilities, recomputing every prefix."""
    got = greedy(Ensemble(members), src, SearchSettings(max_len_a=0.0, max_len_b=6))
    for row, hyp in zip(src, got, strict=True):
        tokens, logprob = [BOS_ID], 0.0
        with torch.inference_mode():
            while len(tokens) <= 6:
                prefix = torch.tensor([tokens], device=src.device)
                p = torch.stack([m(row[None], prefix)[0, -1].float().softmax(-1) for m in members]).mean(0)
                p[[PAD_ID, BOS_ID]] = 0.0  # never chosen (decoding/rules.py)
                token = EOS_ID if len(tokens) == 6 else int(p.argmax())
                tokens.append(token)
                logprob += math.log(float(p[token]))
                if token == EOS_ID:
                    break
        assert hyp.tokens == tokens[1:]
        assert hyp.logprob == pytest.approx(logprob, abs=1e-4)
    alone = [greedy(m, src, SearchSettings(max_len_a=0.0, max_len_b=6)) for m in members]
    assert all([h.tokens for h in got] != [h.tokens for h in one] for one in alone)  # the mixture is its own


def test_a_model_twice_translates_as_the_model(src):
    m = tiny_translator(src.device)
    settings = SearchSettings(beam=4, nbest=2, max_len_b=6)
    alone, twice = translate_batch(m, src, settings), translate_batch(Ensemble([m, m]), src, settings)
    assert [[h.tokens for h in hyps] for hyps in alone] == [[h.tokens for h in hyps] for hyps in twice]
    assert [h.score for hyps in alone for h in hyps] == pytest.approx(
        [h.score for hyps in twice for h in hyps], abs=1e-4
    )


def test_an_ensemble_decodes_on_the_dynamic_path_where_the_static_one_is_asked(members, src):
    settings = SearchSettings(beam=3, max_len_b=6, static="always")
    want = beam_search(Ensemble(members), src, SearchSettings(beam=3, max_len_b=6, static="never"))
    assert translate_batch(Ensemble(members), src, settings) == want


def test_one_member_is_no_ensemble(device):
    with pytest.raises(ValueError, match="at least 2 members"):
        Ensemble([tiny_translator(device)])
