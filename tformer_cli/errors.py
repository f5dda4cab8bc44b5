"""The one exception type a user is meant to see.

Every error a user can act on (a bad recipe key, a missing file, a malformed line) is raised as a
`TformerError` whose message fits on one line. The CLI prints that line to stderr and exits non-zero;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class TformerError(Exception):
    """A user-facing error: its message is one actionable line."""


class ConfigError(TformerError):
    """A recipe or an override is invalid."""


class DataError(TformerError):
    """Input data is missing, malformed or inconsistent."""


class CheckpointError(TformerError):
    """A checkpoint is missing, corrupt, or does not match the recipe."""


def first_line(exc: BaseException, limit: int = 160) -> str:
    """An exception's message cut to its first line (at most `limit` characters), or its type's name if empty:
    what a one-line message quotes of an error from a library."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def command_line(
    name: str, recipe: str | Path | None, overrides: Sequence[str] | None, changes: Sequence[str] = ()
) -> str:
    """`tformer NAME RECIPE OVERRIDES` as a shell reads it, for an error's advice; each of `changes` (`key=value`)
    replaces an override of its key."""
    import shlex

    keys = {change.split("=", 1)[0] for change in changes}
    kept = [item for item in overrides or [] if item.split("=", 1)[0] not in keys]
    return shlex.join(["tformer", name, *([str(recipe)] if recipe is not None else []), *kept, *changes])
