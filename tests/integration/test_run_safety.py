"""Nothing lost, nothing silently wrong: one `train` per run directory, checkpoints that survive `kill -9`
at every point of a save, an index.json that is only a cache, and readers that verify checksums.

Runs are the tiny classifier (and a tiny language model), trained in-process or, where a process must
die, in a subprocess; each test copies a trained run and breaks it the way a crash or a user would.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.evaluate import evaluate_checkpoint
from tformer_cli.files import FolderLock
from tformer_cli.log import MetricsLog
from tformer_cli.run import load_run
from tformer_cli.run.checkpoints import load_checkpoint, load_verified

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes" / "tiny_classifier.yaml")
COMMON = [
    "model.dropout=0.1",  # resuming must restore the RNG for the resumed run to equal a straight one
    "train.schedule=constant",
    "train.warmup_steps=5",
    "train.log_every=1",
    "run.threads=1",
    "train.valid_every=2",
    "train.best_metric=loss",
    "train.keep_last=2",
    "run.device=cpu",  # the files are the subject: the same on a GPU machine, without CUDA in each of ~30 processes
]
runner = CliRunner()


def _train(out: Path, *extra: str, code: int = 0):
    result = runner.invoke(app, ["train", TINY, f"run.out_dir={out}", *COMMON, *extra])
    assert result.exit_code == code, result.output + str(result.exception)
    return result


def _cli(*args: str, code: int = 0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output + str(result.exception)
    return result


def _one_line_error(result, *parts: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


def _error_line(result, *parts: str) -> None:
    """Exit code 1 and the last line is the one error line (warnings may come before it), no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], result.stderr
    for part in parts:
        assert part in lines[-1], (part, lines[-1])


def _resumed_at(stderr: str) -> int | None:
    found = re.search(r"resuming\s.*?at\s+update\s+(\d+)", stderr, re.DOTALL)
    return int(found.group(1)) if found else None


def _records(run: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock times."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if k not in ("time",) and not k.endswith("_per_s")} for line in lines
    ]


