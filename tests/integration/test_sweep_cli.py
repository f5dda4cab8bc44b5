"""`tformer sweep` end to end: real `tformer train` processes on the tiny recipe, a failing point, the resume.

The first sweep trains model.d_ff=32,64 two at a time; the d_ff=64 run fails (its folder holds a damaged
checkpoint, which `tformer train` refuses). The second, after the damage is removed, trains only that run.
The third is the command printed above the table, and trains nothing.
"""

import csv
import json
import os
import shlex
import shutil
import signal
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.model import count_parameters
from tformer_cli.run import build_model_from_config
from tformer_cli.sweep import plan, read_record, run_points

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes" / "tiny_classifier.yaml")
SETTINGS = ["model.d_ff=32,64", "train.epochs=2", "run.threads=1"]
NAMES = {d_ff: f"tiny_classifier,model.d_ff={d_ff},train.epochs=2" for d_ff in ("32", "64")}
TABLE = "sweep_tiny_classifier,model.d_ff,train.epochs=2"
runner = CliRunner()


def _sweep(*args):
    return runner.invoke(app, ["sweep", *map(str, args)])


def _outputs(out):
    """What a sweep left: the markdown table and the CSV rows."""
    md = (out / f"{TABLE}.md").read_text()
    with (out / f"{TABLE}.csv").open() as handle:
        return md, list(csv.DictReader(handle))


def _valid(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "valid"]


def _untouched(run_dir):
    """The run's files that training writes, with their modification times (and the log's size)."""
    files = [*sorted((run_dir / "checkpoints").iterdir()), run_dir / "metrics.jsonl", run_dir / "sweep.json"]
    return {f.name: f.stat().st_mtime_ns for f in files} | {"log": (run_dir / "train.log").stat().st_size}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    damaged = out / NAMES["64"] / "checkpoints"
    damaged.mkdir(parents=True)
    (damaged / "step_00000001.pt").write_bytes(b"not a checkpoint")
    result = _sweep(TINY, *SETTINGS, f"run.out_dir={out}", "--parallel", "2")
    seconds = {d_ff: json.loads((out / name / "sweep.json").read_text())["seconds"] for d_ff, name in NAMES.items()}
    return out, result, *_outputs(out), seconds


@pytest.fixture(scope="module")
def second(first):
    out = first[0]
    before = _untouched(out / NAMES["32"])
    shutil.rmtree(out / NAMES["64"] / "checkpoints")
    result = _sweep(TINY, *SETTINGS, f"run.out_dir={out}", "--parallel", "2")
    return out, result, *_outputs(out), before


def test_a_failing_run_is_reported_and_the_others_still_run(first):
    out, result, md, rows, _ = first
    log = out / NAMES["64"] / "train.log"
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[-1] == f"error: 1 run(s) failed; see {log}"
    assert "holds checkpoint files but no usable step checkpoint" in log.read_text()
    assert [(r["model.d_ff"], r["status"]) for r in rows] == [("32", "finished"), ("64", "failed (exit 1)")]
    assert rows[1]["log"] == str(log) and rows[1]["final_accuracy"] == "" and rows[1]["parameters"] == ""
    assert "| 64 | failed (exit 1) |" in md and md in result.stdout


def test_parallel_2_starts_both_runs_before_either_ends(first):
    lines = first[1].stderr.splitlines()
    started = [i for i, line in enumerate(lines) if ": training (log: " in line]
    ended = [i for i, line in enumerate(lines) if ": finished after" in line or ": FAILED" in line]
    assert len(started) == 2 and len(ended) == 2 and max(started) < min(ended)


def test_a_second_sweep_trains_only_what_did_not_finish(first, second):
    out, result, _, rows, before = second
    assert result.exit_code == 0, result.output
    assert f"{NAMES['32']}: finished before, not trained again" in result.stderr
    assert _untouched(out / NAMES["32"]) == before  # no checkpoint, metric or log line written
    assert [r["status"] for r in rows] == ["finished", "finished"]
    assert (out / NAMES["64"] / "train.log").read_text().count("$ ") == 2  # two attempts, one log
    first_seconds = first[-1]
    assert float(rows[0]["wall_s"]) == first_seconds["32"]  # kept from the run that trained it
    assert float(rows[1]["wall_s"]) > first_seconds["64"]  # both attempts


