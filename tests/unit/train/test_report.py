"""train/report.py's Curves: curves.png redrawn from metrics.jsonl at validations and at the end, never twice from
the same records."""

import json
from pathlib import Path

from tformer_cli.plots import training_curves
from tformer_cli.run.layout import CURVES, METRICS
from tformer_cli.train.report import Curves


def _record(run: Path, step: int, split: str = "train") -> None:
    record = {"split": split, "step": step, "epoch": 0, "loss": 1.0 / step, "lr": 1e-3, "accuracy": 0.5}
    with (run / METRICS).open("a") as f:
        f.write(json.dumps(record) + "\n")


def _counting(monkeypatch, now: list[float] | None = None) -> list[Path]:
    """The pictures drawn, each taking half a second of the `now` clock (_clock) where there is one."""
    drawn: list[Path] = []

    def draw(metrics: Path, out: Path, marks=()) -> None:
        drawn.append(out)
        training_curves(metrics, out, marks)
        if now is not None:
            now[0] += 0.5

    monkeypatch.setattr("tformer_cli.plots.training_curves", draw)
    return drawn


def _clock(monkeypatch) -> list[float]:
    """A clock the test moves: [seconds]."""
    now = [1000.0]
    monkeypatch.setattr("tformer_cli.train.report.time.time", lambda: now[0])
    return now


def _curves(run: Path, monkeypatch) -> tuple[Curves, list[Path], list[float]]:
    """The run's Curves, the pictures it draws (half a second each) and the clock the test moves."""
    now = _clock(monkeypatch)
    drawn = _counting(monkeypatch, now)
    return Curves(run, enabled=True), drawn, now


def test_the_first_picture_waits_20_times_its_estimated_cost_from_the_start(tmp_path, monkeypatch):
    curves, drawn, now = _curves(tmp_path, monkeypatch)
    _record(tmp_path, 1, "valid")
    now[0] += 9.0
    curves.draw(final=False)  # a validation 9 s into the run: a picture would cost a twentieth of it
    assert drawn == []
    now[0] += 2.0
    curves.draw(final=False)  # 11 s: drawn, so that a run killed from now on has one
    assert drawn == [tmp_path / CURVES]


def test_a_run_of_a_few_seconds_draws_once_at_its_end(tmp_path, monkeypatch):
    curves, drawn, now = _curves(tmp_path, monkeypatch)
    for step in (1, 2, 3):
        _record(tmp_path, step, "valid")
        now[0] += 1.0
        curves.draw(final=False)
    curves.draw(final=True)
    assert drawn == [tmp_path / CURVES] and (tmp_path / CURVES).is_file()


def test_the_end_draws_what_the_last_validation_did_not(tmp_path, monkeypatch):
    curves, drawn, now = _curves(tmp_path, monkeypatch)
    _record(tmp_path, 1)
    _record(tmp_path, 2, "valid")
    now[0] += 60.0
    curves.draw(final=False)  # the first validation a minute into the run draws
    assert drawn == [tmp_path / CURVES] and (tmp_path / CURVES).is_file()
    curves.draw(final=True)  # the run ends at that validation: the picture already shows every record
    assert len(drawn) == 1
    _record(tmp_path, 3)
    now[0] += 9.0
    curves.draw(final=False)  # younger than 20 times its cost: not redrawn at a validation
    assert len(drawn) == 1
    curves.draw(final=True)  # a record since: the end draws it
    assert len(drawn) == 2


def test_the_end_draws_again_where_the_picture_is_gone(tmp_path, monkeypatch):
    curves, drawn, now = _curves(tmp_path, monkeypatch)
    _record(tmp_path, 1, "valid")
    now[0] += 60.0
    curves.draw(final=False)
    (tmp_path / CURVES).unlink()
    curves.draw(final=True)
    assert len(drawn) == 2 and (tmp_path / CURVES).is_file()


def test_a_process_other_than_the_main_one_draws_nothing(tmp_path, monkeypatch):
    drawn = _counting(monkeypatch)
    _record(tmp_path, 1, "valid")
    Curves(tmp_path, enabled=False).draw(final=True)
    assert drawn == [] and not (tmp_path / CURVES).exists()
