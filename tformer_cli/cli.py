"""The `tformer` command: each subcommand loads a recipe, calls one library function, reports.

User errors (`TformerError`) print one line to stderr and exit 1; `--debug` shows the traceback.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import IO, Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

try:  # typer 0.2x carries its own copy of click, whose exceptions its commands raise
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]  # the same module, from click itself

from tformer_cli.errors import TformerError, command_line
from tformer_cli.kinds import DATA_KINDS, Command
from tformer_cli.stdout import STDOUT, guard_standard_streams
from tformer_cli.version import __version__


class _OneLineUsage(TyperGroup):
    """The command table, whose usage errors (an unknown option, `--stride x`) are one `error:` line, exit 1.

    Click prints them as a usage block with a boxed message (exit 2, which tformer keeps for its own bugs).
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **kwargs: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(
                args, prog_name, complete_var, standalone_mode=False, windows_expand_args=windows_expand_args, **kwargs
            )
        try:
            code = super().main(
                args, prog_name, complete_var, standalone_mode=False, windows_expand_args=windows_expand_args, **kwargs
            )
        except click_errors.NoArgsIsHelpError as exc:  # `tformer` alone, `tformer eval` alone: the help
            print(exc.ctx.get_help() if exc.ctx is not None else exc.format_message(), file=STDOUT)
            sys.exit(0)
        except click_errors.UsageError as exc:
            see = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            print(f"error: {' '.join(exc.format_message().split())}{see}", file=sys.stderr)
            sys.exit(1)
        except click_errors.ClickException as exc:
            print(f"error: {' '.join(exc.format_message().split())}", file=sys.stderr)
            sys.exit(1)
        except typer.Abort:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        except TformerError as exc:  # what runs outside a command (--version, the help): a closed standard output
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(1)
        except BrokenPipeError:  # `tformer --help | head -1`
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.exit(141)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineUsage,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: a flag is `--force`, not `--force <bool>`
    help="Train and evaluate Transformer models from YAML recipes.",
)
out = Console(file=cast(IO[str], STDOUT), highlight=False, soft_wrap=True)  # no hard wrapping: output stays parseable
_debug = {"on": False}

Recipe = Annotated[Path, typer.Argument(help="Recipe YAML, e.g. recipes/pattern_classifier.yaml")]
RecipeOrRun = Annotated[
    Path,
    typer.Argument(
        help="Recipe YAML, e.g. recipes/pattern_classifier.yaml, or a run folder (runs/NAME): its own settings"
    ),
]
Overrides = Annotated[list[str] | None, typer.Argument(help="key=value overrides, e.g. train.lr=5e-4")]
# What a trained run takes (run/load.py INFERENCE_OVERRIDES): its decode settings and the CPU threads.
RunOverrides = Annotated[
    list[str] | None, typer.Argument(help="decode.key=value and run.threads=N overrides, e.g. decode.beam=5")
]


