"""bench/lm_race.py's own logic: the GPT-2 peer and tformer's models scored by the same per-word count, the peer at
the recipe's size, overrides routed to their recipe, the sweep's choice, and the report's files."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import _lm_peer  # noqa: E402
import _lm_report  # noqa: E402
import lm_race  # noqa: E402

from tformer_cli.config import load_config  # noqa: E402
from tformer_cli.model import build_model  # noqa: E402
from tformer_cli.tokenizer import EOS_ID  # noqa: E402

VOCAB, BLOCK = 40, 8
LINES = [" The cat sat on the mat . ", "", " A dog ran , far away . ", " Short ", " x y z w v u t s r q p o n m "]


class CharTokenizer:
    """A tokenizer of one id per character (ids 4 ..): what `evaluate_lm_text` asks of one."""

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [[4 + ord(c) % (VOCAB - 4) for c in line] for line in lines]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def reference_ppl_word(logits_of, lines: list[str]) -> tuple[float, int]:
    """Per-word perplexity written out: the lines' ids one stream, each line followed by an end of line, the stream
    starting after one; cut into blocks of BLOCK predictions; the total NLL over the words, each line's
    line.split() plus its end of line (PyTorch's word_language_model count)."""
    stream = [EOS_ID]
    for row in CharTokenizer().encode(lines):
        stream += row + [EOS_ID]
    ids = torch.tensor(stream)
    nll = 0.0
    for start in range(0, len(stream) - 1, BLOCK):
        block = ids[start : start + BLOCK + 1]
        logits = logits_of(block[None, :-1])[0]  # (T, V)
        nll += F.cross_entropy(logits.double(), block[1:], reduction="sum").item()
    words = sum(len(line.split()) + 1 for line in lines)
    return math.exp(nll / words), words


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_inner=32,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
    )
    return GPT2LMHeadModel(config).eval()


def tiny_tformer():
    torch.manual_seed(0)
    model = build_model("lm", vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=32)
    return model.eval()


@pytest.mark.parametrize("system", ["gpt2", "tformer"])
def test_both_architectures_are_scored_per_word_as_written_out(tmp_path, system):
    text = tmp_path / "test.txt"
    text.write_text("".join(line + "\n" for line in LINES))
    bench = lm_race.Bench({}, [], [1.0], 1.0, tmp_path, 1, valid=text, test=text)
    if system == "gpt2":
        gpt2 = tiny_gpt2()
        model, logits_of = _lm_peer.Scorer(gpt2), lambda x: gpt2(input_ids=x).logits
    else:
        model = tiny_tformer()
        logits_of = model
    with torch.no_grad():
        expected, words = reference_ppl_word(logits_of, LINES)
    scores = lm_race.evaluate(bench, model, CharTokenizer(), BLOCK)
    assert scores["test_words"] == words == 34
    assert scores["test_ppl_word"] == pytest.approx(expected, rel=1e-5)
    assert scores["valid_ppl_word"] == scores["test_ppl_word"]
    # per token: the same NLL over the stream's predictions (characters and ends of line)
    tokens = sum(len(line) + 1 for line in LINES)
    assert scores["test_ppl_token"] == pytest.approx(expected ** (words / tokens), rel=1e-5)


def test_the_peer_is_built_at_the_recipes_size_and_its_checkpoint_loads_back(tmp_path):
    recipe = load_config(lm_race.RECIPES["tformer"], [])
    config = _lm_peer.gpt2_config(recipe, 8000)
    m = recipe.model
    assert (config.n_embd, config.n_layer, config.n_head, config.n_inner, config.n_positions) == (
        m.d_model, m.n_layers, m.n_heads, m.d_ff, m.max_len
    )  # fmt: skip
    assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (m.dropout, m.dropout, m.attn_dropout)
    assert config.vocab_size == 8000 and config.tie_word_embeddings == m.tie_embeddings

    model = tiny_gpt2()
    path = tmp_path / "peer" / "checkpoint.pt"
    _lm_peer.save(model, path)
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no partial file left beside it
    loaded = _lm_peer.load(path)
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, model(input_ids=x).logits)


def test_overrides_reach_their_own_recipe():
    given = ["train.lr=1e-3", "lstm:model.d_model=64", "tformer:model.n_heads=2"]
    bench = lm_race.Bench({}, given, [1], 1, Path(), 1, valid=Path(), test=None)
    assert bench.overrides_for("tformer") == ["train.lr=1e-3", "model.n_heads=2"]
    assert bench.overrides_for("lstm") == ["train.lr=1e-3", "model.d_model=64"]
    assert bench.overrides_for("gpt2") == ["train.lr=1e-3", "model.n_heads=2"]  # the size tformer's recipe sets


