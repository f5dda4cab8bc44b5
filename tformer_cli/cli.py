"""The `tformer` command: each subcommand loads a recipe, calls one library function, reports.

User errors (`TformerError`) print one line to stderr and exit 1; `--debug` shows the traceback.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from tformer_cli import __version__
from tformer_cli.errors import TformerError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train and evaluate Transformer models from YAML recipes.")
out = Console(highlight=False)
_debug = {"on": False}

Recipe = Annotated[Path, typer.Argument(help="Recipe YAML, e.g. recipes/pattern_classifier.yaml")]
Overrides = Annotated[Optional[list[str]], typer.Argument(help="key=value overrides, e.g. train.lr=5e-4")]


def user_errors(fn):
    """Turn a TformerError into one line on stderr and exit code 1 (unless --debug)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TformerError as exc:
            if _debug["on"]:
                raise
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper


def _version(value: bool) -> None:
    if value:
        print(f"tformer {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    _debug["on"] = debug


def _print_check(config) -> None:
    from tformer_cli.config import config_to_yaml
    from tformer_cli.model import count_parameters
    from tformer_cli.train.tasks import make_task

    out.print(config_to_yaml(config), end="")
    table = Table(title="parameters by component")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    for name, count in count_parameters(make_task(config).build_model()).items():
        table.add_row(name, f"{count:,}")
    out.print(table)


@app.command()
@user_errors
def prepare(recipe: Recipe, overrides: Overrides = None) -> None:
    """Read the recipe's data (local files or the hub), train SentencePiece, encode to data.dir."""
    from tformer_cli.config import load_config
    from tformer_cli.data.prepare import prepare as run_prepare

    config = load_config(recipe, overrides or [])
    manifest = run_prepare(config, log=lambda line: print(line, file=sys.stderr))
    out.print(f"prepared: {config.data.dir}  (tokenizer {manifest['tokenizer']['fingerprint'][:12]}, "
              f"{manifest['tokenizer']['vocab_size']} pieces)")
    for split, counts in manifest["splits"].items():
        drops = {k.removeprefix("dropped_"): v for k, v in counts.items() if k.startswith("dropped_")}
        out.print(f"  {split}: read {counts['read']:,}  kept {counts['kept']:,}  dropped {drops}  tokens {counts['tokens']}")


@app.command()
@user_errors
def check(recipe: Recipe, overrides: Overrides = None) -> None:
    """Validate a recipe; print the resolved config and the parameter count by component."""
    from tformer_cli.config import load_config

    _print_check(load_config(recipe, overrides or []))


@app.command()
@user_errors
def train(
    recipe: Recipe,
    overrides: Overrides = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate and print, do not train.")] = False,
) -> None:
    """Train a recipe into runs/<run.name> (resumes if that run has a checkpoint)."""
    from tformer_cli.config import load_config
    from tformer_cli.train.loop import train as run_training

    config = load_config(recipe, overrides or [])
    if dry_run:
        _print_check(config)
        return
    run_dir = Path(config.run.out_dir) / config.run.name
    result = run_training(config, run_dir)
    metric = config.train.best_metric
    out.print(f"run: {run_dir}")
    shown = "  ".join(f"{k}: {v:.4f}" for k, v in result.items() if not k.startswith("best_"))
    out.print(f"final validation {shown}")
    out.print(f"best validation {metric}: {result[f'best_{metric}']:.4f}  ({run_dir / 'checkpoints' / 'best.pt'})")


@app.command("eval")
@user_errors
def eval_(
    path: Annotated[Path, typer.Argument(help="A run directory (uses its best checkpoint) or a checkpoint file.")],
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
) -> None:
    """Recompute validation accuracy from a checkpoint and print the confusion matrix."""
    from tformer_cli.evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(path, device)
    out.print(f"checkpoint: {result['checkpoint']}")
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


def main() -> None:
    app()
