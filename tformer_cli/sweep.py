"""`tformer sweep`: train a grid of settings, one plain `tformer train` process per point, and tabulate.

    tformer sweep recipes/tiny_classifier.yaml train.lr=1e-3,3e-3 model.dropout=0,0.1 --parallel 2

`key=a,b,c` sweeps a recipe key over its values; several swept keys give every combination (the
cartesian product, the first key varying slowest). `key=value` (one value) is set in every run. Commas
inside brackets or quotes do not split: `train.betas=[0.9,0.98],[0.9,0.999]` is two values.

`--one-at-a-time` (an ablation) runs instead the point where every swept key has its first value, then
each other value of each key with the rest at their first values: 1 + (a-1) + (b-1) + ... runs, not
a * b * ...:

    tformer sweep recipes/chapter39_tricks.yaml --one-at-a-time \
        train.warmup_steps=200,0 train.label_smoothing=0.1,0 model.dropout=0.1,0     # 4 runs, not 8

Its points are named as the grid's (each swept key with its value), so the two share finished runs.

Each point trains as `python -m tformer_cli train RECIPE <settings> run.name=<name>` into
`<run.out_dir>/<name>/`. The name is the recipe's run.name, then each setting given as `,key=value`
(`tiny_classifier,train.lr=1e-3,model.dropout=0`), in the order given. Everything but letters, digits
and `._-~+` is percent-encoded (`/` is `%2F`, `,` is `%2C`), so a name is one folder name and two
different settings never share one. run.name, run.out_dir, run.device and run.threads say where and on
what a run trains, not what it trains: set without being swept, they stay out of the name.

Beside training's own files, the sweep keeps two in each run directory:
    train.log     the training process's stdout and stderr, every attempt appended
    sweep.json    the last attempt's outcome (finished or failed, exit code), the seconds of all
                  attempts, the parameter count, and the config trained (less the where-keys above)
`tformer train` leaves no mark of a complete run (early stopping and train.max_minutes end runs before
their planned updates), so its exit status, recorded in sweep.json, is the mark: a point whose sweep.json
says it finished with the same config is not trained again. Any other point is: `tformer train` resumes
it from its latest checkpoint (or refuses a changed model, as it always does).

The table, `<run.out_dir>/sweep_<run.name>,<settings>.md` and `.csv` (swept keys without their values),
has one row per point: the swept values, the status, the final validation (the last one in
metrics.jsonl), the best (the validation `checkpoints/best.pt` holds, by `train.best_metric`), the wall
time of all attempts, the parameter count, and the log. Beside it, `.png`: every run's training and
validation loss against the update, one line per run, labelled with its swept values.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from tformer_cli.config import config_to_dict, load_config, relevant_dict
from tformer_cli.errors import ConfigError, TformerError
from tformer_cli.files import atomic_open, open_own_file, write_json, write_text
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.outputs import Kind, check_output
from tformer_cli.run.checkpoints import read_index
from tformer_cli.run.layout import BEST, CHECKPOINTS, METRICS, SWEEP_RECORD, TRAIN_LOG
from tformer_cli.schema import Config

WHERE_KEYS = ("run.name", "run.out_dir", "run.device", "run.threads")  # not what a run trains
UNSWEPT = ("run.name", "run.out_dir")  # one base name and one table per sweep
SAFE = "._-~+"  # kept as they are in names, besides letters and digits (`quote` keeps `_.-~` anyway)
MAX_NAME_BYTES = 255  # a folder name's limit on Linux and macOS
POLL_SECONDS = 0.2
Say = Callable[[str], None]


# ---------------------------------------------------------------- the grid and its names


@dataclass(frozen=True)
class Setting:
    """One command-line argument: a recipe key and its values (one value: the same in every run)."""

    key: str
    values: tuple[str, ...]

    @property
    def swept(self) -> bool:
        return len(self.values) > 1


@dataclass(frozen=True)
class Point:
    """One run of the grid."""

    name: str  # its run.name
    overrides: tuple[str, ...]  # what `tformer train` is given: every setting, then run.name=<name>
    swept: dict[str, str]  # the swept keys' values (the table's first columns)
    config: Config  # the resolved recipe, validated

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.out_dir) / self.name


@dataclass(frozen=True)
class Sweep:
    """A validated grid: its points in order, and where its table goes."""

    recipe: Path
    settings: list[Setting]
    points: list[Point]
    table: Path  # without suffix: .md and .csv are written


def split_values(raw: str) -> list[str]:
    """`raw` split at its commas, except those inside brackets, braces or quotes (YAML lists and strings)."""
    values, depth, quoting, start = [], 0, "", 0
    for i, char in enumerate(raw):
        if quoting:
            quoting = "" if char == quoting else quoting
        elif char in "'\"":
            quoting = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            values.append(raw[start:i])
            start = i + 1
    return [*values, raw[start:]]


def parse_settings(args: list[str]) -> list[Setting]:
    """The settings of `key=a,b,c` and `key=value` arguments, in the order given.

    Raises:
        ConfigError: an argument without `=` or a key, a key given twice, no value or an empty one,
            a value listed twice, or run.name / run.out_dir swept.
    """
    settings: list[Setting] = []
    for arg in args:
        key, has_equals, raw = arg.partition("=")
        key = key.strip()
        where = f"sweep setting {arg!r}"
        if not has_equals or not key:
            raise ConfigError(f"{where}: expected key=a,b,c (one run per value) or key=value, e.g. train.lr=1e-3,3e-3")
        if key in (s.key for s in settings):
            raise ConfigError(f"{where}: {key} is given twice; list all its values in one {key}=a,b,c")
        values = split_values(raw)
        if not raw.strip():
            raise ConfigError(f"{where}: no value; give one or more, e.g. {key}=a,b")
        if any(not value.strip() for value in values):
            raise ConfigError(f"{where}: an empty value between commas; for an empty string write {key}=''")
        if duplicates := sorted(value for value, n in Counter(values).items() if n > 1):
            raise ConfigError(f"{where}: {duplicates[0]!r} is listed twice; each run must differ")
        if len(values) > 1 and key in UNSWEPT:
            raise ConfigError(f"{where}: {key} cannot be swept (one sweep has one base name and one folder)")
        settings.append(Setting(key, tuple(values)))
    return settings


def expand_grid(settings: list[Setting]) -> list[dict[str, str]]:
    """Every combination of the settings' values, key -> value in the settings' order (first key slowest)."""
    keys = [s.key for s in settings]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(s.values for s in settings))]


def one_at_a_time(settings: list[Setting]) -> list[dict[str, str]]:
    """The first values of every key, then each later value of each key alone (key -> value, in order)."""
    first = {s.key: s.values[0] for s in settings}
    return [first, *({**first, s.key: value} for s in settings for value in s.values[1:])]


def _encode(text: str) -> str:
    """`text` with every character but letters, digits and SAFE percent-encoded (so no `,`, `=`, `/`)."""
    return quote(text, safe=SAFE)


def run_name(base: str, settings: dict[str, str]) -> str:
    """`base,key=value,...`: one folder name, and a different one for different settings.

    The parts are encoded, so the commas and `=` between them are the only ones: the name reads back
    into exactly one base and one list of settings.
    """
    return ",".join([_encode(base), *(f"{key}={_encode(value)}" for key, value in settings.items())])


def table_name(base: str, settings: list[Setting], ablation: bool = False) -> str:
    """`sweep_<base>,...`: each swept key, and each fixed `key=value` that run names hold, in the order given.

    An ablation's table ends in `,one-at-a-time` (no key has that name), beside the grid's of the same keys.
    """
    parts = [_encode(base)]
    for s in settings:
        if s.swept:
            parts.append(s.key)
        elif s.key not in WHERE_KEYS:
            parts.append(f"{s.key}={_encode(s.values[0])}")
    return "sweep_" + ",".join([*parts, *(["one-at-a-time"] if ablation else [])])


def _fits(name: str, what: str) -> str:
    """`name`, or a ConfigError when it is too long for a folder or file name, or is not one name (the
    encoding keeps `/` out of names; this makes sure that no point ever trains outside run.out_dir)."""
    if name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"{what} {name!r} is not one folder name")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise ConfigError(
            f"{what} {name[:60]}... is longer than the {MAX_NAME_BYTES} bytes a file name may have; "
            "sweep fewer keys or give a shorter run.name"
        )
    return name


MAX_POINTS = 1000  # each point is a training run: a larger grid is a typo unless the user says otherwise


def plan(recipe: Path, args: list[str], ablation: bool = False, max_points: int = MAX_POINTS) -> Sweep:
    """Parse the settings, expand the grid (`one_at_a_time` for an ablation), name every point and
    validate its config (nothing runs). A grid of more than `max_points` points is refused before it expands.

    Raises:
        ConfigError: a bad setting (see `parse_settings`), an unknown key, a value of the wrong type or
            range, or a name too long (one line, naming the run whose config it is).
    """
    settings = parse_settings(args)
    swept = [s.key for s in settings if s.swept]
    size = 1
    for s in settings:
        size = size + len(s.values) - 1 if ablation else size * len(s.values)
    if size > max_points:
        raise ConfigError(
            f"the sweep has {size:,} points, more than {max_points:,}: sweep fewer values, split it, "
            f"or give --max-points {size} to train them all"
        )
    grid = one_at_a_time(settings) if ablation else expand_grid(settings)
    base = load_config(recipe, [f"run.name={s.values[0]}" for s in settings if s.key == "run.name"]).run.name
    points = []
    for values in grid:
        name = _fits(run_name(base, {k: v for k, v in values.items() if k in swept or k not in WHERE_KEYS}), "run name")
        overrides = (*(f"{k}={v}" for k, v in values.items() if k != "run.name"), f"run.name={name}")
        try:
            config = load_config(recipe, overrides)
        except ConfigError as exc:
            raise ConfigError(f"run {name}: {exc}") from None
        points.append(Point(name, overrides, {k: values[k] for k in swept}, config))
    _refuse_same_runs(points)
    out_dir = Path(points[0].config.run.out_dir)
    return Sweep(recipe, settings, points, out_dir / _fits(table_name(base, settings, ablation), "table name"))


def _refuse_same_runs(points: list[Point]) -> None:
    """Refuse two points whose configs are the same but for their names: values compared as the config holds
    them (1e-3 and 0.001 are one learning rate), not as they were written.

    Raises:
        ConfigError: naming both runs.
    """
    seen: dict[str, str] = {}
    for point in points:
        settings = json.loads(json.dumps(config_to_dict(point.config)))
        del settings["run"]["name"]  # each point's own name
        key = json.dumps(settings, sort_keys=True)
        if key in seen:
            raise ConfigError(
                f"runs {seen[key]} and {point.name} would run the same config (values are compared as numbers, "
                "lists and strings, not as written); each run must differ"
            )
        seen[key] = point.name


# ---------------------------------------------------------------- running the points


def _what_trains(config: Config) -> dict[str, Any]:
    """The config as JSON values, less the where-keys (a run moved to another device is the same run) and the
    sections the recipe's kinds do not use (`relevant_dict`: a sweep of a translation recipe has no `pattern`)."""
    data = json.loads(json.dumps(relevant_dict(config)))
    for key in WHERE_KEYS:
        section, name = key.split(".")
        del data[section][name]
    return data


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's sweep.json, or None when it has none.

    Raises:
        TformerError: the file is not a sweep record (one line saying what to do).
    """
    path = run_dir / SWEEP_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if not (isinstance(record, dict) and {"status", "exit_code", "seconds", "parameters", "config"} <= record.keys()):
        raise TformerError(f"{path} is not a sweep record; delete it (the sweep then trains the run again)")
    return record


def is_finished(point: Point) -> bool:
    """True when the point's last attempt finished training with the config it has now."""
    record = read_record(point.run_dir)
    return (
        record is not None and record["status"] == "finished" and _holds(record["config"], _what_trains(point.config))
    )


