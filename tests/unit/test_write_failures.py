"""A writer's own words for a full disk or the file-size limit become the OSError behind them (files.write_failure).

safetensors says "(os error 28)", torch.save "unexpected pos"; the CLI then prints `PATH: No space left on
device` in one line instead of an internal error, and the target keeps its old contents.
"""

import errno

import pytest

from tformer_cli import files
from tformer_cli.files import atomic_path


def _fail_inside(path, exc):
    with pytest.raises(OSError) as raised, atomic_path(path) as tmp:
        tmp.write_bytes(b"half")
        raise exc
    return raised.value


def test_a_rust_writers_error_number_is_read(tmp_path):
    target = tmp_path / "w.safetensors"
    target.write_bytes(b"old")
    error = _fail_inside(target, RuntimeError("Error while serializing: I/O error: No space left (os error 28)"))
    assert (error.errno, error.filename) == (errno.ENOSPC, str(target))
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_a_full_disk_is_found_when_the_message_names_none(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_disk_full", lambda folder: True)
    error = _fail_inside(tmp_path / "a.pt", RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos"))
    assert error.errno == errno.ENOSPC and error.strerror == "No space left on device"


def test_other_failures_stay_what_they_are(tmp_path):
    with pytest.raises(ValueError), atomic_path(tmp_path / "a.pt"):
        raise ValueError("a bug")
    assert list(tmp_path.iterdir()) == []
