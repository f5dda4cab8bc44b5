"""The Python API (tformer_cli/api.py): docs/api.md's example runs as written, and each call gives what its command
prints."""

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tformer_cli as tformer
from tformer_cli.cli import app
from tformer_cli.errors import ConfigError, TformerError

runner = CliRunner()
DOC = Path(__file__).parents[2] / "docs" / "api.md"


def _doc_example() -> str:
    """The first python block of docs/api.md (its example, under 10 lines)."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)[1]
    assert len([line for line in code.splitlines() if line.strip()]) < 10
    return code


def _cli_translate(run, lines, *overrides):
    result = runner.invoke(app, ["translate", str(run), "run.device=cpu", *overrides], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_the_docs_example_translates_and_generates_as_the_commands_do(translation_run, lm_run, tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs/multi30k_en_de").symlink_to(translation_run / "runs/mt")
    (tmp_path / "runs/wikitext2_lm").symlink_to(lm_run / "runs/lm")
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_doc_example(), str(DOC), "exec"), {})
    first, greedy, generated = printed.getvalue().rstrip("\n").split("\n", 2)
    sources = ["A man rides a bike.", "Two dogs play in the snow."]
    assert eval(first) == _cli_translate(translation_run / "runs/mt", sources)
    assert eval(greedy) == _cli_translate(translation_run / "runs/mt", sources[:1], "decode.beam=1")
    args = ["generate", str(lm_run / "runs/lm"), "--prompt", "The game", "run.device=cpu"]
    decode = ["decode.max_new_tokens=20", "decode.temperature=0.8", "decode.top_k=40", "decode.seed=1"]
    command = runner.invoke(app, [*args, *decode])
    assert command.exit_code == 0, command.output
    assert generated == command.stdout.rstrip("\n")


def test_score_and_evaluate_give_what_the_commands_print(translation_run):
    run, src, ref = translation_run / "runs/mt", translation_run / "valid.en", translation_run / "valid.de"
    model = tformer.load(run, device="cpu")
    scores = list(model.score(src.read_text().splitlines(), ref.read_text().splitlines()))
    command = runner.invoke(app, ["score", str(run), "--src", str(src), "--ref", str(ref), "run.device=cpu"])
    assert command.exit_code == 0, command.output
    assert [f"{s.line}\t{s.logprob:.4f}\t{s.tokens}" for s in scores] == command.stdout.splitlines()
    result = model.evaluate(src, ref, test_set="api", beam=1)
    hypotheses = _cli_translate(run, src.read_text().splitlines(), "decode.beam=1")
    assert result["decode"]["beam"] == 1
    assert result["bleu"] == tformer.evaluate_translations(hypotheses, ref)["bleu"]
    by_lists = tformer.evaluate_translations(hypotheses, ref.read_text().splitlines())
    assert {k: by_lists[k] for k in ("bleu", "chrf", "ter")} == {k: result[k] for k in ("bleu", "chrf", "ter")}


def test_settings_are_checked_and_a_run_refuses_what_it_cannot_do(translation_run, lm_run):
    model = tformer.load(translation_run / "runs/mt", device="cpu")
    with pytest.raises(ConfigError, match="did you mean 'decode.beam'"):
        model.translate(["the cat"], bem=2)
    with pytest.raises(ConfigError, match="decode.beam"):
        tformer.load(translation_run / "runs/mt", device="cpu", beam=0)
    with pytest.raises(TformerError, match="chosen when loading"):
        model.translate(["the cat"], precision="bf16")
    with pytest.raises(TformerError, match="is a seq2seq model: use `tformer translate`"):
        model.generate("the cat")
    with pytest.raises(TformerError, match="is a lm model: use `tformer generate`"):
        list(tformer.load(lm_run / "runs/lm", device="cpu").translate(["the cat"]))
    assert model.translate(["the cat"], beam=1) == model.translate(["the cat"], beam=1, max_len_b=50)


def test_importing_the_package_does_not_import_torch_until_the_api_is_used():
    code = "import sys, tformer_cli as t; a = 'torch' in sys.modules; t.load; print(a, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
