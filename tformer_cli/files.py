"""Files that are never half-written, folders that one process at a time may write into, and files' hashes.

Every output tformer writes goes to a temporary name beside its target (`.NAME.<random>.tmp`) and is
renamed over the target only once complete and flushed to disk: a crash, a full disk or a `kill -9`
leaves either the previous file or the new one. A folder that a long job writes into (a run
directory, a prepared-data directory) is locked with `flock`, which the kernel releases when the
process dies, however it dies.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tformer_cli.errors import TformerError

TMP_SUFFIX = ".tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary file name beside `path`; on a clean exit, the file is fsynced and renamed over `path`.

    For writers that take a file name (safetensors, matplotlib); `atomic_open` gives a handle. On an
    exception nothing is renamed and the temporary file is removed: `path` keeps its old contents (or
    stays absent). The new file gets the usual permissions (0666 less the umask), and the folder is
    fsynced after the rename so that the rename itself survives a power cut.

    Raises:
        TformerError: `path` is a folder, or its folder does not exist.
    """
    if path.is_dir():
        raise TformerError(f"{path} is a folder; give a file name")
    if not path.parent.is_dir():
        raise TformerError(f"{path}: the folder {path.parent} does not exist")
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _fsync(tmp, os.O_RDONLY)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a full disk names no file: name the target
            exc.filename = str(path)
        raise
    _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """`atomic_path` with the temporary file opened: "w" (text, `encoding`) or "wb" (bytes).

    Raises:
        TformerError: `path` is a folder, or its folder does not exist.
    """
    with atomic_path(path) as tmp, tmp.open(mode, encoding=None if "b" in mode else encoding) as handle:
        yield handle


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(text)


def write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as indented JSON, atomically."""
    write_text(path, json.dumps(data, indent=1) + "\n")


def remove_temporaries(folder: Path) -> list[Path]:
    """Delete the leftovers of interrupted `atomic_open` writes in `folder` (call it holding the folder's lock)."""
    removed = []
    for leftover in folder.glob(f".*{TMP_SUFFIX}"):
        if leftover.is_file():
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def same_file(a: Path, b: Path) -> bool:
    """True when `a` and `b` name the same existing file (also through links or different spellings)."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


class FolderLock:
    """An exclusive `flock` on `folder/<name>` (default `.lock`), which records the holder's pid.

    A second process (or a second lock in the same process) gets a `TformerError` naming the holder.
    The kernel drops the lock when the holder exits, so a killed run never leaves a stale lock.
    """

    def __init__(self, folder: Path, what: str, name: str = ".lock") -> None:
        self.path = folder / name
        self.what = what
        self._handle: IO[str] | None = None

    def acquire(self) -> FolderLock:
        """Take the lock or raise a TformerError naming the process that holds it."""
        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                where = self.path.parent if self.path.name == ".lock" else self.path
                raise TformerError(
                    f"{where} is in use by process {holder} ({self.what}); wait for it or choose another folder"
                ) from None
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        """Drop the lock (the .lock file stays: removing it would race with a waiting process)."""
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (inputs, tokenizers, checkpoints)."""
    with path.open("rb") as handle:
        return sha256_stream(handle)


def sha256_stream(handle: IO[bytes]) -> str:
    """The sha256 of what is left to read in a binary handle."""
    digest = hashlib.sha256()
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()
