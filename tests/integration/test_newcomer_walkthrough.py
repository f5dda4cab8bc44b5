"""A newcomer's first hour with recipes/multi30k_en_de.yaml, walked off a terminal on a tiny made-up
corpus: the official file names under a data root, `TFORMER_DATA` set once, the commands typed in the folder the
newcomer works in (the recipe's data.dir and run.out_dir land there: no paths given at all).

prepare needs no data setting; train needs none either (only sizes, to take seconds) and prints a plain line per
interval, kept in the run's train.log; Ctrl-C is said as a stop, leaves curves.png, and the same command resumes;
`tformer translate` translates; the Hugging Face export's `generate(**ids)` and the CTranslate2 README's call give
`tformer translate`'s lines (the recipe's beam 4, length penalty 0.6); the attention picture's panels carry the
source and target tokens on the right axes.
"""

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import GERMAN, ON_CPU, WORDS, word_for_word, write_pairs
from typer.testing import CliRunner

from tformer_cli import attention_maps
from tformer_cli.cli import app
from tformer_cli.decoding.search import greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.run import load_run
from tformer_cli.tokenizer import EOS_ID

transformers = pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

RECIPE = str(Path(__file__).parents[2] / "recipes" / "multi30k_en_de.yaml")
# the recipe's file names: (lines, words per line); the test lines longer, where the length penalty matters
FILES = {"train": (560, 2, 8), "val": (40, 2, 8), "test_2016_flickr": (24, 3, 10)}
VOCAB = "tokenizer.vocab_size=60"
# Sizes only, for seconds on a CPU core (and the positions, the decoding precision and the device, below): no data
# setting, no path.
SIZES = [
    VOCAB,
    "model.d_model=32",
    "model.n_layers=1",
    "model.d_ff=64",
    "model.dropout=0.0",
    "train.lr=3e-3",
    "train.warmup_steps=10",
    "train.max_tokens=300",
    "train.max_updates=300",
    "train.valid_every=150",
    "train.valid_bleu_lines=10",
    "train.log_every=10",
    "run.threads=1",
    # The Hugging Face export maps the model to Marian, whose positions are sinusoidal: the recipe's rotary ones export
    # to CTranslate2 only (the recipe's header says so); and compiling (the recipe's train.compile) takes a minute.
    "model.pos=sinusoidal",
    "train.compile=false",
    # The exports run fp32; the recipe's decode.precision auto decodes bf16 on a CPU with AVX512-BF16 or AMX, and there
    # `tformer translate` differs from them on some lines (2 of 24 in a trial): the run decodes fp32, as other CPUs do.
    "decode.precision=fp32",
    # Trained on the CPU on every machine, and translated there (ON_CPU): `tformer translate`'s lines are compared with
    # the exports' on the CPU, and run.device auto would take a GPU where there is one.
    "run.device=cpu",
]
STOP_AT = 20  # Ctrl-C once this update's line is printed: before the first validation
TOTAL = 300  # train.max_updates
PLAIN = re.compile(  # update / total, epoch, loss, accuracy, lr, tokens/s, elapsed, ETA
    rf"update (\d+)/{TOTAL} epoch \d+ loss \d+\.\d+ acc \d\.\d+ lr \S+ tokens/s \d+ "
    r"elapsed \d+:\d\d:\d\d eta \d+:\d\d:\d\d"
)
STOPPED = re.compile(r"stopped at update (\d+) \(checkpoint saved\); rerun the same command to resume")
runner = CliRunner()