def test_the_peer_takes_its_own_overrides_last():
    given = ["gpt2:train.max_updates=7", "train.max_updates=9", "tformer:train.max_updates=8"]
    bench = lm_race.Bench({}, given, [1], 1, Path(), 1, valid=Path(), test=None)
    assert bench.overrides_for("gpt2") == ["train.max_updates=9", "train.max_updates=8", "train.max_updates=7"]
    assert bench.overrides_for("tformer") == ["train.max_updates=9", "train.max_updates=8"]
    assert bench.overrides_for("lstm") == ["train.max_updates=9"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--lr", "gpt2", "fast"], "--lr gpt2 fast: learning rates are numbers"),
        (["--lr", "rnn", "1e-3"], "--lr rnn: the systems raced are tformer, lstm, gpt2"),
        (["--sweep-lr", "lstm"], "--sweep-lr lstm: give one or more learning rates > 0"),
        (["--sweep-lr", "lstm", "1e-3", "-1"], "--sweep-lr lstm: give one or more learning rates > 0"),
    ],
)
def test_a_bad_learning_rate_option_is_refused_in_one_line(argv, said):
    with pytest.raises(SystemExit) as stop:
        lm_race.parse(argv)
    assert str(stop.value).startswith(said)


def mark(valid: float, test: float | None = None) -> _lm_report.Mark:
    return _lm_report.Mark(0.5, 31.0, 40, "ckpt", valid, valid / 10, 100, test, test and test / 10, 120, 1.5)


def test_the_sweep_chooses_the_lowest_validation_perplexity():
    rows = [
        _lm_report.SweepRow("gpt2", 1e-3, 0.5, mark(300.0)),
        _lm_report.SweepRow("gpt2", 2e-3, 0.5, mark(250.0)),
        _lm_report.SweepRow("gpt2", 4e-3, 0.5, mark(280.0)),
        _lm_report.SweepRow("gpt2", 8e-3, 0.5, None, "diverged"),
    ]
    assert _lm_report.best_rate(rows) == 2e-3
    table = _lm_report.sweep_table(rows)
    assert "| HF GPT-2 architecture | 0.002 | 0.5 | 40 | 250.0 | yes |" in table
    assert sum(line.endswith("| yes |") for line in table) == 1
    assert any("failed: diverged" in line for line in table)


def test_the_report_writes_its_table_json_and_plot(tmp_path):
    systems = [
        _lm_report.SystemResult("tformer", 2e-3, "recipe", 5_200_000, 9000.0, [mark(200.0, 190.0), mark(150.0, 140.5)]),
        _lm_report.SystemResult("gpt2", 1e-3, "peer", 5_300_000, 7000.0, [mark(220.0, 210.25)]),
        _lm_report.SystemResult("lstm", 2e-3, error="RuntimeError: boom"),
    ]
    systems[0].marks[1].minutes = 1.0
    report = _lm_report.Report("machine", "cmd", "test (10 words)", "valid", [0.5, 1.0], 1, systems)
    report.sweep = [_lm_report.SweepRow("gpt2", 1e-3, 0.5, mark(230.0))]
    out = tmp_path / "docs" / "race.md"
    _lm_report.write(report, out)

    table = out.read_text()
    assert "| tformer Transformer | 0.002 | 5.20M | 190.0 | 140.5 | 40 / 40 |" in table
    assert "| HF GPT-2 architecture | 0.001 | 5.30M | 210.2 | n/a | 40 / n/a |" in table
    assert "| tformer LSTM | 0.002 | failed: RuntimeError: boom |" in table
    assert "| HF GPT-2 architecture | 0.001 | 0.5 | 40 | 230.0 | yes |" in table
    raw = json.loads(out.with_suffix(".json").read_text())
    assert [s["name"] for s in raw["systems"]] == ["tformer", "gpt2", "lstm"]
    assert raw["systems"][0]["marks"][1]["test_ppl_word"] == 140.5
    assert _lm_report.SystemResult.from_dict(raw["systems"][0]) == systems[0]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_runs_own_process_is_given_the_races_settings(tmp_path):
    valid, test = tmp_path / "valid.txt", tmp_path / "test.txt"
    valid.write_text(" a b\n"), test.write_text(" c d\n")
    given = ["data.block_size=64", "lstm:model.d_model=64", "--minutes", "0.5", "2", "--threads", "3"]
    args = lm_race.parse([*given, "--valid", str(valid), "--test", str(test), "--sweep-lr", "gpt2", "1e-3", "2e-3"])
    bench = lm_race.Bench(lm_race.RECIPES, args.overrides, args.minutes, 2.0, tmp_path, args.threads, valid, test)
    sweep = lm_race.Job("gpt2", 2e-3, [0.5], tmp_path / "sweep" / "gpt2", valid_only=True)
    child = lm_race.parse(lm_race.child_args(args, bench, sweep))
    assert (child.job, child.lr, child.minutes, child.budget) == ("gpt2", {"gpt2": 2e-3}, [0.5], 2.0)
    assert (child.threads, child.work, child.valid, child.test) == (3, sweep.work, valid, None)  # validation only
    config = load_config(lm_race.RECIPES["tformer"])  # whose data.test names a file the sweep's run must not score
    assert child.valid_only and lm_race.texts(child, config) == (valid, None)
    assert child.overrides == ["data.block_size=64", "lstm:model.d_model=64"]
    race = lm_race.Job("lstm", 4e-3, [0.5, 2.0], tmp_path / "lstm")
    child = lm_race.parse(lm_race.child_args(args, bench, race))
    assert (child.job, child.lr, child.minutes, child.test) == ("lstm", {"lstm": 4e-3}, [0.5, 2.0], test)
    assert not child.valid_only and lm_race.texts(child, config) == (valid, test)
