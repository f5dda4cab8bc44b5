"""Bad input anywhere in the CLI ends in one `error:` line naming what to fix, exit 1, never a traceback.

Exit 2 with "internal error" is the CLI's last resort for a bug: no case here may reach it.
"""

import errno
import re

import pytest
from typer.testing import CliRunner

from tformer_cli.cli import app

runner = CliRunner()


def _fails_in_one_line(args, expected, stdin=None):
    result = runner.invoke(app, [str(a) for a in args], input=stdin)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "internal error" not in lines[0] and "Traceback" not in result.output
    assert expected in lines[0], lines[0]
    return result


def test_translation_run_bad_inputs(translation_run, tmp_path):
    run, valid = translation_run / "runs/mt", translation_run / "valid.en"
    _fails_in_one_line(["translate", run], "<stdin>:2: invalid UTF-8", stdin=b"the cat\n\xff\xfe dog\n")
    _fails_in_one_line(["translate", run, "-i", valid, "-o", tmp_path / "no" / "out.txt"], "does not exist")
    _fails_in_one_line(["translate", run, "-i", valid, "-o", tmp_path], "is a folder")
    _fails_in_one_line(["translate", run, "-i", tmp_path / "missing.txt"], "missing.txt")
    _fails_in_one_line(["generate", run, "--prompt", "hi"], "use `tformer translate`")
    _fails_in_one_line(["perplexity", run, valid], "perplexity needs a language model")
    assert list(tmp_path.iterdir()) == []  # no output file, not even a temporary one


def test_language_model_bad_inputs(lm_run, tmp_path):
    run, valid = lm_run / "runs/lm", lm_run / "valid.txt"
    _fails_in_one_line(["generate", run], "<stdin>:1: invalid UTF-8", stdin=b"\xc3\x28\n")
    _fails_in_one_line(["perplexity", run, valid, "--stride", "33"], "--stride 33: must be in 1..32")
    _fails_in_one_line(["perplexity", run, valid, "--stride", "-1"], "--stride -1")
    (tmp_path / "blank.txt").write_text("\n  \n")
    _fails_in_one_line(["perplexity", run, tmp_path / "blank.txt"], "no text to score")
    _fails_in_one_line(["eval", run, "--src", valid, "--ref", valid], "--src/--ref need seq2seq")
    _fails_in_one_line(["translate", run, "-i", valid], "use `tformer generate`")


def test_file_system_failures_name_the_file(classifier_run, tmp_path):
    (tmp_path / "a_file").write_text("x")
    train = ["train", "recipes/tiny_classifier.yaml", "train.epochs=1"]
    _fails_in_one_line([*train, f"run.out_dir={tmp_path / 'a_file'}"], f"{tmp_path / 'a_file'}")
    _fails_in_one_line(["eval", tmp_path / "nothing"], "no such run directory or checkpoint")
    _fails_in_one_line(["eval", tmp_path / "a_file"], "not a loadable tformer checkpoint")
    _fails_in_one_line(["attention", classifier_run, "-o", tmp_path / "maps.xyz"], "cannot write .xyz files")
    _fails_in_one_line(["attention", classifier_run, "-o", tmp_path / "no" / "maps.png"], "does not exist")


