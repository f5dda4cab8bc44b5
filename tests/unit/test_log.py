"""What training says (log.py): the run's own pace and the end it predicts, the plain lines, train.log, the bar."""

import io

import pytest
from rich.console import Console

from tformer_cli import log
from tformer_cli.errors import TformerError
from tformer_cli.log import Pace, TrainLog, hms, interval_line


@pytest.mark.parametrize(
    "seconds,shown", [(0, "0:00:00"), (61.9, "0:01:01"), (3600 * 27 + 5, "27:00:05"), (-3, "0:00:00")]
)
def test_hms(seconds, shown):
    assert hms(seconds) == shown


def test_pace_knows_nothing_before_the_first_update_since_this_start():
    assert Pace(40, 300.0).estimate(40, 310.0, 160, 0) == (160, None)


def test_pace_is_the_average_rate_since_this_start_from_the_first_interval_on():
    """At 6 s per update, one update is enough for an ETA (a 30-s window of rich would show none)."""
    assert Pace(0, 0.0).estimate(1, 6.0, 160, 0) == (160, 159 * 6.0)
    # resumed at update 40 after 300 s: the rate is since this start (10 updates in 20 s), the time left from it
    assert Pace(40, 300.0).estimate(50, 320.0, 160, 0) == (160, 110 * 2.0)


def test_pace_leaves_the_warm_up_out_after_the_first_estimate():
    """A first update of 60 s (compilation), then 1 s per update: the first estimate has only the slow one to go
    by; the next ones measure from there, at the rate the run keeps."""
    pace = Pace(0, 0.0)
    assert pace.estimate(1, 60.0, 100, 0) == (100, 99 * 60.0)
    assert pace.estimate(11, 70.0, 100, 0) == (100, 89.0)
    assert pace.estimate(21, 80.0, 100, 0) == (100, 79.0)


def test_pace_honours_the_time_budget_when_it_ends_the_run_first():
    # 6 s per update, 30 s of budget: 4 more updates fit after the first (the loop stops at the first past it)
    assert Pace(0, 0.0).estimate(1, 6.0, 160, 30.0) == (5, 24.0)
    # a budget that the schedule's end comes before changes nothing
    assert Pace(0, 0.0).estimate(1, 6.0, 3, 3600.0) == (3, 12.0)
    # the budget already spent: the run ends here
    assert Pace(0, 0.0).estimate(10, 60.0, 160, 30.0) == (10, 0.0)


def test_interval_line_is_one_line_of_key_value_pairs():
    line = interval_line(25, 400, 2, "loss 2.3456 lr 1.00e-03 tokens/s 1234", 62.0, 940.0)
    assert line == "update 25/400 epoch 2 loss 2.3456 lr 1.00e-03 tokens/s 1234 elapsed 0:01:02 eta 0:15:40"
    assert interval_line(1, 10, 1, "loss 1.0", 5.0, None).endswith("eta -:--:--")


def _console(monkeypatch, terminal: bool) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(log, "console", Console(file=out, force_terminal=terminal, width=200))
    return out


def test_off_a_terminal_each_interval_is_a_plain_line_and_train_log_gets_everything(tmp_path, monkeypatch):
    out = _console(monkeypatch, terminal=False)
    path = tmp_path / "train.log"
    said = TrainLog(path)
    said.say("[yellow]warning:[/] something")
    said.interval("update 5/10 epoch 1 loss 1.0")
    assert out.getvalue().splitlines() == ["warning: something", "update 5/10 epoch 1 loss 1.0"]
    TrainLog(path).say("resuming at update 5")  # a resumed run appends
    lines = path.read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "warning: something",
        "update 5/10 epoch 1 loss 1.0",
        "resuming at update 5",
    ]
    assert all(line[:4].isdigit() and line[10] == " " for line in lines)  # each stamped with the date and time


def test_on_a_terminal_the_bar_shows_the_interval_and_the_file_still_gets_it(tmp_path, monkeypatch):
    out = _console(monkeypatch, terminal=True)
    said = TrainLog(tmp_path / "train.log")
    said.interval("update 5/10 epoch 1 loss 1.0")
    assert out.getvalue() == ""
    assert (tmp_path / "train.log").read_text().endswith(" update 5/10 epoch 1 loss 1.0\n")


def test_other_processes_say_nothing(tmp_path, monkeypatch):
    out = _console(monkeypatch, terminal=False)
    TrainLog(None).say("hello")
    TrainLog(None).interval("update 1/1")
    assert out.getvalue() == "" and not list(tmp_path.iterdir())


def test_a_stderr_that_is_the_log_file_gets_each_line_once(tmp_path, monkeypatch):
    """`tformer sweep` sends training's stdout and stderr to the run's train.log: the lines are not doubled."""
    path = tmp_path / "train.log"
    with path.open("w") as captured:
        monkeypatch.setattr(log.sys, "stderr", captured)
        monkeypatch.setattr(log, "console", Console(stderr=True, force_terminal=False))
        TrainLog(path).interval("update 5/10 epoch 1 loss 1.0")
    assert path.read_text() == "update 5/10 epoch 1 loss 1.0\n"


def test_the_bar_takes_the_predicted_total_and_counts_the_time_left_down(monkeypatch):
    _console(monkeypatch, terminal=True)
    now = [1000.0]
    monkeypatch.setattr(log.time, "monotonic", lambda: now[0])
    progress = log.training_progress()
    progress.get_time = lambda: now[0]
    bar = progress.add_task("train", total=160, completed=0, stats="", before=300.0, ends=None)
    clock = next(c for c in progress.columns if isinstance(c, log._Clock))
    assert str(clock.render(progress.tasks[0])).endswith("eta -:--:--")
    log.update_bar(progress, bar, 1, 5, 24.0, "loss 1.0")
    task = progress.tasks[0]
    assert (task.completed, task.total) == (1, 5)
    now[0] += 10.0
    assert str(clock.render(task)) == "0:05:10 eta 0:00:14"  # 300 s before this start, 10 s since; 24 - 10 left


def test_off_a_terminal_there_is_no_bar(monkeypatch):
    _console(monkeypatch, terminal=False)
    assert log.training_progress().disable
    _console(monkeypatch, terminal=True)
    assert not log.training_progress().disable


@pytest.mark.parametrize("name", ["train.log", "metrics.jsonl"])
def test_a_planted_link_is_refused_not_written_through(tmp_path, monkeypatch, name):
    _console(monkeypatch, terminal=False)
    target = tmp_path / "someone_elses_file"
    theirs = '{"split": "train", "step": 0}\n'  # a record a resume at update 0 keeps: the file is appended to
    target.write_text(theirs)
    (tmp_path / name).symlink_to(target)
    with pytest.raises(TformerError, match=f"{name} is a symbolic link"):
        if name == "train.log":
            TrainLog(tmp_path / name).say("hello")
        else:
            log.MetricsLog(tmp_path / name).write({"split": "train", "step": 1, "loss": 1.0})
    assert target.read_text() == theirs
