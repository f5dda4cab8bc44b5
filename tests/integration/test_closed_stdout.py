"""A closed or failing standard output, as a Unix tool meets it: one `error:` line and exit 1, or a quiet exit when
the reader of a pipe left; never a traceback, never exit 0 with the result lost."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tformer_cli.cli import app

CLOSED = "standard output is closed"


def _commands(mt: Path, lm: Path, tmp: Path) -> dict[str, list[str]]:
    """Each command that prints its result, on a run it serves."""
    (tmp / "src.txt").write_text("the cat\nthe dog is red\n")
    (tmp / "ref.txt").write_text("die katze\nder hund ist rot\n")
    return {
        "translate": ["translate", str(mt), "-i", str(tmp / "src.txt"), "run.device=cpu"],
        "score": ["score", str(mt), "--src", str(tmp / "src.txt"), "--ref", str(tmp / "ref.txt"), "run.device=cpu"],
        "generate": ["generate", str(lm), "--prompt", "the cat", "run.device=cpu", "decode.max_new_tokens=3"],
        "eval": ["eval", str(lm), "run.device=cpu"],
        "bleu": ["bleu", str(tmp / "ref.txt"), "--ref", str(tmp / "ref.txt")],
        "check": ["check", "recipes/tiny_classifier.yaml"],
        "average": ["average", str(mt), "--last", "2", "-o", str(tmp / "avg.pt"), "--force"],
        "attention": ["attention", str(mt), "-o", str(tmp / "a.png"), "--text", "the cat", "--force"],
        "--version": ["--version"],
    }


@pytest.fixture(scope="module")
def commands(translation_run, lm_run, tmp_path_factory) -> dict[str, list[str]]:
    return _commands(translation_run / "runs/mt", lm_run / "runs/lm", tmp_path_factory.mktemp("stdout"))


def _run_with_closed_stdout(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """The command in this process with sys.stdout as Python leaves it when descriptor 1 is closed: None."""
    command = typer.main.get_command(app)
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", None)
        with pytest.raises(SystemExit) as exited:
            command.main(args, prog_name="tformer")
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["translate", "score", "generate", "eval", "bleu", "check", "average", "attention", "--version"]
)
def test_every_command_refuses_a_closed_stdout_in_one_line(commands, name, capsys, monkeypatch):
    code, err = _run_with_closed_stdout(commands[name], capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 1, (code, err)
    assert lines[-1].startswith("error: ") and CLOSED in lines[-1], err
    assert "Traceback" not in err and "internal error" not in err, err


def _process(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    code = "from tformer_cli.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_real_process_with_descriptor_1_closed(commands):
    """`tformer translate ... >&-`: Python holds None in sys.stdout; the first file opened would be descriptor 1."""
    done = _process(commands["translate"], stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {CLOSED}"), done.stderr


def test_what_a_library_prints_is_refused_too():
    """The help, printed by click: with descriptor 1 closed it went nowhere, exit 0."""
    done = _process(["--help"], stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: {CLOSED}"), done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_standard_output_is_one_line_naming_it(commands):
    with open("/dev/full", "w") as full:
        done = _process(commands["translate"], stdout=full)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: standard output: No space left on device", done.stderr


def test_a_reader_that_left_ends_the_command_quietly(commands):
    """`tformer generate ... | head -c1`: the pipe breaks; exit 141 as a shell reports SIGPIPE, nothing on stderr."""
    args = [*commands["generate"][:-1], "decode.max_new_tokens=400", "decode.temperature=1.0"]
    reader, writer = os.pipe()
    os.close(reader)  # the reader left before the first write
    done = _process(args, stdout=writer)
    os.close(writer)
    assert done.returncode == 141, done.stderr
    assert "error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
