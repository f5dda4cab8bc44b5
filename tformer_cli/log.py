"""What training says: the progress bar or plain lines on stderr, `train.log` and `metrics.jsonl` in the run (and
the trackers of run.report_to, train/tracking.py).

On a terminal, a progress bar; anywhere else (a file, a pipe, nohup, CI) one plain line per log interval, as
fairseq, Marian and nanoGPT print them. Either way `train.log` in the run directory gets the plain lines, the
validations and the messages, appended across resumes; `metrics.jsonl` gets the same numbers as JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.table import Column
from rich.text import Text

from tformer_cli.files import open_own_file, write_text

console = Console(stderr=True, soft_wrap=True)  # no hard wrapping: one message, one line


class MetricsLog:
    """Appends one JSON object per line; each line carries the update number and wall time."""

    def __init__(self, path: Path, enabled: bool = True, resume_at: int = 0, trackers: Sequence[Any] = ()) -> None:
        """Open the log of a run that (re)starts after update `resume_at`.

        Records past `resume_at` (written before a kill, and about to be replayed) and a line torn by a
        kill mid-append are dropped first, so that the log of a resumed run is that of a straight run.

        Args:
            trackers: where each record's numbers go too (train/tracking.py: TensorBoard, MLflow, W&B), closed
                when the log is (`with MetricsLog(...)`).
        """
        self.path, self.enabled, self.trackers = path, enabled, list(trackers)
        self.start = time.time()
        if enabled:
            keep_records_until(path, resume_at)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        numbers = {
            key: value
            for key, value in record.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch")
        }
        for tracker in self.trackers:
            tracker.log(record["split"], record["step"], numbers)
        record = {"time": round(time.time() - self.start, 3), **record}
        _append(self.path, (json.dumps(record) + "\n").encode("utf-8"))

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        """Close the trackers: finished unless training ended on an error or a stop."""
        for tracker in self.trackers:
            tracker.close(finished=kind is None)


def _append(path: Path, data: bytes) -> None:
    """Append `data` with one O_APPEND write (a kill leaves whole lines, or at worst one torn last line), never
    through a link someone planted (files.open_own_file).

    Raises:
        TformerError: `path` is a symbolic link, a hard link or not a regular file.
    """
    fd = open_own_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def keep_records_until(path: Path, step: int) -> None:
    """Rewrite the JSON-lines log `path` (atomically) without records past `step` or unreadable lines."""
    if not path.is_file():
        return
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.splitlines()
    kept = [line for line, at in zip(lines, map(_step_of, lines), strict=True) if at is not None and at <= step]
    if len(kept) != len(lines) or not text.endswith("\n"):
        write_text(path, "".join(line + "\n" for line in kept))


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record.get("step") if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def hms(seconds: float) -> str:
    """`H:MM:SS` (hours unbounded), as the plain lines and the bar show times."""
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Pace:
    """The run's own average rate since this start (of the run, or of its resumption), and the end it predicts.

    An average, not a recent window: at several seconds per update a window of seconds holds no update at all
    (rich's 30-s window showed no ETA for 13 minutes on a slow machine). The first estimate averages from this
    start; the later ones from that first estimate on, so that the warm-up of each start (compilation, the first
    batches' allocations) does not slow the estimate for the rest of the run.
    """

    def __init__(self, step: int, seconds: float) -> None:
        """A start at update `step` after `seconds` of training (those of the earlier starts: max_minutes counts
        them)."""
        self.since: tuple[int, float] = (step, seconds)
        self.warm = False

    def estimate(self, step: int, seconds: float, total_steps: int, budget_seconds: float) -> tuple[int, float | None]:
        """(the update the run will end at, the seconds left; None before the first update since this start).

        Args:
            step: updates done; seconds: training time now (counted as at the start).
            total_steps: the updates the schedule runs (epochs, max_updates).
            budget_seconds: train.max_minutes in seconds; 0: no time limit. Whichever ends first ends the run.
        """
        done, spent = step - self.since[0], seconds - self.since[1]
        if done <= 0 or spent <= 0:
            return total_steps, None
        rate = done / spent  # updates per second, validations and checkpoints included
        if not self.warm:  # later estimates leave out the time until now, the warm-up's
            self.since, self.warm = (step, seconds), True
        total = total_steps
        if budget_seconds:
            total = min(total, step + math.ceil(max(budget_seconds - seconds, 0.0) * rate))
        return total, (total - step) / rate


class TrainLog:
    """Messages and interval lines of a training run: on stderr, and with a time stamp in `path` (train.log)."""

    def __init__(self, path: Path | None) -> None:
        """`path` None: a process other than the main one, which says nothing."""
        self.path = path
        self.plain = not console.is_terminal  # no bar: each interval line is printed
        # stderr already goes to `path` (`tformer sweep` runs training so): what is printed is in the file once
        self.captured = path is not None and _is_stderr(path)

    def say(self, message: str) -> None:
        """A message on stderr and in the file; rich markup (`[yellow]warning:[/]`): escape what the user wrote."""
        if self.path is None:
            return
        console.print(message)
        self._append(Text.from_markup(message).plain)

    def interval(self, line: str) -> None:
        """A log interval's line (plain text): in the file, and on stderr when there is no bar to show it."""
        if self.path is None:
            return
        if self.plain:
            console.print(line, markup=False, highlight=False)
        self._append(line)

    def _append(self, text: str) -> None:
        if self.captured:
            return
        assert self.path is not None  # `say` and `interval` return first where there is no file
        stamped = "".join(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n" for line in text.splitlines())
        _append(self.path, stamped.encode("utf-8"))


def _is_stderr(path: Path) -> bool:
    """Whether this process's stderr is the file `path`."""
    try:
        return os.path.samestat(os.fstat(sys.stderr.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # no such file; a stderr without a descriptor (tests, notebooks)
        return False


def interval_line(step: int, total: int, epoch: int, stats: str, seconds: float, left: float | None) -> str:
    """`update 25/400 epoch 1 loss 2.3456 ... elapsed 0:01:02 eta 0:15:40`: key-value pairs, one line, grep-able."""
    eta = hms(left) if left is not None else "-:--:--"
    return f"update {step}/{total} epoch {epoch} {stats} elapsed {hms(seconds)} eta {eta}"


class _Clock(ProgressColumn):
    """The run's training time (earlier starts included) and the time left, ticking between log intervals.

    Task fields: `before` (training seconds before this start), `ends` (time.monotonic() at which the run
    is expected to end; None while unknown).
    """

    def render(self, task: Task) -> Text:
        elapsed = task.fields["before"] + (task.elapsed or 0.0)
        ends = task.fields["ends"]
        eta = hms(ends - time.monotonic()) if ends is not None else "-:--:--"
        return Text(f"{hms(elapsed)} eta {eta}", style="progress.elapsed")


def update_bar(progress: Progress, bar: TaskID, step: int, total: int, left: float | None, stats: str | None) -> None:
    """Move the bar to `step` of `total` with the interval's `stats` (None: as they were); its time left counts down
    from `left`."""
    ends = time.monotonic() + left if left is not None else None
    fields: dict[str, Any] = {"stats": stats} if stats is not None else {}
    progress.update(bar, completed=step, total=total, ends=ends, **fields)


def training_progress(enabled: bool = True) -> Progress:
    """update i/N, bar, training time and time left, then the latest loss, accuracy, lr and throughput.

    Disabled off a terminal (TrainLog prints plain lines there): a bar written to a file is one truncated line.
    """
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        _Clock(table_column=Column(no_wrap=True)),
        TextColumn("{task.fields[stats]}"),
        console=console,
        transient=False,
        disable=not enabled or not console.is_terminal,
    )


EVERY = 30.0  # seconds between LineProgress's plain lines


class LineProgress:
    """What a long command (`eval`, `translate -i FILE`) says while it works through its lines, on stderr:
    `translated 1,200/3,003 lines elapsed 0:00:41 eta 0:01:02`.

    On a terminal a bar, moved after every batch; anywhere else a plain line at most every `every` seconds
    and one at the end (nothing for a command that ends within `every`). The time left comes from the
    command's own average rate so far, as training's does (`Pace`).
    """

    def __init__(
        self, verb: str, total: int, unit: str = "lines", every: float | None = None, enabled: bool = True
    ) -> None:
        """`every`: seconds between plain lines (None: `EVERY`)."""
        self.verb, self.total, self.unit = verb, total, unit
        self.every = EVERY if every is None else every
        self.done, self.start = 0, time.monotonic()
        self.said_at = self.start  # the last plain line's time
        self.bar: Progress | None = None
        if enabled and total and console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(table_column=Column(no_wrap=True)),
                TextColumn("{task.fields[clock]}"),
                console=console,
                transient=True,  # the command's own output follows; the bar is gone once it is done
            )
            self.task = self.bar.add_task(verb, total=total, clock="")
            self.bar.start()
        self.plain = enabled and bool(total) and self.bar is None

    def line(self) -> str:
        """`<verb> done/total <unit> elapsed H:MM:SS eta H:MM:SS`."""
        spent = time.monotonic() - self.start
        left = (self.total - self.done) * spent / self.done if self.done and spent > 0 else None
        eta = hms(left) if left is not None else "-:--:--"
        return f"{self.verb} {self.done:,}/{self.total:,} {self.unit} elapsed {hms(spent)} eta {eta}"

    def advance(self, lines: int) -> None:
        """`lines` more are done."""
        self.done = min(self.total, self.done + lines)
        if self.bar is not None:
            clock = self.line().split(f" {self.unit} ", 1)[1]
            self.bar.update(self.task, completed=self.done, clock=clock)
        elif self.plain and time.monotonic() - self.said_at >= self.every and self.done < self.total:
            console.print(self.line(), markup=False, highlight=False)
            self.said_at = time.monotonic()

    def close(self) -> None:
        """The bar goes; off a terminal, the last line (when any was printed: a short command says nothing)."""
        if self.bar is not None:
            self.bar.stop()
        elif self.plain and self.said_at != self.start:
            console.print(self.line(), markup=False, highlight=False)

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