def _tformer(*args: str, cwd: Path, env: dict[str, str], **kwargs) -> subprocess.Popen:
    """`tformer ARGS` as typed in a shell whose output goes to a pipe (CI, nohup, tee): no terminal anywhere."""
    return subprocess.Popen(
        [sys.executable, "-m", "tformer_cli", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _done(proc: subprocess.Popen, stdin: str = "") -> tuple[int, str, str]:
    out, err = proc.communicate(stdin, timeout=120)
    return proc.returncode, out, err


def _ok(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result.stdout


def _source(walk) -> list[str]:
    """The lines the newcomer translates: the recipe's test set."""
    return (walk["root"] / "multi30k" / "test_2016_flickr.en").read_text().splitlines()


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """The newcomer's commands, run in order; what each printed."""
    home = tmp_path_factory.mktemp("newcomer")
    root = home / "data_root"
    (root / "multi30k").mkdir(parents=True)
    rng = random.Random(0)
    for name, (n, shortest, longest) in FILES.items():
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(shortest, longest))) for _ in range(n)]
        write_pairs(root / "multi30k", {name: lines}, word_for_word(GERMAN))
    work = home / "work"  # where the newcomer types the commands
    work.mkdir()
    # the newcomer's shell: TFORMER_DATA set once; Python's output buffered as a pipe leaves it (lines must come live)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "TFORMER_DATA": str(root)}
    steps = {"root": root, "work": work, "run": work / "runs" / "multi30k_en_de"}
    steps["prepare"] = _done(_tformer("prepare", RECIPE, VOCAB, cwd=work, env=env))
    assert steps["prepare"][0] == 0, steps["prepare"]

    proc = _tformer("train", RECIPE, *SIZES, cwd=work, env=env)  # Ctrl-C once update STOP_AT is said
    err = []
    for line in proc.stderr:
        err.append(line)
        if line.startswith(f"update {STOP_AT}/"):
            proc.send_signal(signal.SIGINT)
            break
    out, rest = proc.communicate(timeout=120)
    steps["stopped"] = (proc.returncode, out, "".join(err) + rest)
    steps["curves_at_stop"] = (steps["run"] / "curves.png").is_file()
    steps["log_at_stop"] = (steps["run"] / "train.log").read_text() if (steps["run"] / "train.log").is_file() else ""
    steps["resumed"] = _done(_tformer("train", RECIPE, *SIZES, cwd=work, env=env))  # the same command again
    assert steps["resumed"][0] == 0, steps["resumed"]
    source = (root / "multi30k" / "test_2016_flickr.en").read_text()
    steps["translate"] = _done(_tformer("translate", str(steps["run"]), *ON_CPU, cwd=work, env=env), stdin=source)
    return steps


def test_prepare_reads_the_files_under_the_data_root_with_no_data_setting(walk):
    code, out, err = walk["prepare"]
    assert f"on {walk['root']}/multi30k/train" in out + err  # the local files, not the hub
    for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        assert re.search(rf"{split}: read {FILES[name][0]}\b", out), out
    assert (walk["work"] / "data" / "multi30k_en_de" / "manifest.json").is_file()  # the recipe's data.dir, here