def user_errors(fn):
    """Every failure ends in one line on stderr and a non-zero exit code (`--debug` shows the traceback).

    `TformerError`s are the user's to fix (exit 1). A failing file operation (a folder that is a file,
    a full disk, no permission) is reported with its file name (exit 1). Anything else is a bug in
    tformer: one line that says so (exit 2), with the traceback under `--debug`.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
            STDOUT.flush()  # a write that fails (a full disk) fails here, reported, rather than at exit
            return result
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except BrokenPipeError:  # `tformer translate ... | head`: the reader left, nothing to report
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(141) from None
        except Exception as exc:
            if _debug["on"]:
                raise
            print(f"error: {_one_line(exc)}", file=sys.stderr)
            raise typer.Exit(getattr(exc, "exit_code", 1 if isinstance(exc, (TformerError, OSError)) else 2)) from None

    return wrapper


def _one_line(exc: Exception) -> str:
    """The message of a user error, a file-system error with its file, or a bug named as one."""
    if isinstance(exc, TformerError):
        return " ".join(line.strip() for line in str(exc).splitlines())  # one line, whatever a library said
    if isinstance(exc, OSError) and exc.strerror:
        files = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{files}: {exc.strerror}" if files else exc.strerror
    text = " ".join(str(exc).split())[:200] or "no message"
    return f"internal error ({type(exc).__name__}: {text}); this is a bug in tformer: please report it with --debug"


def _version(value: bool) -> None:
    if value:
        print(f"tformer {__version__}", file=STDOUT)
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _debug["on"] = debug


def _print_check(config, recipe: Path, overrides: list[str] | None) -> None:
    """The resolved config (the sections its kinds use), parameters, cost, memory, then the data report.

    Raises:
        TformerError: the recipe's local input files are not all there and data.dir does not already hold
            what they would give (one line: the first missing file, with its key).
    """
    from tformer_cli.budget import check_lines, parameter_counts
    from tformer_cli.config import relevant_yaml
    from tformer_cli.flops import cost_lines

    parameters = parameter_counts(config)  # from the shapes: no model is built (budget.py)
    memory = check_lines(config, parameters["total"])  # refuses what no single device could hold
    out.print(relevant_yaml(config), end="")
    table = Table(title="parameters by component")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    for name, count in parameters.items():
        table.add_row(name, f"{count:,}")
    out.print(table)
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's: each process takes its own batches
    for line in [*cost_lines(config, parameters, processes), *memory, *_waste_lines(config)]:
        out.print(line)
    lines, missing = _data_report(config, recipe, overrides)
    for line in lines:
        out.print(line)
    if missing:
        raise TformerError(missing)


def _waste_lines(config) -> list[str]:
    """What would waste the run (train/waste.py): a warm-up as long as train.max_updates, too many CPU threads."""
    from tformer_cli.train.waste import warmup_warning

    lines = [warmup_warning(config.train, config.train.max_updates)] if config.train.max_updates else []
    return [line for line in [*lines, _threads_line(config)] if line is not None]


def _threads_line(config) -> str | None:
    """The thread warning of a run on the CPU (waste.machine_threads_warning); None on a GPU."""
    import torch

    from tformer_cli.train.waste import machine_threads_warning

    if config.run.device == "cuda" or (config.run.device == "auto" and torch.cuda.is_available()):
        return None
    return machine_threads_warning(config.run.threads, torch.get_num_threads())


NO_DATA = "set data.train (local files) or data.hub (a Hugging Face dataset)"


def _data_report(config, recipe: Path, overrides: list[str] | None) -> tuple[list[str], str | None]:
    """What the recipe reads and whether data.dir holds it, read from the disk only (the hub is not contacted).

    Returns:
        The report's lines, and the error of a missing local input (None when none is missing, or when
        data.dir already holds what the files would give: training reads data.dir only).
    """
    from tformer_cli.data.manifest import prepared_state
    from tformer_cli.data.prepared import with_prepared_sources
    from tformer_cli.data.sources import local_files
    from tformer_cli.errors import DataError

    d = config.data
    if DATA_KINDS[d.kind].generated:
        seed = getattr(d, d.kind).seed
        return [f"data: {d.kind}, generated from data.{d.kind}.seed={seed} when training starts (no prepare)"], None
    files = local_files(config.data)
    missing = [(split, path) for split, paths in files.items() for path in paths if not path.is_file()]
    if files:
        lines = [f"data: {d.kind}, local files"]
        for split, paths in files.items():
            lines.append(
                f"  data.{split}: " + ", ".join(f"{p} ({'found' if p.is_file() else 'MISSING'})" for p in paths)
            )
    elif d.hub is not None:
        splits = ", ".join(s for s in (d.train_split, d.valid_split, d.test_split) if s)
        revision = f", revision {d.hub_revision}" if d.hub_revision else ""
        lines = [
            f"data: {d.kind}, hub dataset {d.hub} ({d.hub_config or 'default config'}{revision}), splits {splits} "
            "(not contacted here: `tformer prepare` downloads it)"
        ]
    else:
        lines = [f"data: {d.kind}, none: {NO_DATA}"]
    try:  # the prepared folder is the truth: where its data came from may differ from the recipe's
        adopted, taken = with_prepared_sources(config.data, config.tokenizer, recipe, overrides)
        advice = f"run `{command_line('prepare', recipe, overrides)}`"
    except DataError as exc:  # not what this recipe trains on: the reason comes with the commands that work
        reason, advice = _one_line(exc).removeprefix(f"{d.dir} was ").removeprefix(f"{d.dir}: ").split("; ", 1)
        lines.append(f"  data.dir {d.dir}: {reason}: {advice}")
        return lines, None
    if taken is not None:
        lines.append(f"  {taken}")
        files, missing = local_files(adopted), []  # training reads data.dir, prepared from these
    stale = prepared_state(
        adopted, config.tokenizer, hash_inputs=bool(files) and all(p.is_file() for ps in files.values() for p in ps)
    )
    if stale is None:
        lines.append(f"  data.dir {d.dir}: prepared and matches the recipe")
        return lines, None
    lines.append(f"  data.dir {d.dir}: {stale}: {advice}")
    if not files and d.hub is None:
        return lines, f"no data: {NO_DATA}"
    if missing:
        split, path = missing[0]
        more = f" (and {len(missing) - 1} more missing, listed above)" if len(missing) > 1 else ""
        return lines, f"data.{split}: file not found: {path}{more}; `tformer prepare` reads it"
    return lines, None


@app.command()
@user_errors
def prepare(recipe: Recipe, overrides: Overrides = None) -> None:
    """Read the recipe's data (local files or the hub), train SentencePiece, encode to data.dir."""
    from tformer_cli.config import load_config
    from tformer_cli.data.prepare import prepare as run_prepare
    from tformer_cli.outputs import check_data_dir

    config = load_config(recipe, overrides or [])
    if not DATA_KINDS[config.data.kind].generated:
        check_data_dir(Path(config.data.dir))
    manifest = run_prepare(config.data, config.tokenizer, log=lambda line: print(line, file=sys.stderr))
    out.print(
        f"prepared: {config.data.dir}  (tokenizer {manifest['tokenizer']['fingerprint'][:12]}, "
        f"{manifest['tokenizer']['vocab_size']} pieces)"
    )
    for split, counts in manifest["splits"].items():
        drops = {k.removeprefix("dropped_"): v for k, v in counts.items() if k.startswith("dropped_")}
        out.print(
            f"  {split}: read {counts['read']:,}  kept {counts['kept']:,}  dropped {drops}  tokens {counts['tokens']}"
        )


