"""Settings that waste a run are said in one line (tformer_cli/waste.py): a warm-up as long as the run, a
time budget that ends the schedule early, more threads than free cores; `check` and `train` say them."""

import json
import os
import re

import pytest
from typer.testing import CliRunner

from tformer_cli import waste
from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.train.optim import lr_at
from tformer_cli.waste import busy_cores, reach_warning, threads_warning, warmup_warning

runner = CliRunner()
CLASSIFIER = "recipes/tiny_classifier.yaml"


def _train(*overrides: str):
    return load_config(None, list(overrides)).train


@pytest.mark.parametrize("schedule", ["constant", "cosine", "inverse_sqrt"])
def test_a_warm_up_longer_than_the_run_says_the_fraction_of_the_peak_the_learning_rate_reaches(schedule):
    tc = _train(f"train.schedule={schedule}", "train.warmup_steps=400", "train.max_updates=150")
    line = warmup_warning(tc, 150)
    assert line is not None and "\n" not in line
    reached = lr_at(150, tc, 512, 150) / lr_at(400, tc, 512, 400)  # the last update's rate, the peak's
    said = re.search(r"rises to (\d+)% of its peak", line)
    assert said is not None and abs(int(said.group(1)) / 100 - reached) < 0.006  # rounded to a percent
    assert said.group(1) == "38"
    assert "train.warmup_steps=400 >= the 150 updates this run will do" in line
    assert ("never decays" in line) == (schedule != "constant")


def test_a_warm_up_that_ends_within_the_run_is_not_said():
    assert warmup_warning(_train("train.warmup_steps=400"), 401) is None
    assert warmup_warning(_train("train.warmup_steps=400"), 400) is not None
    assert warmup_warning(_train("train.warmup_steps=0"), 5) is None


def test_a_time_budget_that_stops_a_cosine_schedule_early_says_how_far_it_gets():
    tc = _train("train.schedule=cosine", "train.warmup_steps=100", "train.max_minutes=10")
    line = reach_warning(tc, 1000, 4000)
    assert "train.max_minutes=10 ends the run near update 1,000 of 4,000" in line
    assert (
        "reaches 23% of its decay (the learning rate still 87% of train.lr)" in line
    )  # (1000 - 100) / (4000 - 100): 23%, cos: 87%
    assert "set train.max_updates=1000" in line
    assert reach_warning(tc, 3900, 4000) is None  # within a tenth of the end
    assert (
        reach_warning(_train("train.schedule=constant", "train.warmup_steps=100", "train.max_minutes=10"), 1000, 4000)
        is None
    )
    assert reach_warning(_train("train.schedule=cosine", "train.warmup_steps=100"), 1000, 4000) is None  # no budget


def test_a_schedule_fitted_to_the_time_is_no_waste_but_its_warm_up_still_is():
    tc = _train("train.schedule=cosine", "train.warmup_steps=100", "train.max_minutes=10")
    assert reach_warning(tc, 1000, 4000).endswith("or train.fit_schedule_to_time=true to end its decay with the time")
    fitted = _train(
        "train.schedule=cosine", "train.warmup_steps=100", "train.max_minutes=10", "train.fit_schedule_to_time=true"
    )
    assert reach_warning(fitted, 1000, 4000) is None  # its decay ends with the time
    assert "the warm-up reaches 50% of it; lower train.warmup_steps" in reach_warning(fitted, 50, 4000)


def test_a_time_budget_that_stops_the_warm_up_says_so():
    tc = _train("train.schedule=constant", "train.warmup_steps=4000", "train.max_minutes=5")
    line = reach_warning(tc, 1000, 8000)
    assert "the warm-up reaches 25% of it; lower train.warmup_steps (e.g. train.warmup_steps=100)" in line
    assert "train.max_updates" not in line  # a shorter schedule leaves the warm-up as long


def test_more_threads_than_the_load_leaves_free_suggest_run_threads():
    line = threads_warning(2, 2, 1.8)
    assert "2 CPU threads, and the load average is 1.8 on 2 cores (about 1 free)" in line
    assert line.endswith("try run.threads=1")
    assert threads_warning(2, 2, 0.3) is None
    assert threads_warning(1, 2, 5.0) is None  # one thread always has a core's share
    assert threads_warning(8, 16, 4.0) is None


