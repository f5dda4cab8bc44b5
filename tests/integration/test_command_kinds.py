"""Every command against every model kind: it works (and its output says so), or it refuses in one line.

The table `CASES` holds one entry per (command variant, model kind): either OK (the command works, and
`CHECKS[variant]` reads its output and fails if the output is wrong for that kind), or the text its
`error:` line must hold (which names the kind, or what the command needs). A refusal is exit 1, one
`error:` line on stderr, no traceback, nothing on stdout, no output file, and the run directory as it was.

The models are the session's tiny runs (tests/integration/conftest.py); the recipe commands read
recipes/*.yaml, one per kind. Only the CLI is used (`tformer_cli.cli.app`): files are read with
torch and safetensors, never with tformer's own readers.
"""

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_models import GERMAN_WORDS, WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app

ROOT = Path(__file__).parents[2]
RECIPES = {
    "classifier": ROOT / "recipes/tiny_classifier.yaml",
    "lm": ROOT / "recipes/wikitext2_lm.yaml",
    "lstm": ROOT / "recipes/wikitext2_lstm.yaml",
    "seq2seq": ROOT / "recipes/wmt14_base.yaml",
    "sessions-lm": ROOT / "recipes/streamrec_transformer.yaml",  # data.kind: sessions (item ids, no text)
    "sessions-lstm": ROOT / "recipes/streamrec_lstm.yaml",
}
KINDS = list(RECIPES)
MODEL_KIND = {kind: kind.removeprefix("sessions-") for kind in KINDS}  # model.kind of each column's run
# step files of each run: the classifier and the text LSTM keep 1; the others 2
AVERAGE_LAST = {"classifier": 1, "lm": 2, "lstm": 1, "seq2seq": 2, "sessions-lm": 2, "sessions-lstm": 2}
# the runs' attention layers: 2 encoder; 1 decoder; 1 + 1 (+ cross); 1 decoder
ATTENTION_MAPS = {"classifier": 2, "lm": 1, "seq2seq": 3, "sessions-lm": 1}
ATTENTION_ROWS = {  # `check`'s components that are attention, by kind
    "classifier": {"encoder self-attention"},
    "lm": {"decoder self-attention"},
    "lstm": set(),
    "seq2seq": {"encoder self-attention", "decoder self-attention", "decoder cross-attention"},
    "sessions-lm": {"decoder self-attention"},
    "sessions-lstm": set(),
}
SESSIONS = "is a session model (data.kind=sessions, model.kind={}): "  # how a refusal names a sessions run
NO_TEXT = {
    kind: SESSIONS.format(MODEL_KIND[kind]) + "it reads item ids, not text (`tformer eval` scores it)" for kind in KINDS
}
PROMPT = "the small cat"
runner = CliRunner()

