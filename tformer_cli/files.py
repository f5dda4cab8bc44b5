"""Files that are never half-written, folders that one process at a time may write into, and files' hashes.

Every output tformer writes goes to a temporary name beside its target (`.NAME.<host>.<pid>-<random>.tmp`,
`temporary_prefix`) and is renamed over the target only once complete and flushed to disk: a crash, a full disk
or a `kill -9` leaves either the previous file or the new one, and perhaps a temporary, which the next write into
the same folder removes (`remove_leftovers`: those of this host whose process has exited). A folder that a long
job writes into (a run directory, a prepared-data directory) is locked with `flock`, which the kernel releases
when the process dies, however it dies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tformer_cli.errors import TformerError

TMP_SUFFIX = ".tmp"
LOCK = ".lock"  # FolderLock's file: a folder's own lock, or the ending of `.NAME.lock` beside a folder


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
    remove_leftovers(path.parent)
    fd, name = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _fsync(tmp, os.O_RDONLY)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        failure = write_failure(exc, [tmp], path)
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a full disk names no file: name the target
            exc.filename = str(path)
        if failure is not None:
            raise failure from None
        raise
    _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "", socket.gethostname())[:40]


# A temporary of tformer's: `.NAME.<host>.<pid>-` and mkstemp's or mkdtemp's 8 characters, then .tmp (a file or
# folder being written) or .old (a folder being replaced).
_TEMPORARY = re.compile(r"\..+\.(?P<host>[A-Za-z0-9-]*)\.(?P<pid>\d+)-[a-z0-9_]{8}\.(tmp|old)")


def temporary_prefix(target: Path) -> str:
    """The prefix of a temporary beside `target` (for mkstemp or mkdtemp): it names this host and process, so
    that `remove_leftovers` knows when its writer is gone."""
    return f".{target.name}.{_host()}.{os.getpid()}-"


def remove_leftovers(folder: Path) -> list[Path]:
    """Delete the temporaries that killed writers left in `folder`: names of `temporary_prefix`'s form whose
    process, on this host, has exited (a live writer's, another host's, are left alone). Files, folders (an export,
    prepared data) and links (unlinked, never followed). Returns what went."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    removed = []
    for entry in entries:
        found = _TEMPORARY.fullmatch(entry.name)
        if found is None or found["host"] != _host() or _alive(int(found["pid"])):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def write_failure(exc: BaseException, written: list[Path], target: Path) -> OSError | None:
    """The OSError behind a library's failure to write (None when there is none to name).

    Writers in C++ and Rust report a full disk or the file-size limit (RLIMIT_FSIZE) in their own words:
    safetensors says "(os error 28)", torch.save "unexpected pos". Found from the message's error number, or
    else from the state the write left: a file of `written` at the size limit, or no space left on the disk.
    """
    if isinstance(exc, (OSError, TformerError)) or not isinstance(exc, Exception):
        return None
    found = re.search(r"os error (\d+)", str(exc))
    if found:
        code = int(found.group(1))
    elif _at_size_limit(written):
        code = errno.EFBIG
    elif _disk_full(target.parent):
        code = errno.ENOSPC
    else:
        return None
    return OSError(code, os.strerror(code), str(target))


def _at_size_limit(files: list[Path]) -> bool:
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return False
    sizes = [
        p.stat().st_size for f in files if f.exists() for p in ([f] if f.is_file() else f.rglob("*")) if p.is_file()
    ]
    return any(size >= limit for size in sizes)


def _disk_full(folder: Path) -> bool:
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


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
    """A `flock` on `folder/<name>` (default `.lock`), which records its holders' pids.

    Exclusive (a writer: `train` of a run, `prepare` of a data folder) or shared (`shared=True`: a reader,
    such as training reading its prepared data folder, which `prepare` may then not replace). A conflicting
    lock, in another process or the same one, gets a `TformerError` naming the holders. The kernel drops the
    lock when the holder exits, so a killed process never leaves a stale lock.

    The lock file is opened without following a symbolic link and must be a regular file with no other
    name (a planted link to another file is refused, never written into).
    """

    def __init__(
        self, folder: Path, what: str, name: str = LOCK, shared: bool = False, readers: str | None = None
    ) -> None:
        """`what`: the exclusive holder's work, as messages name it; `readers`: the shared holders' (default `what`)."""
        self.path = folder / name
        self.what = what
        self.readers = readers or what
        self.shared = shared
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock or raise a TformerError naming the processes that hold it.

        Raises:
            TformerError: the lock is held (naming the holders), or the lock file is a link or not a file.
        """
        fd = _open_lock_file(self.path, self.shared)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            holders, readers = _holders(fd), not self.shared and _held_shared(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                where = self.path.parent if self.path.name == LOCK else self.path
                what = self.readers if readers else self.what
                raise TformerError(
                    f"{where} is in use by process {holders} ({what}); wait for it or choose another folder"
                ) from None
            raise
        _record_holder(fd, self.shared)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the .lock file stays: removing it would race with a waiting process)."""
        if self._fd is not None:
            if not self.shared:  # its pid goes with it (readers that come next append theirs)
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # a lock nobody refers to any more is released, as its closed file would be
        if self._fd is not None:
            self.release()


def _open_lock_file(path: Path, shared: bool) -> int:
    """The lock file's descriptor (`open_own_file`), read-write, created if absent.

    A shared lock on a folder one may not write into (prepared data on a read-only disk) is taken on a
    read-only descriptor; flock needs no write access.
    """
    try:
        return open_own_file(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if not (shared and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM) and path.is_file()):
            raise
    return open_own_file(path, os.O_RDONLY)


def open_own_file(path: Path, flags: int) -> int:
    """`os.open(path, flags)` for a file tformer keeps writing into (a lock, a log it appends to): never through
    a symbolic link (O_NOFOLLOW), and only a regular file with no other name, so that a link someone planted
    is refused rather than written through. Never blocks (a pipe is refused, not waited on).

    Raises:
        TformerError: `path` is a symbolic link, not a regular file, or a hard link to another file.
        OSError: what opening raises otherwise (no permission, no such folder).
    """
    extra = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | extra, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TformerError(f"{path} is a symbolic link, not a file of tformer's; remove it") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else "a hard link to another file"
        raise TformerError(f"{path} is {what}, not a file of tformer's; remove it")
    os.set_blocking(fd, True)
    return fd


def _record_holder(fd: int, shared: bool) -> None:
    """Write this pid into the lock file: alone (exclusive), or appended to the other readers' (shared)."""
    try:
        if not shared:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        else:
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:  # a read-only lock file: the lock holds all the same, unnamed
        pass


def _held_shared(fd: int) -> bool:
    """Whether the lock on `fd`'s file is held shared only (a shared lock can still be had)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def _holders(fd: int) -> str:
    """The live pids a lock file names (a shared lock's file may still name readers that have exited)."""
    try:
        text = os.pread(fd, 1 << 16, 0).decode("ascii", "replace")
    except OSError:
        text = ""
    pids = list(dict.fromkeys(int(word) for word in text.split() if word.isdigit() and int(word) > 0))
    alive = [str(pid) for pid in pids if _alive(pid)]
    return ", ".join(alive or map(str, pids)) or "unknown"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


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