def _model(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _index(run: Path) -> dict:
    return json.loads((run / "checkpoints/index.json").read_text())


def _steps_on_disk(run: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*.pt"))


def _flip_tensor_bytes(path: Path, key: str = "head.weight") -> None:
    """Change one weight inside the file; it still loads (no zip checksum is checked), with another value."""
    data = bytearray(path.read_bytes())
    raw = _model(path)[key].numpy().tobytes()
    at = data.find(raw)
    assert at > 0
    before = _model(path)[key]
    data[at + len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    assert not torch.equal(torch.load(path, weights_only=True)["model"][key], before)  # the bytes, unverified


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """8 updates, validated and saved every 2 (step files 6 and 8 kept, best.pt)."""
    out = tmp_path_factory.mktemp("trained")
    _train(out, "train.max_updates=8")
    return out / "tiny_classifier"


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The same run trained straight to 12 updates: what every resumed run must equal."""
    out = tmp_path_factory.mktemp("straight")
    _train(out, "train.max_updates=12")
    return out / "tiny_classifier"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of `trained` to break."""
    shutil.copytree(trained, tmp_path / "tiny_classifier")
    return tmp_path / "tiny_classifier"


def _resume_to_12(run: Path, code: int = 0):
    return _train(run.parent, "train.max_updates=12", code=code)


def _assert_equals_straight(run: Path, straight: Path) -> None:
    assert _records(run) == _records(straight)
    assert _equal(
        _model(run / "checkpoints" / _index(run)["latest"]), _model(straight / "checkpoints/step_00000012.pt")
    )
    assert _equal(_model(run / "checkpoints/best.pt"), _model(straight / "checkpoints/best.pt"))
    load_verified(run / "checkpoints/best.pt")


# 1. one process per run directory


def test_a_second_train_into_a_locked_run_stops_at_once_and_writes_nothing(run):
    with FolderLock(run, "tformer train"):
        before = _snapshot(run)
        result = _resume_to_12(run, code=1)
        assert _snapshot(run) == before
    _one_line_error(result, f"in use by process {os.getpid()}", str(run))


def test_two_train_processes_into_one_run_directory(tmp_path):
    first = subprocess.Popen(
        [sys.executable, "-m", "tformer_cli", "train", TINY, f"run.out_dir={tmp_path}", *COMMON, "train.epochs=400"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = tmp_path / "tiny_classifier"
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (_lock_holder(run) == str(first.pid) and (run / "metrics.jsonl").exists()):
            time.sleep(0.05)  # locked, and training (the SIGTERM handler is in place)
        assert first.poll() is None, first.communicate()[1]
        second = _train(tmp_path, "train.epochs=400", "train.max_updates=3", code=1)  # fails fast without a lock
        _one_line_error(second, f"in use by process {first.pid} (tformer train)")
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=60)
    assert first.returncode == 143, stderr  # stopped by our signal, not by the second process


def _lock_holder(run: Path) -> str | None:
    try:
        return (run / ".lock").read_text().strip()
    except FileNotFoundError:
        return None


# 2. checkpoint files are the truth, index.json a cache


@pytest.mark.parametrize("damage", ["deleted", "garbage", "not an index"])
def test_a_missing_or_unreadable_index_is_rebuilt_and_training_resumes(run, straight, damage):
    index = run / "checkpoints/index.json"
    if damage == "deleted":
        index.unlink()
    else:
        index.write_text('{"latest": "step_0' if damage == "garbage" else "[1, 2]")
    result = _resume_to_12(run)
    assert _resumed_at(result.stderr) == 8
    warnings = [line for line in result.stderr.splitlines() if "index.json" in line]
    assert len(warnings) == 1 and "rebuilding it from the checkpoint files" in warnings[0]
    _assert_equals_straight(run, straight)


@pytest.mark.parametrize("index_too", [False, True])
def test_when_no_step_checkpoint_is_usable_training_stops_and_keeps_best_pt(run, index_too):
    for step in _steps_on_disk(run):
        path = run / f"checkpoints/step_{step:08d}.pt"
        path.write_bytes(path.read_bytes()[:5000])  # truncated
    if index_too:
        (run / "checkpoints/index.json").unlink()
    before = _snapshot(run / "checkpoints")
    result = _resume_to_12(run, code=1)
    _error_line(result, str(run / "checkpoints"), "no usable step checkpoint", "move the folder away", "run.name")
    assert _snapshot(run / "checkpoints") == before
    load_checkpoint(run / "checkpoints/best.pt")


def test_a_checkpoint_the_index_does_not_list_is_resumed_from(run, straight):
    """A kill between a step file's rename and the index write: the file is complete, so it counts."""
    index = _index(run)
    del index["files"]["step_00000008.pt"]
    index["latest"] = "step_00000006.pt"
    (run / "checkpoints/index.json").write_text(json.dumps(index))
    result = _resume_to_12(run)
    assert _resumed_at(result.stderr) == 8
    _assert_equals_straight(run, straight)


def test_an_indexed_checkpoint_missing_on_disk_does_not_break_resuming(run, straight):
    (run / "checkpoints/step_00000006.pt").unlink()
    result = _resume_to_12(run)
    assert _resumed_at(result.stderr) == 8
    _assert_equals_straight(run, straight)


# 5. leftovers of killed runs


def test_resuming_removes_the_temporaries_of_killed_writes(run):
    leftovers = [
        run / "checkpoints/.step_00000010.pt.k1ll3d.tmp",
        run / ".config.yaml.x7.tmp",
        run / ".metrics.jsonl.y.tmp",
    ]
    for path in leftovers:
        path.write_bytes(b"\0" * 100_000)
    _resume_to_12(run)
    assert not any(path.exists() for path in leftovers)
    assert not list(run.rglob("*.tmp"))


def test_resuming_drops_replayed_and_torn_metrics_records(run, straight):
    """kill -9 after update 10 (checkpoint at 8) while appending a line: records 9, 10 and a torn line."""
    replayed = [{"time": 1.0, "split": "train", "step": s, "epoch": 0, "loss": 9.0} for s in (9, 10)]
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in replayed) + '{"time": 1.2, "split": "tr')
    _resume_to_12(run)
    _assert_equals_straight(run, straight)


def test_metrics_log_keeps_whole_lines_up_to_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"split": "train", "step": 1}\n{"split": "train", "step": 2}\n{"split": "valid", "st')
    log = MetricsLog(path, resume_at=1)
    log.write({"split": "train", "step": 2, "loss": 0.5})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in records] == [("train", 1), ("train", 2)] and records[1]["loss"] == 0.5


# 6. every reader verifies the checksum the index recorded


def test_every_reader_refuses_a_corrupt_best_pt(run, tmp_path):
    best = run / "checkpoints/best.pt"
    _flip_tensor_bytes(best)
    for args in (
        ["eval", str(run)],
        ["eval", str(best)],
        ["export", str(run), "-o", str(tmp_path / "m.safetensors")],
        ["attention", str(run), "-o", str(tmp_path / "a.png")],
        ["translate", str(run)],
    ):
        _one_line_error(runner.invoke(app, args), "checksum mismatch", str(best))
    assert not (tmp_path / "m.safetensors").exists() and not (tmp_path / "a.png").exists()
    standalone = tmp_path / "copy.pt"  # outside a run, no index: the checksum saved in the file still refuses it
    shutil.copy(best, standalone)
    _one_line_error(runner.invoke(app, ["eval", str(standalone)]), "checksum saved in it", str(standalone))


def test_averaging_verifies_every_checkpoint(run, tmp_path):
    step = run / "checkpoints/step_00000006.pt"
    _flip_tensor_bytes(step)
    _one_line_error(
        runner.invoke(app, ["average", str(run), "--last", "2", "-o", str(tmp_path / "a.pt")]),
        "checksum mismatch",
        str(step),
    )
    _one_line_error(runner.invoke(app, ["translate", str(run), "--average", "2"]), "checksum mismatch", str(step))
    assert not (tmp_path / "a.pt").exists()


def test_the_eval_json_beside_the_run_is_written_atomically(run, monkeypatch):
    _cli("eval", str(run))
    saved = (run / "eval_valid_best.json").read_text()

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        evaluate_checkpoint(load_run(run, cast=False))
    assert (run / "eval_valid_best.json").read_text() == saved
    assert not list(run.glob(".*.tmp"))


# 7. eval checks the tokenizer of the data it scores on


def test_eval_refuses_a_model_trained_with_another_tokenizer(lm_run, tmp_path):
    """`lm_run` (tests/integration/conftest.py): a tiny language model and its prepared data."""
    _cli("eval", str(lm_run / "runs/lm"))
    state = load_checkpoint(lm_run / "runs/lm/checkpoints/best.pt")
    state["tokenizer_fingerprint"] = "0123456789ab" + "0" * 52  # as if the data were prepared again, differently
    torch.save(state, tmp_path / "other.pt")
    result = runner.invoke(app, ["eval", str(tmp_path / "other.pt")])
    data_fingerprint = json.loads((lm_run / "data/manifest.json").read_text())["tokenizer"]["fingerprint"]
    _one_line_error(result, "another tokenizer", "0123456789ab", data_fingerprint[:12])


# 8. averaging arguments


def test_average_counts_below_one_are_errors(run):
    for last in ("0", "-2"):
        _one_line_error(runner.invoke(app, ["average", str(run), "--last", last]), "--last", last)
    _one_line_error(runner.invoke(app, ["translate", str(run), "--average", "-1"]), "--average", "0: off", "-1")
    assert not list((run / "checkpoints").glob("averaged*"))


def test_average_refuses_to_overwrite_its_inputs_or_the_runs_checkpoints(run):
    folder = run / "checkpoints"
    before = _snapshot(folder)
    for target in ("step_00000008.pt", "step_00000006.pt", "best.pt", "index.json", "../checkpoints/best.pt"):
        result = runner.invoke(app, ["average", str(run), "--last", "2", "-o", str(folder / target)])
        _one_line_error(result, "is one of the checkpoints")
    assert _snapshot(folder) == before
    _cli("average", str(run), "--last", "2")
    load_verified(folder / "averaged_last2.pt")


# 9. a corrupt index.json is one line for readers, never a traceback


@pytest.mark.parametrize("without_best", [False, True])
def test_readers_of_a_run_with_a_corrupt_index_get_one_line(run, tmp_path, without_best):
    (run / "checkpoints/index.json").write_text("{not json")
    if without_best:
        (run / "checkpoints/best.pt").unlink()
    for args in (
        ["eval", str(run)],
        ["export", str(run), "-o", str(tmp_path / "m.st")],
        ["average", str(run), "--last", "2"],
    ):
        _one_line_error(runner.invoke(app, args), "index.json is unreadable", "tformer train")


# 3 and 4. kill -9 at every point of save(): the rerun resumes at the newest complete checkpoint

# Runs the CLI in processes that SIGKILL themselves at point KILL_AT of save number SAVE_AT. The points
# are the start of save() and the moment after each call that changes the folder: tempfile.mkstemp
# (a temporary appears), os.fsync (its bytes are on disk), os.replace (it lands) and Path.unlink
# (pruning). "After one call" is "before the next", so every point before or after a write, a rename,
# a prune and an index write is covered. Every point is logged as "save point what".
# One subprocess imports torch and the CLI once and forks a child per run, two at a time (before any
# tensor op, so no thread pool is copied): each run is a process of its own without paying the import.
KILLER = r"""
import json, os, signal, sys, tempfile
from pathlib import Path

from tformer_cli.train.store import CheckpointStore

jobs, train_args = json.loads(sys.argv[1]), sys.argv[2:]
count = {"save": 0, "point": 0, "inside": False, "at": (0, 0), "log": ""}


def point(what):
    count["point"] += 1
    with open(count["log"], "a") as log:
        log.write(f"{count['save']} {count['point']} {what}\n")
    if (count["save"], count["point"]) == count["at"]:
        os.kill(os.getpid(), signal.SIGKILL)


def watch(owner, name, show):
    real = getattr(owner, name)

    def watched(*args, **kwargs):
        result = real(*args, **kwargs)
        if count["inside"]:
            point(f"after {name} {show(*args, **kwargs)}")
        return result

    setattr(owner, name, watched)


real_save = CheckpointStore.save


def save(self, *args, **kwargs):
    count["save"] += 1
    count["point"] = 0
    point("start")
    count["inside"] = True
    try:
        return real_save(self, *args, **kwargs)
    finally:
        count["inside"] = False


CheckpointStore.save = save
watch(tempfile, "mkstemp", lambda *args, **kw: kw.get("prefix"))
watch(os, "fsync", lambda *args: "")
watch(os, "replace", lambda src, dst, **kw: Path(dst).name)
watch(Path, "unlink", lambda path, *args, **kw: path.name)
from tformer_cli.cli import main
import tformer_cli.plots, torch._dynamo  # what a run imports on its way (curves, the optimizer): once, not per fork


def run(save_at, kill_at, out):
    count["at"], count["log"] = (save_at, kill_at), f"{out}/points.log"
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        os.dup2(os.open(f"{out}/{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = ["tformer", *train_args, f"run.out_dir={out}"]
    try:
        main()
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else 1
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)


running, codes = {}, {}
for save_at, kill_at, out in jobs:
    if len(running) == 2:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    pid = os.fork()
    if pid == 0:
        run(save_at, kill_at, out)
    running[pid] = out
while running:
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""
# lr 3e-2 makes validation loss go up and down: saves at 2 (best), 4, 6 (not best; 6 prunes 4) and 8
# (best again; prunes 2 and 6), then 10. The sweep kills saves 3 and 4.
KILL_RUN = ["train.lr=3e-2", "train.keep_last=1", "train.max_updates=10"]


class _Killed(NamedTuple):
    returncode: int
    stderr: str


def _kill_runs(jobs: list[tuple[int, int, Path]]) -> list[_Killed]:
    """The kill run for each (save, point, out folder), SIGKILLed at that point of that save (0, 0: never)."""
    args = ["train", TINY, *COMMON, *KILL_RUN]
    todo = json.dumps([[save_at, kill_at, str(out)] for save_at, kill_at, out in jobs])
    server = subprocess.run([sys.executable, "-c", KILLER, todo, *args], capture_output=True, text=True)
    assert server.returncode == 0, server.stderr[-2000:]
    codes = json.loads(server.stdout.strip().splitlines()[-1])
    return [_Killed(codes[str(out)], (out / "stderr.txt").read_text()) for _, _, out in jobs]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[int, list[str]]]:
    """The kill run without a kill (the straight run to compare with), and each save's points."""
    out = tmp_path_factory.mktemp("reference")
    [result] = _kill_runs([(0, 0, out)])
    assert result.returncode == 0, result.stderr[-2000:]
    points: dict[int, list[str]] = {}
    for line in (out / "points.log").read_text().splitlines():
        save, _, what = line.split(" ", 2)
        points.setdefault(int(save), []).append(what)
    three, four = "\n".join(points[3]), "\n".join(points[4])
    assert "best.pt" not in three and "unlink step_00000004.pt" in three, three  # a plain save that prunes
    assert "replace best.pt" in four and "unlink step_00000006.pt" in four, four  # a best save that prunes two
    return out / "tiny_classifier", points


def _killed_state(out: Path, save_at: int, killed: _Killed, where: str) -> int:
    """The killed run kept every complete checkpoint and a whole best.pt: returns its newest step."""
    assert killed.returncode == -signal.SIGKILL, (where, killed.stderr[-2000:])
    run = out / "tiny_classifier"
    newest = max(_steps_on_disk(run))  # renamed into place, so complete
    assert newest == 2 * save_at or newest == 2 * save_at - 2, where
    load_checkpoint(run / "checkpoints/best.pt")  # best.pt is never missing or half-written
    return newest


def _resumed_to_the_end(reference_run: Path, out: Path, newest: int, resumed: _Killed, where: str) -> None:
    """The same command resumed the killed run from its newest step to the end the straight run reached: the same
    records, checkpoints and index."""
    run = out / "tiny_classifier"
    assert resumed.returncode == 0 and _resumed_at(resumed.stderr) == newest, (where, resumed.stderr[-2000:])
    assert not list(run.rglob("*.tmp")), where
    assert _records(run) == _records(reference_run), where
    assert sorted(_index(run)["files"]) == sorted(p.name for p in (run / "checkpoints").glob("*.pt")), where
    for name in _index(run)["files"]:
        assert _equal(_model(run / "checkpoints" / name), _model(reference_run / "checkpoints" / name)), (where, name)
        load_verified(run / "checkpoints" / name)  # the checksum in the index matches


def test_kill_9_at_every_point_of_a_save(reference, tmp_path):
    """SIGKILL at the start of save() and after each mkstemp, fsync, rename and unlink in it, for a save
    that prunes and one that also writes best.pt; each rerun resumes from the newest complete step."""
    reference_run, points = reference
    kills = [(save, kill_at, what) for save in (3, 4) for kill_at, what in enumerate(points[save], start=1)]
    assert len(kills) >= 20  # the sweep really covers every file operation
    outs = [tmp_path / f"save{save}_point{kill_at}" for save, kill_at, _ in kills]
    wheres = [f"killed at save {save} point {kill_at} ({what})" for save, kill_at, what in kills]
    for out in outs:
        out.mkdir()
    killed = _kill_runs([(save, kill_at, out) for (save, kill_at, _), out in zip(kills, outs, strict=True)])
    newest = [
        _killed_state(out, save, result, where)
        for (save, _, _), out, result, where in zip(kills, outs, killed, wheres, strict=True)
    ]
    resumed = _kill_runs([(0, 0, out) for out in outs])  # the same command again, killed nowhere
    for out, step, result, where in zip(outs, newest, resumed, wheres, strict=True):
        _resumed_to_the_end(reference_run, out, step, result, where)
