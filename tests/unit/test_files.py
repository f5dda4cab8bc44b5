"""Atomic writes and folder locks (tformer_cli/files.py)."""

import os
import stat
import subprocess
import sys

import pytest

from tformer_cli.errors import TformerError
from tformer_cli.files import FolderLock, atomic_open, remove_temporaries, same_file, write_json, write_text


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    write_text(target, "old\n")
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half of the new")
        raise RuntimeError("disk full")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_new_file_gets_the_umask_permissions_not_mkstemps_0600(tmp_path):
    write_json(tmp_path / "a.json", {"x": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o666 & ~mask


def test_remove_temporaries_deletes_only_leftovers(tmp_path):
    (tmp_path / ".best.pt.abc123.tmp").write_bytes(b"x" * 10)
    (tmp_path / "best.pt").write_bytes(b"keep")
    (tmp_path / ".lock").write_text("1\n")
    assert [p.name for p in remove_temporaries(tmp_path)] == [".best.pt.abc123.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "best.pt"]


def test_same_file_sees_through_spellings_and_links(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "a.txt")
    assert same_file(tmp_path / "a.txt", tmp_path / "sub" / ".." / "a.txt") is False  # sub does not exist
    assert same_file(tmp_path / "a.txt", tmp_path / "." / "a.txt")
    assert same_file(tmp_path / "a.txt", tmp_path / "link.txt")
    assert not same_file(tmp_path / "a.txt", tmp_path / "missing.txt")


def test_a_second_lock_names_the_holder_and_the_lock_dies_with_its_process(tmp_path):
    with FolderLock(tmp_path, "tformer train"):
        with pytest.raises(TformerError, match=rf"in use by process {os.getpid()} \(tformer train\)"):
            FolderLock(tmp_path, "tformer train").acquire()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from pathlib import Path; from tformer_cli.files import FolderLock; "
            f"lock = FolderLock(Path({str(tmp_path)!r}), 'x').acquire(); "
            "print('held', flush=True); import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TformerError, match=rf"process {holder.pid} "):
            FolderLock(tmp_path, "x").acquire()
    finally:
        holder.kill()
        holder.wait()
    FolderLock(tmp_path, "x").acquire().release()  # killed: the kernel released it
