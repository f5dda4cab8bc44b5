"""`decode.static` (decoding/static.py) from the commands: the same translations and generations as the dynamic
path, from a trained run; on CUDA, where `auto` takes it, through CUDA graphs."""

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.decoding import static

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("error:decoding without CUDA graphs:RuntimeWarning")  # see test_static.py


@pytest.fixture
def sessions(monkeypatch):
    """The static sessions the commands make (a batch shape each): none means the dynamic path decoded."""
    made = []
    graph_for = static.graph_for

    def counting(*args):
        made.append(args[1:])
        return graph_for(*args)

    monkeypatch.setattr(static, "graph_for", counting)
    return made


def _out(args, input=None):
    result = runner.invoke(app, args, input=input)
    assert result.exit_code == 0, result.output + str(result.exception)
    return result.stdout


def _translations(out: str, device: torch.device) -> list:
    """The lines of `translate`'s output; an n-best line (`i<TAB>score<TAB>text`) with its score to within rounding:
    printed to 4 decimals, and on CUDA the static path's kernels are not the dynamic one's, both multiplying fp32 in
    TF32 (inputs rounded to 2^-11 relative), which moves a score of -10 in its third decimal."""
    rel = 5e-4 if device.type == "cuda" else 0.0
    lines = []
    for line in out.split("\n"):
        fields = line.split("\t")
        if len(fields) == 3:
            line = (fields[0], pytest.approx(float(fields[1]), rel=rel, abs=1e-3), fields[2])
        lines.append(line)
    return lines


@pytest.mark.parametrize("search", [["decode.beam=1"], ["decode.beam=4"], ["decode.beam=3", "decode.nbest=3"]])
def test_translate_static_gives_the_dynamic_paths_translations(translation_run, search, device, sessions):
    tmp = translation_run
    args = ["translate", str(tmp / "runs/mt"), "-i", str(tmp / "valid.en"), f"run.device={device.type}", *search]
    dynamic = _out([*args, "decode.static=never"])
    assert not sessions
    assert _translations(_out([*args, "decode.static=always"]), device) == _translations(dynamic, device)
    assert sessions
    assert len(dynamic.strip().split("\n")) >= len((tmp / "valid.en").read_text().strip().split("\n"))
    sessions.clear()
    auto = _out(args)  # auto: the static path on CUDA only, its step in a CUDA graph there
    assert _translations(auto, device) == _translations(dynamic, device) and bool(sessions) == (device.type == "cuda")


def test_the_static_path_translates_in_batches_without_padded_sentences(translation_run, monkeypatch):
    """Batches cut to the sentence counts the static path runs as they are (2^k, 3 x 2^k): no padded rows but
    in the last batch; the same translations as the dynamic path's batches."""
    sizes = []
    search = static.static_beam_search
    spy = lambda m, s, *a, **kw: sizes.append(s.size(0)) or search(m, s, *a, **kw)  # noqa: E731
    monkeypatch.setattr(static, "static_beam_search", spy)
    tmp = translation_run
    args = ["translate", str(tmp / "runs/mt"), "-i", str(tmp / "valid.en"), "run.device=cpu", "decode.max_tokens=60"]
    assert _out([*args, "decode.static=always"]) == _out([*args, "decode.static=never"])
    assert len(sizes) > 2 and all(static.sentence_bucket(n) == n for n in sizes[:-1]), sizes


@pytest.mark.parametrize("sampling", [[], ["decode.temperature=1.0", "decode.top_p=0.9", "decode.seed=3"]])
def test_generate_static_gives_the_dynamic_paths_text(lm_run, sampling, device, sessions):
    args = ["generate", str(lm_run / "runs/lm"), "--prompt", "the cat", f"run.device={device.type}"]
    args += ["decode.max_new_tokens=20", *sampling]
    dynamic = _out([*args, "decode.static=never"])
    assert not sessions
    assert _out([*args, "decode.static=always"]) == dynamic and dynamic.startswith("the cat")
    assert sessions


def test_an_unknown_decode_static_value_is_refused_in_one_line(translation_run):
    result = runner.invoke(app, ["translate", str(translation_run / "runs/mt"), "decode.static=on"], input="a\n")
    assert result.exit_code == 1 and "decode.static" in result.stderr
    assert len(result.stderr.strip().split("\n")) == 1