OK = None  # the command works: CHECKS[variant] says what its output must show
CASES = {
    # command variant: {kind: OK (checked by CHECKS[variant]) or the text of the error line}
    "eval": {"classifier": OK, "lm": OK, "lstm": OK, "seq2seq": OK, "sessions-lm": OK, "sessions-lstm": OK},
    "eval --split test": {
        "classifier": "is a classifier: --split test: only data.kind=sessions has a test split",
        "lm": "is a lm model: --split test: only data.kind=sessions has a test split",
        "lstm": "is an LSTM language model: --split test: only data.kind=sessions has a test split",
        "seq2seq": "is a seq2seq model: --split test: only data.kind=sessions has a test split",
        "sessions-lm": OK,
        "sessions-lstm": OK,
    },
    "perplexity": {
        "classifier": "is a classifier: it reads no text",
        "lm": OK,
        "lstm": OK,
        "seq2seq": "is a seq2seq model: perplexity needs a language model",
        "sessions-lm": NO_TEXT["sessions-lm"],
        "sessions-lstm": NO_TEXT["sessions-lstm"],
    },
    "eval --src --ref": {
        "classifier": "is a classifier: it reads no text",
        "lm": "is a lm model: --src/--ref need seq2seq",
        "lstm": "is an LSTM language model: --src/--ref need seq2seq",
        "seq2seq": OK,
        "sessions-lm": NO_TEXT["sessions-lm"],
        "sessions-lstm": NO_TEXT["sessions-lstm"],
    },
    "translate": {
        "classifier": "is a classifier: it reads no text",
        "lm": "is a lm model: use `tformer generate`",
        "lstm": "is an LSTM language model: use `tformer generate`",
        "seq2seq": OK,
        "sessions-lm": NO_TEXT["sessions-lm"],
        "sessions-lstm": NO_TEXT["sessions-lstm"],
    },
    "generate": {
        "classifier": "is a classifier: it reads no text",
        "lm": OK,
        "lstm": OK,
        "seq2seq": "is a seq2seq model: use `tformer translate`",
        "sessions-lm": NO_TEXT["sessions-lm"],
        "sessions-lstm": NO_TEXT["sessions-lstm"],
    },
    "average": {"classifier": OK, "lm": OK, "lstm": OK, "seq2seq": OK, "sessions-lm": OK, "sessions-lstm": OK},
    "export": {"classifier": OK, "lm": OK, "lstm": OK, "seq2seq": OK, "sessions-lm": OK, "sessions-lstm": OK},
    "attention --example": {
        "classifier": OK,
        "lm": "is a lm model: give the sentence to show with --text",
        "lstm": "is an LSTM language model: it has no attention to show",
        "seq2seq": "is a seq2seq model: give the sentence to show with --text",
        "sessions-lm": OK,
        "sessions-lstm": SESSIONS.format("lstm") + "it has no attention to show",
    },
    "attention --text": {
        "classifier": "is a classifier: it reads no text",
        "lm": OK,
        "lstm": "is an LSTM language model: it has no attention to show",
        "seq2seq": OK,
        "sessions-lm": SESSIONS.format("lm")
        + "it reads item ids, not text: show a validation session with --example N",
        "sessions-lstm": SESSIONS.format("lstm") + "it has no attention to show",
    },
    "check": {"classifier": OK, "lm": OK, "lstm": OK, "seq2seq": OK, "sessions-lm": OK, "sessions-lstm": OK},
    "train --dry-run": {"classifier": OK, "lm": OK, "lstm": OK, "seq2seq": OK, "sessions-lm": OK, "sessions-lstm": OK},
    "prepare": {
        "classifier": "data.kind=pattern is generated at training time; nothing to prepare",
        "lm": OK,
        "lstm": OK,
        "seq2seq": OK,
        "sessions-lm": "data.kind=sessions is generated at training time; nothing to prepare",
        "sessions-lstm": "data.kind=sessions is generated at training time; nothing to prepare",
    },
}
RECIPE_COMMANDS = {"check", "train --dry-run", "prepare"}


