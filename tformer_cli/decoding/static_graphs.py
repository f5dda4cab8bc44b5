"""The fixed-shape path's graphs: for one batch shape, the static caches, the search's state and the decoder step
(with, for greedy and beam search, the choice of the next tokens), captured in a CUDA graph on CUDA and run
eagerly elsewhere (decoding/cuda_graphs.py, `StepRunner`). One class per search: `GreedyGraph`, `BeamGraph`,
`LMGraph` (a language model's step: sampling's random draws stay outside the graph). decoding/static.py runs the
searches with them; `graph_for` keeps them per model.

Shape legend: B sentences (or LM rows), K beam, R = B x K rows, H_kv key/value heads, L the cache's length in
steps, S source length, d_head head width, V vocabulary.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import TypeVar, cast

import torch
from torch import Tensor, nn

from tformer_cli.decoding.cuda_graphs import StepRunner
from tformer_cli.decoding.search_state import BeamState, GreedyState
from tformer_cli.decoding.static_cache import (
    Cursor,
    StaticBeamCache,
    StaticBeamKVCache,
    StaticDecodeCache,
    StaticKVCache,
    StaticMemoryKV,
)
from tformer_cli.model.cache import KVCache, LayerCache
from tformer_cli.model.layers import Block
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack
from tformer_cli.tokenizer import BOS_ID, PAD_ID

MAX_GRAPHS = 8  # batch shapes (with their buffers and graphs) kept per model


class StepBuffers:
    """What every fixed-shape search decodes with: the model (held weakly: `graph_for`'s dictionary is keyed
    weakly by it, which a strong reference would keep alive, buffers and all), the static caches of `n_sent` x
    `beam` rows (beam None: one row per sentence or LM row), `src_len` source tokens (seq2seq), `cache_len` steps,
    the step's input tokens and the source mask."""

    def __init__(self, model: nn.Module, n_sent: int, beam: int | None, src_len: int, cache_len: int) -> None:
        self._model = weakref.ref(model)
        weight = next(model.parameters())
        self.device, rows = weight.device, n_sent * (beam or 1)
        cursor = Cursor(self.device)
        decoder = cast(Stack, model.decoder)  # a Seq2Seq's or a LanguageModel's
        layers = [_layer_cache(block, cursor, n_sent, beam, src_len, cache_len, weight) for block in _blocks(decoder)]
        # RoPE's tables of every position, built now. The attention layers read them through their `rotary`, which
        # a later, longer dynamic forward may give new tables; held here, these stay alive where a captured step
        # reads them. Nothing reads this attribute.
        self.rotary_tables = _rotary_tables(decoder, cache_len, self.device)
        if beam is None:
            self.cache: StaticDecodeCache = StaticDecodeCache(layers, cursor, rows, cache_len)
        else:
            self.cache = StaticBeamCache(layers, cursor, n_sent, beam, cache_len)
        self.tokens = torch.full((rows, 1), BOS_ID, dtype=torch.long, device=self.device)  # the step's input
        self.memory_mask = torch.zeros(n_sent, 1, 1, max(src_len, 1), dtype=torch.bool, device=self.device)
        self.use_graph = self.device.type == "cuda" and torch.cuda.is_available()

    @property
    def model(self) -> nn.Module:
        model = self._model()
        assert model is not None, "a graph is used only through its live model (graph_for)"
        return model

    def decode(self) -> Tensor:
        """The decoder step on `tokens` -> the next logits (R, V)."""
        if isinstance(self.model, Seq2Seq):
            return self.model.decode(self.tokens, None, self.memory_mask, self.cache)[:, -1]
        return self.model(self.tokens, cache=self.cache)[:, -1]

    def start(self, first: Tensor, src: Tensor | None = None) -> Tensor:
        """A new batch: the caches emptied, the first forward run eagerly (it fills cross-attention's keys, and a
        language model's prompt may be of any length); returns its last position's logits (R, V)."""
        self.cache.reset()
        if src is None:
            return self.model(first, cache=self.cache)[:, -1]
        self.memory_mask.copy_((src != PAD_ID)[:, None, None, :])
        model = cast(Seq2Seq, self.model)  # given a source: an encoder-decoder
        memory = model.encoder(src)
        return model.decode(first, memory, self.memory_mask, self.cache)[:, -1]


def _blocks(stack: Stack) -> Iterable[Block]:
    return cast("Iterable[Block]", stack.blocks)  # an nn.ModuleList types its items as modules


def _layer_cache(
    block: Block, cursor: Cursor, n_sent: int, beam: int | None, src_len: int, cache_len: int, weight: Tensor
) -> LayerCache:
    attn, cross, rows = block.self_attn, block.cross_attn, n_sent * (beam or 1)
    if beam is None:
        self_kv: KVCache = StaticKVCache(cursor, (rows, attn.n_kv_heads, cache_len, attn.d_head), weight)
    else:
        self_kv = StaticBeamKVCache(cursor, (n_sent, attn.n_kv_heads, cache_len, beam, attn.d_head), weight)
    if cross is None:
        return LayerCache(self_kv, KVCache())
    return LayerCache(self_kv, StaticMemoryKV((n_sent, cross.n_kv_heads, src_len, cross.d_head), weight, beam or 1))


