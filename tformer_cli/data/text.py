"""Strict readers for local text: plain lines, aligned parallel files, TSV and JSONL (plain or .gz).

- UTF-8 only: an invalid byte is an error naming the file, the line and the byte offset.
- Lines end at `\\n` only: a `\\r` or U+2028 inside a line never makes a new line (a trailing `\\r`
  of a CRLF file is removed).
- A UTF-8 byte order mark (U+FEFF, which Windows editors put first) is removed from the start of the file:
  it is no text, and kept it would make the first line differ (a reference's first sentence, a TSV header).
- Parallel files must have the same number of lines: otherwise an error naming both files and counts.
- A file that cannot be read to its end (a directory, no permission, a truncated or corrupt .gz) is a
  one-line `DataError` naming the file and, where known, the line reached.
"""

from __future__ import annotations

import gzip
import itertools
import json
import zlib
from collections.abc import Iterable, Iterator
from io import BufferedIOBase
from pathlib import Path

from tformer_cli.errors import DataError

BOM = "\ufeff"  # the byte order mark, as UTF-8 decodes it
READ_ERRORS = (OSError, EOFError, zlib.error)  # what reading a plain or gzip file can raise


def read_error(path: Path, exc: BaseException, line: int | None = None) -> DataError:
    """The one-line error for a file that cannot be read (to its end): names the file and the line reached.

    Args:
        path: the file.
        exc: one of READ_ERRORS (gzip.BadGzipFile is an OSError; a truncated .gz raises EOFError).
        line: the line being read when it failed, if known.
    """
    where = f"{path}:{line}" if line else str(path)
    if isinstance(exc, EOFError):
        reason = "the compressed stream ends early (a truncated .gz file?)"
    elif isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        reason = f"not a valid gzip file ({exc})"
    elif isinstance(exc, IsADirectoryError):
        reason = "a directory, not a file"
    else:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return DataError(f"{where}: cannot read: {reason}")


def _open(path: Path) -> BufferedIOBase:
    if path.is_dir():
        raise read_error(path, IsADirectoryError())
    if not path.is_file():
        if path.exists():  # a named pipe, /dev/stdin, <(...): read once only, where some commands read twice
            raise DataError(f"{path}: not a regular file (a pipe or a device); save it to a file first")
        raise DataError(f"file not found: {path}")
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
    except OSError as exc:
        raise read_error(path, exc) from None


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The file's lines as bytes, split on b"\\n" only; a read failure names the line it reached."""
    with _open(path) as handle:
        lines = iter(handle)  # binary iteration splits on b"\n" only
        for number in itertools.count(1):
            try:
                raw = next(lines, None)
            except READ_ERRORS as exc:
                raise read_error(path, exc, number) from None
            if raw is None:
                return
            yield raw


def read_lines(path: Path) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file, split on `\\n` only, without the line end."""
    return decode_lines(_raw_lines(path), str(path))


def decode_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    """Decode lines of bytes (each ending in b"\\n", the last maybe not) as `read_lines` does; `name` for errors."""
    offset = 0
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{name}:{number}: invalid UTF-8 at byte offset {offset + exc.start} ({exc.reason})"
            ) from None
        offset += len(raw)
        if number == 1:
            line = line.removeprefix(BOM)
        yield line[:-1].removesuffix("\r") if line.endswith("\n") else line.removesuffix("\r")


def count_lines(path: Path) -> int:
    """Lines as `read_lines` sees them (a last line without `\\n` counts)."""
    count, last = 0, b"\n"
    with _open(path) as handle:
        try:
            while chunk := handle.read1(1 << 20):  # read1: a truncated .gz gives its last bytes before failing
                count += chunk.count(b"\n")
                last = chunk[-1:]
        except READ_ERRORS as exc:
            raise read_error(path, exc, count + 1) from None
    return count + (last != b"\n")


def read_parallel(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """Yield aligned (source, target) lines; refuse files of different lengths before yielding any."""
    n_src, n_tgt = count_lines(src), count_lines(tgt)
    if n_src != n_tgt:
        raise DataError(f"parallel files differ in length: {src} has {n_src} lines, {tgt} has {n_tgt}")
    yield from zip(read_lines(src), read_lines(tgt), strict=True)


def read_records(path: Path, fields: list[str]) -> Iterator[list[str]]:
    """Yield the named fields of each TSV (header row names the columns) or JSONL record."""
    name = path.name.removesuffix(".gz")
    lines = read_lines(path)
    if name.endswith(".tsv"):
        header = next(lines, "").split("\t")
        missing = [f for f in fields if f not in header]
        if missing:
            raise DataError(f"{path}:1: TSV header has no column {missing[0]!r} (columns: {', '.join(header)})")
        columns = [header.index(f) for f in fields]
        for number, line in enumerate(lines, start=2):
            cells = line.split("\t")
            if len(cells) != len(header):
                raise DataError(f"{path}:{number}: {len(cells)} TSV cells, the header has {len(header)}")
            yield [cells[c] for c in columns]
    elif name.endswith(".jsonl"):
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            yield [_field(record, f, path, number) for f in fields]
    else:
        raise DataError(f"{path}: expected a .tsv or .jsonl file for named fields")


def _field(record: object, dotted: str, path: Path, number: int) -> str:
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise DataError(f"{path}:{number}: record has no field {dotted!r}")
        value = value[part]
    if not isinstance(value, str):
        raise DataError(f"{path}:{number}: field {dotted!r} is not a string")
    return value
