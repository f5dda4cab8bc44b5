"""Settings that waste a run, said in one line before the time is spent (`tformer check` and `tformer train`).

- A warm-up as long as the run or longer: the learning rate never reaches its peak (and a schedule that decays
  never starts to).
- train.max_minutes ending the run well before the schedule's end: a cosine schedule stops high (unless
  train.fit_schedule_to_time ends its decay with the time), a warm-up unfinished. Said once the run's pace is
  known (the first log interval), with the update it will reach.
- More CPU threads than the cores the machine's load leaves free: threads that wait for each other's cores can
  make every update several times slower than one thread.
"""

from __future__ import annotations

import math
import os

from tformer_cli.schema import Config, TrainConfig

WARNING = "[yellow]warning:[/]"


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
    fit = f"set train.max_updates={reach} to fit the schedule to the time"
    if tc.warmup_steps > reach:
        return f"{WARNING} {ends}: the warm-up reaches {reach / tc.warmup_steps:.0%} of it; {fit}"
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


def machine_threads_warning(setting: int, default_threads: int) -> str | None:
    """`threads_warning` for run.threads=`setting` (0: PyTorch's `default_threads`) on this machine now (None
    where the load average cannot be read)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return threads_warning(setting or default_threads, cores, load)


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