def _rotary_tables(decoder: Stack, cache_len: int, device: torch.device) -> list[tuple[Tensor, Tensor]]:
    rotaries = [block.self_attn.rotary for block in _blocks(decoder) if block.self_attn.rotary is not None]
    return [rotary.prepare(cache_len, device) for rotary in rotaries]


class GreedyGraph:
    """Greedy search on one batch shape: `n_sent` sentences, `src_len` source tokens, `cache_len` steps; `repeats`
    (no_repeat_ngram, repetition_penalty) are part of its captured step."""

    def __init__(self, model: nn.Module, n_sent: int, src_len: int, cache_len: int, repeats: tuple[int, float]) -> None:
        self.buffers = StepBuffers(model, n_sent, None, src_len, cache_len)
        self.search = GreedyState(n_sent, cache_len, self.buffers.device, *repeats)
        state = self.buffers.cache.state() + self.search.state()
        self.runner = StepRunner(self._step, self.buffers.use_graph, state)

    def _step(self) -> Tensor:
        self.buffers.tokens.copy_(self.search.token.view(-1, 1))
        return self.search.choose(self.buffers.decode())

    def first(self, src: Tensor) -> Tensor:
        """The first step of a batch (padded to the shape), eagerly: returns `done` (R,)."""
        return self.search.choose(self.buffers.start(self.search.token[:, None].clone(), src))

    def step(self) -> Tensor:
        """One step from the search's own state (through the graph where there is one): returns `done` (R,)."""
        return self.runner()


class BeamGraph:
    """Beam search on one batch shape: `n_sent` sentences x `beam` hypotheses, `src_len` source tokens, `cache_len`
    steps; `repeats` (no_repeat_ngram, repetition_penalty) are part of its captured step."""

    def __init__(
        self, model: nn.Module, n_sent: int, beam: int, src_len: int, cache_len: int, repeats: tuple[int, float]
    ) -> None:
        self.buffers = StepBuffers(model, n_sent, beam, src_len, cache_len)
        self.search = BeamState(n_sent, beam, cache_len, self.buffers.device, *repeats)
        state = self.buffers.cache.state() + self.search.state()
        self.runner = StepRunner(self._step, self.buffers.use_graph, state)

    def _step(self) -> Tensor:
        self.buffers.tokens.copy_(self.search.token.view(-1, 1))
        self.buffers.cache.reorder(self.search.choose(self.buffers.decode()))  # the cache follows the hypotheses
        return self.search.active

    def first(self, src: Tensor) -> Tensor:
        """The first step of a batch (padded to the shape), eagerly: returns `active` (B,)."""
        logits = self.buffers.start(self.search.token[:, None].clone(), src)  # BOS
        self.buffers.cache.reorder(self.search.choose(logits))
        return self.search.active

    def step(self) -> Tensor:
        """One step from the search's own state (through the graph where there is one): returns `active` (B,)."""
        return self.runner()


class LMGraph:
    """A language model's decoder step on one batch shape (`rows` x `cache_len` steps); the sampling that chooses
    the next tokens stays outside the graph."""

    def __init__(self, model: nn.Module, rows: int, cache_len: int) -> None:
        self.buffers = StepBuffers(model, rows, None, 0, cache_len)
        self.runner = StepRunner(self.buffers.decode, self.buffers.use_graph, self.buffers.cache.state())

    def first(self, prompt: Tensor) -> Tensor:
        """The prompt, eagerly: returns its last position's logits (R, V)."""
        return self.buffers.start(prompt)

    def step(self, tokens: Tensor) -> Tensor:
        """One token per row (R,) -> the next logits (R, V), through the graph where there is one."""
        self.buffers.tokens.copy_(tokens.view(-1, 1))
        return self.runner()


Graph = TypeVar("Graph", GreedyGraph, BeamGraph, LMGraph)

# The graphs made so far: per model (weakly: they go with it), then per batch shape, search settings, and the
# weights' dtype, device and address (`data_ptr`: a model cast or moved after decoding gets new graphs, since a
# captured step reads the weights where they were). Used only by `graph_for`.
_graphs: weakref.WeakKeyDictionary[nn.Module, OrderedDict] = weakref.WeakKeyDictionary()


def graph_for(
    model: nn.Module, n_sent: int, beam: int | None, src_len: int, cache_len: int, repeats: tuple[int, float] = (0, 1.0)
) -> GreedyGraph | BeamGraph | LMGraph:
    """The model's graph for this batch shape and search (beam None: greedy for an encoder-decoder, a language
    model's step otherwise; `repeats`, which a captured search step holds), made on first use and kept in
    `_graphs`; the least recently used beyond `MAX_GRAPHS` are let go (with their buffers and graphs)."""
    graphs = _graphs.setdefault(model, OrderedDict())
    weight = next(model.parameters())
    key = (n_sent, beam, src_len, cache_len, weight.dtype, weight.device, weight.data_ptr(), repeats)
    if key not in graphs:
        if not isinstance(model, Seq2Seq):
            graphs[key] = LMGraph(model, n_sent, cache_len)
        elif beam is None:
            graphs[key] = GreedyGraph(model, n_sent, src_len, cache_len, repeats)
        else:
            graphs[key] = BeamGraph(model, n_sent, beam, src_len, cache_len, repeats)
        while len(graphs) > MAX_GRAPHS:
            graphs.popitem(last=False)
    graphs.move_to_end(key)
    return graphs[key]
