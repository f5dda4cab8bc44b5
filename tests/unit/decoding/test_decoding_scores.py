"""Every decoding path gives the uncached forward's answers for every attention score: the plain and
the searches' caches step by step, greedy and beam search, sampling, and CPU-packed linears."""

import copy

import pytest
import torch
from tiny_models import padded_sources, tiny_lm, tiny_seq2seq

from tformer_cli.decoding.cache import search_cache
from tformer_cli.decoding.packed import pack_linears, packing_available
from tformer_cli.decoding.search import beam_search, generate, greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.run.load import cast_weights
from tformer_cli.tokenizer import EOS_ID

SCORES = ["scaled_dot", "dot", "general", "additive"]
# (score, pos, n_kv_heads): every score with absolute and ALiBi positions, RoPE where it is allowed
CASES = [(s, "sinusoidal", None) for s in SCORES] + [(s, "alibi", 2) for s in SCORES] + [("dot", "rope", None)]


def _with_random_scores(model):
    """Move the score parameters off their initialisation (general's W = I / sqrt(d_k) is the scaled dot's)."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".score." in name:
                p.add_(0.3 * torch.randn(p.shape, generator=gen).to(p.device))
    return model


@pytest.mark.parametrize("score, pos, n_kv_heads", CASES)
def test_lm_caches_step_by_step_give_the_full_forward(score, pos, n_kv_heads, device):
    """A left-padded prompt, then one token at a time, rows reordered midway: the plain cache and the
    searches' pooled cache both give the logits of the full recompute at every step."""
    model = _with_random_scores(tiny_lm(pos, n_kv_heads=n_kv_heads, attention_score=score).to(device))
    tokens = torch.randint(1, 50, (3, 12), device=device)
    tokens[1, :2] = 0  # a left-padded prompt
    full = model(tokens)  # all 12 steps at once, the future masked
    plain = model.new_cache()
    with search_cache(model, 12) as pooled:
        for cache in (plain, pooled):
            assert torch.allclose(model(tokens[:, :5], cache=cache), full[:, :5], atol=1e-5)
        for t in range(5, 12):
            if t == 8:
                for cache in (plain, pooled):
                    cache.reorder(torch.tensor([2, 1, 1], device=device))
                tokens, full = tokens[[2, 1, 1]], full[[2, 1, 1]]
            for cache in (plain, pooled):
                step = model(tokens[:, t : t + 1], cache=cache)[:, 0]
                assert torch.allclose(step, full[:, t], atol=1e-5), f"step {t}"


def _s2s(score, pos="sinusoidal", n_kv_heads=None, device="cpu"):
    model = _with_random_scores(tiny_seq2seq(pos, n_kv_heads=n_kv_heads, attention_score=score))
    with torch.no_grad():  # make EOS plausible so that hypotheses end at different lengths
        model.lm_head.weight[EOS_ID] *= 3.0
    return model.to(device)


@pytest.fixture
def src(device):
    return padded_sources(device, n=4, vocab_size=50)


@pytest.mark.parametrize("score, pos, n_kv_heads", CASES)
def test_cached_greedy_and_beam_search_give_the_uncached_answers(score, pos, n_kv_heads, src):
    model = _s2s(score, pos, n_kv_heads, src.device)
    cached = beam_search(model, src, SearchSettings(beam=3, nbest=3, max_len_b=6))
    uncached = beam_search(model, src, SearchSettings(beam=3, nbest=3, max_len_b=6, use_cache=False))
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]
    for got, want in zip(cached, uncached, strict=True):
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
    g_cached, g_uncached = (
        greedy(model, src, SearchSettings(max_len_b=6)),
        greedy(model, src, SearchSettings(max_len_b=6, use_cache=False)),
    )
    assert [h.tokens for h in g_cached] == [h.tokens for h in g_uncached]
    assert [h.score for h in g_cached] == pytest.approx([h.score for h in g_uncached], abs=1e-4)


