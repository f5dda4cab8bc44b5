"""No traceback, ever, and `internal error` only for real bugs: the inputs a hostile probe found.

Closed stdin, empty files, integers past 64 bits, a temperature that underflows, recipes nested 5,000 deep or
holding a NUL byte, and writes that hit the file-size limit (as a full disk does) each end in one `error:`
line with exit 1, or work.
"""

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import _all_keys
from tformer_cli.schema import Config

runner = CliRunner()
ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes/tiny_classifier.yaml")


def _one_error_line(result, *parts):
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "internal error" not in lines[0] and "Traceback" not in result.output
    for part in parts:
        assert part in lines[0], (part, lines[0])


def _cli(*args, stdin=None):
    return runner.invoke(app, [str(a) for a in args], input=stdin)


@pytest.mark.parametrize("command", ["translate", "generate"])
def test_closed_stdin_is_one_line(translation_run, lm_run, command):
    run = translation_run / "runs/mt" if command == "translate" else lm_run / "runs/lm"
    shell = 'exec "$0" "$@" <&-'  # fd 0 closed: Python starts with sys.stdin None
    args = ["sh", "-c", shell, sys.executable, "-m", "tformer_cli", command, str(run)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines[-1].startswith("error: stdin is closed"), result.stderr
    assert "Traceback" not in result.stderr


def test_scoring_empty_files_is_one_line(tmp_path):
    (tmp_path / "empty").write_text("")
    _one_error_line(_cli("bleu", tmp_path / "empty", "--ref", tmp_path / "empty"), "nothing to score")


def test_integers_past_64_bits_are_refused_for_every_integer_key():
    int_keys = [key for key, annotation in _all_keys_typed() if "int" in annotation]
    assert len(int_keys) > 20
    for key in int_keys:
        for value in (2**63, -(2**63) - 1, 10**40):
            _one_error_line(_cli("check", TINY, f"{key}={value}"), key, "64-bit integer")


def _all_keys_typed():
    import dataclasses
    import typing

    def walk(cls, prefix=""):
        for field in dataclasses.fields(cls):
            hint = typing.get_type_hints(cls)[field.name]
            if dataclasses.is_dataclass(hint):
                yield from walk(hint, f"{prefix}{field.name}.")
            else:
                yield f"{prefix}{field.name}", str(hint)

    keys = list(walk(Config))
    assert {k for k, _ in keys} <= set(_all_keys(Config))
    return keys


def test_a_temperature_that_underflows_still_samples(lm_run):
    for temperature in ("1e-30", "1e-300", "5e-324"):
        result = _cli("generate", lm_run / "runs/lm", "--prompt", "the", f"decode.temperature={temperature}")
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("model: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("model: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "nested too deeply"),
        ("model:\n  d_model: 3\x00\n", "character '\\x00' at position 19"),
        ("".join(" " * i + "a:\n" for i in range(1500)) + " " * 1500 + "b: 1\n", "nested too deeply"),
    ],
)
def test_hostile_recipes_are_one_line(tmp_path, text, says):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    _one_error_line(_cli("check", recipe), says)
    _one_error_line(_cli("check", TINY, "model.d_model=" + "[" * 5000 + "]" * 5000), "nested too deeply")


@pytest.fixture
def file_size_limit():
    """Writes past 64 KiB fail as on a full disk (EFBIG; Python ignores SIGXFSZ), for this test only."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_the_file_size_limit_in_export_average_and_saving_is_one_line(translation_run, tmp_path, file_size_limit):
    run = translation_run / "runs/mt"
    _one_error_line(_cli("export", run, "-o", tmp_path / "w.safetensors"), "w.safetensors: File too large")
    _one_error_line(_cli("average", run, "--last", "2", "-o", tmp_path / "avg.pt"), "avg.pt: File too large")
    hf = _cli("export", run, "--format", "hf", "-o", tmp_path / "hf")  # transformers draws a progress bar first
    assert hf.exit_code == 1 and hf.stderr.strip().splitlines()[-1].endswith("hf: File too large"), hf.stderr
    assert [line for line in hf.stderr.splitlines() if "error" in line] == hf.stderr.strip().splitlines()[-1:]
    train = _cli("train", TINY, f"run.out_dir={tmp_path}/runs", "train.epochs=1", "model.d_model=64", "model.d_ff=256")
    lines = train.stderr.strip().splitlines()
    assert train.exit_code == 1 and lines[-1].startswith("error: ") and "File too large" in lines[-1], train.output
    assert "internal error" not in train.output and "Traceback" not in train.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no export, no average, no temporary
    assert not list(tmp_path.rglob("*.tmp"))


def test_usage_errors_are_one_line_and_help_is_not_an_error():
    _one_error_line(_cli("perplexity", "--stride", "x"), "Invalid value for '--stride'", "perplexity --help)")
    _one_error_line(_cli("eval", "--bogus"), "No such option: --bogus")
    _one_error_line(_cli("nocommand"), "No such command 'nocommand'")
    _one_error_line(_cli("average"), "Missing argument")
    for args in ([], ["--help"], ["eval", "--help"]):
        result = _cli(*args)
        assert result.exit_code == 0 and "Usage" in result.stdout and not result.stderr, result.output


def test_attention_refuses_an_empty_text_and_text_with_example(lm_run, tmp_path):
    run, png = lm_run / "runs/lm", tmp_path / "maps.png"
    for text in ("", "  \t "):
        _one_error_line(_cli("attention", run, "--text", text, "-o", png), "--text is empty")
    _one_error_line(_cli("attention", run, "--text", "the cat", "--example", "0", "-o", png), "not both")
    assert not png.exists()
