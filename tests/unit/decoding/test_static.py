"""The static decoding path (decoding/static.py) gives the searches' answers, reads the device only where a batch
may end, and carries nothing from one batch to the next (on each device; on CUDA through CUDA graphs)."""

import dataclasses

import pytest
import torch
from meta_device import META, OffTheCpu
from tiny_models import POSITIONS, padded_sources, tiny_lm, tiny_translator
from torch.utils._python_dispatch import TorchDispatchMode

from tformer_cli.decoding import api, static, static_graphs
from tformer_cli.decoding.search import beam_search, generate, greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.decoding.static import static_beam_search, static_generate, static_greedy, use_static
from tformer_cli.errors import TformerError
from tformer_cli.model import build_model
from tformer_cli.run import cast_weights
from tformer_cli.tokenizer import EOS_ID

# On CUDA every search here runs through CUDA graphs: a capture that fails (a host read inside the step, an
# operation a graph cannot hold) would fall back to eager steps with the same answers; here it fails the test.
pytestmark = pytest.mark.filterwarnings("error:decoding without CUDA graphs:RuntimeWarning")


def _model(device, **kw):
    return tiny_translator(device, **{"share_all_embeddings": True, "norm_placement": "pre", **kw})


def _same(got, want):
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    for g, w in zip(got, want, strict=True):
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-4)
        assert [h.logprob for h in g] == pytest.approx([h.logprob for h in w], abs=1e-4)


CASES = [
    ("sinusoidal", None, "pre", "scaled_dot"),
    ("learned", 1, "post", "scaled_dot"),
    ("rope", 2, "pre", "scaled_dot"),
    ("alibi", None, "post", "scaled_dot"),
    ("sinusoidal", None, "pre", "additive"),
]


@pytest.mark.parametrize("pos, n_kv_heads, norm, score", CASES)
def test_static_greedy_gives_greedys_hypotheses(pos, n_kv_heads, norm, score, device):
    m = _model(device, pos=pos, n_kv_heads=n_kv_heads, norm_placement=norm, attention_score=score)
    src = padded_sources(device)  # 5 sentences: padded to 8 rows, the 3 extra finished from the start
    want = greedy(m, src, SearchSettings(max_len_b=6))
    got = static_greedy(m, src, SearchSettings(max_len_b=6))
    _same([[h] for h in got], [[h] for h in want])
    assert len({len(h.tokens) for h in want}) > 1  # sentences ended at different steps


@pytest.mark.parametrize("pos, n_kv_heads, norm, score", CASES)
@pytest.mark.parametrize("beam", [1, 3, 4])
def test_static_beam_search_gives_beam_searchs_hypotheses(pos, n_kv_heads, norm, score, beam, device):
    m = _model(device, pos=pos, n_kv_heads=n_kv_heads, norm_placement=norm, attention_score=score)
    src = padded_sources(device)
    want = beam_search(m, src, SearchSettings(beam=beam, nbest=beam, max_len_b=6))
    got = static_beam_search(m, src, SearchSettings(beam=beam, nbest=beam, max_len_b=6))
    _same(got, want)
    assert len({len(hyps[0].tokens) for hyps in want}) > 1


@pytest.mark.parametrize("alpha, min_len, a, b", [(0.0, 0, 1.0, 6), (1.0, 4, 0.0, 9), (0.6, 0, 2.0, 2)])
def test_static_searches_follow_length_penalty_min_len_and_limits(alpha, min_len, a, b, device):
    m, src = _model(device), padded_sources(device, seed=3, n=6)
    _same(
        static_beam_search(
            m, src, SearchSettings(beam=4, alpha=alpha, max_len_a=a, max_len_b=b, nbest=2, min_new_tokens=min_len - 1)
        ),
        beam_search(
            m, src, SearchSettings(beam=4, alpha=alpha, max_len_a=a, max_len_b=b, nbest=2, min_new_tokens=min_len - 1)
        ),
    )
    _same(
        [[h] for h in static_greedy(m, src, SearchSettings(max_len_a=a, max_len_b=b, min_new_tokens=min_len - 1))],
        [[h] for h in greedy(m, src, SearchSettings(max_len_a=a, max_len_b=b, min_new_tokens=min_len - 1))],
    )