def _recipe_or_run(path: Path, overrides: list[str] | None):
    """(the config, the recipe file it came from): a recipe with its overrides, or a run folder's own settings
    (its config.yaml, run/portable.py) with them."""
    if path.is_dir():  # the run package (and torch with it) only for a run folder: `check RECIPE` stays light
        from tformer_cli.run.layout import CONFIG
        from tformer_cli.run.portable import run_folder_recipe

        return run_folder_recipe(path, overrides or []), path / CONFIG
    from tformer_cli.config import load_config

    return load_config(path, overrides or []), path


@app.command()
@user_errors
def check(recipe: RecipeOrRun, overrides: Overrides = None) -> None:
    """Validate a recipe; print its config, parameters and data (exit 1 when a local data file is missing).

    The config shown holds the sections the recipe's kinds use.
    The data: each local file found or missing, or the hub dataset (not contacted); data.dir prepared or not.
    A missing local file fails the check, unless data.dir already holds what `tformer prepare` would make.
    """
    config, recipe = _recipe_or_run(recipe, overrides)
    _print_check(config, recipe, overrides)


@app.command()
@user_errors
def train(
    recipe: RecipeOrRun,
    overrides: Overrides = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate and print, do not train.")] = False,
) -> None:
    """Train a recipe into runs/<run.name> (resumes if that run has a checkpoint), or resume a run folder with its
    own settings (its config.yaml; key=value overrides change them, as with a recipe)."""
    from dataclasses import replace

    from tformer_cli.budget import check_fits
    from tformer_cli.data.prepared import with_prepared_sources
    from tformer_cli.run.layout import BEST, CHECKPOINTS
    from tformer_cli.train.loop import Preempted
    from tformer_cli.train.loop import train as run_training

    config, recipe = _recipe_or_run(recipe, overrides)
    if dry_run:
        _print_check(config, recipe, overrides)
        return
    # the prepared folder is the truth: where its data came from (overrides given to prepare, another data root)
    data, taken = with_prepared_sources(config.data, config.tokenizer, recipe, overrides)
    config = replace(config, data=data)
    if taken is not None and os.environ.get("RANK", "0") == "0":  # said once under torchrun
        print(taken, file=sys.stderr)
    run_dir = Path(config.run.out_dir) / config.run.name
    check_fits(config)  # budget.py: what the training device cannot hold is refused before anything is allocated
    if os.environ.get("RANK", "0") == "0" and (crowded := _threads_line(config)):
        from tformer_cli.log import console

        console.print(crowded)
    try:
        result = run_training(config, run_dir)
    except Preempted as stop:  # a stop the user asked for, already said by the loop: no error, the signal's code
        raise typer.Exit(stop.exit_code) from None
    metric = config.train.best_metric
    out.print(f"run: {run_dir}")
    shown = "  ".join(f"{k}: {v:.4f}" for k, v in result.items() if not k.startswith("best_"))
    out.print(f"final validation {shown}")
    out.print(f"best validation {metric}: {result[f'best_{metric}']:.4f}  ({run_dir / CHECKPOINTS / BEST})")


