"""Strict readers: UTF-8 errors with location, \\n-only line splitting, parallel length checks."""

import gzip
import os
from pathlib import Path

import pytest

from tformer_cli.data.text import count_lines, read_lines, read_parallel, read_records
from tformer_cli.errors import DataError


def test_invalid_utf8_names_file_line_and_byte_offset(tmp_path):
    path = tmp_path / "bad.en"
    path.write_bytes(b"fine\nalso fine\nbro\xffken\n")
    with pytest.raises(DataError, match=r"bad.en:3: invalid UTF-8 at byte offset 18"):
        list(read_lines(path))


def test_only_newline_splits_lines(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("a\rb\r\nc\u2028d\ne\x0bf\x0cg\x1c\n".encode())
    assert list(read_lines(path)) == ["a\rb", "c\u2028d", "e\x0bf\x0cg\x1c"]
    assert count_lines(path) == 3


def test_last_line_without_newline_and_gzip(tmp_path):
    path = tmp_path / "x.txt.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b"one\ntwo")
    assert list(read_lines(path)) == ["one", "two"] and count_lines(path) == 2


def test_mismatched_parallel_files_name_both_files_and_counts(tmp_path):
    (tmp_path / "t.en").write_text("a\nb\nc\n")
    (tmp_path / "t.de").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"t.en has 3 lines, .*t.de has 2"):
        next(read_parallel(tmp_path / "t.en", tmp_path / "t.de"))


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        list(read_lines(tmp_path / "nope"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a POSIX thing")
def test_a_named_pipe_or_a_device_is_not_called_missing(tmp_path):
    os.mkfifo(tmp_path / "pipe")  # opened by no writer: reading it would wait forever
    for path in (tmp_path / "pipe", Path("/dev/null")):
        with pytest.raises(DataError, match=rf"^{path}: not a regular file \(a pipe or a device\); save it to a file"):
            list(read_lines(path))
        with pytest.raises(DataError, match="not a regular file"):
            count_lines(path)


def test_tsv_and_jsonl_fields(tmp_path):
    tsv = tmp_path / "x.tsv"
    tsv.write_text("en\tde\nhello\thallo\n")
    assert list(read_records(tsv, ["en", "de"])) == [["hello", "hallo"]]
    with pytest.raises(DataError, match="no column 'fr'"):
        list(read_records(tsv, ["fr"]))
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text('{"translation": {"en": "hi", "de": "hallo"}}\n{"translation": {"en": "x"}}\n')
    with pytest.raises(DataError, match=r"x.jsonl:2: record has no field 'translation.de'"):
        list(read_records(jsonl, ["translation.en", "translation.de"]))


def _gzip_of_lines(n: int) -> bytes:
    return gzip.compress("".join(f"line {i}\n" for i in range(1, n + 1)).encode())


def _corrupt_deflate(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[11] ^= 0xFF  # inside the deflate block header: zlib.error, not a CRC mismatch
    return bytes(damaged)


@pytest.mark.parametrize("reader", [lambda p: list(read_lines(p)), count_lines], ids=["read_lines", "count_lines"])
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) // 2], r"x.txt.gz:\d+: cannot read: the compressed stream ends early"),
        (lambda data: b"not gzip\n", r"x.txt.gz:1: cannot read: not a valid gzip file \(Not a gzipped file"),
        (_corrupt_deflate, r"x.txt.gz:1: cannot read: not a valid gzip file \(Error -3 while decompressing"),
    ],
    ids=["truncated", "not-gzip", "corrupt"],
)
def test_bad_gzip_is_one_data_error_naming_file_and_line(tmp_path, reader, damage, message):
    path = tmp_path / "x.txt.gz"
    path.write_bytes(damage(_gzip_of_lines(20_000)))
    with pytest.raises(DataError, match=message):
        reader(path)


def test_truncated_gzip_names_the_line_reached_by_either_reader(tmp_path):
    path = tmp_path / "x.txt.gz"
    data = _gzip_of_lines(20_000)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as by_lines:
        list(read_lines(path))
    with pytest.raises(DataError) as by_count:
        count_lines(path)
    line = int(str(by_lines.value).split(":")[1])
    assert 1 < line < 20_000 and str(by_count.value) == str(by_lines.value)


def test_a_directory_is_named_as_such(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path}: cannot read: a directory, not a file"):
        list(read_lines(tmp_path))
    with pytest.raises(DataError, match="a directory, not a file"):
        count_lines(tmp_path)