class Case:
    """One row: where its inputs are, where its outputs go, and the command line."""

    def __init__(self, variant: str, kind: str, request, tmp: Path) -> None:
        self.variant, self.kind, self.tmp = variant, kind, tmp
        self.inputs, self.outputs = tmp / "in", tmp / "out"
        self.inputs.mkdir()
        self.outputs.mkdir()
        self.run = None if variant in RECIPE_COMMANDS else _run_dir(kind, request)
        self.src = _write(self.inputs / "src.en", ["the cat", "we are the dog", "small house"])
        self.ref = _write(self.inputs / "ref.de", ["die katze", "wir sind der hund", "kleines haus"])
        self.text = _write(self.inputs / "text.txt", ["the red cat is on the house", "we and you", "a big dog"])
        self.translate_in = _write(self.inputs / "translate.en", ["the cat", "", "small house", "we are red"])
        self.output = self.outputs / {
            "translate": "out.de",
            "average": "avg.pt",
            "export": "model.safetensors",
            "attention --example": "maps.png",
            "attention --text": "maps.png",
            "prepare": "data",
        }.get(variant, "none")

    def args(self) -> list[str]:
        run, recipe = str(self.run), str(RECIPES[self.kind])
        return [
            str(a)
            for a in {
                "eval": ["eval", run],
                "eval --split test": ["eval", run, "--split", "test"],
                "perplexity": ["perplexity", run, self.text],
                "eval --src --ref": ["eval", run, "--src", self.src, "--ref", self.ref, "decode.beam=2"],
                "translate": ["translate", run, "-i", self.translate_in, "-o", self.output, "decode.beam=2"],
                "generate": ["generate", run, "--prompt", PROMPT, "decode.max_new_tokens=6"],
                "average": ["average", run, "--last", AVERAGE_LAST[self.kind], "-o", self.output],
                "export": ["export", run, "-o", self.output],
                "attention --example": ["attention", run, "--example", "1", "-o", self.output],
                "attention --text": ["attention", run, "--text", "the red cat", "-o", self.output],
                "check": ["check", recipe, f"data.dir={self.tmp / 'nothing'}"],
                "train --dry-run": [
                    "train",
                    recipe,
                    "--dry-run",
                    f"data.dir={self.tmp / 'nothing'}",
                    f"run.out_dir={self.outputs / 'runs'}",
                ],
                "prepare": ["prepare", recipe, *self._corpus()],
            }[self.variant]
        ]

    def _corpus(self) -> list[str]:
        """A small corpus of the recipe's data kind, and data.dir under out/ (the classifier has none)."""
        rng = random.Random(0)
        rows = [[rng.randrange(len(WORDS)) for _ in range(rng.randint(3, 10))] for _ in range(300)]
        if self.kind == "seq2seq":
            for split, part in (("train", rows[:260]), ("valid", rows[260:])):
                _write(self.inputs / f"{split}.en", [" ".join(WORDS[i] for i in row) for row in part])
                _write(self.inputs / f"{split}.de", [" ".join(GERMAN_WORDS[i] for i in row) for row in part])
            files, vocab = [f"data.train={self.inputs / 'train'}", f"data.valid={self.inputs / 'valid'}"], 60
        else:
            for split, part in (("train", rows[:260]), ("valid", rows[260:])):
                _write(self.inputs / f"{split}.txt", [" ".join(WORDS[i] for i in row) for row in part])
            files = [f"data.train={self.inputs / 'train.txt'}", f"data.valid={self.inputs / 'valid.txt'}"]
            vocab = 40
        if self.kind in ("classifier", "sessions-lm", "sessions-lstm"):  # generated data: no corpus
            files = []
        return [*files, f"data.dir={self.output}", f"tokenizer.vocab_size={vocab}"]


def _run_dir(kind: str, request) -> Path:
    if kind == "classifier":
        return request.getfixturevalue("classifier_run")
    if kind.startswith("sessions-"):
        return request.getfixturevalue("sessions_run") / f"runs/{MODEL_KIND[kind]}"
    if kind == "seq2seq":
        return request.getfixturevalue("translation_run") / "runs/mt"
    return request.getfixturevalue("lm_run") / f"runs/{kind}"


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _snapshot(folder: Path | None) -> dict[str, tuple[int, int]]:
    if folder is None:
        return {}
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _numbers(pattern: str, text: str) -> list[float]:
    match = re.search(pattern, text)
    assert match, (pattern, text)
    return [float(g.replace(",", "")) for g in match.groups()]


def _checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


# The checks of a command that worked: each fails if the command did the wrong thing for this kind.


def _eval(case: Case, stdout: str) -> None:
    if case.kind.startswith("sessions-"):
        _eval_sessions(case, stdout, "valid")
        return
    if case.kind == "classifier":
        accuracy, _, n = _numbers(r"validation accuracy: ([\d.]+)\s+loss: ([\d.]+)\s+\((\d+) examples\)", stdout)
        rows = [[int(c) for c in re.findall(r"\d+", line)] for line in stdout.splitlines() if re.match(r"│ \d", line)]
        assert len(rows) == 3 and all(len(row) == 4 for row in rows), stdout  # 3 classes: label + 3 counts
        assert sum(sum(row[1:]) for row in rows) == n == 100
        assert accuracy == pytest.approx(sum(row[1 + row[0]] for row in rows) / n, abs=1e-4)  # the diagonal
        return
    loss, ppl, accuracy = _numbers(r"validation loss: ([\d.]+)\s+ppl: ([\d.]+)\s+accuracy: ([\d.]+)", stdout)
    assert 0 < loss and ppl == pytest.approx(math.exp(loss), rel=1e-3) and 0 <= accuracy <= 1


