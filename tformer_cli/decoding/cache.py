"""The searches' key/value caches: preallocated, reused between batches, and beam search's shared one.

They implement the interface of `tformer_cli/model/cache.py` (the model calls nothing else) and are
tested against its plain reference caches (tests/unit/decoding/test_cache.py): same logits.

- `PooledKVCache`: self-attention keys and values written into a buffer preallocated to the longest
  output, taken from the model's `BufferPool` and handed back when the search ends, so the next batch
  reuses it instead of paying a page fault per 4 KB page of fresh memory (docs/benchmarks.md).
- `BeamKVCache` / `BeamDecodeCache`: beam search's cache, which never moves keys (below).

`search_cache(model, max_steps, beam)` makes the right one for a model and gives its buffers back.

Shape legend: B sentences, K beam, H_kv key/value heads, T steps, S source length, d_head head width.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import cast

import torch
from torch import Tensor, nn

from tformer_cli.decoding.ensemble import Ensemble, EnsembleCache
from tformer_cli.model.cache import DecodeCache, KVCache, LayerCache
from tformer_cli.model.lm import LanguageModel
from tformer_cli.model.lstm import LSTMLanguageModel, LSTMState
from tformer_cli.model.seq2seq import Seq2Seq


class BufferPool:
    """Key/value buffers handed back by finished caches, for the next batch to reuse.

    A buffer returns here only when the search that held it ends (`search_cache`), so two live
    caches never share one. Holds at most `capacity` buffers, the largest (one cache's worth: then
    decoding holds at most twice the memory of its largest cache).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[Tensor] = []  # flat and contiguous, largest first

    def take(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """An uninitialised tensor of `shape`, dtype and device of `like`: the smallest free buffer
        that is large enough, or a new one."""
        numel = math.prod(shape)
        fitting = [
            i
            for i, buf in enumerate(self._free)
            if buf.dtype == like.dtype and buf.device == like.device and buf.numel() >= numel
        ]
        if not fitting:  # the free buffers of this kind are all too small: let them go
            self._free = [b for b in self._free if b.dtype != like.dtype or b.device != like.device]
            return like.new_empty(shape)
        return self._free.pop(fitting[-1])[:numel].view(shape)  # largest first: the last fit is the smallest

    def give(self, tensor: Tensor) -> None:
        """Hand back a tensor that `take` returned (or a view of it); nobody may use it afterwards."""
        base = tensor if tensor._base is None else tensor._base
        if base.is_contiguous():
            self._free.append(base.view(-1))
            self._free.sort(key=Tensor.numel, reverse=True)
            del self._free[self.capacity :]


# Each model's buffer pool, kept between searches (weakly: it goes with its model). Used only by `pool_for`.
_pools: weakref.WeakKeyDictionary[nn.Module, BufferPool] = weakref.WeakKeyDictionary()


def pool_for(model: Seq2Seq | LanguageModel) -> BufferPool:
    """The buffer pool of `model`'s searches: one released cache's keys and values per layer; made on first use
    and kept with the model in `_pools`."""
    if model not in _pools:
        _pools[model] = BufferPool(capacity=2 * len(model.decoder.blocks))
    return _pools[model]


class PooledKVCache(KVCache):
    """Self-attention keys and values in buffers preallocated to `max_steps` steps, from `pool`.

    `update` writes the new steps in place; `reorder` copies only the filled steps, in place when the
    batch keeps its size. `release` hands the buffers back; the cache must not be used afterwards.
    """

    def __init__(self, max_steps: int, pool: BufferPool) -> None:
        super().__init__()
        self.max_steps, self.pool, self.length = max_steps, pool, 0
        self._owned: list[Tensor] = []  # the buffers taken from the pool

    def _allocate(self, shape: tuple[int, ...], like: Tensor) -> None:
        self.k, self.v = self.pool.take(shape, like), self.pool.take(shape, like)
        self._owned = [self.k, self.v]

    def release(self) -> None:
        """The search is over: the buffers go back to the pool, and this cache holds nothing."""
        for buf in self._owned:
            self.pool.give(buf)
        self._owned, self.k, self.v, self.length = [], None, None, 0

    def _check_room(self, t_new: int) -> None:
        if self.length + t_new > self.max_steps:
            raise ValueError(f"KV cache holds {self.max_steps} steps; asked for {self.length + t_new}")

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add `k`, `v` of shape (B, H_kv, T_new, d_head); return all keys and values so far."""
        t_new = k.size(2)
        if self.k is None:
            self._allocate((k.size(0), k.size(1), self.max_steps, k.size(3)), k)
        assert self.k is not None and self.v is not None  # allocated on the first update
        self._check_room(t_new)
        self.k[:, :, self.length : self.length + t_new] = k
        self.v[:, :, self.length : self.length + t_new] = v
        self.length += t_new
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index`: only the filled steps are copied, in place."""
        if self.k is None or self.v is None:
            return
        filled_k = self.k[:, :, : self.length].index_select(0, index)
        filled_v = self.v[:, :, : self.length].index_select(0, index)
        self.k, self.v = self.k[: index.numel()], self.v[: index.numel()]
        self.k[:, :, : self.length] = filled_k
        self.v[:, :, : self.length] = filled_v


def _fold(q: Tensor, beam: int) -> Tensor:
    """(B*K, H, 1, d_head) -> (B, H, K, d_head): a sentence's hypotheses become its queries."""
    return q.reshape(-1, beam, q.size(1), q.size(3)).transpose(1, 2)


def _unfold(out: Tensor) -> Tensor:
    """(B, H, K, d_head) -> (B*K, H, 1, d_head)."""
    return out.transpose(1, 2).reshape(-1, out.size(1), 1, out.size(3))


class BeamKVCache(PooledKVCache):
    """Self-attention keys and values for beam search, written in place and never moved.

    A plain cache for beam search copies every layer's keys and values at every step to follow the
    surviving hypotheses (`KVCache.reorder`); at beam 4 x 32 sentences that copying moves more memory
    than the weights do. Here the K hypotheses of a sentence share one buffer: step s of slot j holds
    the keys of whichever hypothesis sat in beam slot j at step s, and nothing moves afterwards. The
    K queries of a sentence attend together (`relayout_queries`) to all K slots' keys of all steps, each masked
    to its own ancestors (`BeamDecodeCache.record`): the same attention, read where it
    was written.

    Shapes: buffers (B, H_kv, max_steps, K, d_head); `update` and `relayout_queries` take the decoder's
    (B*K, ., 1, d_head) and `relayout_outputs` returns it. The buffers' rows are sentences:
    `reorder(sentences)` is how finished sentences leave the batch.
    """

    def __init__(self, max_steps: int, beam: int, pool: BufferPool) -> None:
        super().__init__(max_steps, pool)
        self.beam = beam

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write one step of (B*K, H_kv, 1, d_head); return all keys, values as (B, H_kv, t*K, d_head)."""
        if k.size(2) != 1:
            raise ValueError(f"beam search decodes one step at a time, got {k.size(2)}")
        n, h, d = k.size(0) // self.beam, k.size(1), k.size(3)
        if self.k is None:
            self._allocate((n, h, self.max_steps, self.beam, d), k)
        assert self.k is not None and self.v is not None  # allocated on the first update
        self._check_room(1)
        self.k[:, :, self.length] = k.view(n, self.beam, h, d).transpose(1, 2)  # (B, H_kv, K, d_head)
        self.v[:, :, self.length] = v.view(n, self.beam, h, d).transpose(1, 2)
        self.length += 1
        return self.k[:, :, : self.length].flatten(2, 3), self.v[:, :, : self.length].flatten(2, 3)

    def relayout_queries(self, q: Tensor) -> Tensor:
        return _fold(q, self.beam)

    def relayout_outputs(self, out: Tensor) -> Tensor:
        return _unfold(out)


class BeamMemoryKV(KVCache):
    """Cross-attention for beam search: the encoder's keys and values once per sentence, not once per
    hypothesis; a sentence's K hypotheses query them together."""

    def __init__(self, beam: int) -> None:
        super().__init__()
        self.beam = beam

    def relayout_queries(self, q: Tensor) -> Tensor:
        return _fold(q, self.beam)

    def relayout_outputs(self, out: Tensor) -> Tensor:
        return _unfold(out)


class BeamDecodeCache(DecodeCache):
    """Beam search's cache: K hypotheses per sentence, keys and values never moved (`BeamKVCache`).

    `ancestry` (B*K, t) holds, for each live hypothesis, the beam slot its ancestor occupied at each
    step, i.e. where that step's keys were written. `reorder` then only reorders this small table;
    the keys stay put (and move only when finished sentences leave the batch).
    """

    def __init__(self, layers: list[LayerCache], beam: int) -> None:
        super().__init__(layers)
        self.beam = beam
        self.ancestry: Tensor | None = None  # (B*K, t) long

    @property
    def n_keys(self) -> int:
        """The steps recorded so far (each spans K flattened keys: `relayout_score_bias`)."""
        return 0 if self.ancestry is None else self.ancestry.size(1)

    def record(self, key_mask: Tensor, causal: bool) -> tuple[Tensor, Tensor | None, bool]:
        """Record one new step (each hypothesis writes into its own slot); return its position and the mask.

        key_mask: (B*K, 1), the new step's tokens (beam search never feeds padding).
        Returns the step's position (1,), and (B, 1, K, t*K) bool: hypothesis k of sentence b may attend to
        flattened key s*K + j iff its ancestor at step s sat in slot j (the past only: the decoder is causal by
        construction).
        """
        if key_mask.size(1) != 1 or not bool(key_mask.all()):
            raise ValueError("beam search feeds one real token per hypothesis and step")
        positions = torch.arange(self.n_keys, self.n_keys + 1, device=key_mask.device)
        slots = torch.arange(key_mask.size(0), device=key_mask.device) % self.beam
        column = slots[:, None]
        self.ancestry = column if self.ancestry is None else torch.cat([self.ancestry, column], dim=1)
        allowed = torch.nn.functional.one_hot(self.ancestry, self.beam).bool()  # (B*K, t, K)
        return positions, allowed.view(-1, self.beam, self.n_keys * self.beam).unsqueeze(1), False

    def relayout_score_bias(self, bias: Tensor) -> Tensor:
        """A (., H, T_q, t) score bias over steps -> over the flattened (t*K) keys."""
        return bias.repeat_interleave(self.beam, dim=-1)

    def reorder(self, index: Tensor) -> None:
        """Hypotheses `index` (rows of the previous step, grouped by sentence) continue.

        Only the ancestry table moves; when the batch shrinks (sentences finished), every layer keeps
        the remaining sentences' keys and values (cross-attention's included: one copy per sentence).
        """
        if self.ancestry is None:
            raise ValueError("reorder before the first step")
        if index.numel() < self.ancestry.size(0):
            sentences = index.view(-1, self.beam)[:, 0] // self.beam
            for layer in self.layers:
                layer.self_kv.reorder(sentences)
                layer.cross_kv.reorder(sentences)
        self.ancestry = self.ancestry.index_select(0, index)


@contextmanager
def search_cache(
    model: nn.Module, max_steps: int, beam: int | None = None
) -> Iterator[DecodeCache | BeamDecodeCache | LSTMState | EnsembleCache]:
    """The fast cache for decoding `model` up to `max_steps` steps (`beam=K`: beam search's, rows are
    B sentences x K hypotheses); its buffers come from the model's pool (`pool_for`, kept with the model between
    searches) and go back to it when the block ends. An ensemble: one such cache per member."""
    match model:
        case LSTMLanguageModel():
            yield model.new_cache()  # the recurrent state: small, nothing to reuse
            return
        case Ensemble():
            with ExitStack() as members:
                caches = [members.enter_context(search_cache(m, max_steps, beam)) for m in model.seq2seqs]
                yield EnsembleCache(cast("list[DecodeCache]", caches))  # a Seq2Seq's: DecodeCache or BeamDecodeCache
            return
        case Seq2Seq() | LanguageModel():
            pool, n_layers = pool_for(model), len(model.decoder.blocks)
        case _:
            raise TypeError(f"{type(model).__name__} does not decode")
    if beam is None:
        owned = [PooledKVCache(max_steps, pool) for _ in range(n_layers)]
        cache = DecodeCache([LayerCache(kv, KVCache()) for kv in owned])
    else:
        owned = [BeamKVCache(max_steps, beam, pool) for _ in range(n_layers)]
        cache = BeamDecodeCache([LayerCache(kv, BeamMemoryKV(beam)) for kv in owned], beam)
    try:
        yield cache
    finally:
        for kv in owned:
            kv.release()
