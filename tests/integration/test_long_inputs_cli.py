"""Long inputs through the CLI are bounded: a megabyte source line is cut to what the model serves,
with one warning naming its line, and the file goes on; a megabyte prompt is continued from its end."""

import time

import pytest
from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app

runner = CliRunner()
MEGABYTE = " ".join(WORDS[i % len(WORDS)] for i in range(250_000))  # ~1 MB, ~300k tokens: the example
LONG = " ".join(WORDS[i % len(WORDS)] for i in range(3_000))  # past 1,024 tokens, quick to decode whole


@pytest.mark.parametrize("line", [LONG, MEGABYTE], ids=["long", "megabyte"])
def test_a_long_source_line_is_cut_and_the_file_goes_on(translation_run, tmp_path, line):
    source = tmp_path / "in.en"
    source.write_text(f"the cat is red\n{line}\na small dog\n")
    out = tmp_path / "out.de"
    start = time.process_time()
    args = ["translate", str(translation_run / "runs/mt"), "-i", str(source), "-o", str(out), "run.device=cpu"]
    result = runner.invoke(app, [*args, "decode.beam=1"])
    assert result.exit_code == 0, result.output
    assert time.process_time() - start < 60  # hours before: a 300k-token source and an output limit past it
    assert len(out.read_text().splitlines()) == 3
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: line 2: "), warnings
    assert "(model.max_len 1,024): translated from its first 1,023 tokens" in warnings[0]


def test_a_long_prompt_is_continued_from_its_end(lm_run):
    args = ["generate", str(lm_run / "runs/lm"), "run.device=cpu", "decode.max_new_tokens=20"]
    result = runner.invoke(app, args, input=LONG)
    assert result.exit_code == 0, result.output
    assert "continuing its last 1,004" in result.stderr


def test_eval_cuts_a_long_source_line_as_translate_does(translation_run, tmp_path):
    """`eval --src` translates through the same bound as `translate` (a sinusoidal model: model.max_len)."""
    source, reference = tmp_path / "in.en", tmp_path / "ref.de"
    source.write_text(f"the cat is red\n{LONG}\n")
    reference.write_text("das katze ist rot\ndas\n")
    args = ["eval", str(translation_run / "runs/mt"), "--src", str(source), "--ref", str(reference)]
    result = runner.invoke(app, [*args, "--test-set", "long", "run.device=cpu", "decode.beam=1"])
    assert result.exit_code == 0, result.output
    assert "warning: line 2: " in result.stderr and "translated from its first 1,023 tokens" in result.stderr
