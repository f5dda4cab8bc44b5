"""What the commands share: the arguments and options that mean the same everywhere, the fixed choices (Enums
that the parser checks), standard output and how a result's report is printed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import IO, Annotated, Any, cast

import typer
from rich.console import Console

from tformer_cli.errors import TformerError
from tformer_cli.stdout import STDOUT


class ResultConsole(Console):
    """rich's Console less one habit: the text of a write that failed (a closed or full standard output) stays in
    its buffer and comes out before the next print, another command's output in one process; here it goes."""

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except BaseException:
            del self._buffer[:]
            raise


out = ResultConsole(file=cast(IO[str], STDOUT), highlight=False, soft_wrap=True)  # no hard wrap: output stays parseable

Recipe = Annotated[Path, typer.Argument(help="Recipe YAML, e.g. recipes/pattern_classifier.yaml")]
RecipeOrRun = Annotated[
    Path,
    typer.Argument(
        help="Recipe YAML, e.g. recipes/pattern_classifier.yaml, or a run folder (runs/NAME): its own settings"
    ),
]
Overrides = Annotated[list[str] | None, typer.Argument(help="key=value overrides, e.g. train.lr=5e-4")]
# What a trained run takes (run/load.py INFERENCE_OVERRIDES): its decode settings, the device and the CPU threads.
RunOverrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="decode.key=value, run.device=auto|cpu|cuda (default auto: CUDA where there is one) and run.threads=N "
        "overrides, e.g. decode.beam=5"
    ),
]
Checkpoint = Annotated[Path, typer.Argument(help="A run directory (its best checkpoint) or a checkpoint file.")]
Average = Annotated[int, typer.Option(help="Average the run's last N step checkpoints first.")]
EnsembleOf = Annotated[
    list[Path] | None,
    typer.Option(
        "--ensemble",
        help="Translate with this run or checkpoint too, as one model (the mean of the models' probabilities at "
        "each step); repeat it for more. Trained with RUN's tokenizer; RUN's decode settings apply.",
    ),
]
Force = Annotated[
    bool, typer.Option("--force", help="Replace an existing file that is not an earlier output of this command.")
]
TestSet = Annotated[
    str, typer.Option(help="Name of the test set, e.g. newstest2014-full (3003) or newstest2014-filtered (2737).")
]


class Split(str, Enum):
    """A run's own data that `tformer eval` scores: its validation split, or (generated sessions) its test split."""

    valid = "valid"
    test = "test"


class Engine(str, Enum):
    """What translates: tformer's search, or the same search in CTranslate2."""

    native = "native"
    ctranslate2 = "ctranslate2"


class Quantization(str, Enum):
    """CTranslate2's weights (none given: float32)."""

    int8 = "int8"
    int8_float16 = "int8_float16"
    float16 = "float16"


class ExportFormat(str, Enum):
    """What `tformer export` writes."""

    safetensors = "safetensors"
    hf = "hf"
    ctranslate2 = "ctranslate2"


def show(report: Any) -> None:
    """A result's report (evaluate.Report): its notes on stderr, then its lines on stdout."""
    for note in report.notes:
        print(note, file=sys.stderr)
    for line in report.lines:
        out.print(line)


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def write_now(text: str) -> None:
    """Standard output written at once (tokens as they are produced)."""
    STDOUT.write(text)
    STDOUT.flush()


def text_argument(text: str, option: str) -> str:
    """`text` as given on the command line, refused in one line where it is not UTF-8: Python keeps a byte it
    cannot decode as a lone surrogate, which no tokenizer takes (as stdin_lines refuses such a byte)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(text[exc.start]) - 0xDC00 if "\udc80" <= text[exc.start] <= "\udcff" else None
        what = f"byte 0x{byte:02x}" if byte is not None else f"character {text[exc.start]!r}"
        raise TformerError(f"{option}: not valid UTF-8 ({what} at character {exc.start + 1})") from None
    return text


def stdin_lines(instead: str) -> Iterator[str]:
    """The lines of stdin, read as files are: UTF-8 only (a bad byte names its line), split on `\\n` only.

    Raises:
        TformerError: stdin is closed (`<&-`), naming the option to give `instead`.
    """
    from tformer_cli.data.text import decode_lines

    if sys.stdin is None or sys.stdin.closed or not hasattr(sys.stdin, "buffer"):
        raise TformerError(f"stdin is closed: nothing to read; give the input with {instead}")
    return decode_lines(sys.stdin.buffer, "<stdin>")