def _eos_first(device):
    """The decoding tests' model with EOS the likeliest next token almost everywhere."""
    m = _model(device)
    eos_bonus = torch.zeros(24, device=device)
    eos_bonus[EOS_ID] = 10.0
    m.lm_head.register_forward_hook(lambda module, inputs, logits: logits + eos_bonus)
    return m


def test_with_eos_the_likeliest_every_hypothesis_ends_exactly_at_min_len(device):
    m, src = _eos_first(device), padded_sources(device)
    for min_len in (1, 3):
        for got in (
            static_greedy(m, src, SearchSettings(max_len_b=9, min_new_tokens=min_len - 1)),
            greedy(m, src, SearchSettings(max_len_b=9, min_new_tokens=min_len - 1)),
        ):
            assert [len(h.tokens) for h in got] == [min_len] * 5
        beams = static_beam_search(m, src, SearchSettings(beam=3, nbest=3, max_len_b=9, min_new_tokens=min_len - 1))
        assert all(len(h.tokens) >= min_len for hyps in beams for h in hyps)
        assert [len(hyps[0].tokens) for hyps in beams] == [min_len] * 5


def test_eos_beyond_a_sentences_room_finishes_nothing_and_a_full_sentence_stops(device, monkeypatch):
    """EOS is the best continuation almost everywhere: a step brings more EOS among a sentence's first K
    candidates than it has room for (K minus those finished); only the first that fit finish, and once
    every sentence has K the search stops, however far the output limit."""
    m = _eos_first(device)
    src = padded_sources(device)
    want = beam_search(m, src, SearchSettings(beam=4, nbest=4, max_len_b=40))
    steps = []
    step = static_graphs.BeamGraph.step
    monkeypatch.setattr(static_graphs.BeamGraph, "step", lambda self: steps.append(1) or step(self))
    # nbest beyond K: what the search kept, all of it
    got = static_beam_search(m, src, SearchSettings(beam=4, nbest=10, max_len_b=40))
    _same(got, want)
    assert all(len(hyps) == 4 for hyps in got)
    assert max(len(h.tokens) for hyps in want for h in hyps) <= 3  # every sentence is done within 3 steps ...
    assert 0 < len(steps) < 2 * static.CHECK_EVERY  # ... and the search stops at the next check, not at 47 steps


def test_a_batch_carries_nothing_into_the_next(device):
    """The same graph (shape) decodes a long batch, then a short one: as if the short one came first."""
    m = _model(device)
    long_src, short_src = padded_sources(device, seed=4), padded_sources(device, seed=5)
    short_src[:, 4:] = 0
    fresh = static_beam_search(_model(device), short_src, SearchSettings(beam=3, nbest=3, max_len_b=6))
    static_beam_search(m, long_src, SearchSettings(beam=3, nbest=3, max_len_b=6))
    static_greedy(m, long_src, SearchSettings(max_len_b=6))
    _same(static_beam_search(m, short_src, SearchSettings(beam=3, nbest=3, max_len_b=6)), fresh)
    _same(
        [[h] for h in static_greedy(m, short_src, SearchSettings(max_len_b=6))],
        [[h] for h in greedy(m, short_src, SearchSettings(max_len_b=6))],
    )
    assert len(static_graphs._graphs[m]) == 2  # one shape for beam search, one for greedy: reused


class _HostReads(TorchDispatchMode):
    """Counts the operations that make the host wait for the device: a value read (`int()`, `bool()`; under
    inference mode `item` and `is_nonzero`), a data-dependent shape. (`tolist` is not dispatched: not seen.)"""

    SYNCING = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.nonzero", "aten.masked_select")

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(str(func).startswith(name + ".") or str(func) == name for name in self.SYNCING):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_the_static_searches_read_the_device_only_where_a_batch_may_end():
    m, src = _model("cpu"), padded_sources("cpu")
    steps = 7 + 40  # the output limit: source length + b
    for search in (
        lambda: static_greedy(m, src, SearchSettings(max_len_b=40, min_new_tokens=39)),
        lambda: static_beam_search(m, src, SearchSettings(beam=4, max_len_b=40, min_new_tokens=39)),
    ):
        search()  # the graph is made outside the count
        with _HostReads() as reads:
            search()
        # the output limit, the encoder's "is there padding?" (once per batch), then one read per check
        assert 0 < reads.count <= 2 + steps // static.CHECK_EVERY
    with _HostReads() as reads:
        greedy(m, src, SearchSettings(max_len_b=40, min_new_tokens=39))
    assert reads.count >= steps  # the dynamic path reads every step (what this path removes)


