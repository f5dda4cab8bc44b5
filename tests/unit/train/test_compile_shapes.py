"""train.compile in the training loop: one graph per model (no graph break in the training forward), a bounded
number of recompilations over token-budget batches, and train.pad_to_multiple (few batch shapes, the same loss
and metrics). torch.compile runs with backend="eager" (TorchDynamo's capture only): seconds on a CPU."""

import random
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from tiny_models import WORDS
from torch._dynamo.utils import counters

from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.errors import ConfigError, DataError
from tformer_cli.model import build_model
from tformer_cli.train import loop, step
from tformer_cli.train import loss as loss_module
from tformer_cli.train.dist import World
from tformer_cli.train.tasks import make_task

TINY = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.1, attn_dropout=0.1, activation_dropout=0.1)
CPU = torch.device("cpu")


def _inputs(kind: str) -> tuple[torch.Tensor, ...]:
    """A training batch for `kind`, padded (id 0) at the end of some rows."""
    tokens = torch.randint(2, 50, (3, 7))
    tokens[0, 5:] = 0
    if kind != "seq2seq":
        return (tokens,)
    tgt = torch.randint(2, 50, (3, 6))
    tgt[1, 4:] = 0
    return tokens, tgt


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(kind, vocab_size=50, n_classes=4, **TINY).train()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: more threads only wait for each other (and for whatever else the machine runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test counts its own compilations."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------- one graph per model


@pytest.mark.parametrize("kind", ["seq2seq", "lm", "classifier"])
@pytest.mark.parametrize("padded", [True, False])
def test_the_training_forward_compiles_to_one_graph_that_computes_what_eager_does(kind, padded):
    """Eager drops a mask without padding (the fused kernels' fast paths); reading the mask's values would break
    the graph, so compiled code keeps the mask: one graph, the same numbers (dropout's draws included)."""
    model, inputs = _model(kind), _inputs(kind) if padded else tuple(x.clamp_min(2) for x in _inputs(kind))
    graphs = []
    compiled = torch.compile(model, backend=lambda graph, example_inputs: graphs.append(graph) or graph.forward)
    torch.manual_seed(1)
    out = compiled(*inputs)
    assert (len(graphs), dict(counters["graph_break"])) == (1, {})  # the reasons of any break, on failure
    torch.manual_seed(1)
    torch.testing.assert_close(out, model(*inputs), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- the model and its loss


def _graphs_of_training(config, run_dir, monkeypatch) -> dict[str, list[torch.fx.GraphModule]]:
    """The graphs torch.compile captures while `tformer train` runs `config` (TorchDynamo's capture only), by what
    was compiled: "objective" (the model and its loss, step.Objective) and "_piece" (train.loss_chunk's pieces)."""
    graphs = {}

    def compile_(fn, **kwargs):
        name = fn.__name__ if callable(fn) and not isinstance(fn, torch.nn.Module) else "objective"
        return real_compile(fn, backend=lambda gm, _: graphs.setdefault(name, []).append(gm) or gm.forward, **kwargs)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(loss_module, "_compiled_piece", loss_module._CompiledPiece())  # compiled anew here
    monkeypatch.setattr(loss_module, "_outside", None)  # train.loss_chunk's fence, made by the loop as on a first run
    loop.train(config, run_dir)
    return graphs


def _calls(graph: torch.fx.GraphModule) -> set:
    return {node.target for node in graph.graph.nodes if node.op == "call_function"}


@pytest.mark.parametrize("pos", ["sinusoidal", "rope"])  # rope: recipes/multi30k_en_de.yaml compiles it
@pytest.mark.parametrize("chunk", [0, 16])
def test_the_loops_compiled_step_holds_the_forward_pass_and_the_loss_in_one_graph(
    chunk, pos, translation, monkeypatch, tmp_path
):
    """train.compile compiles the model and its loss together (step.Objective): one graph from the embedding to
    the loss, so the compiler can fuse the loss over the logits. train.loss_chunk's pieces run after the graph
    (counted in Python, they would recompile at every token count), each piece compiled on its own: the graph
    ends at the hidden states."""
    config = translation("train.compile=true", "train.max_updates=3", f"train.loss_chunk={chunk}", f"model.pos={pos}")
    graphs = _graphs_of_training(config, tmp_path / "run", monkeypatch)
    model = graphs.pop("objective")
    assert model and all(F.scaled_dot_product_attention in _calls(graph) for graph in model)
    if chunk:
        assert not any(F.cross_entropy in _calls(graph) for graph in model)
        assert list(counters["graph_break"]) and all("train.loss_chunk" in why for why in counters["graph_break"])
        assert list(graphs) == ["_piece"] and 1 <= len(graphs["_piece"]) <= 2  # a piece of one row may get its own
    else:
        assert all(F.cross_entropy in _calls(graph) for graph in model)
        assert dict(counters["graph_break"]) == {} and graphs == {}


def test_the_compiled_objective_updates_as_the_eager_one(translation):
    """AOTAutograd's joint graph of the model and its loss (the backward as the compiler sees it) gives eager's
    loss, statistics and parameters after three updates."""
    task = make_task(translation("model.dropout=0.0", "model.attn_dropout=0.0", "model.activation_dropout=0.0"))

    def three_updates(compile_: bool) -> tuple[list[tuple[float, int, int]], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = task.build_model()
        objective = step.Objective(model, task)
        net = torch.compile(objective, backend="aot_eager") if compile_ else objective
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        engine = step.Engine(
            net, task, optimizer, torch.amp.GradScaler("cpu", enabled=False), CPU, World(), "fp32", 1.0
        )
        stats = [step.update(engine, step.Step([batch], True, 0.5))[0].host() for batch in task.batches(0)[:3]]
        return [(s.loss_sum, s.correct, s.count) for s in stats], [p.detach().clone() for p in model.parameters()]

    (stats, params), (stats_compiled, params_compiled) = three_updates(False), three_updates(True)
    assert [s[1:] for s in stats_compiled] == [s[1:] for s in stats]
    assert [s[0] for s in stats_compiled] == pytest.approx([s[0] for s in stats], rel=1e-5)
    for p, q in zip(params_compiled, params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- token-budget batches


@pytest.fixture(scope="module")
def translation(prepared_pairs):
    """`overrides -> Config` for a prepared corpus of 340 pairs (300 to train) of 1 to 24 words a side."""
    rng = random.Random(0)
    sentences = [[rng.choice(WORDS) for _ in range(rng.randint(1, 24))] for _ in range(340)]
    pairs = [(" ".join(s), " ".join(rng.sample(s, rng.randint(1, len(s))))) for s in sentences]  # other lengths
    return prepared_pairs(pairs, 300, "data.max_len_ratio=30", "model.dropout=0.0", "train.max_tokens=256")


def _lengths(task) -> list[tuple[int, int, int]]:
    """(B, S, T) of every training batch of epoch 0."""
    return [(*src.shape, tgt_in.size(1)) for src, tgt_in, _ in map(task.collate, task.batches(0))]


def test_pad_to_multiple_bounds_the_batch_shapes_within_the_budget(translation):
    """A compile with static shapes (dynamic=False, CUDA graphs) compiles once per (B, S, T): fewer here."""
    plain, padded = make_task(translation()), make_task(translation("train.pad_to_multiple=8"))
    shapes = _lengths(padded)
    assert all(s % 8 == 0 and t % 8 == 0 and b * max(s, t) <= 256 for b, s, t in shapes)  # padding counts
    plain_shapes = _lengths(plain)
    assert len(set(shapes)) < len(set(plain_shapes))
    lengths, plain_lengths = ({n for _, s, t in each for n in (s, t)} for each in (shapes, plain_shapes))
    assert len(lengths) <= max(lengths) // 8 < len(plain_lengths) / 2
    covered = sorted(torch.cat([torch.from_numpy(b) for b in padded.batches(0)]).tolist())
    assert covered == list(range(len(plain.train_src)))  # every pair once


def _compiled_updates(task, monkeypatch) -> int:
    """Train `task` for an epoch as the loop does (step.compiled, step.update); returns the graphs compiled."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda net, **kwargs: real_compile(net, backend="eager", **kwargs))
    model = task.build_model()
    objective = step.Objective(model, task)
    net = step.compiled(objective, task, CPU, "fp32")
    assert net is not objective  # compiled: no fallback to eager
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    engine = step.Engine(net, task, optimizer, torch.amp.GradScaler("cpu", enabled=False), CPU, World(), "fp32", 1.0)
    with torch._dynamo.config.patch(recompile_limit=1000):  # count them all (the default falls back to eager at 8)
        for batch in task.batches(0):
            assert step.update(engine, step.Step([batch], True, 0.01))[1] == "ok"
    return counters["stats"]["unique_graphs"]


def test_token_budget_batches_compile_once(translation, monkeypatch):
    """One graph with dynamic sizes for every (B, S, T), compiled by the check before the first update
    (step.varying_sizes). torch.compile left to itself compiles twice: a graph for the first batch's shapes, then
    one with dynamic sizes at the first new shape. Around a graph break, each piece would compile on its own."""
    task = make_task(translation())
    assert len(set(_lengths(task))) > 20  # shapes that would each compile again with static shapes
    varying = step.varying_sizes(task, task.batches(0)[:8])
    assert varying == [[0, 1], [0, 1], [0, 1]]  # source, decoder input, target: (B, S), (B, T)
    assert _compiled_updates(task, monkeypatch) == 1


def test_a_size_that_never_changes_stays_static(tmp_path):
    """A language model's blocks are all (B, block): no size is marked dynamic, the graph keeps its sizes (the
    epoch's last, shorter batch, if any, recompiles once)."""
    rng = random.Random(0)
    for name, lines in (("train", 300), ("valid", 20)):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(lines))
        (tmp_path / f"{name}.txt").write_text(text + "\n")
    overrides = [
        f"data.train={tmp_path}/train.txt", f"data.valid={tmp_path}/valid.txt", f"data.dir={tmp_path}/data",
        "data.test=null", "tokenizer.vocab_size=40", "data.block_size=16", "train.batch_size=4", "data.workers=1",
    ]  # fmt: skip
    config = load_config(Path(__file__).parents[3] / "recipes/wikitext2_lm.yaml", overrides)
    prepare(config.data, config.tokenizer, log=lambda _: None)
    task = make_task(config)
    assert len(task.batches(0)) > 8
    assert step.varying_sizes(task, task.batches(0)[:8]) == [[], []]


def test_padding_to_a_multiple_leaves_loss_and_metrics_unchanged(translation):
    plain, padded = make_task(translation()), make_task(translation("train.pad_to_multiple=8"))
    torch.manual_seed(0)
    model = plain.build_model().train()  # dropout 0: the same numbers each call
    for batch in plain.batches(0)[:8]:
        assert padded.collate(batch)[0].size(1) % 8 == 0  # padded indeed
        (loss, stats), (loss_padded, stats_padded) = (t.loss_on(model, *t.inputs(batch, CPU)) for t in (plain, padded))
        torch.testing.assert_close(loss_padded, loss, rtol=0, atol=1e-6)
        assert (stats_padded.correct, stats_padded.count) == (stats.correct, stats.count)
    valid = plain.evaluate(model, CPU)
    widths = []
    model.register_forward_hook(lambda module, args, out: widths.extend(x.size(1) for x in args))
    valid_padded = padded.evaluate(model, CPU)
    assert widths and all(width % 8 == 0 for width in widths)  # validation pads as training does
    assert valid_padded.keys() == valid.keys()
    for key, value in valid.items():
        assert valid_padded[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key


# ---------------------------------------------------------------- the key


@pytest.mark.parametrize("value", ["0", "-8"])
def test_pad_to_multiple_below_one_is_refused_in_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"train.pad_to_multiple={value}"])
    message = str(error.value)
    assert f"train.pad_to_multiple must be in [1, 131_072], got {value}" in message and "\n" not in message


def test_a_pair_that_fits_the_learned_positions_only_unpadded_is_refused_before_training(translation):
    task = make_task(translation())
    arrays = (task.train_src, task.train_tgt, task.valid.src, task.valid.tgt)
    longest = max(int(array.lengths.max()) for array in arrays)
    make_task(translation("model.pos=learned", f"model.max_len={longest}"))  # unpadded, every pair fits
    with pytest.raises(DataError) as error:
        make_task(translation("model.pos=learned", f"model.max_len={longest}", f"train.pad_to_multiple={longest + 1}"))
    message = str(error.value)
    padded = f"({longest + 1} padded to a multiple of train.pad_to_multiple={longest + 1})"
    assert f"{padded}, more than model.max_len={longest} (learned positions)" in message
    assert "lower train.pad_to_multiple" in message and "\n" not in message