def test_the_table_holds_each_runs_validation_parameters_and_time(second):
    out, result, md, rows, _ = second
    assert list(rows[0]) == [
        "model.d_ff",
        "status",
        "steps",
        "final_loss",
        "final_accuracy",
        "best_step",
        "best_loss",
        "best_accuracy",
        "wall_s",
        "parameters",
        "log",
    ]
    for row, (d_ff, name) in zip(rows, NAMES.items(), strict=True):
        valid = _valid(out / name)
        best = max(valid, key=lambda r: r["accuracy"])  # train.best_metric: accuracy
        assert len(valid) == 2 and row["model.d_ff"] == d_ff
        assert (int(row["steps"]), float(row["final_loss"])) == (valid[-1]["step"], valid[-1]["loss"])
        assert (int(row["best_step"]), float(row["best_accuracy"])) == (best["step"], best["accuracy"])
        config = load_config(TINY, [f"model.d_ff={d_ff}"])
        assert int(row["parameters"]) == count_parameters(build_model_from_config(config))["total"]
        assert 0 < float(row["wall_s"]) < 600 and row["log"] == str(out / name / "train.log")
    assert md.splitlines()[4].startswith(f"| 32 | finished | {rows[0]['steps']} | {float(rows[0]['final_loss']):.4f} |")
    assert result.stdout == md
    assert torch.load(out / NAMES["64"] / "checkpoints" / "best.pt", weights_only=True)["config"]["model"]["d_ff"] == 64


def test_the_printed_command_reruns_and_trains_nothing(second):
    out, _, md, rows, _ = second
    command = md.splitlines()[0].strip("`")
    args = shlex.split(command)
    assert args[:2] == ["tformer", "sweep"]
    result = runner.invoke(app, args[1:])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("not trained again") == 2 and ": training" not in result.stderr
    assert _outputs(out) == (md, rows)
    assert f"curves: {out / TABLE}.png" in result.stderr and (out / f"{TABLE}.png").stat().st_size > 0


def test_an_ablation_reuses_the_grids_finished_runs_and_trains_only_its_new_point(second):
    out = second[0]
    result = _sweep(
        TINY, "model.d_ff=32,64", "train.epochs=2,1", "run.threads=1", f"run.out_dir={out}", "--one-at-a-time"
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.count("not trained again") == 2  # (32, 2) and (64, 2): the grid's runs
    assert result.stderr.count(": training") == 1 and "model.d_ff=32,train.epochs=1: training" in result.stderr
    table = "sweep_tiny_classifier,model.d_ff,train.epochs,one-at-a-time"
    md = (out / f"{table}.md").read_text()
    assert md.splitlines()[0].strip("`").endswith("--one-at-a-time")  # the printed command is the ablation
    with (out / f"{table}.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["model.d_ff"], r["train.epochs"], r["status"]) for r in rows] == [
        ("32", "2", "finished"),
        ("64", "2", "finished"),
        ("32", "1", "finished"),
    ]


def test_an_interrupted_sweep_stops_its_runs_and_records_them(tmp_path, monkeypatch):
    sweep = plan(Path(TINY), [f"run.out_dir={tmp_path}", "train.epochs=1"])
    said = []

    def interrupt(_seconds):  # Ctrl-C while the sweep waits for its run
        raise KeyboardInterrupt

    monkeypatch.setattr("tformer_cli.sweep.time.sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_points(sweep.recipe, sweep.points, 1, said.append)
    record = read_record(sweep.points[0].run_dir)
    assert record["status"] == "failed" and record["exit_code"] != 0 and record["parameters"] is None
    assert said[-1].startswith(f"{sweep.points[0].name}: FAILED (exit {record['exit_code']}; see ")


def test_a_sweep_sent_sigterm_stops_its_runs_and_starts_no_other(tmp_path, monkeypatch):
    """`kill SWEEP` (background jobs ignore SIGINT): the running point is stopped and recorded; no other starts."""
    sweep = plan(Path(TINY), [f"run.out_dir={tmp_path}", "train.epochs=1", "model.d_ff=32,64"])
    said = []

    def terminate(_seconds):  # SIGTERM while the sweep waits for its first run
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr("tformer_cli.sweep.time.sleep", terminate)
    with pytest.raises(KeyboardInterrupt):
        run_points(sweep.recipe, sweep.points, 1, said.append)
    assert read_record(sweep.points[0].run_dir)["status"] == "failed"
    assert not sweep.points[1].run_dir.exists() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
