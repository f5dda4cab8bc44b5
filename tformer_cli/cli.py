"""The `tformer` command: the table of its commands (each in tformer_cli/commands/, one job each: parse, call one
library function, print what it returns) and the one way their failures end.

User errors (`TformerError`) print one line to stderr and exit 1; `--debug` shows the traceback. Usage errors (an
unknown option, a choice not among an Enum's) are one `error:` line, exit 1; an old spelling of a command that
moved names the new one (`MOVED`).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # typer 0.2x carries its own copy of click, whose exceptions its commands raise
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]  # the same module, from click itself

from tformer_cli.commands import (
    attention,
    average,
    bleu,
    check,
    evaluate,
    export,
    generate,
    perplexity,
    prepare,
    score,
    sweep,
    train,
    translate,
)
from tformer_cli.errors import TformerError
from tformer_cli.stdout import STDOUT, guard_standard_streams
from tformer_cli.version import __version__

_PERPLEXITY = "`tformer perplexity RUN TEXT [--stride N] [--window N] [--first-tokens N]`"
# Old spellings that users may have in scripts: (command, option) -> the command that does that job now.
MOVED = {
    ("eval", "--hyp"): "`tformer bleu HYP --ref REF`",
    ("eval", "--text"): _PERPLEXITY,
    ("eval", "--stride"): _PERPLEXITY,
    ("eval", "--window"): _PERPLEXITY,
    ("eval", "--first-tokens"): _PERPLEXITY,
}


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
        except click_errors.NoSuchOption as exc:
            print(f"error: {_moved(exc, sys.argv[1:] if args is None else list(args))}", file=sys.stderr)
            sys.exit(1)
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


def _moved(exc: click_errors.NoSuchOption, args: list[str]) -> str:
    """The error of an unknown option: for an old spelling (`MOVED`, or `--device` on a run), the command or override
    that replaced it; else click's message."""
    in_command = exc.ctx is not None and exc.ctx.parent is not None  # not `tformer --device cuda translate`
    command = (exc.ctx.info_name if exc.ctx is not None and in_command else None) or ""
    typed = " ".join(["tformer", *([command] if command else []), exc.option_name])
    if exc.option_name == "--device":  # the device is the config's run.device: an override like the others
        given = [a.split("=", 1)[1] for a in args if a.startswith("--device=")]
        given += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--device"]
        value = given[0] if given else "NAME"
        return f"`{typed} {value}` is now the override run.device={value} (among the key=value ones)"
    if (command, exc.option_name) in MOVED:
        return f"`{typed}` is now {MOVED[command, exc.option_name]}"
    see = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
    return f"{' '.join(exc.format_message().split())}{see}"


app = typer.Typer(
    cls=_OneLineUsage,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: a flag is `--force`, not `--force <bool>`
    help="Train and evaluate Transformer models from YAML recipes.",
)
_debug = {"on": False}


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


# The command table: each name, the function that does its one job (tformer_cli/commands/).
COMMANDS = {
    "prepare": prepare.prepare,
    "check": check.check,
    "train": train.train,
    "eval": evaluate.eval_,
    "bleu": bleu.bleu,
    "perplexity": perplexity.perplexity,
    "translate": translate.translate,
    "score": score.score,
    "generate": generate.generate,
    "average": average.average,
    "export": export.export,
    "attention": attention.attention,
    "sweep": sweep.sweep,
}
for _name, _command in COMMANDS.items():
    app.command(_name)(user_errors(_command))


def main() -> None:
    guard_standard_streams()
    app()
