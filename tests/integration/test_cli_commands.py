"""The command table: each command does one job (eval a run, bleu of two files, perplexity of a text), old spellings
name the command that does their job now, fixed choices are refused by the parser, and the device is the override
run.device. The table stays a table: cli.py small, no command module importing another."""

import ast
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import tformer_cli as tformer
from tformer_cli.cli import COMMANDS, app
from tformer_cli.errors import TformerError
from tformer_cli.run import load_run

runner = CliRunner()
PACKAGE = Path(__file__).parents[2] / "tformer_cli"
SHARED = {"options", "recipe"}  # what the command modules share; not commands themselves


def _ok(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _refused(args: list, line: str) -> None:
    """Exit 1 with exactly one stderr line, `error: ` then `line`, and nothing on stdout."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [f"error: {line}"], result.stderr
    assert result.stdout == ""


def _numbers(text: str, pattern: str) -> tuple[float, ...]:
    match = re.search(pattern, text)
    assert match, text
    return tuple(float(x.replace(",", "")) for x in match.groups())


def test_cli_is_a_table_of_commands_that_import_no_other_command():
    assert len((PACKAGE / "cli.py").read_text().splitlines()) <= 350
    for path in sorted((PACKAGE / "commands").glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:  # `from tformer_cli.commands import bleu` too
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        others = {m.split(".")[2] for m in imported if m and m.startswith("tformer_cli.commands.")} - SHARED
        assert others == set(), f"{path.name} imports the command modules {others}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_help_states_what_it_reads_writes_and_prints(command):
    result = runner.invoke(app, [command, "--help"])
    text = " ".join(result.stdout.split()).lower()
    assert result.exit_code == 0 and "reads " in text and "writes " in text, text
    assert "prints " in text or "stdout" in text, text


def test_bleu_scores_a_hypothesis_file_against_its_reference(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("the cat sat on the mat\na dog is in the house\nthe house\n")  # shorter: BLEU is not symmetric
    ref.write_text("the cat sat on a mat\nthe dog is in the house\nthe house is red\n")
    expected = tformer.evaluate_translations(hyp, ref, "three")
    stdout = _ok("bleu", hyp, "--ref", ref, "--test-set", "three")
    assert stdout.splitlines()[0] == "test set: three (3 lines)"
    assert f"BLEU {expected['bleu']:.2f}  signature: {expected['bleu_signature']}" in stdout
    assert f"chrF {expected['chrf']:.2f}  signature: {expected['chrf_signature']}" in stdout
    assert f"TER {expected['ter']:.2f}  signature: {expected['ter_signature']}" in stdout


def test_perplexity_of_a_text_is_the_models(lm_run):
    run, text = lm_run / "runs/lm", lm_run / "valid.txt"
    stdout = _ok("perplexity", run, text, "--stride", "16", "run.device=cpu")
    expected = tformer.load(run, device="cpu").perplexity(text, stride=16)
    assert f"{text}: {expected['tokens']:,} tokens" in stdout and "sliding window 32, stride 16" in stdout
    per_token, per_word = _numbers(stdout, r"perplexity per token ([\d.]+)\s+per word ([\d.]+)")
    assert (per_token, per_word) == (round(expected["ppl_token"], 2), round(expected["ppl_word"], 2))


def test_eval_scores_a_runs_own_split_and_given_files(lm_run, translation_run):
    stdout = _ok("eval", lm_run / "runs/lm", "run.device=cpu")
    assert stdout.splitlines()[0].startswith("checkpoint: ") and "validation loss: " in stdout
    mt = translation_run / "runs/mt"
    src, ref = translation_run / "valid.en", translation_run / "valid.de"
    stdout = _ok("eval", mt, "--src", src, "--ref", ref, "--test-set", "valid", "decode.beam=1", "run.device=cpu")
    expected = tformer.load(mt, device="cpu").evaluate(src, ref, test_set="valid", beam=1)
    assert f"BLEU {expected['bleu']:.2f}  signature: " in stdout


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["eval", "--hyp", "h.txt", "--ref", "r.txt"], "`tformer eval --hyp` is now `tformer bleu HYP --ref REF`"),
        (["eval", "RUN", "--text", "t.txt"], "`tformer eval --text` is now `tformer perplexity RUN TEXT"),
        (["eval", "RUN", "--stride", "8"], "`tformer eval --stride` is now `tformer perplexity RUN TEXT"),
        (["eval", "RUN", "--first-tokens", "8"], "`tformer eval --first-tokens` is now `tformer perplexity RUN TEXT"),
        (
            ["translate", "RUN", "--device", "cuda"],
            "`tformer translate --device cuda` is now the override run.device=cuda",
        ),
        (["eval", "RUN", "--device=cpu"], "`tformer eval --device cpu` is now the override run.device=cpu"),
    ],
)
def test_an_old_spelling_names_what_replaced_it_in_one_line(old, new):
    result = runner.invoke(app, old)
    assert result.exit_code == 1 and result.stdout == "", result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {new}"), line


@pytest.mark.parametrize(
    ("args", "option", "choices"),
    [
        (["translate", "RUN", "--engine", "onnx"], "--engine", "'onnx' is not one of 'native', 'ctranslate2'."),
        (["export", "RUN", "-o", "x", "--format", "onnx"], "--format", "'onnx' is not one of 'safetensors', 'hf', "),
        (["translate", "RUN", "--quantization", "int4"], "--quantization", "'int4' is not one of 'int8', "),
        (["eval", "RUN", "--split", "train"], "--split", "'train' is not one of 'valid', 'test'."),
    ],
)
def test_a_choice_outside_its_set_is_refused_by_the_parser_with_the_choices(args, option, choices):
    result = runner.invoke(app, args)  # RUN does not exist: the parser refuses before anything reads it
    assert result.exit_code == 1, result.output
    (error,) = result.stderr.splitlines()
    assert error.startswith(f"error: Invalid value for '{option}'") and choices in error, error


def test_run_device_is_an_override_of_a_trained_run(lm_run):
    run = lm_run / "runs/lm"
    assert _ok("generate", run, "--prompt", "the cat", "run.device=cpu", "decode.max_new_tokens=3").startswith(
        "the cat"
    )
    _refused(
        ["generate", run, "--prompt", "the", "run.device=tpu"],
        "override 'run.device=tpu': run.device expects auto | cpu | cuda, got 'tpu'; did you mean 'cpu'?",
    )


def test_text_on_the_command_line_that_is_not_utf8_is_refused_in_one_line(lm_run):
    # a shell passes `--prompt $'the \xff'` as bytes; Python keeps the byte it cannot decode as a lone surrogate
    run = lm_run / "runs/lm"
    _refused(
        ["generate", run, "--prompt", "the \udcff", "run.device=cpu"],
        "--prompt: not valid UTF-8 (byte 0xff at character 5)",
    )
    _refused(
        ["attention", run, "--text", "a \udcfe b", "-o", str(lm_run / "a.png")],
        "--text: not valid UTF-8 (byte 0xfe at character 3)",
    )
    assert not (lm_run / "a.png").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of cuda needs a machine without it")
def test_run_device_takes_the_place_of_the_device_argument(lm_run):
    with pytest.raises(TformerError, match=r"cuda asked for \(run.device\) but no CUDA device"):
        load_run(lm_run / "runs/lm", ["run.device=cuda"], device="cpu")


def test_eval_of_a_runs_own_split_refuses_decode_settings_it_would_ignore(lm_run, translation_run):
    _refused(
        ["eval", lm_run / "runs/lm", "decode.beam=2"],
        "decode.beam=2: the run's own split is scored as training scored it, with no decode setting",
    )
    _refused(["eval", lm_run / "runs/lm", "--src", lm_run / "valid.txt"], _TOGETHER)


_TOGETHER = "--src and --ref go together, and score given files instead of the run's --split"


def test_export_refuses_a_device_it_would_not_use():
    _refused(
        ["export", "RUN", "-o", "x", "--format", "hf", "run.device=cuda"],
        "run.device=cuda: export reads the weights on the CPU, as trained; no device applies",
    )