class _Operations(TorchDispatchMode):
    """Counts the operations run outside the graph's step runner (what a CUDA graph would not hold)."""

    def __init__(self):
        super().__init__()
        self.outside, self.inside = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.outside += not self.inside
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("beam", [None, 4])
def test_a_search_runs_its_whole_step_in_the_graph_s_runner(beam, monkeypatch):
    """The choice of the next tokens and the bookkeeping are in the captured step with the decoder's: outside
    it, a fixed number of operations per batch and one read per check, however many steps."""
    from tformer_cli.decoding.cuda_graphs import StepRunner

    m, src = _model("cpu"), padded_sources("cpu")
    search = static_greedy if beam is None else static_beam_search
    run_step = StepRunner.__call__
    counted = {}
    for b in (8, 40):  # 15 and 47 steps
        settings = SearchSettings(beam=beam or 1, max_len_b=b, min_new_tokens=b - 1)
        search(m, src, settings)  # the graph is made outside the count
        with _Operations() as ops:

            def inside(runner, ops=ops):
                ops.inside = True
                try:
                    return run_step(runner)
                finally:
                    ops.inside = False

            monkeypatch.setattr(StepRunner, "__call__", inside)
            search(m, src, settings)
        counted[b] = ops.outside
    # 32 more steps: 8 more checks (`all` or `any`, then its read), nothing per step (greedy's eager
    # bookkeeping was ~28 operations a step; beam search's ~86)
    assert counted[40] - counted[8] <= 2 * (47 - 15) // static.CHECK_EVERY + 2


@pytest.mark.parametrize("pos", POSITIONS)
def test_static_generate_gives_generates_tokens(pos, device):
    m = tiny_lm(pos).to(device)
    prompt = torch.randint(1, 50, (3, 6), device=device)
    prompt[1, :2] = 0  # a left-padded prompt
    for kw in ({}, {"temperature": 0.8, "top_k": 10}, {"temperature": 1.0, "top_p": 0.9}):
        want = generate(m, prompt, SearchSettings(max_new_tokens=20, seed=7, **kw))
        got = static_generate(m, prompt, SearchSettings(max_new_tokens=20, seed=7, **kw))
        assert torch.equal(got, want)


def test_static_generate_stops_where_generate_stops_and_streams_the_same_tokens(device):
    m = tiny_lm("rope").to(device)
    with torch.no_grad():
        m.lm_head.weight[7] *= 4.0  # token 7 plays EOS: likely, so rows end early and at different steps
    prompt = torch.randint(1, 50, (2, 5), device=device)
    for eos in (7, 3):
        dynamic_stream, static_stream = [], []
        want = generate(
            m,
            prompt,
            SearchSettings(max_new_tokens=30, eos_id=eos),
            on_token=lambda t, seen=dynamic_stream: seen.append(t.tolist()),
        )
        got = static_generate(
            m,
            prompt,
            SearchSettings(max_new_tokens=30, eos_id=eos),
            on_token=lambda t, seen=static_stream: seen.append(t.tolist()),
        )
        assert torch.equal(got, want)
        assert static_stream == dynamic_stream
    assert want.size(1) < 5 + 30 or eos == 3


def test_the_static_paths_run_on_another_device_than_the_cpu():
    """Their buffers, caches, states and steps are made on the model's device: on the meta device, which
    fails where a CPU tensor is mixed in as CUDA does (tests/unit/meta_device.py), every step of each runs."""
    m, src, lms = _model("cpu"), padded_sources("cpu"), [tiny_lm(pos) for pos in POSITIONS]
    prompt = torch.randint(1, 50, (3, 6))
    with OffTheCpu(answer=False, number=12) as reads:  # no batch ever done; an output limit of 12
        m, src, prompt = m.to(META), src.to(META), prompt.to(META)  # moved here: tied weights stay tied
        lms = [lm.to(META) for lm in lms]
        static_greedy(m, src, SearchSettings())
        static_beam_search(m, src, SearchSettings(beam=4, nbest=2))
        for lm in lms:
            static_generate(lm, prompt, SearchSettings(max_new_tokens=10, eos_id=EOS_ID))
            static_generate(lm, prompt, SearchSettings(max_new_tokens=10, temperature=0.8, top_k=10, top_p=0.9))
    assert reads.reads > 0  # the end of each search read its results


