"""The searches' fast caches give the logits of the full recompute and of the model's reference cache."""

import pytest
import torch
from tiny_models import POSITIONS
from tiny_models import tiny_lm as _lm
from tiny_models import tiny_seq2seq as _seq2seq

from tformer_cli.decoding.cache import BufferPool, PooledKVCache, pool_for, search_cache
from tformer_cli.model import build_model


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_pooled_cache_gives_the_reference_caches_logits(pos, n_kv_heads, device):
    """A prompt with left padding, then one token at a time, rows reordered midway."""
    model = _lm(pos, n_kv_heads=n_kv_heads).to(device)
    tokens = torch.randint(1, 50, (3, 12), device=device)
    tokens[1, :2] = 0  # a left-padded prompt
    reference = model.new_cache()
    with search_cache(model, 12) as fast:
        assert isinstance(fast.layers[0].self_kv, PooledKVCache)
        for cache in (reference, fast):
            model(tokens[:, :5], cache=cache)
        for t in range(5, 12):
            if t == 8:
                for cache in (reference, fast):
                    cache.reorder(torch.tensor([2, 1, 1], device=device))
                tokens = tokens[[2, 1, 1]]
            want, got = (model(tokens[:, t : t + 1], cache=cache) for cache in (reference, fast))
            assert torch.allclose(got, want, atol=1e-6), f"step {t}"
    full = model(tokens)  # and both agree with the full recompute (padding masked)
    assert torch.allclose(got[:, 0], full[:, -1], atol=1e-5)


def test_a_cache_refuses_more_steps_than_it_holds():
    model = _lm("rope")
    with search_cache(model, 4) as cache:
        model(torch.randint(1, 50, (1, 4)), cache=cache)
        with pytest.raises(ValueError, match="holds 4 steps"):
            model(torch.randint(1, 50, (1, 1)), cache=cache)


def test_search_cache_hands_its_buffers_back_even_when_decoding_fails(device):
    model = _lm("rope").to(device)
    pool = pool_for(model)
    pool._free.clear()
    with pytest.raises(RuntimeError, match="boom"), search_cache(model, 6) as cache:
        model(torch.randint(1, 50, (2, 3), device=device), cache=cache)
        raise RuntimeError("boom")
    assert len(pool._free) == 2 * len(model.decoder.blocks)
    assert {buf.device for buf in pool._free} == {model.decoder.embedding.weight.device}


def test_the_lstm_decodes_with_its_recurrent_state(device):
    torch.manual_seed(0)
    model = build_model("lstm", vocab_size=50, d_model=16, n_layers=1, dropout=0.0).eval().to(device)
    tokens = torch.randint(1, 50, (2, 6), device=device)
    with search_cache(model, 6) as state:
        steps = torch.cat([model(tokens[:, t : t + 1], cache=state) for t in range(6)], dim=1)
    assert torch.allclose(steps, model(tokens), atol=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_beam_cache_follows_hypotheses_like_full_recompute(pos, n_kv_heads, device):
    """Beam search's in-place cache: random parents each step, one sentence leaving midway."""
    model = _seq2seq(pos, n_kv_heads=n_kv_heads).to(device)
    n, k, steps = 3, 3, 7
    gen = torch.Generator().manual_seed(0)  # the CPU's: the same draws for every device
    src = torch.randint(1, 50, (n, 6), generator=gen)
    src[1, 4:] = 0  # padding in one source
    memory, memory_mask = model.encode(src.to(device))
    with search_cache(model, steps, beam=k) as cache:
        _follow_random_parents(model, cache, memory, memory_mask, n, k, steps, gen)
        assert cache.layers[0].cross_kv.memory[0].size(0) == 2  # the encoder's keys: one per remaining sentence


def _follow_random_parents(model, cache, memory, memory_mask, n, k, steps, gen):
    """Decode `steps` steps with `cache` (rows on the model's device), checking each against the full recompute."""
    device = memory.device
    sentences = torch.arange(n, device=device)  # which source each group of k rows belongs to
    history = torch.randint(1, 50, (n * k, 1), generator=gen).to(device)  # every row's prefix so far
    for t in range(steps):
        assert memory_mask is not None
        step = model.decode(history[:, -1:], memory[sentences], memory_mask[sentences], cache)
        rows = sentences.repeat_interleave(k)
        full = model.decode(history, memory[rows], memory_mask[rows])
        assert torch.allclose(step[:, 0], full[:, -1], atol=1e-5), f"step {t}"
        keep = torch.arange(sentences.numel(), device=device)
        if t == 3:
            keep = torch.tensor([0, 2], device=device)  # sentence 1 finished: its rows leave the batch
        parents = torch.randint(0, k, (keep.numel(), k), generator=gen).to(device)  # parents within each sentence
        index = (keep[:, None] * k + parents).flatten()
        new_tokens = torch.randint(1, 50, (index.numel(), 1), generator=gen).to(device)
        history = torch.cat([history[index], new_tokens], dim=1)
        sentences = sentences[keep]
        cache.reorder(index)


def test_buffer_pool_hands_out_released_buffers_only():
    pool = BufferPool(capacity=2)
    like = torch.zeros(1)
    a = pool.take((4, 5), like)
    b = pool.take((4, 5), like)
    assert a.data_ptr() != b.data_ptr()  # both live: never shared
    pool.give(a[:2])  # a view: its whole base buffer comes back
    c = pool.take((3, 6), like)  # 18 <= 20 elements: the released buffer
    assert c.data_ptr() == a.data_ptr() and c.shape == (3, 6)
    assert pool.take((3, 6), like).data_ptr() not in (a.data_ptr(), b.data_ptr())  # nothing free: new
    pool.give(b)
    assert pool.take((2,), torch.zeros(1, dtype=torch.float64)).dtype == torch.float64  # wrong dtype: new
    assert pool.take((30,), like).data_ptr() != b.data_ptr() and not pool._free  # too small: dropped
    for n in (3, 9, 5, 7):
        pool.give(torch.empty(n))
    assert [t.numel() for t in pool._free] == [9, 7]  # capacity 2: the largest are kept
    assert pool.take((6,), like).numel() == 6 and [t.numel() for t in pool._free] == [9]  # best fit: the 7


@pytest.mark.cuda
def test_buffer_pool_hands_a_buffer_only_to_its_own_device():
    pool = BufferPool(capacity=2)
    on_gpu = torch.empty(20, device="cuda")
    pool.give(on_gpu)
    assert pool.take((4, 5), torch.zeros(1)).device.type == "cpu"  # another device: a new buffer
    assert [b.data_ptr() for b in pool._free] == [on_gpu.data_ptr()]  # the GPU's waits for the GPU
    assert pool.take((4, 5), torch.zeros(1, device="cuda")).data_ptr() == on_gpu.data_ptr()