def test_training_off_a_terminal_prints_plain_lines_kept_in_train_log(walk):
    for _, _, err in (walk["stopped"], walk["resumed"]):
        assert "\x1b[" not in err and "\r" not in err  # no bar, no colour codes
        assert "error" not in err.lower(), err
    printed = [line for _, _, err in (walk["stopped"], walk["resumed"]) for line in err.splitlines()]
    updates = [line for line in printed if line.startswith("update ")]
    assert all(PLAIN.fullmatch(line) for line in updates), updates
    steps = [int(PLAIN.fullmatch(line).group(1)) for line in updates]
    stop = int(STOPPED.fullmatch(walk["stopped"][2].strip().splitlines()[-1]).group(1))
    assert steps[0] == 10 and steps[-1] == TOTAL and stop >= STOP_AT
    assert steps == sorted(set(steps))  # each interval once, across the stop
    assert {s for s in steps if s > stop} == set(range(stop // 10 * 10 + 10, TOTAL + 1, 10))  # every one after it
    kept = [line.split(" ", 2)[2] for line in (walk["run"] / "train.log").read_text().splitlines()]
    assert [line for line in kept if line.startswith("update ")] == updates  # both sessions, as printed
    assert sum(bool(STOPPED.fullmatch(line)) for line in kept) == 1
    assert [line.split(":")[0].split(" update ")[1] for line in kept if ": valid loss" in line] == ["150", "300"]


def test_ctrl_c_is_a_stop_with_curves_and_the_same_command_resumes(walk):
    code, _, err = walk["stopped"]
    assert code == 130, err  # the shell's code for SIGINT
    assert STOPPED.fullmatch(err.strip().splitlines()[-1]), err
    assert walk["curves_at_stop"]  # drawn at the stop: no validation had come yet
    assert ": valid loss" not in walk["log_at_stop"]
    assert (walk["run"] / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stop = int(STOPPED.fullmatch(err.strip().splitlines()[-1]).group(1))
    _, out, err = walk["resumed"]
    assert f"resuming runs/multi30k_en_de at update {stop} " in err, err
    assert "best validation bleu" in out


def test_translate_gives_a_line_per_input_line(walk):
    code, out, err = walk["translate"]
    source = _source(walk)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == len(source) and all(lines), out
    assert sum(len(t.split()) <= 2 * len(s.split()) for s, t in zip(source, lines, strict=True)) >= len(lines) // 2


def test_the_hf_export_generates_what_tformer_translate_gives(walk, tmp_path, monkeypatch):
    monkeypatch.chdir(walk["work"])  # where the newcomer works: the run names its data.dir from there
    monkeypatch.setattr(transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    _ok("export", walk["run"], "--format", "hf", "-o", tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    ids = tok(_source(walk), return_tensors="pt", padding=True)  # the whole batch, padded
    assert tok.batch_decode(model.generate(**ids), skip_special_tokens=True) == walk["translate"][1].splitlines()
    config = model.generation_config
    assert (config.num_beams, config.length_penalty) == (4, 0.6)  # the recipe's search, which made them equal


def test_the_ctranslate2_readme_call_gives_what_tformer_translate_gives(walk, tmp_path, monkeypatch):
    monkeypatch.chdir(walk["work"])
    _ok("export", walk["run"], "--format", "ctranslate2", "-o", tmp_path / "ct2")
    code = re.search(r"```python\n(.*?)```", (tmp_path / "ct2" / "README.md").read_text(), re.S).group(1)
    scope = {"DIR": str(tmp_path / "ct2")}
    exec(code, scope)  # the README's own code, as a reader would paste it
    ours = walk["translate"][1].splitlines()
    assert scope["translate"](_source(walk)) == ours
    source = walk["root"] / "multi30k" / "test_2016_flickr.en"
    greedy_lines = _ok("translate", walk["run"], "-i", source, *ON_CPU, "decode.beam=1").splitlines()
    unpenalised = _ok("translate", walk["run"], "-i", source, *ON_CPU, "decode.len_penalty=0").splitlines()
    assert ours != greedy_lines and ours != unpenalised  # on these lines the beam and the ranking both matter


def test_the_attention_picture_puts_source_and_target_tokens_on_their_axes(walk, tmp_path, monkeypatch):
    drawn = []
    real = attention_maps.attention_figure

    def keep(*args, **kwargs):
        drawn.append(real(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(attention_maps, "attention_figure", keep)
    monkeypatch.chdir(walk["work"])
    text = "the big dog is on the small house"
    out = _ok("attention", walk["run"], "--text", text, "-o", tmp_path / "attention.png")
    assert "wrote" in out and (tmp_path / "attention.png").read_bytes()[:4] == b"\x89PNG"
    [fig] = drawn
    fig.canvas.draw()
    run = load_run(walk["run"], device="cpu", cast=False)
    tok = run.tokenizer
    ids = tok.encode([text])[0]
    source = tok.pieces(ids + [EOS_ID])
    target = ["<s>"] + tok.pieces(greedy(run.model, torch.tensor([ids + [EOS_ID]]), SearchSettings())[0].tokens[:-1])
    expected = {  # (rows: queries, columns: keys), and the axes' names
        "enc L0.self": (source, source, "source", "source"),
        "dec L0.self": (target, target, "target", "target"),
        "dec L0.cross": (target, source, "target", "source"),
    }
    panels = {}
    for ax in fig.axes:
        if ax.images:
            name, head = ax.get_title().rsplit(" head ", 1)
            panels[name, int(head)] = ax
    assert sorted(panels) == sorted((name, h) for name in expected for h in range(4))  # the recipe's 4 heads
    for (name, head), ax in panels.items():
        rows, cols, row_name, col_name = expected[name]
        assert ax.images[0].get_array().shape == (len(rows), len(cols)), name
        assert [t.get_text() for t in ax.get_xticklabels()] == cols, (name, head)
        assert [t.get_text() for t in ax.get_yticklabels()] == (rows if head == 0 else [""] * len(rows)), (name, head)
        if head == 0:
            assert ax.get_ylabel().startswith(row_name) and ax.get_xlabel().startswith(col_name), name
    assert text in fig.get_suptitle().replace("\n", " ")
    assert [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
