"""Decoding with fixed shapes, for GPUs: static caches, the searches' state on the device, and the decoder
step captured in a CUDA graph.

On a GPU a decoding step of a small batch is bound by the host, not by the GPU: Python, one kernel
launch per operation, and a host sync wherever a search reads a value (`.tolist()`, `bool(...)`). This
path removes those costs, as gpt-fast and CTranslate2 do:
- Every tensor a step reads or writes keeps its shape and address from step to step: self-attention's
  keys and values are allocated once at the maximum length (decoding/static_cache.py: `StaticDecodeCache`;
  `StaticBeamCache` for beam search, whose keys never move, as in decoding/cache.py), cross-attention's
  once per batch shape, and attention spans the whole cache with the steps not yet written masked out.
  The step's position is a tensor on the device (`Cursor.pos`), not a Python int.
- So the decoder step can be captured once in a CUDA graph and replayed (decoding/cuda_graphs.py,
  `StepRunner`): one launch per step instead of hundreds. A `Session` holds one batch shape's buffers,
  caches and graph.
- The searches (`static_greedy`, `static_beam_search`, `static_generate`) keep their bookkeeping on the
  device: a finished sentence stays in the batch, masked, instead of leaving it, and the host reads
  only whether the whole batch is done, every `CHECK_EVERY` steps, and the results once at the end.
  Greedy and beam search keep their state in buffers too (decoding/search_state.py: `GreedyState`,
  `BeamState`, the step number a tensor), so the graph holds a search's whole step: the decoder step, the
  choice of the next tokens and the bookkeeping. (Sampling's random draws stay outside: `static_generate`
  captures the decoder step.)
- Batches are padded to a few shapes (sentences to 2^k or 3 x 2^k, sources to a multiple of 16 tokens,
  the cache to a multiple of 16 steps), so that a handful of graphs serve a whole test set; a padded
  sentence is finished from the start (`translate` cuts its batches to those counts: `largest_bucket`).

The answers are those of decoding/search.py (the reference, and the CPU's path; the tests compare them
on every device: tests/unit/decoding/test_static.py). On a CPU this path runs too, without graphs, but
it is slower there (attention over the whole cache costs more than the launches it saves), so
`decode.static: auto` takes it on CUDA only (`use_static`).

Shape legend: B sentences (or LM rows), K beam, R = B x K rows, H_kv key/value heads, L the cache's
length in steps, S source length, d_head head width, V vocabulary.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor, nn

from tformer_cli.decoding.cuda_graphs import StepRunner
from tformer_cli.decoding.search import (
    Hypothesis,
    beam_search,
    generate,
    greedy,
    lm_rules,
    max_lengths,
    sample_next,
    served_length,
)
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
from tformer_cli.model.lm import LanguageModel
from tformer_cli.model.positions import LearnedPositions, SinusoidalPositions
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack
from tformer_cli.tokenizer import BOS_ID, PAD_ID

CHECK_EVERY = 4  # steps between the host's reads of "is the whole batch done?"
SHAPE_STEP = 16  # sources and caches are padded to a multiple of this many steps
MAX_SESSIONS = 8  # batch shapes (with their buffers and graphs) kept per model


def use_static(setting: str, device: torch.device) -> bool:
    """`decode.static`: auto (on CUDA only), always, never."""
    return setting == "always" or (setting == "auto" and device.type == "cuda")


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _table_length(stack: Stack) -> int | None:
    """How many positions the stack's position table holds (a static step cannot extend it), or None (any)."""
    match stack.positions:
        case LearnedPositions():
            return stack.positions.max_len
        case SinusoidalPositions():
            return stack.positions.table.size(0)
    return None


def cache_length(stack: Stack, needed: int) -> int | None:
    """The static cache's length for `needed` steps: rounded up to `SHAPE_STEP` within the position table,
    or None when the table is shorter than `needed` (the dynamic path then decodes, and says so if it must)."""
    table = _table_length(stack)
    if table is not None and needed > table:
        return None
    return min(_round_up(needed, SHAPE_STEP), table) if table is not None else _round_up(needed, SHAPE_STEP)