def test_an_unexpected_exception_is_one_line_naming_a_bug_and_debug_shows_it(monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("tformer_cli.config.load_config", broken)
    result = runner.invoke(app, ["check", "recipes/tiny_classifier.yaml"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == (
        "error: internal error (ZeroDivisionError: division by zero); this is a bug in tformer: "
        "please report it with --debug"
    )
    debug = runner.invoke(app, ["--debug", "check", "recipes/tiny_classifier.yaml"])
    assert isinstance(debug.exception, ZeroDivisionError)


@pytest.mark.parametrize("output_is_input", [True, False])
def test_translate_never_empties_its_input_or_a_previous_output(translation_run, tmp_path, output_is_input):
    run = translation_run / "runs/mt"
    source = tmp_path / "src.txt"
    source.write_text("the cat\nsmall house\n")
    if output_is_input:
        _fails_in_one_line(
            ["translate", run, "-i", source, "-o", tmp_path / "." / "src.txt"], "is one of this command's inputs"
        )
        assert source.read_text() == "the cat\nsmall house\n"
    else:
        previous = tmp_path / "out.txt"
        previous.write_text("an earlier translation\n")
        bad = tmp_path / "bad.txt"
        bad.write_bytes(b"the cat\n\xff\n")
        _fails_in_one_line(["translate", run, "-i", bad, "-o", previous, "--force"], "bad.txt:2: invalid UTF-8")
        assert previous.read_text() == "an earlier translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) in (["src.txt"], ["bad.txt", "out.txt", "src.txt"])


def test_each_command_refuses_a_model_kind_it_does_not_serve(classifier_run, lm_run, translation_run, tmp_path):
    lm, lstm, mt = lm_run / "runs/lm", lm_run / "runs/lstm", translation_run / "runs/mt"
    png = tmp_path / "maps.png"
    _fails_in_one_line(["attention", lm, "-o", png], "is a lm model: give the sentence to show with --text")
    _fails_in_one_line(["attention", lstm, "--text", "the cat", "-o", png], "LSTM language model: it has no attention")
    _fails_in_one_line(["attention", mt, "-o", png], "is a seq2seq model: give the sentence to show with --text")
    _fails_in_one_line(["attention", classifier_run, "--text", "x", "-o", png], "is a classifier: it reads no text")
    _fails_in_one_line(["attention", classifier_run, "--example", "100", "-o", png], "examples 0..99")
    _fails_in_one_line(["attention", classifier_run, "--example", "-1", "-o", png], "--example -1")
    _fails_in_one_line(["perplexity", classifier_run, lm_run / "valid.txt"], "is a classifier: it reads no text")
    _fails_in_one_line(["eval", classifier_run, "decode.beam=2"], "decode.beam=2: the run's own split is scored as")
    _fails_in_one_line(["translate", classifier_run, "-i", lm_run / "valid.txt"], "is a classifier")
    _fails_in_one_line(
        ["generate", lstm, "--prompt", "the", "model.d_model=8"],
        "only decode.*, run.threads, run.device can change here",
    )
    assert not png.exists()


def test_files_that_are_not_checkpoints_are_named(tmp_path):
    import torch

    (tmp_path / "text.pt").write_text("hello world\n")
    torch.save({"format": 1, "model": {}, "code": _Foreign()}, tmp_path / "pickled.pt")
    _fails_in_one_line(["eval", tmp_path / "text.pt"], "text.pt: not a loadable tformer checkpoint")
    _fails_in_one_line(
        ["export", tmp_path / "pickled.pt", "-o", tmp_path / "x.safetensors"],
        "pickled.pt: not a loadable tformer checkpoint (the safe loader refused it: Unsupported global",
    )


class _Foreign:
    """A class a checkpoint must not be able to bring in."""


def test_export_never_overwrites_its_checkpoint_and_writes_whole_files(translation_run, tmp_path):
    best = translation_run / "runs/mt/checkpoints/best.pt"
    before = best.read_bytes()
    _fails_in_one_line(["export", best, "-o", best], "is one of this command's inputs")
    _fails_in_one_line(["export", best, "-o", tmp_path], "is a folder")
    assert best.read_bytes() == before
    result = runner.invoke(app, ["export", str(best), "-o", str(tmp_path / "mt.safetensors")])
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["mt.safetensors"]  # no temporary left beside it


def test_a_full_disk_while_saving_names_the_file_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    train = ["train", "recipes/tiny_classifier.yaml", f"run.out_dir={tmp_path}", "train.epochs=1"]
    assert runner.invoke(app, train).exit_code == 0
    best = tmp_path / "tiny_classifier/checkpoints/best.pt"
    before = best.read_bytes()

    def full_disk(state, handle, **kwargs):
        handle.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("tformer_cli.run.checkpoints.torch.save", full_disk)
    result = runner.invoke(app, [*train[:-1], "train.epochs=2"])  # resumes, trains, then cannot save
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"error: .*/tiny_classifier/checkpoints/step_\d+\.pt: No space left on device", last), last
    assert best.read_bytes() == before
    assert not list((tmp_path / "tiny_classifier").rglob("*.tmp"))


def test_eval_option_combinations_that_mean_nothing_are_errors(tmp_path):
    """Options that would be ignored (--src without --ref, --split with them) and the old spellings of the jobs that
    left `tformer eval` (scoring two files, a text's perplexity), each refused in one line naming what to type."""
    f = tmp_path / "f.txt"
    f.write_text("a\n")
    _fails_in_one_line(["eval", tmp_path, "--src", f], "--src and --ref go together")
    _fails_in_one_line(["eval", tmp_path, "--ref", f], "--src and --ref go together")
    _fails_in_one_line(["eval", tmp_path, "--src", f, "--ref", f, "--split", "test"], "instead of the run's --split")
    _fails_in_one_line(["eval", "--hyp", f, "--ref", f], "`tformer eval --hyp` is now `tformer bleu HYP --ref REF`")
    _fails_in_one_line(["eval", tmp_path, "--text", f], "`tformer eval --text` is now `tformer perplexity RUN TEXT")
    _fails_in_one_line(["bleu", f], "Missing option '--ref'")