def _holds(recorded: Any, now: Any) -> bool:
    """Whether a recorded config has `now`'s values for each of its keys (a record written before sweep.json
    left out the unused sections holds more keys: its run trained the same and is not trained again)."""
    if isinstance(now, dict) and isinstance(recorded, dict):
        return now.keys() <= recorded.keys() and all(_holds(recorded[key], value) for key, value in now.items())
    return recorded == now


@dataclass
class Attempt:
    """A `tformer train` process the sweep started."""

    point: Point
    process: subprocess.Popen
    log: IO[bytes]
    started: float  # time.monotonic()


def run_points(recipe: Path, points: list[Point], parallel: int, say: Say) -> None:
    """Train the points not finished yet, at most `parallel` at a time; record each attempt in its sweep.json.

    On an interruption (Ctrl-C, or SIGTERM sent to the sweep, e.g. by `kill` or a batch scheduler), the
    runs still going are sent SIGTERM, on which `tformer train` saves a checkpoint and stops; their
    attempts are recorded as failed, no other run starts, and the next sweep resumes them.
    """
    waiting = []
    for point in points:
        if is_finished(point):
            say(f"{point.name}: finished before, not trained again")
        else:
            waiting.append(point)
    running: list[Attempt] = []
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                running.append(_start(recipe, waiting.pop(0), say))
            time.sleep(POLL_SECONDS)
            for attempt in [a for a in running if a.process.poll() is not None]:
                running.remove(attempt)
                _record(attempt, say)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for attempt in running:
            attempt.process.terminate()
        for attempt in running:
            attempt.process.wait()
            _record(attempt, say)


