"""Strict readers: UTF-8 errors with location, \\n-only line splitting, parallel length checks."""

import gzip

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