def _busy(monkeypatch, tmp_path, load: float, ticks: int) -> None:
    """This machine as its load average `load` and /proc/stat say: each of 2 cores busy `ticks` of 100 in the
    quarter of a second machine_threads_warning waits."""
    stat = tmp_path / "stat"
    stat.write_text(_stat((0, 0), (0, 0)))
    monkeypatch.setattr(waste, "PROC_STAT", stat)
    monkeypatch.setattr(waste.os, "getloadavg", lambda: (load, 1.0, 0.5))
    monkeypatch.setattr(waste.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(
        waste.time, "sleep", lambda s: stat.write_text(_stat((ticks, 100 - ticks), (ticks, 100 - ticks)))
    )


def test_check_says_a_wasted_warm_up_and_crowded_threads(monkeypatch, tmp_path):
    _busy(monkeypatch, tmp_path, 7.5, 100)
    result = runner.invoke(
        app, ["check", CLASSIFIER, "run.device=cpu", "run.threads=2", "train.warmup_steps=50", "train.max_updates=20"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("warning: train.warmup_steps=50 >= the 20 updates") for line in lines)
    assert any(line.startswith("warning: 2 CPU threads, and the load average is 7.5") for line in lines)
    assert "try run.threads=1" in result.output


def test_train_says_a_wasted_warm_up_in_the_terminal_and_in_train_log(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    result = runner.invoke(
        app,
        ["train", CLASSIFIER, "run.device=cpu", f"run.out_dir={tmp_path}", "train.warmup_steps=50"]
        + ["train.max_updates=3", "train.epochs=1"],
    )
    assert result.exit_code == 0, result.output
    said = "warning: train.warmup_steps=50 >= the 3 updates this run will do: the learning rate rises to 6%"
    assert said in result.output
    assert said in (tmp_path / "tiny_classifier" / "train.log").read_text()
    records = [json.loads(line) for line in (tmp_path / "tiny_classifier" / "metrics.jsonl").read_text().splitlines()]
    assert records  # the run trained: a warning, not a refusal


def test_train_says_once_where_the_time_budget_ends_a_cosine_schedule(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    result = runner.invoke(
        app,
        ["train", CLASSIFIER, "run.device=cpu", f"run.out_dir={tmp_path}", "train.schedule=cosine"]
        + ["train.warmup_steps=1", "train.max_updates=100000", "train.epochs=1000", "train.max_minutes=0.03"]
        + ["train.log_every=1"],
    )
    assert result.exit_code == 0, result.output
    log = (tmp_path / "tiny_classifier" / "train.log").read_text()
    said = re.findall(
        r"warning: at this pace train.max_minutes=0.03 ends the run near update ([\d,]+) of [\d,]+: "
        r"the cosine schedule reaches \d+% of its decay",
        log,
    )
    assert len(said) == 1, log


def _stat(*cpus: tuple[int, int]) -> str:
    """A /proc/stat whose CPUs have these (busy, idle) clock ticks so far, the busy ones as user time."""
    lines = [f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0" for n, (busy, idle) in enumerate(cpus)]
    return "\n".join(
        [f"cpu  {sum(b for b, _ in cpus)} 0 0 {sum(i for _, i in cpus)} 0 0 0 0 0 0", *lines, "intr 1 2", "", "ctxt 5"]
    )


def test_busy_cores_count_each_cpu_s_busy_share_between_two_readings():
    before, after = _stat((100, 100), (100, 100), (0, 0)), _stat((200, 100), (125, 175), (50, 50))
    assert busy_cores(before, after, {0, 1}) == pytest.approx(1.25)  # all of cpu0, a quarter of cpu1
    assert busy_cores(before, after, {0, 1, 2}) == pytest.approx(1.75)  # cpu2: half
    assert busy_cores(before, after, {1}) == pytest.approx(0.25)  # another process's CPUs are not ours
    waiting = "cpu0 0 0 0 50 50 0 0 0 0 0"  # idle 50 ticks, waiting on a disk 50: not busy
    assert busy_cores("cpu0 0 0 0 0 0 0 0 0 0 0", waiting, {0}) == 0.0


@pytest.mark.parametrize(("busy_now", "warned"), [(0, False), (100, True)])
def test_a_load_average_from_a_job_that_has_ended_is_no_threads_warning(tmp_path, monkeypatch, busy_now, warned):
    """The 1-minute load average says both cores are busy; /proc/stat says whether they still are."""
    _busy(monkeypatch, tmp_path, 1.9, busy_now)
    line = waste.machine_threads_warning(2, 2)
    assert (line is not None) == warned, line
    if warned:
        assert "the load average is 1.9 on 2 cores" in line
