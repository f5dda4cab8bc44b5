"""Settings that waste a run, said in one line before the time is spent (`tformer check` and `tformer train`).

- A warm-up as long as the run or longer: the learning rate never reaches its peak (and a schedule that decays
  never starts to).
- train.max_minutes ending the run well before the schedule's end: a cosine schedule stops high (unless
  train.fit_schedule_to_time ends its decay with the time), a warm-up unfinished. Said once the run's pace is
  known (the first log interval), with the update it will reach.
- More CPU threads than the cores the machine's load leaves free (the 1-minute load average, and the cores busy
  now): threads that wait for each other's cores can make every update several times slower than one thread.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from tformer_cli.schema import Config, TrainConfig

WARNING = "[yellow]warning:[/]"
PROC_STAT = Path("/proc/stat")  # Linux's CPU times, for the cores busy now


def warmup_warning(tc: TrainConfig, updates: int) -> str | None:
    """Why the warm-up wastes a run of `updates` updates (None when it ends within the run).

    The learning rate rises linearly over train.warmup_steps in every schedule (inverse_sqrt's peak is at the
    warm-up's end too), so a run that stops at update u < warmup reaches u / warmup of the peak.
    """
    warmup = tc.warmup_steps
    if not warmup or updates <= 0 or warmup < updates:
        return None
    decay = "" if tc.schedule == "constant" else " and never decays"
    return (
        f"{WARNING} train.warmup_steps={warmup} >= the {updates:,} updates this run will do: the learning rate "
        f"rises to {min(updates / warmup, 1.0):.0%} of its peak{decay}; lower train.warmup_steps "
        f"(e.g. train.warmup_steps={max(1, updates // 10)}) or raise train.max_updates"
    )


def reach_warning(tc: TrainConfig, reach: int, total: int) -> str | None:
    """Why train.max_minutes, ending the run near update `reach` of the schedule's `total`, wastes it (None when
    the schedule loses nothing: it ends in time, or is constant past its warm-up, or never ends: inverse_sqrt)."""
    if not tc.max_minutes or reach >= 0.9 * total:  # the pace is an estimate: a tenth short is no waste to say
        return None
    ends = f"at this pace train.max_minutes={tc.max_minutes:g} ends the run near update {reach:,} of {total:,}"
    if tc.warmup_steps > reach:  # a warm-up counts updates: a shorter schedule or a fitted one leaves it as long
        return (
            f"{WARNING} {ends}: the warm-up reaches {reach / tc.warmup_steps:.0%} of it; lower train.warmup_steps "
            f"(e.g. train.warmup_steps={max(1, reach // 10)})"
        )
    fit = f"set train.max_updates={reach} to fit the schedule to the time"
    if tc.schedule == "cosine" and not tc.fit_schedule_to_time:  # fitted: its decay ends with the time
        done = (reach - tc.warmup_steps) / max(1, total - tc.warmup_steps)
        rate = tc.min_lr_ratio + (1.0 - tc.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * done))  # lr_at's
        return (
            f"{WARNING} {ends}: the cosine schedule reaches {done:.0%} of its decay (the learning rate still "
            f"{rate:.0%} of train.lr); {fit}, or train.fit_schedule_to_time=true to end its decay with the time"
        )
    return None


def threads_warning(threads: int, cores: int, load: float) -> str | None:
    """Why `threads` CPU threads are too many on `cores` cores with this 1-minute `load` average (None when the
    load leaves them free)."""
    free = max(1, round(cores - load))
    if threads <= free:
        return None
    return (
        f"{WARNING} {threads} CPU threads, and the load average is {load:.1f} on {cores} cores (about {free} free): "
        f"threads that wait for busy cores can make training several times slower; try run.threads={free}"
    )


def busy_cores(before: str, after: str, cpus: set[int]) -> float:
    """How many of the CPUs numbered `cpus` were busy between two readings of /proc/stat: each one's time that
    was neither idle nor waiting on a disk, as a share of its time, summed."""

    def times(text: str) -> dict[int, tuple[int, int]]:  # cpu number: (idle, all) in clock ticks
        out = {}
        for line in text.splitlines():
            name, *fields = line.split() or [""]
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                ticks = [int(field) for field in fields[:8]]  # user nice system idle iowait irq softirq steal
                out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
        return out

    start, end = times(before), times(after)
    busy = 0.0
    for cpu in start.keys() & end.keys():
        idle, total = end[cpu][0] - start[cpu][0], end[cpu][1] - start[cpu][1]
        busy += 1.0 - idle / total if total > 0 else 0.0
    return busy


def machine_threads_warning(setting: int, default_threads: int) -> str | None:
    """`threads_warning` for run.threads=`setting` (0: PyTorch's `default_threads`) on this machine now (None
    where the load average cannot be read). The 1-minute average still counts a job that ended seconds ago, so
    where it says the cores are busy, /proc/stat is read twice, a quarter of a second apart: cores that are free
    now are no warning."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    threads = setting or default_threads
    line = threads_warning(threads, len(cpus), load)
    if line is None:
        return None
    try:
        before = PROC_STAT.read_text()
        time.sleep(0.25)
        now = busy_cores(before, PROC_STAT.read_text(), cpus)
    except OSError:  # no /proc (macOS): the average alone
        return line
    return line if threads_warning(threads, len(cpus), now) is not None else None


def threads_line(config: Config) -> str | None:
    """`machine_threads_warning` for a run on the CPU; None on a GPU."""
    import torch

    if config.run.device == "cuda" or (config.run.device == "auto" and torch.cuda.is_available()):
        return None
    return machine_threads_warning(config.run.threads, torch.get_num_threads())


def waste_lines(config: Config) -> list[str]:
    """What would waste the run, said by `tformer check`: a warm-up as long as train.max_updates, too many CPU
    threads."""
    lines = [warmup_warning(config.train, config.train.max_updates)] if config.train.max_updates else []
    return [line for line in [*lines, threads_line(config)] if line is not None]