def _stdin_lines(instead: str) -> Iterator[str]:
    """The lines of stdin, read as files are: UTF-8 only (a bad byte names its line), split on `\\n` only.

    Raises:
        TformerError: stdin is closed (`<&-`), naming the option to give `instead`.
    """
    from tformer_cli.data.text import decode_lines

    if sys.stdin is None or sys.stdin.closed or not hasattr(sys.stdin, "buffer"):
        raise TformerError(f"stdin is closed: nothing to read; give the input with {instead}")
    return decode_lines(sys.stdin.buffer, "<stdin>")


Checkpoint = Annotated[Path, typer.Argument(help="A run directory (its best checkpoint) or a checkpoint file.")]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda")]
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


@app.command("eval")
@user_errors
def eval_(
    path: Annotated[
        Path | None, typer.Argument(help="A run directory (its best checkpoint) or a checkpoint file.")
    ] = None,
    overrides: RunOverrides = None,
    src: Annotated[Path | None, typer.Option(help="Translation: source file to translate and score.")] = None,
    ref: Annotated[Path | None, typer.Option(help="Translation: raw (detokenized) reference file.")] = None,
    hyp: Annotated[Path | None, typer.Option(help="Translation: score this output instead of translating.")] = None,
    test_set: Annotated[
        str, typer.Option(help="Name of the test set, e.g. newstest2014-full (3003) or newstest2014-filtered (2737).")
    ] = "unnamed",
    text: Annotated[Path | None, typer.Option(help="Language model: raw text file to score.")] = None,
    stride: Annotated[
        int, typer.Option(help="Language model: sliding-window stride (0 = non-overlapping blocks).")
    ] = 0,
    window: Annotated[
        int, typer.Option(help="Language model: tokens per window (0 = data.block_size, the training length).")
    ] = 0,
    first_tokens: Annotated[
        int, typer.Option(help="Language model: score only the first N tokens of --text (0 = all).")
    ] = 0,
    split: Annotated[str, typer.Option(help="Generated sessions: score the valid or the test split.")] = "valid",
    device: Device = "auto",
    average: Average = 0,
    ensemble: EnsembleOf = None,
) -> None:
    """Classifier accuracy + confusion matrix; sessions accuracy, Hit@10, MRR by rule beside the Bayes-optimal;
    translation BLEU/chrF/TER (of an ensemble with --ensemble); LM perplexity (token, word, byte): Ctrl-C or
    SIGTERM prints it over the tokens scored so far, marked partial."""
    from tformer_cli import api
    from tformer_cli.evaluate import eval_request

    if first_tokens and text is None:
        raise TformerError("--first-tokens applies to --text (a language model's perplexity)")
    r = eval_request(path, overrides, average, split, src, ref, hyp, text, test_set, stride, window, ensemble)
    if r.task == "files":
        assert hyp is not None and ref is not None  # eval_request: --hyp and --ref score two files
        _print_bleu(api.evaluate_translations(hyp, ref, test_set), ref)
        return
    assert path is not None  # eval_request: every other task has a run
    model = api.load(
        path,
        device=device,
        average=average,
        ensemble=ensemble or (),
        as_trained=r.task == "validation",  # the weights as trained, as training validated them
        overrides=overrides or (),
        command=r.command,
    )
    match r.task:
        case "validation":
            _print_validation(model.validate(split))
        case "translation":
            assert src is not None and ref is not None  # eval_request: translation is --src scored against --ref
            _print_bleu(model.evaluate(src, ref, test_set=test_set), ref)
        case "perplexity":
            assert text is not None  # eval_request: perplexity is that of --text
            result = model.perplexity(text, window=window, stride=stride, first_tokens=first_tokens)
            _print_perplexity(result, text, stride)
            if result["partial"] is not None:  # stopped: the numbers over what was scored are out; the signal's code
                raise typer.Exit(128 + signal.Signals[result["partial"]].value)