class Session:
    """The buffers, caches and step of one batch shape: `n_sent` x `beam` rows (beam None: greedy, one row per
    sentence, or a language model's rows), `src_len` source tokens (seq2seq), `max_len` steps; `repeats`: the
    search's (no_repeat_ngram, repetition_penalty), part of its captured step."""

    def __init__(
        self,
        model: nn.Module,
        n_sent: int,
        beam: int | None,
        src_len: int,
        max_len: int,
        repeats: tuple[int, float] = (0, 1.0),
    ) -> None:
        # The model is held weakly: the sessions live in a dictionary keyed weakly by the model, which a strong
        # reference from here would keep alive, with its buffers, for as long as the process.
        self._model = weakref.ref(model)
        self.n_sent, self.beam, self.max_len = n_sent, beam, max_len
        weight = next(model.parameters())
        device, rows = weight.device, n_sent * (beam or 1)
        decoder: Stack = model.decoder
        cursor = Cursor(device)
        layers = []
        for block in decoder.blocks:
            attn = block.self_attn
            if beam is None:
                self_kv: KVCache = StaticKVCache(cursor, (rows, attn.n_kv_heads, max_len, attn.d_head), weight)
            else:
                self_kv = StaticBeamKVCache(cursor, (n_sent, attn.n_kv_heads, max_len, beam, attn.d_head), weight)
            cross = block.cross_attn
            cross_kv = (
                StaticMemoryKV((n_sent, cross.n_kv_heads, src_len, cross.d_head), weight, beam or 1)
                if cross is not None
                else KVCache()
            )
            layers.append(LayerCache(self_kv, cross_kv))
            if attn.rotary is not None:  # its angles, held here: a graph reads them where they are now
                self.angles = attn.rotary.prepare(max_len, device)
        if beam is None:
            self.cache: StaticDecodeCache = StaticDecodeCache(layers, cursor, rows, max_len)
        else:
            self.cache = StaticBeamCache(layers, cursor, n_sent, beam, max_len)
        self.tokens = torch.full((rows, 1), BOS_ID, dtype=torch.long, device=device)  # the step's input
        self.memory_mask = torch.zeros(n_sent, 1, 1, max(src_len, 1), dtype=torch.bool, device=device)
        graph = device.type == "cuda" and torch.cuda.is_available()
        # A search's whole step in the graph: the decoder step, then the search's choice and bookkeeping.
        if isinstance(model, Seq2Seq) and beam is None:
            self.greedy = GreedyState(rows, max_len, device, *repeats)
            self.runner = StepRunner(self._greedy_step, graph, self.cache.state() + self.greedy.state())
        elif isinstance(model, Seq2Seq):
            self.beam_state = BeamState(n_sent, beam, max_len, device, *repeats)
            self.runner = StepRunner(self._beam_step, graph, self.cache.state() + self.beam_state.state())
        else:  # a language model's sampling draws random numbers: the step alone is captured
            self.runner = StepRunner(self._step, graph, self.cache.state())

    @property
    def model(self) -> nn.Module:
        model = self._model()
        assert model is not None, "a session is used only through its live model (session_for)"
        return model

    def _step(self) -> Tensor:
        if isinstance(self.model, Seq2Seq):
            return self.model.decode(self.tokens, None, self.memory_mask, self.cache)[:, -1]
        return self.model(self.tokens, cache=self.cache)[:, -1]

    def _greedy_step(self) -> Tensor:
        self.tokens.copy_(self.greedy.token.view(-1, 1))
        return self.greedy.choose(self._step())

    def _beam_step(self) -> Tensor:
        self.tokens.copy_(self.beam_state.token.view(-1, 1))
        self.cache.reorder(self.beam_state.choose(self._step()))
        return self.beam_state.active

    def start(self, first: Tensor, src: Tensor | None = None) -> Tensor:
        """A new batch: the caches emptied, the first forward run eagerly (it fills cross-attention's keys, and a
        language model's prompt may be of any length); returns its last position's logits (R, V)."""
        self.cache.reset()
        if src is None:
            return self.model(first, cache=self.cache)[:, -1]
        self.memory_mask.copy_((src != PAD_ID)[:, None, None, :])
        memory = self.model.encoder(src)
        return self.model.decode(first, memory, self.memory_mask, self.cache)[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """A language model's session: one token per row (R,) -> the next logits (R, V), through the graph where
        there is one (the sampling that chooses the next tokens stays outside it)."""
        self.tokens.copy_(tokens.view(-1, 1))
        return self.runner()

    def search_step(self) -> Tensor:
        """A search's next step from its own state: the decoder step on the tokens chosen last, and the choice
        of the next ones (`GreedyState.choose`, `BeamState.choose`), through the graph where there is one;
        returns which rows are done (greedy) or which sentences are still active (beam search)."""
        return self.runner()


_sessions: weakref.WeakKeyDictionary[nn.Module, OrderedDict] = weakref.WeakKeyDictionary()


def session_for(
    model: nn.Module, n_sent: int, beam: int | None, src_len: int, max_len: int, repeats: tuple[int, float] = (0, 1.0)
) -> Session:
    """The model's session for this batch shape (and the search's `repeats` controls, which its captured step
    holds), made on first use; the least recently used beyond `MAX_SESSIONS` are let go (with their buffers and
    graphs)."""
    sessions = _sessions.setdefault(model, OrderedDict())
    weight = next(model.parameters())
    key = (n_sent, beam, src_len, max_len, weight.dtype, weight.device, weight.data_ptr(), repeats)
    if key not in sessions:
        sessions[key] = Session(model, n_sent, beam, src_len, max_len, repeats)
        while len(sessions) > MAX_SESSIONS:
            sessions.popitem(last=False)
    sessions.move_to_end(key)
    return sessions[key]


def sentence_bucket(n: int) -> int:
    """The batch's sentences padded to the next 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k or 3 x 2^k): at most a
    third of the rows are padding, and one shape serves many batch sizes."""
    power = 1 << (n - 1).bit_length()  # the next power of two
    return 3 * power // 4 if power >= 4 and 3 * power // 4 >= n else power


def largest_bucket(n: int) -> int:
    """The largest sentence count <= n that `sentence_bucket` keeps as it is (1, 2, 3, 4, 6, 8, 12, ...)."""
    power = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    return 3 * power // 2 if power >= 2 and 3 * power // 2 <= n else power


def _batch_shape(src: Tensor, limit: int, model: Seq2Seq) -> tuple[int, int, int | None]:
    """(sentences, source length, cache length) of the padded batch; cache length None: no static path.

    The source is padded within the encoder's position table (a source longer than the table stays as it
    is, and the encoder says so as it would anyway)."""
    n_sent = sentence_bucket(src.size(0))
    src_len, table = _round_up(src.size(1), SHAPE_STEP), _table_length(model.encoder)
    if table is not None:
        src_len = max(min(src_len, table), src.size(1))
    return n_sent, src_len, cache_length(model.decoder, limit + 1)


def _pad(src: Tensor, n_sent: int, src_len: int) -> Tensor:
    out = src.new_full((n_sent, src_len), PAD_ID)
    out[: src.size(0), : src.size(1)] = src
    return out


@torch.inference_mode()
def static_greedy(
    model: Seq2Seq,
    src: Tensor,
    a: float = 1.0,
    b: int = 50,
    min_len: int = 0,
    max_len: int | None = None,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[Hypothesis]:
    """decoding/search.py's `greedy` on static shapes (same hypotheses); falls back to it where the position
    table is shorter than the output limit. Each step after the first is one call of the session's captured
    step (`GreedyState.choose` after the decoder step); the host reads only whether all rows are done."""
    model.eval()
    limits = max_lengths(src, a, b, served_length(model.decoder, max_len))
    limit = int(limits.max())  # the one host read before decoding
    n_sent, src_len, cache_len = _batch_shape(src, limit, model)
    repeats = (no_repeat_ngram, repetition_penalty)
    if cache_len is None:
        return greedy(model, src, a, b, min_len=min_len, max_len=max_len, no_repeat_ngram=no_repeat_ngram,
                      repetition_penalty=repetition_penalty)  # fmt: skip
    session = session_for(model, n_sent, None, src_len, cache_len, repeats)
    n, state = src.size(0), session.greedy
    state.begin(limits, n, min_len)
    bos = torch.full((n_sent, 1), BOS_ID, dtype=torch.long, device=src.device)
    done = state.choose(session.start(bos, _pad(src, n_sent, src_len)))  # the first step, eagerly
    for step in range(1, limit):
        done = session.search_step()
        if (step + 1) % CHECK_EVERY == 0 and bool(done.all()):
            break
    return state.hypotheses(torch.arange(n, device=src.device))


@torch.inference_mode()
def static_beam_search(
    model: Seq2Seq,
    src: Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    a: float = 1.0,
    b: int = 50,
    nbest: int = 1,
    min_len: int = 0,
    max_len: int | None = None,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> list[list[Hypothesis]]:
    """decoding/search.py's `beam_search` on static shapes, its bookkeeping on the device (same hypotheses,
    scores within rounding); falls back to it where the position table is shorter than the output limit.

    The rules, as there: the best 2K of a sentence's continuations are ranked; an EOS among the first K
    finishes a hypothesis while the sentence has fewer than K finished; the first K others continue; a
    sentence is done once it has K finished hypotheses (or fewer than K continue).
    """
    model.eval()
    limits = max_lengths(src, a, b, served_length(model.decoder, max_len))
    limit = int(limits.max())
    n_sent, src_len, cache_len = _batch_shape(src, limit, model)
    repeats = (no_repeat_ngram, repetition_penalty)
    if cache_len is None:
        return beam_search(model, src, beam, alpha, a, b, nbest, min_len=min_len, max_len=max_len,
                           no_repeat_ngram=no_repeat_ngram, repetition_penalty=repetition_penalty)  # fmt: skip
    session = session_for(model, n_sent, beam, src_len, cache_len, repeats)
    n, state = src.size(0), session.beam_state
    state.begin(limits, n, min_len)
    first = state.token[:, None].clone()  # BOS
    session.cache.reorder(state.choose(session.start(first, _pad(src, n_sent, src_len))))  # the first step, eagerly
    active = state.active
    for step in range(1, limit):
        active = session.search_step()
        if (step + 1) % CHECK_EVERY == 0 and not bool(active.any()):
            break
    return state.finished.hypotheses(n, alpha, nbest)


@torch.inference_mode()
def static_generate(
    model: LanguageModel,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    on_token: Callable[[Tensor], None] | None = None,
    samples: int = 1,
    min_new_tokens: int = 0,
    no_repeat_ngram: int = 0,
    repetition_penalty: float = 1.0,
) -> Tensor:
    """decoding/search.py's `generate` on static shapes (same tokens, same random draws); falls back to it for
    a recurrent model or where the position table is shorter than prompt + new tokens. The controls (`lm_rules`)
    act outside the captured step, with the sampling."""
    max_len = cache_length(model.decoder, prompt.size(1) + max_new_tokens) if isinstance(model, LanguageModel) else None
    if max_len is None:
        return generate(
            model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id,
            generator=generator, on_token=on_token, samples=samples, min_new_tokens=min_new_tokens,
            no_repeat_ngram=no_repeat_ngram, repetition_penalty=repetition_penalty,
        )  # fmt: skip
    model.eval()
    prompt = prompt.repeat_interleave(samples, dim=0) if samples > 1 else prompt
    session = session_for(model, prompt.size(0), None, 0, max_len)
    device = prompt.device
    out = torch.full((prompt.size(0), max_new_tokens), eos_id or 0, dtype=torch.long, device=device)
    done = torch.zeros(prompt.size(0), dtype=torch.bool, device=device)
    all_done_at = torch.full((), max_new_tokens, dtype=torch.long, device=device)  # new tokens when all rows ended
    rules = lm_rules(eos_id, min_new_tokens, no_repeat_ngram, repetition_penalty)
    logits, token = session.start(prompt), prompt[:, -1]
    for i in range(max_new_tokens):
        if i:
            logits = session.step(token)
        if rules is not None:  # prompt + the tokens chosen so far
            logits = rules(logits, torch.cat([prompt, out[:, :i]], dim=1), i)
        token = sample_next(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            token = token.masked_fill(done, eos_id)
            done |= token == eos_id
            all_done_at = torch.where(done.all() & (all_done_at == max_new_tokens), i + 1, all_done_at)
        out[:, i] = token
        if on_token is not None:
            on_token(token)
        check = 1 if on_token is not None else CHECK_EVERY  # a stream shows no token past the end
        if eos_id is not None and (i + 1) % check == 0 and bool(done.all()):
            break
    return torch.cat([prompt, out[:, : int(all_done_at)]], dim=1)