def _outcome(search, *args, **kw):
    try:
        return [[h.tokens for h in hyps] if isinstance(hyps, list) else hyps.tokens for hyps in search(*args, **kw)]
    except TformerError as e:
        return str(e)


def test_a_position_table_shorter_than_the_output_takes_the_dynamic_path(device):
    """The entry points (decoding/api.py) decide: the fixed-shape path where the output fits its static cache,
    else the dynamic one; the fixed-shape searches alone refuse what does not fit."""
    m, src = _model(device, pos="learned", max_len=12), padded_sources(device)  # sources of 7
    # b=6: up to 13 output steps and BOS, more than the 12 learned positions: the dynamic path decodes
    settings = SearchSettings(static="always", max_len_b=6, eos_id=EOS_ID)
    _same(
        api.translate_batch(m, src, dataclasses.replace(settings, beam=1)),
        [[h] for h in greedy(m, src, SearchSettings(max_len_b=6))],
    )
    _same(
        api.translate_batch(m, src, dataclasses.replace(settings, beam=3)),
        beam_search(m, src, SearchSettings(beam=3, max_len_b=6)),
    )
    assert not static_graphs._graphs.get(m)  # no static graph was made
    for search in (static_greedy, static_beam_search):
        with pytest.raises(ValueError, match="do not fit"):
            search(m, src, settings)
    # b=4: 12 steps fit; the sources are padded to 12, not 16
    got = api.translate_batch(m, src, dataclasses.replace(settings, beam=1, max_len_b=4))
    _same(got, [[h] for h in greedy(m, src, SearchSettings(max_len_b=4))])
    assert [key[2:4] for key in static_graphs._graphs[m]] == [(12, 12)]
    lm = tiny_lm("learned", max_len=16).to(device)
    prompt = torch.randint(1, 50, (1, 6), device=device)
    with pytest.raises(TformerError, match="longer than the learned positions' maximum 16"):
        api.generate(
            lm, prompt, dataclasses.replace(settings, max_new_tokens=11)
        )  # 17 steps: the dynamic path, which says so (as `generate` does)
    assert not static_graphs._graphs.get(lm)
    fitting = dataclasses.replace(settings, max_new_tokens=8)  # 14 steps fit in 16
    assert torch.equal(
        api.generate(lm, prompt, fitting), generate(lm, prompt, SearchSettings(max_new_tokens=8, eos_id=EOS_ID))
    )
    assert static_graphs._graphs[lm]


def test_decode_static_setting():
    assert use_static("auto", torch.device("cuda")) and not use_static("auto", torch.device("cpu"))
    assert use_static("always", torch.device("cpu")) and not use_static("never", torch.device("cuda"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.cuda)])
def test_half_weights_give_the_dynamic_paths_hypotheses_up_to_rounding(dtype, device):
    """In bf16 or fp16 the two paths sum attention over different spans (the whole cache, masked, or the steps
    so far): rounding may differ, rarely the tokens. (fp16: CUDA only, as `decode.precision=fp16`.)"""
    if dtype == torch.float16 and device.type != "cuda":
        pytest.skip("fp16 decoding is for CUDA")
    m = _model(device)
    cast_weights(m, dtype)
    greedy_same = beam_same = total = 0
    for seed in range(5):
        src = padded_sources(device, seed=seed, n=8)
        want, got = greedy(m, src, SearchSettings(max_len_b=10)), static_greedy(m, src, SearchSettings(max_len_b=10))
        greedy_same += sum(w.tokens == g.tokens for w, g in zip(want, got, strict=True))
        want_b, got_b = (
            beam_search(m, src, SearchSettings(beam=4, max_len_b=10)),
            static_beam_search(m, src, SearchSettings(beam=4, max_len_b=10)),
        )
        beam_same += sum(w[0].tokens == g[0].tokens for w, g in zip(want_b, got_b, strict=True))
        total += src.size(0)
    assert greedy_same >= 0.9 * total and beam_same >= 0.85 * total, (greedy_same, beam_same, total)
    assert static_graphs._graphs[m] and next(iter(static_graphs._graphs[m]))[4] == dtype