def _eval_sessions(case: Case, stdout: str, split: str) -> None:
    """The table of a sessions run: rules add up to all targets, each metric beside its Bayes-optimal one."""
    (sessions,) = _numbers(rf"(?m)^{split}: ([\d,]+) sessions", stdout)
    assert sessions == 20, stdout  # the tiny runs hold out 20 sessions each for valid and test
    number = r"([\d.]+) \(([\d.]+)\)"
    rows = {}
    for name in ("all", "local (+1)", "long-range", "random"):
        n, *values = _numbers(rf"(?m)^{re.escape(name)}\s+([\d,]+)\s+{number}\s+{number}\s+{number}$", stdout)
        rows[name] = (n, values)  # accuracy, Bayes, Hit@10, Bayes, MRR, Bayes
    n_all, (accuracy, *_) = rows.pop("all")
    assert n_all == sum(n for n, _ in rows.values()) > 0
    assert accuracy == pytest.approx(sum(n * values[0] for n, values in rows.values()) / n_all, abs=1e-3)
    assert rows["local (+1)"][1][1] == 1.0  # the Bayes-optimal predictor gets every local target (p_local 0.4)
    for _, values in rows.values():
        assert all(0 <= v <= 1 for v in values) and values[0] <= values[2] and values[1] <= values[3]
    saved = json.loads((case.run / f"eval_{split}_best.json").read_text())
    assert (saved["split"], saved["n"], saved["accuracy"]) == (split, n_all, pytest.approx(accuracy, abs=1e-4))


def _perplexity(case: Case, stdout: str) -> None:
    tokens, words = _numbers(r"text\.txt: ([\d,]+) tokens, ([\d,]+) words", stdout)
    lines = case.text.read_text().splitlines()
    assert words == sum(len(line.split()) + 1 for line in lines)  # words and one end-of-line per line
    per_token, per_word = _numbers(r"perplexity per token ([\d.]+)\s+per word ([\d.]+)", stdout)
    assert tokens >= len(lines) and per_token > 1
    assert math.log(per_word) * words == pytest.approx(math.log(per_token) * tokens, rel=1e-2)  # one total NLL


def _eval_bleu(case: Case, stdout: str) -> None:
    assert "(3 lines)" in stdout
    (bleu,) = _numbers(r"BLEU ([\d.]+)\s+signature: \S*nrefs:1", stdout)
    (chrf,) = _numbers(r"chrF ([\d.]+)\s+signature:", stdout)
    assert 0 <= bleu <= 100 and 0 < chrf <= 100


def _translate(case: Case, stdout: str) -> None:
    lines = case.output.read_text().split("\n")
    assert len(lines) == 5 and lines[-1] == "", lines  # one line per input line, each ended by a newline
    assert lines[1] == "" and all(lines[i].strip() for i in (0, 2, 3)), lines  # a blank line stays blank


def _generate(case: Case, stdout: str) -> None:
    assert stdout.startswith(PROMPT) and stdout.endswith("\n") and stdout.count("\n") == 1, repr(stdout)


def _average(case: Case, stdout: str) -> None:
    names = re.search(r"averaged (.+) -> ", stdout).group(1).split(", ")
    assert len(names) == AVERAGE_LAST[case.kind] and all(re.fullmatch(r"step_\d+\.pt", n) for n in names), stdout
    inputs = [_checkpoint(case.run / "checkpoints" / name)["model"] for name in names]
    average = _checkpoint(case.output)["model"]
    assert average.keys() == inputs[0].keys()
    for key, value in average.items():
        mean = torch.stack([state[key].double() for state in inputs]).mean(0) if value.is_floating_point() else value
        torch.testing.assert_close(value, mean.to(value.dtype), msg=key)
    assert len(inputs) == 1 or any(not torch.equal(inputs[0][k], inputs[-1][k]) for k in average)  # not one twice


