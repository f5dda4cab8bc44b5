"""The static caches keep every member of the model's cache interface with its base's meaning: nothing raises,
rows move in place (the buffers keep their addresses), positions come from the device counter."""

import torch

from tformer_cli.decoding.static_cache import (
    Cursor,
    StaticBeamCache,
    StaticBeamKVCache,
    StaticDecodeCache,
    StaticKVCache,
    StaticMemoryKV,
)
from tformer_cli.model.cache import DecodeCache, KVCache, LayerCache

LIKE = torch.zeros(())


def test_static_caches_override_no_base_member_to_raise():
    cursor = Cursor(torch.device("cpu"))
    kv = StaticBeamKVCache(cursor, (2, 1, 4, 3, 2), LIKE)
    memory = StaticMemoryKV((2, 1, 5, 2), LIKE, beam=3)
    for cache in (
        StaticDecodeCache([LayerCache(StaticKVCache(cursor, (2, 1, 4, 2), LIKE), KVCache())], cursor, 2, 4),
        StaticBeamCache([LayerCache(kv, memory)], cursor, 2, 3, 4),
    ):
        for name in vars(DecodeCache):
            if isinstance(getattr(DecodeCache, name), property):
                getattr(cache, name)  # a property of the base reads on the subclass too
        assert cache.n_keys == 4


def test_record_gives_the_positions_of_the_cursor_and_moves_it():
    cursor = Cursor(torch.device("cpu"))
    cache = StaticDecodeCache([LayerCache(StaticKVCache(cursor, (2, 1, 8, 2), LIKE), KVCache())], cursor, 2, 8)
    positions, mask, _ = cache.record(torch.ones(2, 3, dtype=torch.bool), causal=True)
    assert torch.equal(positions, torch.arange(3)) and int(cursor.pos) == 3
    assert mask is not None and mask.shape == (2, 1, 3, 8)
    positions, _, _ = cache.record(torch.ones(2, 1, dtype=torch.bool), causal=True)
    assert torch.equal(positions, torch.tensor([3]))


def test_beam_and_memory_caches_reorder_sentences_in_place():
    cursor = Cursor(torch.device("cpu"))
    kv = StaticBeamKVCache(cursor, (2, 1, 4, 3, 2), LIKE)
    kv.k.copy_(torch.arange(2.0).view(2, 1, 1, 1, 1).expand_as(kv.k))
    address = kv.k.data_ptr()
    kv.reorder(torch.tensor([1, 0]))
    assert kv.k.data_ptr() == address and torch.equal(kv.k[:, 0, 0, 0, 0], torch.tensor([1.0, 0.0]))

    memory = StaticMemoryKV((2, 1, 5, 2), LIKE, beam=3)
    k = torch.arange(2.0).view(2, 1, 1, 1).expand(2, 1, 5, 2).contiguous()
    memory.keep_memory(k, -k)
    addresses = [b.data_ptr() for b in memory.buffers]
    memory.reorder(torch.tensor([1, 0]))
    assert memory.memory is not None
    assert [t.data_ptr() for t in memory.memory] == addresses
    assert torch.equal(memory.memory[0][:, 0, 0, 0], torch.tensor([1.0, 0.0]))
    assert torch.equal(memory.memory[1][:, 0, 0, 0], torch.tensor([-1.0, 0.0]))
