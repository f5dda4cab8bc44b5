"""An export directory written all at once, and the one-line error for a missing optional extra."""

from __future__ import annotations

import importlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from tformer_cli.errors import TformerError
from tformer_cli.files import (
    _umask,  # the one place that reads it
    remove_leftovers,
    temporary_prefix,
    write_failure,
)

MARKER = "tformer_export.json"  # in every export directory tformer writes: what made it


def require(module: str, extra: str = "export") -> ModuleType:
    """Import an optional dependency, or fail with one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TformerError(
            f'this needs the `{module}` package: pip install "tformer-cli[{extra}]"'
            f' (in a checkout: pip install -e ".[{extra}]")'
        ) from None


@contextmanager
def export_folder(output: Path) -> Iterator[Path]:
    """A temporary folder beside `output`, renamed to `output` once the block finishes without error.

    An existing `output` is replaced only when it is an earlier tformer export (it holds MARKER) or
    an empty folder; anything else is refused, so an export never deletes a folder it did not write.
    On an error the temporary folder is removed and `output` is left as it was.

    Raises:
        TformerError: `output` is a file, a folder tformer did not write, or its parent does not exist.
    """
    if output.exists() and not output.is_dir():
        raise TformerError(f"-o {output} is a file; give a folder for this export")
    if output.is_dir() and any(output.iterdir()) and not (output / MARKER).is_file():
        raise TformerError(f"-o {output} is a folder that is not a tformer export; give a new or empty folder")
    if not output.parent.is_dir():
        raise TformerError(f"-o {output}: the folder {output.parent} does not exist")
    remove_leftovers(output.parent)  # what a killed export left
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(output), suffix=".tmp", dir=output.parent))
    try:
        yield tmp
        _as_the_umask_makes_them(tmp)
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=temporary_prefix(output), suffix=".old", dir=output.parent))
            output.rename(old / output.name)
            tmp.rename(output)
            shutil.rmtree(old)
        else:
            tmp.rename(output)
    except BaseException as exc:
        failure = write_failure(exc, [tmp], output)
        shutil.rmtree(tmp, ignore_errors=True)
        if failure is not None:  # a full disk or the file-size limit, in a writer's own words
            raise failure from None
        raise


def _as_the_umask_makes_them(folder: Path) -> None:
    """Give `folder` and all in it the modes mkdir and open give (0o777, 0o666 less the umask): mkdtemp's folder
    is private (drwx------), and so are some writers' files (safetensors' model.safetensors: -rw-------)."""
    umask = _umask()
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