def _export(case: Case, stdout: str) -> None:
    state = _checkpoint(case.run / "checkpoints/best.pt")["model"]
    with safe_open(str(case.output), "pt") as exported:
        names = set(exported.keys())
        assert names <= set(state) and names, sorted(names - set(state))
        for key in names:
            assert torch.equal(exported.get_tensor(key), state[key]), key
        # safetensors keeps one copy of tied weights (as save_model does): each left out is tied to one kept
        for key in set(state) - names:
            assert any(torch.equal(state[key], state[kept]) for kept in names), f"{key} is missing, not tied"
        assert f'"kind": "{MODEL_KIND[case.kind]}"' in exported.metadata()["config"]


def _eval_test_split(case: Case, stdout: str) -> None:
    _eval_sessions(case, stdout, "test")


def _attention(case: Case, stdout: str) -> None:
    assert case.output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {case.output}: {ATTENTION_MAPS[case.kind]} attention layers" in stdout


def _check(case: Case, stdout: str) -> None:
    assert re.search(rf"^model: \{{kind: {MODEL_KIND[case.kind]},", stdout, re.MULTILINE), stdout
    rows = dict(re.findall(r"│ ([a-z -]+?)\s+│\s+([\d,]+) │", stdout))
    counts = {name: int(count.replace(",", "")) for name, count in rows.items()}
    assert counts.pop("total") == sum(counts.values()) > 0, counts
    assert {name for name in counts if "attention" in name} == ATTENTION_ROWS[case.kind], counts
    if MODEL_KIND[case.kind] == "lstm":  # its recurrent layers are a component of their own, not the output head
        assert any("lstm" in name for name in counts), counts


def _dry_run(case: Case, stdout: str) -> None:
    _check(case, stdout)
    assert not (case.outputs / "runs").exists()  # nothing trained, no run directory


def _prepare(case: Case, stdout: str) -> None:
    assert re.search(rf"prepared: {re.escape(str(case.output))}\s+\(tokenizer [0-9a-f]{{12}}, \d+ pieces\)", stdout)
    (train_read,) = _numbers(r"train: read ([\d,]+)", stdout)
    (valid_read,) = _numbers(r"valid: read ([\d,]+)", stdout)
    assert (train_read, valid_read) == (260, 40), stdout
    assert case.output.is_dir() and any(case.output.iterdir())


CHECKS = {
    "eval": _eval,
    "eval --split test": _eval_test_split,
    "perplexity": _perplexity,
    "eval --src --ref": _eval_bleu,
    "translate": _translate,
    "generate": _generate,
    "average": _average,
    "export": _export,
    "attention --example": _attention,
    "attention --text": _attention,
    "check": _check,
    "train --dry-run": _dry_run,
    "prepare": _prepare,
}
TABLE = [(variant, kind, expected) for variant, row in CASES.items() for kind, expected in row.items()]


def test_the_table_covers_every_command_and_kind():
    assert all(list(row) == KINDS for row in CASES.values())
    assert set(CASES) == set(CHECKS)


@pytest.mark.parametrize(("variant", "kind", "expected"), TABLE, ids=[f"{v.replace(' ', '')}-{k}" for v, k, _ in TABLE])
def test_command_on_model_kind(variant, kind, expected, request, tmp_path):
    case = Case(variant, kind, request, tmp_path)
    run_before = _snapshot(case.run)
    result = runner.invoke(app, case.args())
    assert "Traceback" not in result.output, result.output
    if expected is OK:
        assert result.exit_code == 0, (result.exit_code, result.output)
        CHECKS[variant](case, result.stdout)
        made = {p.name for p in case.outputs.iterdir()}
        assert made <= {case.output.name, f".{case.output.name}.lock"}, made  # no temporary file beside it
        return
    lines = result.stderr.strip().splitlines()
    assert (result.exit_code, isinstance(result.exception, SystemExit)) == (1, True), (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0], lines[0]
    assert result.stdout == ""
    assert list(case.outputs.iterdir()) == [], "an output was left behind"
    assert _snapshot(case.run) == run_before, "the run directory changed"