def _print_bleu(result: dict, ref: Path) -> None:
    if result["reference_looks_tokenized"]:
        print(
            f"warning: {ref} looks tokenized (Moses escapes or split punctuation); BLEU against a "
            "tokenized reference is not comparable to published sacreBLEU",
            file=sys.stderr,
        )
    out.print(f"test set: {result['test_set']} ({result['lines']} lines)")
    out.print(result["bleu_text"])
    out.print(f"BLEU {result['bleu']:.2f}  signature: {result['bleu_signature']}")
    out.print(f"chrF {result['chrf']:.2f}  signature: {result['chrf_signature']}")
    out.print(f"TER {result['ter']:.2f}  signature: {result['ter_signature']}")


def _print_perplexity(result: dict, text: Path, stride: int) -> None:
    window, precision = result["window"], result["precision"]
    mode = f"sliding window {window}, stride {stride}" if stride else f"blocks of {window}"
    mode += f", {precision} weights" if precision != "fp32" else ""
    scored = f"{result['tokens']:,} tokens"
    if result["tokens"] < result["text_tokens"]:
        scored = f"the first {result['tokens']:,} of {result['text_tokens']:,} tokens"
    if result["partial"] is not None:
        print(f"stopped by {result['partial']}: the result below is partial, over {scored}", file=sys.stderr)
        scored = f"partial ({result['partial']}): {scored}"
    out.print(f"{text}: {scored}, {result['words']:,} words ({mode})")
    out.print(
        f"perplexity per token {result['ppl_token']:.2f}  per word {result['ppl_word']:.2f}  "
        f"bits per byte {result['bits_per_byte']:.4f}"
    )


_RULE_ROWS = {"": "all", "_local": "local (+1)", "_long": "long-range", "_random": "random"}


def _print_sessions(result: dict) -> None:
    """Sessions: loss, then accuracy, Hit@10 and MRR per rule, each beside the Bayes-optimal number."""
    out.print(
        f"{result['split']}: {result['sessions']:,} sessions, {result['n']:,} targets  "
        f"loss: {result['loss']:.4f} ({result['bayes_loss']:.4f})  ppl: {result['ppl']:.4f}"
    )
    out.print("next-item prediction: model (Bayes-optimal: the best any predictor can do on these sessions)")
    out.print(f"{'targets':<12}{'n':>8}  {'accuracy':<17}  {'Hit@10':<17}  MRR")
    for suffix, name in _RULE_ROWS.items():
        cells = [f"{result[m + suffix]:.4f} ({result[f'bayes_{m}{suffix}']:.4f})" for m in ("accuracy", "hit10", "mrr")]
        out.print(f"{name:<12}{result['n' + suffix]:>8,}  " + "  ".join(f"{cell:<17}" for cell in cells).rstrip())