def test_batches_are_padded_to_few_sentence_counts_with_at_most_a_third_padding():
    allowed = {1} | {2**k for k in range(1, 12)} | {3 * 2**k for k in range(0, 11)}
    buckets = [static.sentence_bucket(n) for n in range(1, 1025)]
    for n, bucket in enumerate(buckets, start=1):
        assert bucket >= n and bucket in allowed and 3 * (bucket - n) <= bucket, (n, bucket)
    assert len(set(buckets)) == 20  # 1, 2, 3, 4, 6, 8, ..., 768, 1024


def test_the_lstm_generates_on_its_own_path(device):
    """A recurrent model has no key/value cache to fix: `api.generate` hands it to the dynamic `generate`."""
    torch.manual_seed(0)
    lstm = build_model("lstm", vocab_size=50, d_model=16, n_layers=1, dropout=0.0).eval().to(device)
    prompt = torch.randint(1, 50, (2, 4), device=device)
    got = api.generate(lstm, prompt, SearchSettings(static="always", max_new_tokens=6, eos_id=EOS_ID))
    assert torch.equal(got, generate(lstm, prompt, SearchSettings(max_new_tokens=6, eos_id=EOS_ID)))
    with pytest.raises(ValueError):
        static_generate(lstm, prompt, SearchSettings(max_new_tokens=6))
    assert not static_graphs._graphs.get(lstm)


def test_a_model_and_its_graphs_are_freed_together(device):
    import gc
    import weakref

    m = _model(device)
    static_beam_search(m, padded_sources(device), SearchSettings(beam=2, max_len_b=4))
    static_greedy(m, padded_sources(device), SearchSettings(max_len_b=4))
    assert len(static_graphs._graphs[m]) == 2
    gone = weakref.ref(m)
    del m
    gc.collect()
    assert gone() is None  # no graph keeps its model (and the model's buffers) alive


def test_a_failed_graph_capture_warns_once_and_steps_eagerly():
    """Where capture fails (here: no CUDA at all, or an operation a graph cannot hold), the step still runs."""
    import warnings

    from tformer_cli.decoding.cuda_graphs import StepRunner

    calls = []
    counter = torch.zeros((), device="cuda" if torch.cuda.is_available() else "cpu")  # a host read of it syncs

    def step():
        calls.append(1)
        if not torch.cuda.is_available():
            return counter.add_(1).clone()
        raise_in_capture = torch.cuda.is_current_stream_capturing()
        if raise_in_capture:
            counter.item()  # a host read: not allowed while capturing
        return counter.add_(1).clone()

    runner = StepRunner(step, graph=True, state=[counter])
    with pytest.warns(RuntimeWarning, match="decoding without CUDA graphs .* decode.static=never"):
        first = runner()
    assert not runner.use_graph and runner.graph is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second capture
        assert float(runner()) == float(first) + 1 and len(calls) >= 2


def test_the_capture_failure_is_said_in_one_line(monkeypatch):
    """CUDA's errors run over several lines ("CUDA error: ...", then "Search for ...", "For debugging ..."): the
    warning quotes the first, so that it stays one line (and a pattern over it matches, as on a GPU)."""
    from tformer_cli.decoding.cuda_graphs import StepRunner

    def fail():
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nSearch for `cudaError`")

    runner = StepRunner(lambda: torch.ones(()), graph=True, state=[])
    monkeypatch.setattr(runner, "_capture", fail)
    with pytest.warns(RuntimeWarning) as caught:
        runner()
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message and "capture failed: RuntimeError: CUDA error: operation not permitted" in message
    assert message.endswith("decode.static=never takes the dynamic path")


def test_a_capture_that_fails_in_its_warm_up_restores_the_state_for_the_eager_step(monkeypatch):
    """A warm-up run that fails after changing the state (e.g. out of memory on the second): the eager step
    that follows starts from the state as it was. (CUDA's streams are stood in for, so this runs anywhere.)"""
    import contextlib

    from tformer_cli.decoding.cuda_graphs import StepRunner

    class _Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    counter, calls = torch.zeros(()), []

    def step():
        calls.append(1)
        counter.add_(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return counter.clone()

    runner = StepRunner(step, graph=True, state=[counter])
    with pytest.warns(RuntimeWarning, match="capture failed: RuntimeError: out of memory"):
        assert float(runner()) == 1.0  # not 3.0: the two warm-up runs' changes undone
    assert float(runner()) == 2.0 and len(calls) == 4
