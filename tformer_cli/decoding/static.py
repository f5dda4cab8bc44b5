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
  `StepRunner`): one launch per step instead of hundreds. One graph per search and batch shape
  (decoding/static_graphs.py: `GreedyGraph`, `BeamGraph`, `LMGraph`) holds its buffers, caches and step.
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

These functions decode only what fits a static cache (`fits`, `fits_lm`), and take what decoding/search.py's take:
(model, inputs, settings), by decoding/rules.py's rules; decoding/api.py, the one entry point, decides between this
path and the dynamic one. The answers are those of decoding/search.py (the
reference, and the CPU's path; the tests compare them on every device: tests/unit/decoding/test_static.py). On
a CPU this path runs too, without graphs, but it is slower there (attention over the whole cache costs more
than the launches it saves), so `decode.static: auto` takes it on CUDA only (`use_static`).

Shape legend: B sentences (or LM rows), K beam, R = B x K rows, H_kv key/value heads, L the cache's
length in steps, S source length, d_head head width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from tformer_cli.decoding.rules import Hypothesis
from tformer_cli.decoding.search import draws, lm_rules, output_limits, sample_next
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.decoding.static_graphs import BeamGraph, GreedyGraph, LMGraph, graph_for
from tformer_cli.model.lm import LanguageModel
from tformer_cli.model.positions import LearnedPositions, SinusoidalPositions
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack
from tformer_cli.tokenizer import PAD_ID

CHECK_EVERY = 4  # steps between the host's reads of "is the whole batch done?"
SHAPE_STEP = 16  # sources and caches are padded to a multiple of this many steps


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


def fits(model: Seq2Seq, limit: int) -> bool:
    """Whether outputs of up to `limit` tokens (and BOS) fit the decoder's position table: a static cache's."""
    return cache_length(model.decoder, limit + 1) is not None


def fits_lm(model: nn.Module, length: int) -> bool:
    """Whether a language model generates `length` positions (prompt and new tokens) on this path: a Transformer
    whose position table holds them (a recurrent model has no key/value cache to fix)."""
    return isinstance(model, LanguageModel) and cache_length(model.decoder, length) is not None


def _pad(src: Tensor, n_sent: int, src_len: int) -> Tensor:
    out = src.new_full((n_sent, src_len), PAD_ID)
    out[: src.size(0), : src.size(1)] = src
    return out


def _static_shape(model: Seq2Seq, src: Tensor, limit: int) -> tuple[int, int, int]:
    n_sent, src_len, cache_len = _batch_shape(src, limit, model)
    if cache_len is None:
        raise ValueError(f"outputs of {limit} tokens do not fit the decoder's position table (decoding/api.py decides)")
    return n_sent, src_len, cache_len


@torch.inference_mode()
def static_greedy(model: Seq2Seq, src: Tensor, settings: SearchSettings) -> list[Hypothesis]:
    """decoding/search.py's `greedy` on static shapes (same hypotheses), for outputs that fit (`fits`). Each step
    after the first is one call of the model's graph for this shape (`graph_for`: made on first use and kept
    with the model), `GreedyState.choose` after the decoder step; the host reads only whether all rows are done.

    Raises:
        ValueError: the outputs do not fit the decoder's position table.
    """
    model.eval()
    limits = output_limits(model, src, settings)
    limit = int(limits.max())  # the one host read before decoding
    n_sent, src_len, cache_len = _static_shape(model, src, limit)
    graph = graph_for(model, n_sent, None, src_len, cache_len, settings.repeats)
    assert isinstance(graph, GreedyGraph)
    n = src.size(0)
    graph.search.begin(limits, n, settings.min_length)
    done = graph.first(_pad(src, n_sent, src_len))
    for step in range(1, limit):
        done = graph.step()
        if (step + 1) % CHECK_EVERY == 0 and bool(done.all()):
            break
    return graph.search.hypotheses(torch.arange(n, device=src.device))


@torch.inference_mode()
def static_beam_search(model: Seq2Seq, src: Tensor, settings: SearchSettings) -> list[list[Hypothesis]]:
    """decoding/search.py's `beam_search` on static shapes, its bookkeeping on the device (same hypotheses,
    scores within rounding), for outputs that fit (`fits`). Each step after the first is one call of the model's
    graph for this shape (`graph_for`: made on first use and kept with the model).

    Raises:
        ValueError: the outputs do not fit the decoder's position table.
    """
    model.eval()
    limits = output_limits(model, src, settings)
    limit = int(limits.max())
    n_sent, src_len, cache_len = _static_shape(model, src, limit)
    graph = graph_for(model, n_sent, settings.beam, src_len, cache_len, settings.repeats)
    assert isinstance(graph, BeamGraph)
    n = src.size(0)
    graph.search.begin(limits, n, settings.min_length)
    active = graph.first(_pad(src, n_sent, src_len))
    for step in range(1, limit):
        active = graph.step()
        if (step + 1) % CHECK_EVERY == 0 and not bool(active.any()):
            break
    return graph.search.finished.hypotheses(n, settings.alpha, settings.nbest)


@torch.inference_mode()
def static_generate(
    model: LanguageModel, prompt: Tensor, settings: SearchSettings, on_token: Callable[[Tensor], None] | None = None
) -> Tensor:
    """decoding/search.py's `generate` on static shapes (same tokens, same random draws), for a Transformer
    whose position table holds prompt + new tokens (`fits_lm`). The controls (`lm_rules`) act outside the
    captured step, with the sampling.

    Raises:
        ValueError: a recurrent model, or a position table shorter than prompt + new tokens.
    """
    new_tokens, eos_id = settings.max_new_tokens, settings.eos_id
    if not fits_lm(model, prompt.size(1) + new_tokens):
        raise ValueError("not a Transformer language model whose positions hold the output (decoding/api.py decides)")
    cache_len = cache_length(model.decoder, prompt.size(1) + new_tokens)
    assert cache_len is not None  # fits_lm: the table holds them
    model.eval()
    generator = draws(settings, prompt.device)
    prompt = prompt.repeat_interleave(settings.samples, dim=0) if settings.samples > 1 else prompt
    graph = graph_for(model, prompt.size(0), None, 0, cache_len)
    assert isinstance(graph, LMGraph)
    device = prompt.device
    out = torch.full((prompt.size(0), new_tokens), eos_id or 0, dtype=torch.long, device=device)
    done = torch.zeros(prompt.size(0), dtype=torch.bool, device=device)
    all_done_at = torch.full((), new_tokens, dtype=torch.long, device=device)  # new tokens when all rows ended
    rules = lm_rules(settings)
    logits, token = graph.first(prompt), prompt[:, -1]
    for i in range(new_tokens):
        if i:
            logits = graph.step(token)
        if rules is not None:  # prompt + the tokens chosen so far
            logits = rules(logits, torch.cat([prompt, out[:, :i]], dim=1), i)
        token = sample_next(logits, settings, generator)
        if eos_id is not None:
            token = token.masked_fill(done, eos_id)
            done |= token == eos_id
            all_done_at = torch.where(done.all() & (all_done_at == new_tokens), i + 1, all_done_at)
        out[:, i] = token
        if on_token is not None:
            on_token(token)
        check = 1 if on_token is not None else CHECK_EVERY  # a stream shows no token past the end
        if eos_id is not None and (i + 1) % check == 0 and bool(done.all()):
            break
    return torch.cat([prompt, out[:, : int(all_done_at)]], dim=1)
