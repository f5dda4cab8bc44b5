"""Seq2seq decoding: beam 1 = greedy, cached = uncached, length penalty, n-best order, limits (on each device)."""

import pytest
import torch
from meta_device import off_the_cpu
from tiny_models import padded_sources, tiny_translator

from tformer_cli.decoding.cache import pool_for
from tformer_cli.decoding.rules import length_penalty
from tformer_cli.decoding.search import beam_search, greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.tokenizer import EOS_ID


@pytest.fixture(scope="module")
def model(device):
    return tiny_translator(device, share_all_embeddings=True, norm_placement="pre")


@pytest.fixture
def src(device):
    return padded_sources(device)


def test_beam_size_one_equals_greedy(model, src):
    g = greedy(model, src, SearchSettings(max_len_a=1.0, max_len_b=5))
    bs = beam_search(model, src, SearchSettings(beam=1, alpha=0.0, max_len_a=1.0, max_len_b=5))
    assert [h.tokens for h in g] == [hyps[0].tokens for hyps in bs]
    assert [h.logprob for h in g] == pytest.approx([hyps[0].logprob for hyps in bs], abs=1e-4)


def test_cached_and_uncached_beam_search_agree(model, src):
    cached = beam_search(model, src, SearchSettings(beam=4, nbest=4, max_len_b=6))
    uncached = beam_search(model, src, SearchSettings(beam=4, nbest=4, max_len_b=6, use_cache=False))
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]
    g_cached, g_uncached = (
        greedy(model, src, SearchSettings(max_len_b=6)),
        greedy(model, src, SearchSettings(max_len_b=6, use_cache=False)),
    )
    assert [h.tokens for h in g_cached] == [h.tokens for h in g_uncached]
    assert len({len(h.tokens) for h in g_cached}) > 1  # sentences finished and left the batch midway
    assert [h.score for h in g_cached] == pytest.approx([h.score for h in g_uncached], abs=1e-4)


@pytest.mark.parametrize("pos, n_kv_heads", [("rope", None), ("alibi", 2), ("learned", 1)])
def test_cached_and_uncached_beam_search_agree_for_every_position_scheme(src, pos, n_kv_heads):
    # sentences finish at different steps and leave the batch
    m = tiny_translator(src.device, n_kv_heads=n_kv_heads, pos=pos)
    cached = beam_search(m, src, SearchSettings(beam=3, nbest=3, max_len_b=6))
    uncached = beam_search(m, src, SearchSettings(beam=3, nbest=3, max_len_b=6, use_cache=False))
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]
    assert len({len(hyps[0].tokens) for hyps in cached}) > 1  # the batch did shrink midway


def _poison(pool):
    with torch.inference_mode():  # decoding made them inference tensors
        for buf in pool._free:
            buf.fill_(float("nan"))


def test_reused_cache_buffers_leak_nothing_into_the_next_batch(src):
    """Released caches' buffers serve the next batch; poisoned with NaN, they change no hypothesis."""
    m = tiny_translator(src.device, pos="rope")
    uncached = beam_search(m, src, SearchSettings(beam=3, nbest=3, max_len_b=6, use_cache=False))
    g_uncached = greedy(m, src, SearchSettings(max_len_b=6, use_cache=False))
    beam_search(m, src, SearchSettings(beam=3, max_len_b=6))  # fills the pool
    pool = pool_for(m)
    assert len(pool._free) == 2 * len(m.decoder.blocks)  # keys and values of every layer came back
    for _ in range(2):  # the second time, the buffers were reused and handed back again
        _poison(pool)
        reused = beam_search(m, src, SearchSettings(beam=3, nbest=3, max_len_b=6))
        assert [[h.tokens for h in hyps] for hyps in reused] == [[h.tokens for h in hyps] for hyps in uncached]
        _poison(pool)
        assert [h.tokens for h in greedy(m, src, SearchSettings(max_len_b=6))] == [h.tokens for h in g_uncached]


def test_length_penalty_formula():
    assert length_penalty(7, 0.6) == pytest.approx(((5 + 7) / 6) ** 0.6)
    assert length_penalty(10, 0.0) == 1.0


def test_scores_are_length_penalised_logprobs_and_nbest_is_sorted(model, src):
    results = beam_search(model, src, SearchSettings(beam=4, alpha=0.6, nbest=4, max_len_b=6))
    for hyps in results:
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.tokens[-1] == EOS_ID
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens), 0.6))


def test_maximum_length_is_a_times_source_plus_b(model, src):
    for a, b in ((1.0, 2), (0.0, 3)):
        for hyps, s in zip(beam_search(model, src, SearchSettings(beam=3, max_len_a=a, max_len_b=b)), src, strict=True):
            assert len(hyps[0].tokens) <= int((s != 0).sum()) * a + b
        for hyp, s in zip(greedy(model, src, SearchSettings(max_len_a=a, max_len_b=b)), src, strict=True):
            assert len(hyp.tokens) <= int((s != 0).sum()) * a + b and hyp.tokens[-1] == EOS_ID


def test_beam_finds_at_least_the_greedy_logprob(model, src):
    g = greedy(model, src, SearchSettings(max_len_b=6))
    bs = beam_search(model, src, SearchSettings(beam=4, alpha=0.0, max_len_b=6))
    for greedy_hyp, hyps in zip(g, bs, strict=True):
        assert hyps[0].logprob >= greedy_hyp.logprob - 1e-4


def test_min_len_forbids_early_eos(model, src):
    for hyps in beam_search(model, src, SearchSettings(beam=3, max_len_a=0.0, max_len_b=6, min_new_tokens=5)):
        assert len(hyps[0].tokens) == 6
    assert all(
        len(h.tokens) == 6 for h in greedy(model, src, SearchSettings(max_len_a=0.0, max_len_b=6, min_new_tokens=5))
    )


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_searches_run_on_another_device_than_the_cpu(use_cache):
    """Every tensor they make is on the model's device: on the meta device, which refuses a CPU tensor mixed in as
    CUDA does, each search takes the CPU's course step by step (tests/unit/meta_device.py, `off_the_cpu`)."""
    model = tiny_translator("cpu", share_all_embeddings=True, norm_placement="pre")
    torch.manual_seed(1)
    src = torch.randint(4, 24, (5, 7))
    src[1, 5:] = 0
    src[3, 3:] = 0
    for search in (
        lambda m, s: [[h] for h in greedy(m, s, SearchSettings(max_len_b=8, use_cache=use_cache, min_new_tokens=1))],
        lambda m, s: beam_search(
            m, s, SearchSettings(beam=4, nbest=2, max_len_b=8, use_cache=use_cache, min_new_tokens=1)
        ),
    ):
        on_cpu, on_meta = off_the_cpu(search, model, src)
        assert [[h.tokens for h in hyps] for hyps in on_meta] == [[h.tokens for h in hyps] for hyps in on_cpu]
