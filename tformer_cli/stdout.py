"""Standard output as a Unix tool writes it: the one writer of every command's results.

A closed standard output (`tformer translate ... >&-`) is a one-line error at the first write (exit 1), never a
result lost with exit 0; a failing write (a full disk, `> /dev/full`) is one line naming standard output; a reader
that left (`| head`) ends the command quietly (cli.user_errors). `guard_standard_streams` runs first in every
process of the CLI: it puts /dev/null on a closed descriptor 0, 1 or 2, so that no file the command opens later takes
its number (a checkpoint opened as descriptor 1 would receive the translation).
"""

from __future__ import annotations

import errno
import os
import sys

from tformer_cli.errors import TformerError

_CLOSED = TformerError(
    "standard output is closed: the result would be lost; redirect it to a file (or give -o where the command has it)"
)


def guard_standard_streams() -> None:
    """Open /dev/null on each of descriptors 0, 1 and 2 that is closed; a closed standard output then refuses every
    write (libraries' too: click's help), where Python would hold None in sys.stdout and drop what is printed."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = _Closed()


class _Closed:
    """sys.stdout where standard output is closed: every write is the one-line error."""

    closed = True
    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise _CLOSED

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class StandardOutput:
    """A text stream over whatever `sys.stdout` is at each call (the CLI's tests swap it), that refuses to write
    into a closed one and names standard output in a failed write's one-line error.

    Raises (on write and flush):
        TformerError: standard output is closed, or writing to it failed (other than a broken pipe).
        BrokenPipeError: the reader left (the command ends quietly).
    """

    def write(self, text: str) -> int:
        stream = _stream()
        try:
            return stream.write(text)
        except OSError as exc:
            raise _failed(exc) from None

    def flush(self) -> None:
        stream = sys.stdout
        if stream is None:
            return  # nothing was written (a write raised)
        try:
            stream.flush()
        except OSError as exc:
            raise _failed(exc) from None

    def isatty(self) -> bool:
        stream = sys.stdout
        return stream is not None and stream.isatty()

    def fileno(self) -> int:
        return _stream().fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"


def _stream():
    stream = sys.stdout
    if stream is None or getattr(stream, "closed", False):
        raise _CLOSED
    return stream


def _failed(exc: OSError) -> BaseException:
    if isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
        return BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
    if exc.errno == errno.EBADF:
        return _CLOSED
    return TformerError(f"standard output: {exc.strerror or exc}")


STDOUT = StandardOutput()