def _print_validation(result: dict) -> None:
    out.print(f"checkpoint: {result['checkpoint']}")
    if "bayes_accuracy" in result:
        _print_sessions(result)
        return
    if "confusion" not in result:
        out.print("validation " + "  ".join(f"{k}: {result[k]:.4f}" for k in ("loss", "ppl", "accuracy")))
        return
    n = len(result["confusion"])
    table = Table(title="confusion matrix (rows: true class, columns: predicted)")
    table.add_column("")
    for j in range(n):
        table.add_column(str(j), justify="right")
    for i, row in enumerate(result["confusion"]):
        table.add_row(str(i), *(str(c) for c in row))
    out.print(table)
    out.print(f"validation accuracy: {result['accuracy']:.4f}  loss: {result['loss']:.4f}  ({result['n']} examples)")


@app.command()
@user_errors
def translate(
    path: Checkpoint,
    overrides: RunOverrides = None,
    input: Annotated[
        Path | None, typer.Option("--input", "-i", help="Source file (default: stdin, line by line).")
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file (default: stdout).")] = None,
    device: Device = "auto",
    average: Average = 0,
    ensemble: EnsembleOf = None,
    engine: Annotated[
        str,
        typer.Option(
            help="native (tformer's search) or ctranslate2 (the same search in CTranslate2, from an export "
            "built into RUN/ctranslate2/ on first use and kept while the checkpoint is unchanged)."
        ),
    ] = "native",
    quantization: Annotated[
        str | None,
        typer.Option(
            help="--engine ctranslate2: int8, int8_float16 or float16 weights (default: float32); the float16 "
            "types are for GPUs (on a CPU, CTranslate2 computes them as int8 and float32)."
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Translate raw text: one output line per input line (decode.* overrides: decode.beam=1 for greedy)."""
    from tformer_cli import api
    from tformer_cli.data.text import read_lines
    from tformer_cli.files import atomic_open, same_file
    from tformer_cli.log import LineProgress
    from tformer_cli.outputs import check_output

    api.check_engine(engine, quantization)
    if input is not None and output is not None and same_file(input, output):
        raise TformerError(f"-o {output} is the input file: the translation would replace it; write it elsewhere")
    if ensemble and (engine != "native" or average):
        from tformer_cli.evaluate import ENSEMBLE_AS_GIVEN

        raise TformerError(f"--ensemble: the native engine translates an ensemble, {ENSEMBLE_AS_GIVEN}")
    if output is not None:
        check_output(output, "text", (path, *(ensemble or [])), force)
    model = api.load(
        path,
        device=device,
        average=average,
        ensemble=ensemble or (),
        engine=engine,  # type: ignore[arg-type]  # api.load refuses another name in one line
        quantization=quantization,
        overrides=overrides or (),
        command="translate",
    )
    file_lines = list(read_lines(input)) if input is not None else None
    lines = file_lines if file_lines is not None else _stdin_lines("-i FILE")
    progress = LineProgress("translated", len(file_lines) if file_lines is not None else 0)  # a file: its lines
    with (
        atomic_open(output) if output is not None else nullcontext(STDOUT) as sink,  # never half-written
        progress,
    ):
        for line in model.translate_iter(lines, interactive=input is None, on_done=progress.advance):
            sink.write(line + "\n")
            sink.flush()


@app.command()
@user_errors
def score(
    path: Checkpoint,
    overrides: RunOverrides = None,
    src: Annotated[Path | None, typer.Option(help="Source file, one sentence a line.")] = None,
    ref: Annotated[Path | None, typer.Option(help="The given translation of each source line.")] = None,
    device: Device = "auto",
    average: Average = 0,
) -> None:
    """Score given translations: `line<TAB>log p<TAB>tokens` per pair on stdout, the total on stderr
    (log p of the reference and its end, given the source; fairseq --score-reference, marian-scorer)."""
    import math

    from tformer_cli import api
    from tformer_cli.data.text import read_lines

    if src is None or ref is None:
        raise TformerError("give --src and --ref: the source lines and their translations to score")
    model = api.load(path, device=device, average=average, overrides=overrides or (), command="score")
    pairs = tokens = 0
    total = 0.0
    for pair in model.score(read_lines(src), read_lines(ref), names=(src, ref)):
        STDOUT.write(f"{pair.line}\t{pair.logprob:.4f}\t{pair.tokens}\n")
        pairs, tokens, total = pairs + 1, tokens + pair.tokens, total + pair.logprob
    STDOUT.flush()
    per_token = total / tokens if tokens else 0.0
    print(
        f"scored {pairs:,} pairs: log p {total:.4f} over {tokens:,} tokens, {per_token:.4f} per token "
        f"(perplexity {math.exp(-per_token):.4f})",
        file=sys.stderr,
    )


@app.command()
@user_errors
def generate(
    path: Annotated[Path, typer.Argument(help="A language model's run directory or checkpoint.")],
    overrides: RunOverrides = None,
    prompt: Annotated[str | None, typer.Option(help="Text to continue (default: read from stdin).")] = None,
    device: Device = "auto",
    average: Average = 0,
) -> None:
    """Continue a prompt; tokens appear as they are produced (decode.temperature/top_k/top_p/seed/max_new_tokens,
    decode.min_len/no_repeat_ngram/repetition_penalty; decode.samples=N: N samples, each printed whole, separated
    by a line of dashes)."""
    from tformer_cli import api

    model = api.load(path, device=device, average=average, overrides=overrides or (), command="generate")
    text = prompt if prompt is not None else "\n".join(_stdin_lines("--prompt TEXT")).rstrip("\n")
    shown = model.generate(text, on_text=_write_now)
    STDOUT.write("\n")
    if not shown.strip():  # generated from the start token, and the model's first token ended the line
        print(
            "warning: nothing generated: the model's first token was the end of the line; "
            "sample (decode.temperature=0.8) or give a --prompt",
            file=sys.stderr,
        )


def _write_now(text: str) -> None:
    STDOUT.write(text)
    STDOUT.flush()


@app.command()
@user_errors
def average(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    last: Annotated[int, typer.Option(help="How many of the latest step checkpoints to average.")] = 5,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Default: RUN/checkpoints/averaged_last<N>.pt")
    ] = None,
    force: Force = False,
) -> None:
    """Average the weights of the last N step checkpoints (the paper averages the last 5); any model kind."""
    from tformer_cli.outputs import check_output
    from tformer_cli.run.checkpoints import average_checkpoints, average_inputs, save_checkpoint
    from tformer_cli.run.layout import CHECKPOINTS, averaged_file

    target = output or run_dir / CHECKPOINTS / averaged_file(last)
    paths = average_inputs(run_dir, last, target)
    check_output(target, "average", tuple(paths), force)
    save_checkpoint(average_checkpoints(paths), target)
    out.print(f"averaged {', '.join(p.name for p in paths)} -> {target}")


@app.command()
@user_errors
def export(
    path: Checkpoint,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="The .safetensors file to write, or the folder (hf, ctranslate2; replaced if an export).",
        ),
    ],
    overrides: RunOverrides = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="safetensors (the weights, any kind), hf (a Hugging Face model folder) or ctranslate2 "
            "(a CTranslate2 model folder; seq2seq and lm).",
        ),
    ] = "safetensors",
    quantization: Annotated[
        str | None,
        typer.Option(
            help="--format ctranslate2: int8, int8_float16 or float16 weights (default: float32); the float16 "
            "types are for GPUs (on a CPU, CTranslate2 computes them as int8 and float32)."
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Export a checkpoint: its weights as safetensors, or a model folder other tools load (hf, ctranslate2).

    The folders carry the decoding settings (decode.* overrides change them: decode.beam=1 decode.no_repeat_ngram=3).
    """
    from tformer_cli.outputs import check_output
    from tformer_cli.run import load_run

    if overrides and fmt == "safetensors":
        raise TformerError("decode.* overrides apply to --format hf and ctranslate2 (safetensors: the weights only)")
    if fmt not in ("safetensors", "hf", "ctranslate2"):
        raise TformerError(f"--format {fmt}: choose safetensors, hf or ctranslate2")
    if quantization is not None and fmt != "ctranslate2":
        raise TformerError(f"--quantization applies to --format ctranslate2, not {fmt}")
    check_output(output, "safetensors" if fmt == "safetensors" else "folder", (path,), force)
    match fmt:
        case "safetensors":
            from tformer_cli.export import export_safetensors

            run = load_run(path, device="cpu", cast=False, read_tokenizer=False)  # the weights as trained; no data
            export_safetensors(run, output)
        case "hf":
            from tformer_cli.export.hugging_face import export_hugging_face

            run = load_run(path, overrides, device="cpu", cast=False)  # the weights as trained, and the tokenizer
            export_hugging_face(run, output)
        case "ctranslate2":
            from tformer_cli.export.ctranslate2 import export_ctranslate2

            run = load_run(path, overrides, device="cpu", cast=False)  # the weights as trained, and the tokenizer
            export_ctranslate2(run, output, quantization)
    out.print(f"{run.checkpoint} -> {output}")


@app.command()
@user_errors
def attention(
    path: Checkpoint,
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG to write.")],
    example: Annotated[
        int, typer.Option(help="Classifier / sessions: which validation example (session) to show.")
    ] = 0,
    text: Annotated[str | None, typer.Option(help="Translation / LM: the input sentence.")] = None,
    force: Force = False,
) -> None:
    """Attention heatmaps per layer and head (encoder self-, decoder self- and cross-attention) as a PNG."""
    from tformer_cli.attention_maps import attention_heatmaps, classifier_maps, session_maps, text_maps
    from tformer_cli.outputs import check_output
    from tformer_cli.run import check_served, load_run

    check_output(output, "figure", (path,), force)

    run = load_run(path, device="cpu", cast=False)  # the maps are read on the CPU, from the weights as trained
    command: Command = "attention --example" if text is None else "attention --text"
    check_served(run, command)
    if text is not None:
        maps, rows, cols, title = text_maps(run, text)
    elif run.kind == "classifier":  # --example serves two kinds (kinds.py), each with its own examples to show
        maps, rows, cols, title = classifier_maps(run, example)
    else:
        maps, rows, cols, title = session_maps(run, example)
    attention_heatmaps(maps, rows, cols, output, title)
    made = (
        " over the greedy translation (not decode.beam's search)" if text is not None and run.kind == "seq2seq" else ""
    )
    out.print(f"wrote {output}: {len(maps)} attention layers{made}")


@app.command()
@user_errors
def sweep(
    recipe: Recipe,
    settings: Annotated[
        list[str] | None,
        typer.Argument(help="key=a,b,c (one run per value; several keys: every combination) or key=value (every run)."),
    ] = None,
    parallel: Annotated[int, typer.Option(help="How many runs train at a time.")] = 1,
    one_at_a_time: Annotated[
        bool,
        typer.Option(
            "--one-at-a-time",
            help="An ablation: every swept key at its first value, then each other value of one key alone.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace existing files at the table's names that are not sweep tables.")
    ] = False,
    max_points: Annotated[
        int, typer.Option("--max-points", help="The largest grid to train; a larger one is refused with its size.")
    ] = 1000,
) -> None:
    """Train a grid of settings, one run each (finished runs are not trained again); print and save a table."""
    import shlex

    from tformer_cli.sweep import run_sweep

    command = [
        "tformer",
        "sweep",
        str(recipe),
        *(settings or []),
        *(["--parallel", str(parallel)] if parallel != 1 else []),
        *(["--one-at-a-time"] if one_at_a_time else []),
    ]
    result = run_sweep(
        recipe,
        settings or [],
        parallel,
        shlex.join(command),
        lambda line: print(line, file=sys.stderr),
        one_at_a_time,
        force,
        max_points,
    )
    out.print(result.markdown, markup=False, end="")
    if result.failed:
        raise TformerError(f"{len(result.failed)} run(s) failed; see {', '.join(map(str, result.failed))}")


def main() -> None:
    guard_standard_streams()
    app()