def _interrupt(_signum: int, _frame: Any) -> None:
    """SIGTERM stops a sweep as Ctrl-C does (background jobs ignore SIGINT, so `kill` is how one stops them)."""
    raise KeyboardInterrupt


def _start(recipe: Path, point: Point, say: Say) -> Attempt:
    """Start `tformer train` for `point`, its stdout and stderr appended to the run's train.log."""
    command = [sys.executable, "-m", "tformer_cli", "train", str(recipe), *point.overrides]
    point.run_dir.mkdir(parents=True, exist_ok=True)
    log = os.fdopen(open_own_file(point.run_dir / TRAIN_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")
    log.write(f"$ {shlex.join(command)}\n".encode())
    log.flush()
    say(f"{point.name}: training (log: {point.run_dir / TRAIN_LOG})")
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return Attempt(point, process, log, time.monotonic())


def _record(attempt: Attempt, say: Say) -> None:
    """Write the outcome of a finished process to its sweep.json, adding its seconds to the earlier attempts'."""
    attempt.log.close()
    point, code = attempt.point, attempt.process.returncode
    seconds = time.monotonic() - attempt.started
    earlier = read_record(point.run_dir)
    record = {
        "status": "finished" if code == 0 else "failed",
        "exit_code": code,
        "seconds": round(seconds + (earlier["seconds"] if earlier else 0.0), 3),
        "parameters": parameter_count(point.config) if code == 0 else None,
        "config": _what_trains(point.config),
    }
    write_json(point.run_dir / SWEEP_RECORD, record)
    outcome = "finished" if code == 0 else f"FAILED (exit {code}; see {point.run_dir / TRAIN_LOG})"
    say(f"{point.name}: {outcome} after {seconds:.1f} s")


def parameter_count(config: Config) -> int:
    """The parameters of the model `config` trains, counted without allocating it (on the meta device)."""
    import torch

    from tformer_cli.data.prepared import PreparedData
    from tformer_cli.model import count_parameters
    from tformer_cli.run import build_model_from_config

    # as training built it: the prepared tokenizer's vocabulary; pattern and sessions data set their own
    vocab_size = (
        None if DATA_KINDS[config.data.kind].generated else PreparedData(config.data, config.tokenizer).vocab_size
    )
    with torch.device("meta"):
        return count_parameters(build_model_from_config(config, vocab_size))["total"]


# ---------------------------------------------------------------- the table


NOT_METRICS = ("time", "split", "step", "epoch")


def result_row(point: Point) -> dict[str, Any]:
    """A point's row: swept values, status, final and best validation, wall time, parameters, log.

    Metrics are left out of a run that did not finish.
    """
    record = read_record(point.run_dir)
    row: dict[str, Any] = {**point.swept, "log": str(point.run_dir / TRAIN_LOG)}
    if record is None:
        return {**row, "status": "not run"}
    if record["status"] != "finished":
        return {**row, "status": f"failed (exit {record['exit_code']})", "wall_s": record["seconds"]}
    valid = [r for r in _records(point.run_dir / METRICS) if r.get("split") == "valid"]
    index = read_index(point.run_dir / CHECKPOINTS)
    best_step = index["files"][BEST]["step"] if index is not None and BEST in index["files"] else None
    best = [r for r in valid if r["step"] == best_step]
    row.update(status="finished", wall_s=record["seconds"], parameters=record["parameters"])
    if valid:
        row.update(steps=valid[-1]["step"], **{f"final_{k}": v for k, v in valid[-1].items() if k not in NOT_METRICS})
    if best:
        row.update(best_step=best_step, **{f"best_{k}": v for k, v in best[-1].items() if k not in NOT_METRICS})
    return row


def _records(path: Path) -> list[dict[str, Any]]:
    """The records of a finished run's metrics.jsonl (none when it has none).

    Raises:
        TformerError: a line that is not a JSON record (training leaves whole lines in a finished run).
    """
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise TformerError(f"{path}:{number}: not a JSON record; the run's metrics log is damaged") from None
    return records


def columns(swept: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """The swept keys, status, steps, final_*, best_step, best_*, wall_s, parameters, log (metrics as found)."""
    metrics = list(dict.fromkeys(k.removeprefix("final_") for row in rows for k in row if k.startswith("final_")))
    return [
        *swept,
        "status",
        "steps",
        *(f"final_{m}" for m in metrics),
        "best_step",
        *(f"best_{m}" for m in metrics),
        "wall_s",
        "parameters",
        "log",
    ]


def _cell(column: str, value: Any) -> str:
    """How the markdown table shows a value (the CSV keeps every digit)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.1f}" if column == "wall_s" else f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def markdown(command: str, header: list[str], rows: list[dict[str, Any]]) -> str:
    """The table in markdown, under the command that makes it."""
    lines = [f"`{command}`", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c, row.get(c)) for c in header) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, header: list[str], rows: list[dict[str, Any]]) -> None:
    with atomic_open(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([["" if row.get(c) is None else row[c] for c in header] for row in rows])


def write_curves(points: list[Point], out: Path, title: str) -> bool:
    """One picture of every run's training and validation loss (runs with metrics; False: none has any)."""
    runs = [(_label(p), records) for p in points if (records := _records(p.run_dir / METRICS))]
    if not runs:
        return False
    try:
        from tformer_cli.plots import sweep_curves
    except ImportError:  # matplotlib is a dependency, but a broken install must not fail a finished sweep
        return False
    sweep_curves(runs, out, title)
    return True


def _label(point: Point) -> str:
    """The swept values that tell a run apart in a legend (the run name when nothing is swept)."""
    return ", ".join(f"{key}={value}" for key, value in point.swept.items()) or point.name


# ---------------------------------------------------------------- the command


@dataclass(frozen=True)
class SweepResult:
    markdown: str
    table: Path  # without suffix
    failed: list[Path]  # the logs of the runs that did not finish


def run_sweep(
    recipe: Path,
    args: list[str],
    parallel: int,
    command: str,
    say: Say,
    ablation: bool = False,
    force: bool = False,
    max_points: int = MAX_POINTS,
) -> SweepResult:
    """Plan the grid, train what is not finished, and write the table (.md and .csv) and the loss curves (.png).

    Args:
        args: `key=a,b,c` and `key=value` settings.
        parallel: how many `tformer train` processes run at a time.
        command: the command line, printed above the table.
        say: where progress lines go.
        ablation: one key varied at a time (`one_at_a_time`) rather than every combination.
        force: replace files at the table's names that are not an earlier sweep's table (see `outputs`).
        max_points: the largest grid trained (`plan`).

    Raises:
        ConfigError: bad settings, before anything runs (see `plan`).
        TformerError: `parallel` below 1, an unreadable sweep.json, or a file at the table's names that is
            not an earlier table (without `force`), before anything runs.
    """
    if parallel < 1:
        raise TformerError(f"--parallel {parallel}: must be at least 1")
    sweep = plan(recipe, args, ablation, max_points)
    md, csv_path, curves = (sweep.table.with_name(sweep.table.name + suffix) for suffix in (".md", ".csv", ".png"))
    outputs: tuple[tuple[Path, Kind], ...] = ((md, "table"), (csv_path, "csv"), (curves, "figure"))
    for path, kind in outputs:
        check_output(path, kind, force=force, what="the sweep's table")
    say(f"sweep: {len(sweep.points):,} run{'s' if len(sweep.points) != 1 else ''}")
    run_points(recipe, sweep.points, parallel, say)
    rows = [result_row(point) for point in sweep.points]
    header = columns([s.key for s in sweep.settings if s.swept], rows)
    text = markdown(command, header, rows)
    write_text(md, text)
    write_csv(csv_path, header, rows)
    say(f"table: {md} and {csv_path}")
    if write_curves(sweep.points, curves, command):
        say(f"curves: {curves}")
    return SweepResult(text, sweep.table, [Path(row["log"]) for row in rows if row["status"] != "finished"])
