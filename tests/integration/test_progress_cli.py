"""`eval` and `translate -i FILE` say how far they are on stderr (sentences done, time left), and eval files
name every search setting that is not the default, so that results of other settings sit side by side."""

import json
import re

import pytest
from typer.testing import CliRunner

from tformer_cli import log
from tformer_cli.cli import app

runner = CliRunner()
PROGRESS = r"translated (\d+)/(\d+) lines elapsed \d+:\d\d:\d\d eta (\d+:\d\d:\d\d|-:--:--)"


@pytest.fixture
def every_batch(monkeypatch):
    monkeypatch.setattr(log, "EVERY", 0.0)  # a plain line after every batch (30 s apart by default)


def _progress(stderr: str) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for m in re.finditer(PROGRESS, stderr)]


def test_translate_from_a_file_counts_its_lines_and_ends_at_the_total(translation_run, tmp_path, every_batch):
    src = translation_run / "valid.en"
    n = len(src.read_text().splitlines())
    out = tmp_path / "out.de"
    result = runner.invoke(
        app, ["translate", str(translation_run / "runs/mt"), "-i", str(src), "-o", str(out), "decode.max_tokens=64"]
    )
    assert result.exit_code == 0, result.output
    said = _progress(result.stderr)
    assert len(said) >= 3, result.stderr  # several batches of 64 tokens, then the last line
    assert all(total == n for _, total in said) and said[-1][0] == n
    assert [done for done, _ in said] == sorted(done for done, _ in said)
    assert len(out.read_text().splitlines()) == n


def test_translate_from_stdin_says_no_progress(translation_run, every_batch):
    result = runner.invoke(app, ["translate", str(translation_run / "runs/mt")], input="a cat\n")
    assert result.exit_code == 0, result.output
    assert _progress(result.stderr) == []


def test_eval_shows_progress_and_names_its_settings(translation_run, every_batch):
    run = translation_run / "runs/mt"
    src, ref = translation_run / "valid.en", translation_run / "valid.de"
    args = ["eval", str(run), "--src", str(src), "--ref", str(ref), "--test-set", "valid40", "decode.max_tokens=64"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    assert _progress(plain.stderr)[-1] == (40, 40)
    controlled = runner.invoke(app, [*args, "decode.len_penalty=1.0", "decode.no_repeat_ngram=2"])
    assert controlled.exit_code == 0, controlled.output
    assert (run / "eval_valid40_best_beam4.json").is_file()
    saved = json.loads((run / "eval_valid40_best_beam4_lp1_norepeat2.json").read_text())
    assert saved["decode"]["no_repeat_ngram"] == 2 and saved["decode"]["len_penalty"] == 1.0


def test_eval_of_text_counts_tokens(lm_run, every_batch):
    text = lm_run / "valid.txt"
    result = runner.invoke(app, ["perplexity", str(lm_run / "runs/lm"), str(text)])
    assert result.exit_code == 0, result.output
    said = re.findall(r"scored ([\d,]+)/([\d,]+) tokens", result.stderr)
    assert said and said[-1][0] == said[-1][1]


def test_export_takes_decode_overrides_into_the_generation_config(translation_run, tmp_path):
    run = str(translation_run / "runs/mt")
    result = runner.invoke(
        app, ["export", run, "--format", "hf", "-o", str(tmp_path / "hf"), "decode.no_repeat_ngram=3"]
    )
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert config["no_repeat_ngram_size"] == 3 and config["num_beams"] == 4
    refused = runner.invoke(app, ["export", run, "-o", str(tmp_path / "w.safetensors"), "decode.beam=1"])
    assert refused.exit_code == 1 and "decode.* overrides apply to --format hf and ctranslate2" in refused.stderr
    other = runner.invoke(app, ["export", run, "--format", "hf", "-o", str(tmp_path / "hf2"), "model.d_model=8"])
    assert other.exit_code == 1 and len(other.stderr.splitlines()) == 1
