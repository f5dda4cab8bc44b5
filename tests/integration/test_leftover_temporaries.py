"""Every atomic writer cleans its own leftovers: writers are killed (-9) at random points, and the next write into
the same folder leaves none of the temporaries they left, and the target whole; a live writer's temporaries, and
another host's, are left alone."""

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.export.folder import MARKER, export_folder
from tformer_cli.files import TMP_SUFFIX, temporary_prefix, write_text
from tformer_cli.run.checkpoints import load_checkpoint, save_checkpoint

ROOT = Path(__file__).parents[2]
LEFTOVER = re.compile(r"\..+\.(tmp|old)")
BIG = 1 << 21

# Each writer in a loop, in its own process: a text file, an export folder, a checkpoint. "ready" once one is whole.
WRITERS = {
    "text": f"""
from tformer_cli.files import write_text
i = 0
while True:
    write_text(FOLDER / "out.txt", str(i) + "x" * {BIG})
    i += 1
    if i == 1:
        print("ready", flush=True)
""",
    "export": f"""
import json
from tformer_cli.export.folder import MARKER, export_folder
i = 0
while True:
    with export_folder(FOLDER / "exp") as tmp:
        for n in range(3):
            (tmp / f"part{{n}}.bin").write_bytes(b"w" * {BIG})
        (tmp / MARKER).write_text(json.dumps({{"i": i}}))
    i += 1
    if i == 1:
        print("ready", flush=True)
""",
    "checkpoint": """
import torch
from tformer_cli.run.checkpoints import save_checkpoint
i = 0
while True:
    save_checkpoint({"model": {"w": torch.full((1 << 19,), float(i))}, "position": {"step": i}}, FOLDER / "c.pt")
    i += 1
    if i == 1:
        print("ready", flush=True)
""",
}


def _start(kind: str, folder: Path) -> subprocess.Popen:
    code = f"from pathlib import Path\nFOLDER = Path({str(folder)!r})\n" + WRITERS[kind]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if LEFTOVER.fullmatch(p.name))


def _next_write(kind: str, folder: Path) -> None:
    """The next run of the same writer into the folder, in this process; then its target must be whole."""
    if kind == "text":
        write_text(folder / "out.txt", "new")
        assert (folder / "out.txt").read_text() == "new"
    elif kind == "export":
        with export_folder(folder / "exp") as tmp:
            (tmp / MARKER).write_text("{}")
        assert sorted(p.name for p in (folder / "exp").iterdir()) == [MARKER]
    else:
        save_checkpoint({"model": {"w": torch.zeros(2)}, "position": {"step": -1}}, folder / "c.pt")
        assert load_checkpoint(folder / "c.pt")["position"]["step"] == -1


def test_writers_killed_at_random_points_leave_nothing_after_the_next_write(tmp_path):
    rng = random.Random(0)
    left = 0
    for round_ in range(3):
        started = {}
        for kind in WRITERS:  # the three writers at once, each in its own folder
            folder = tmp_path / f"{kind}{round_}"
            folder.mkdir()
            started[kind] = (folder, _start(kind, folder))
        for kind, (folder, process) in started.items():
            assert process.stdout.readline().strip() == "ready", kind
            time.sleep(rng.uniform(0, 0.15))
            process.send_signal(signal.SIGKILL)
            process.wait()
            process.stdout.close()
            left += len(_leftovers(folder))
        for kind, (folder, _) in started.items():
            _next_write(kind, folder)
            assert _leftovers(folder) == [], (kind, round_)
    assert left > 0  # the kills did land inside writes


def test_the_leftover_of_a_writer_killed_mid_write_is_removed_by_the_next_write_of_another_file(tmp_path):
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom tformer_cli.files import atomic_open\n"
        f"with atomic_open(Path({str(tmp_path / 'a.txt')!r})) as handle:\n"
        "    handle.write('half'); handle.flush(); print('ready', flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout.readline().strip() == "ready"
    [leftover] = _leftovers(tmp_path)
    write_text(tmp_path / "b.txt", "b")  # the writer is alive: its temporary stays
    assert _leftovers(tmp_path) == [leftover]
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stdout.close()
    write_text(tmp_path / "b.txt", "b")
    assert _leftovers(tmp_path) == [] and not (tmp_path / "a.txt").exists()


def test_what_is_not_a_dead_writers_temporary_stays(tmp_path):
    mine = tmp_path / (temporary_prefix(tmp_path / "x") + "abcdefgh" + TMP_SUFFIX)  # this live process's
    other_host = tmp_path / ".x.another-host.1-abcdefgh.tmp"
    older_name = tmp_path / ".x.abcdefgh.tmp"  # no process in its name: never guessed at
    user = tmp_path / "notes.tmp"
    for path in (mine, other_host, older_name, user):
        path.write_text("keep")
    write_text(tmp_path / "y.txt", "y")
    assert all(p.read_text() == "keep" for p in (mine, other_host, older_name, user))


@pytest.mark.parametrize("fmt", ["hf", "safetensors"])
def test_a_killed_export_leaves_nothing_after_the_next_export(translation_run, tmp_path, fmt):
    """`tformer export` killed at a random point while it writes; the next export into the same folder."""
    out = tmp_path / ("model" if fmt == "hf" else "model.safetensors")
    args = ["export", str(translation_run / "runs/mt"), "--format", fmt, "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", "from tformer_cli.cli import main; main()", *args], env=env)
    deadline = time.monotonic() + 120
    while not _leftovers(tmp_path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(random.Random(fmt).uniform(0, 0.01))
    process.send_signal(signal.SIGKILL)
    process.wait()
    result = CliRunner().invoke(app, [*args, "--force"])
    assert result.exit_code == 0, result.output
    assert _leftovers(tmp_path) == [] and out.exists()
