"""Generated cases for what must never be lost or silently wrong: folders that might nest, inputs of any length in
every command that feeds a model, a closed standard output in every command, deleted or damaged checkpoint indexes.

As in test_property_cli.py: few derandomized examples, so CI runs the same cases in seconds
(TFORMER_PROPERTY_EXAMPLES=200 explores further). The runs are the session's tiny trained ones.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import typer
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.attention_maps import text_maps
from tformer_cli.cli import app
from tformer_cli.data.manifest import CREATED_BY, MANIFEST
from tformer_cli.errors import TformerError
from tformer_cli.outputs import check_data_dir, check_run_dir
from tformer_cli.run import load_run

EXPLORE = int(os.environ.get("TFORMER_PROPERTY_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=EXPLORE or 6,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.explicit, Phase.generate],
)
FEW = settings(SETTINGS, max_examples=EXPLORE or 3)
runner = CliRunner()


@pytest.fixture(scope="module")
def fast_cli():
    """The command table built once (typer rebuilds it for every invoke)."""
    command = typer.main.get_command(app)
    previous = typer.testing._get_command
    typer.testing._get_command = lambda _app: command
    yield command
    typer.testing._get_command = previous


def _one_line_or_ok(result, where) -> None:
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.output, (where, result.output)
    if result.exit_code != 0:
        assert result.exit_code == 1, (where, result.exit_code, result.stderr, repr(result.exception))
        assert [line for line in lines if line.startswith("error: ")] == lines[-1:], (where, result.stderr)
        assert "internal error" not in lines[-1], (where, lines[-1])


# ---------------------------------------------------------------- folders that might nest

# Where the run and the prepared folder are, relative to one temporary folder; "link" is a symbolic link to "a".
PLACES = ["a", "a/b", "a/b/c", "b", "b/a", "link", "link/b", "a/../b", "b/../a/b"]


def _real(tmp: Path, place: str) -> Path:
    return (tmp / place).resolve()


@SETTINGS
@given(run=st.sampled_from(PLACES), data=st.sampled_from(PLACES))
def test_a_run_and_a_prepared_folder_never_nest(tmp_path_factory, run, data):
    tmp = tmp_path_factory.mktemp("nest")
    (tmp / "a").mkdir()
    (tmp / "link").symlink_to(tmp / "a")
    prepared = tmp / data
    prepared.mkdir(parents=True, exist_ok=True)
    (prepared / MANIFEST).write_text(json.dumps({"created_by": CREATED_BY}))
    real_run, real_data = _real(tmp, run), _real(tmp, data)
    nested = real_run == real_data or real_data in real_run.parents or real_run in real_data.parents
    try:
        check_run_dir(tmp / run)
        refused = False
    except TformerError as exc:
        refused = True
        assert "\n" not in str(exc) and str(real_data) in str(exc)
    assert refused == nested, (run, data)
    if not nested:  # the run is made; now prepare's side: a data.dir at or inside a run is refused
        (real_run / "checkpoints").mkdir(parents=True, exist_ok=True)
        (real_run / "config.yaml").write_text("run: {}\n")
        inside = tmp / run / "data"
        with pytest.raises(TformerError, match="run directory"):
            check_data_dir(inside)
        if real_run not in real_data.parents:
            check_data_dir(tmp / data)


# ---------------------------------------------------------------- inputs of every length


def _text(n_words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


@pytest.fixture(scope="module")
def runs(translation_run, lm_run) -> dict[str, Path]:
    return {"mt": translation_run / "runs/mt", "lm": lm_run / "runs/lm"}


@pytest.fixture(scope="module")
def loaded(runs):
    return {name: load_run(path, device="cpu", cast=False) for name, path in runs.items()}


def _lengths(max_len: int) -> st.SearchStrategy[int]:
    return st.sampled_from([1, max_len - 2, max_len - 1, max_len, max_len + 1]) | st.integers(1, 3 * max_len)


@SETTINGS
@given(data=st.data())
def test_attention_never_shows_a_position_the_model_was_not_trained_for(loaded, data, capsys):
    for name, run in loaded.items():
        max_len = run.config.model.max_len
        n = data.draw(_lengths(max_len), label=f"{name} words")
        capsys.readouterr()
        maps, rows, cols, _ = text_maps(run, _text(n))
        assert all(w.shape[-1] <= max_len and w.shape[-2] <= max_len for _, w in maps), name
        tokens = len(run.tokenizer.encode([_text(n)])[0])
        cut = "more than the model serves" in capsys.readouterr().err
        assert cut == (tokens > (max_len - 1 if name == "mt" else max_len)), (name, n, tokens)


@FEW
@given(data=st.data())
def test_every_command_that_reads_text_takes_any_length_in_one_line(fast_cli, runs, loaded, tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("lengths")
    mt_len, lm_len = (loaded[k].config.model.max_len for k in ("mt", "lm"))
    src = _text(data.draw(_lengths(mt_len), label="source words"))
    ref = _text(data.draw(_lengths(mt_len), label="reference words"))
    prompt = _text(data.draw(_lengths(lm_len), label="prompt words"))
    (tmp / "src").write_text(src + "\n")
    (tmp / "ref").write_text(ref + "\n")
    (tmp / "lm.txt").write_text(prompt + "\n")
    commands = [
        ["translate", str(runs["mt"]), "-i", str(tmp / "src"), "run.device=cpu", "decode.beam=1"],
        ["score", str(runs["mt"]), "--src", str(tmp / "src"), "--ref", str(tmp / "ref"), "run.device=cpu"],
        ["generate", str(runs["lm"]), "--prompt", prompt, "run.device=cpu", "decode.max_new_tokens=2"],
        ["perplexity", str(runs["lm"]), str(tmp / "lm.txt"), "--window", "16", "run.device=cpu"],
    ]
    for args in commands:
        result = runner.invoke(app, args)
        _one_line_or_ok(result, args[0])
        if args[0] == "translate":  # a source the model cannot serve is cut, and the user told
            too_long = len(loaded["mt"].tokenizer.encode([src])[0]) + 1 > mt_len
            assert ("more than the model serves" in result.stderr) == too_long, result.stderr


# ---------------------------------------------------------------- a closed standard output

PRINTING = {
    "translate": lambda r, t: ["translate", str(r["mt"]), "-i", str(t / "src"), "run.device=cpu"],
    "translate -o": lambda r, t: ["translate", str(r["mt"]), "-i", str(t / "src"), "-o", str(t / "out"), "--force"],
    "score": lambda r, t: ["score", str(r["mt"]), "--src", str(t / "src"), "--ref", str(t / "src")],
    "generate": lambda r, t: ["generate", str(r["lm"]), "--prompt", "the", "decode.max_new_tokens=2"],
    "eval": lambda r, t: ["eval", str(r["lm"]), "run.device=cpu"],
    "bleu": lambda r, t: ["bleu", str(t / "src"), "--ref", str(t / "src")],
    "check": lambda r, t: ["check", "recipes/tiny_classifier.yaml"],
    "export": lambda r, t: ["export", str(r["mt"]), "-o", str(t / "m.safetensors"), "--force"],
    "average": lambda r, t: ["average", str(r["mt"]), "--last", "1", "-o", str(t / "a.pt"), "--force"],
    "a typo": lambda r, t: ["translate", str(r["mt"]), "--no-such-option"],
}


def _closed(command, args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", None)  # as Python leaves it when descriptor 1 is closed
        with pytest.raises(SystemExit) as exited:
            command.main(args, prog_name="tformer")
    return exited.value.code, capsys.readouterr().err


@SETTINGS
@given(names=st.lists(st.sampled_from(sorted(PRINTING)), min_size=1, max_size=3, unique=True))
def test_a_closed_stdout_never_loses_a_result_with_exit_0(fast_cli, runs, tmp_path_factory, names, capsys, monkeypatch):
    tmp = tmp_path_factory.mktemp("closed")
    (tmp / "src").write_text("the cat\n")
    for name in names:
        args = PRINTING[name](runs, tmp)
        opened = runner.invoke(app, args)  # the same command with a standard output: what it prints there
        code, err = _closed(fast_cli, args, capsys, monkeypatch)
        lines = err.strip().splitlines()
        assert "Traceback" not in err and code in (0, 1), (name, code, err)
        if opened.stdout:
            assert code == 1, (name, err)  # it had something to print: never exit 0 with it lost
        if code == 1:
            assert lines and lines[-1].startswith("error: ") and "internal error" not in lines[-1], (name, err)


# ---------------------------------------------------------------- deleted or damaged indexes


def _damage_index(index_path: Path, how: str, rng_bytes: bytes) -> str:
    """Damage index.json `how`; return what a reader must do: "ok" or the words of its one-line refusal."""
    index = json.loads(index_path.read_text())
    match how:
        case "deleted":
            index_path.unlink()
            return "ok"
        case "truncated":
            text = index_path.read_text().rstrip()
            index_path.write_text(text[: len(rng_bytes) % len(text)])
            return "index.json is unreadable"
        case "bytes":
            index_path.write_bytes(rng_bytes)
            return "index.json is unreadable"
        case "wrong sha":
            index["files"]["best.pt"]["sha256"] = rng_bytes.hex()[:64].ljust(64, "0")
            index_path.write_text(json.dumps(index))
            return "the index is stale or damaged"
        case "entry dropped":
            del index["files"]["best.pt"]
            index_path.write_text(json.dumps(index))
            return "ok"
    return "ok"  # "intact"


HOWS = ["intact", "deleted", "truncated", "bytes", "wrong sha", "entry dropped"]


def _every_damage(test):
    for how in HOWS:  # each kind of damage at least once, with and without a damaged best.pt
        for damage_best in (False, True):
            test = example(how=how, noise=b"\x7f{", damage_best=damage_best)(test)
    return test


@SETTINGS
@_every_damage
@given(
    how=st.sampled_from(HOWS),
    noise=st.binary(min_size=1, max_size=40),
    damage_best=st.booleans(),
)
def test_a_deleted_or_damaged_index_never_lets_a_damaged_checkpoint_through(
    fast_cli, runs, tmp_path_factory, how, noise, damage_best
):
    tmp = tmp_path_factory.mktemp("index")
    run = tmp / "mt"
    shutil.copytree(runs["mt"], run, ignore=shutil.ignore_patterns("eval_*", "ctranslate2", "*.lock"))
    (tmp / "src").write_text("the cat\n")
    expected = _damage_index(run / "checkpoints/index.json", how, noise)
    if damage_best:
        state = torch.load(run / "checkpoints/best.pt", weights_only=True)
        weights = next(t for t in state["model"].values() if t.is_floating_point())
        weights.view(-1)[: 1 + len(noise)] = float("inf")
        torch.save(state, run / "checkpoints/best.pt")
        if expected in ("ok", "the index is stale or damaged"):
            expected = "checksum"
    result = runner.invoke(app, ["translate", str(run), "-i", str(tmp / "src"), "run.device=cpu"])
    _one_line_or_ok(result, how)
    if expected == "ok":
        assert result.exit_code == 0, (how, result.stderr)
    else:
        assert result.exit_code == 1 and expected in result.stderr, (how, damage_best, result.stderr)