@pytest.mark.parametrize("score", SCORES)
def test_beam_search_checks_itself_against_the_full_recompute(score):
    """The beam cache reads keys where they were written, a sentence's hypotheses querying together:
    decode a few steps by hand with random parents and compare each step with the full recompute."""
    model = _s2s(score)
    n, k = 3, 3
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(4, 50, (n, 6), generator=gen)
    src[1, 4:] = 0
    memory, memory_mask = model.encode(src)
    sentences = torch.arange(n)
    history = torch.randint(4, 50, (n * k, 1), generator=gen)
    with torch.no_grad(), search_cache(model, 6, beam=k) as cache:
        for t in range(6):
            step = model.decode(history[:, -1:], memory[sentences], memory_mask[sentences], cache)
            rows = sentences.repeat_interleave(k)
            full = model.decode(history, memory[rows], memory_mask[rows])
            assert torch.allclose(step[:, 0], full[:, -1], atol=1e-5), f"step {t}"
            keep = torch.tensor([0, 2]) if t == 2 else torch.arange(sentences.numel())  # sentence 1 ends
            parents = torch.randint(0, k, (keep.numel(), k), generator=gen)
            index = (keep[:, None] * k + parents).flatten()
            history = torch.cat([history[index], torch.randint(4, 50, (index.numel(), 1), generator=gen)], dim=1)
            sentences = sentences[keep]
            cache.reorder(index)


@pytest.mark.parametrize("score", SCORES)
def test_cached_generation_and_sampling_give_the_uncached_tokens(score, device):
    model = _with_random_scores(tiny_lm("alibi", attention_score=score).to(device))
    prompt = torch.randint(1, 50, (2, 5), device=device)
    assert torch.equal(
        generate(model, prompt, SearchSettings(max_new_tokens=10)),
        generate(model, prompt, SearchSettings(max_new_tokens=10, use_cache=False)),
    )
    sampled = [
        generate(
            model,
            prompt,
            SearchSettings(
                max_new_tokens=10,
                temperature=1.0,
                top_p=0.9,
                use_cache=cached,
                seed=3,
            ),
        )
        for cached in (True, False)
    ]
    assert torch.equal(*sampled)


@pytest.mark.skipif(not packing_available(), reason="oneDNN is not available: nothing is packed")
@pytest.mark.parametrize("score", SCORES)
def test_packed_linears_give_the_same_searches(score):
    model = _s2s(score)
    torch.manual_seed(1)
    src = torch.randint(4, 50, (6, 7))
    src[2, 4:] = 0
    packed = copy.deepcopy(model)
    assert pack_linears(packed) > 0
    got, want = (
        beam_search(packed, src, SearchSettings(beam=3, nbest=2, max_len_b=6)),
        beam_search(model, src, SearchSettings(beam=3, nbest=2, max_len_b=6, use_cache=False)),
    )
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps], abs=1e-4)
    assert [h.tokens for h in greedy(packed, src, SearchSettings(max_len_b=6))] == [
        h.tokens for h in greedy(model, src, SearchSettings(max_len_b=6, use_cache=False))
    ]


@pytest.mark.parametrize("score", SCORES)
def test_bf16_weights_decode_with_every_score(score):
    """decode.precision=bf16 casts the weights but not ALiBi's fp32 bias: the written-out path must not
    mix the two dtypes (the fused path casts the bias; the reference path had not)."""
    model = _with_random_scores(tiny_lm("alibi", attention_score=score))
    low = copy.deepcopy(model)
    cast_weights(low, torch.bfloat16)
    tokens = torch.randint(1, 50, (2, 8))
    with torch.no_grad():
        assert torch.allclose(low(tokens).float(), model(tokens), atol=0.1)
    assert generate(low, tokens[:, :5], SearchSettings(max_new_tokens=6)).shape == (2, 11)
