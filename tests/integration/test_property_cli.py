"""Generated values thrown at every recipe key and every CLI option: exit 0, or one `error:` line and exit 1.

Hypothesis draws the values (numbers at and past every bound, floats down to the smallest, YAML's special
words and brackets, control characters, paths to files tformer manages); examples are few and derandomized,
so CI runs the same cases in seconds (TFORMER_PROPERTY_EXAMPLES=500 explores further, with other cases).
The runs are the session's tiny trained ones (tests/integration/conftest).
"""

import dataclasses
import os
import typing
from pathlib import Path

import pytest
import typer
import typer.testing
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.schema import Config

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes/tiny_classifier.yaml")
# No shrinking: an example runs every command, and derandomize already makes a failure reproducible.
EXPLORE = int(os.environ.get("TFORMER_PROPERTY_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=EXPLORE or 4,  # each example gives every recipe key a value
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.explicit, Phase.generate],
)
MANY = settings(SETTINGS, max_examples=EXPLORE or 12)
runner = CliRunner()


def _recipe_keys() -> list[str]:
    def walk(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[field.name]):
                yield from walk(hints[field.name], f"{prefix}{field.name}.")
            else:
                yield f"{prefix}{field.name}"

    return list(walk(Config))


NUMBERS = st.one_of(
    st.integers(-3, 70),
    st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**40]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([5e-324, 1e-300, 1e-30, 1e300, -0.0]),
)
WORDS = st.sampled_from(
    ["", " ", "null", "~", "true", "no", ".nan", "-.inf", "1e-4", "0x10", "[", "]", "{", "[1, 2]", "{a: 1}", "a: b"]
    + ["&a 1", "*a", "!!python/object/apply:os.system ['true']", "'", '"', "#", "- 1", "\t", "a=b", "..", "/"]
)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
VALUES = st.one_of(NUMBERS.map(str), WORDS, TEXT)


@pytest.fixture(scope="module")
def fast_cli():
    """The command table built once (typer rebuilds it for every invoke, which would dominate these tests)."""
    command = typer.main.get_command(app)
    previous = typer.testing._get_command
    typer.testing._get_command = lambda _app: command
    yield
    typer.testing._get_command = previous


def _exits_cleanly(args: list[str], stdin: str | None = None) -> None:
    """Exit 0, or exit 1 with exactly one line on stderr, `error: ...`, which is not a bug's."""
    result = runner.invoke(app, args, input=stdin)
    lines = result.stderr.strip().splitlines()
    if result.exit_code == 0:
        assert "Traceback" not in result.output, (args, result.output)
        return
    where = (args, result.exit_code, result.stderr[-2000:], repr(result.exception))
    assert result.exit_code == 1, where
    assert len(lines) == 1 and lines[0].startswith("error: "), where
    assert "internal error" not in lines[0], where


KEYS = _recipe_keys()


@SETTINGS
@given(data=st.data())
def test_every_recipe_key_takes_any_value_in_one_line(fast_cli, data):
    for key in KEYS:
        _exits_cleanly(["check", TINY, f"{key}={data.draw(VALUES, label=key)}"])


@MANY
@given(overrides=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=2, max_size=6))
def test_recipe_keys_together(fast_cli, overrides):
    _exits_cleanly(["check", TINY, *(f"{key}={value}" for key, value in overrides)])


def _paths(runs: dict[str, Path], tmp: Path) -> st.SearchStrategy[str]:
    """Paths a user might give: new files, the runs' own files, folders, devices, what is not there."""
    mt, lm = runs["mt"], runs["lm"]
    named = [
        tmp / "new.txt",
        tmp / "new.png",
        tmp / "new.safetensors",
        tmp / "missing" / "x",
        tmp,
        mt / "checkpoints/best.pt",
        mt / "config.yaml",
        lm / "metrics.jsonl",
        mt.parent.parent / "valid.en",
        mt.parent.parent / "data/spm.model",
        tmp / "pipe",  # a FIFO: what is not a regular file (never a device of the machine's, in case a guard breaks)
    ]
    if not (tmp / "pipe").exists():
        os.mkfifo(tmp / "pipe")
    # a name in `tmp` (never a path outside it: this test must not write into the checkout or /), without NUL,
    # which no command line can hold
    fresh = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="/\0"), max_size=12)
    return st.sampled_from([str(p) for p in named]) | fresh.map(lambda name: str(tmp / name))


OPTIONS = {  # command: (the run it takes, {option: "int" | "text" | "path" | "flag"})
    "translate": ("mt", {"-i": "path", "-o": "path", "--average": "int", "--engine": "text", "--force": "flag"}),
    "generate": ("lm", {"--prompt": "text", "--average": "int"}),
    "average": ("mt", {"--last": "int", "-o": "path", "--force": "flag"}),
    "export": ("mt", {"-o": "path", "--format": "text", "--quantization": "text", "--force": "flag"}),
    "attention": ("mt", {"-o": "path", "--example": "int", "--text": "text", "--force": "flag"}),
    "eval": ("lm", {"--split": "text", "--test-set": "text", "--average": "int"}),
    "perplexity": ("lm", {"--stride": "int", "--window": "int", "--first-tokens": "int"}),
    "sweep": ("recipe", {"--parallel": "int", "--one-at-a-time": "flag", "--force": "flag"}),
    "train": ("recipe", {"--dry-run": "flag"}),
}


@pytest.fixture(scope="module")
def runs(translation_run, lm_run) -> dict[str, Path]:
    return {"mt": translation_run / "runs/mt", "lm": lm_run / "runs/lm", "recipe": Path(TINY)}


@MANY
@given(data=st.data())
def test_every_cli_option_takes_any_value_in_one_line(fast_cli, runs, tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("property")
    kinds = {"int": NUMBERS.map(lambda n: str(int(n)) if n == n and abs(n) != float("inf") else str(n)), "text": VALUES}
    kinds["path"] = _paths(runs, tmp)
    for command, (run, options) in OPTIONS.items():
        chosen = data.draw(st.lists(st.sampled_from(sorted(options)), min_size=1, max_size=3, unique=True))
        args = [command, str(runs[run])]
        for option in chosen:
            kind = options[option]
            args += [option] if kind == "flag" else [option, data.draw(kinds[kind], label=f"{command} {option}")]
        if command == "perplexity":  # the text to score, then the options drawn
            args.insert(2, str(runs["lm"].parent.parent / "valid.txt"))
            args += [] if "--window" in chosen else ["--window", "16"]
        if command == "sweep":  # a setting its plan refuses: the options are parsed and checked, nothing trains
            args += ["model.d_ff=16,nonsense"]
        _exits_cleanly(args, stdin="the cat\n")


@MANY
@given(hyp=st.lists(TEXT, max_size=3), ref=st.lists(TEXT, max_size=3), test_set=VALUES)
def test_scoring_any_files_in_one_line(fast_cli, tmp_path_factory, hyp, ref, test_set):
    tmp = tmp_path_factory.mktemp("score")
    (tmp / "hyp").write_text("".join(line + "\n" for line in hyp))
    (tmp / "ref").write_text("".join(line + "\n" for line in ref))
    _exits_cleanly(["bleu", str(tmp / "hyp"), "--ref", str(tmp / "ref"), "--test-set", test_set])
