"""The training loop, top to bottom: set up, resume, then update / log / validate / checkpoint.

Run directory layout:
    .lock              held by the training process (files.FolderLock): one run at a time
    config.yaml        the resolved recipe, headed by what changed on resumes (resume.py)
    train.log          what training said, one plain line per log interval, validation and message (log.py)
    metrics.jsonl      one line per log interval and per validation
    curves.png         loss, learning rate and the run's validation metric; rewritten at validations
    valid_<update>.hyp the translations validation BLEU scored (seq2seq with train.valid_bleu_lines; report.py)
    checkpoints/       step_*.pt, best.pt, index.json (see store.py)

One optimiser update (micro-batches, loss weighting, skipped updates): see step.py.
"""

from __future__ import annotations

import gc
import math
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
from rich.markup import escape
from rich.progress import Progress as Display
from rich.progress import TaskID

from tformer_cli.config import config_to_dict, config_to_yaml
from tformer_cli.errors import TformerError
from tformer_cli.files import FolderLock, remove_temporaries, write_text
from tformer_cli.log import MetricsLog, Pace, TrainLog, console, hms, interval_line, training_progress, update_bar
from tformer_cli.metrics import Stats
from tformer_cli.outputs import check_run_dir
from tformer_cli.precision import choose_train_precision
from tformer_cli.run import resolve_device, use_tf32
from tformer_cli.run.layout import CONFIG, METRICS, TRAIN_LOG
from tformer_cli.run.portable import absolute_paths_of, with_absolute_paths
from tformer_cli.schema import HIGHER_IS_BETTER, Config, TrainConfig
from tformer_cli.train.dist import World, any_across, close_world, init_world, sum_across
from tformer_cli.train.ema import WeightAverage, trained_weights
from tformer_cli.train.init import init_from
from tformer_cli.train.keep import keep_prepared_data
from tformer_cli.train.optim import build_optimizer, load_optimizer_state, lr_at
from tformer_cli.train.report import Curves, curve_marks, keep_translations
from tformer_cli.train.reproducibility import deterministic_kernels, rng_state, set_rng_state
from tformer_cli.train.resume import (
    changes_warning,
    check_same_structure,
    config_header,
    recipe_changes,
    with_defaults,
)
from tformer_cli.train.step import Engine, Step, build_engine, update
from tformer_cli.train.store import BackgroundSaves, CheckpointStore
from tformer_cli.train.tasks import make_task
from tformer_cli.train.tracking import check_installed, open_trackers
from tformer_cli.validation import PairValidation
from tformer_cli.waste import reach_warning, warmup_warning


class Preempted(TformerError):
    """SIGTERM / SIGINT: the current update finished, a checkpoint was saved and the stop was said (not an error:
    the CLI exits with the shell's code for the signal, 130 or 143, so that `tformer train ... && tformer eval`
    does not go on to evaluate a run that has not finished, and a scheduler sees a stop, not a success)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Progress:
    """How far training has come: updates done, the next batch of which epoch, and the validation record (stored in
    a checkpoint under "position")."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    best: float | None = None
    validated_at: int = -1
    stale_validations: int = 0  # validations since the best one (early stopping)
    nonfinite_skipped: int = 0
    oom_skipped: int = 0
    seconds: float = 0.0  # training time so far, resumes included (train.max_minutes)
    decay_began: float | None = None  # seconds at the warm-up's end: train.fit_schedule_to_time's decay clock


def _finished(tc: TrainConfig, progress: Progress, out_of_time: bool) -> bool:
    """Early stopping (train.patience validations in a row without a new best) or the time budget."""
    return out_of_time or (bool(tc.patience) and progress.stale_validations >= tc.patience)


def _improved(metric: str, value: float, best: float | None) -> bool:
    return best is None or (value > best if metric in HIGHER_IS_BETTER else value < best)


def train(config: Config, run_dir: Path) -> dict[str, float]:
    """Train `config` into `run_dir`, resuming from its latest good checkpoint if there is one.

    The main process locks `run_dir` before reading or writing anything in it and holds the lock until
    training returns or raises: a second `tformer train` into the same run stops at once.

    Returns:
        The final validation metrics, plus `best_<metric>`.

    Raises:
        Preempted: on SIGTERM/SIGINT, after saving (exit code 143/130).
        TformerError: `run_dir` is locked by another process, too many non-finite updates in a row, or a
            recipe that does not fit the checkpoint.
        CheckpointError: the run has checkpoint files but none usable (see CheckpointStore.recover).
    """
    check_installed(config.run.report_to)  # a tracker asked for and not installed: said before anything starts
    config = with_absolute_paths(config)  # what the run records means the same from any directory (portable.py)
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    with deterministic_kernels(config.run.deterministic):  # before CUDA's first use: it sets cuBLAS's workspace
        device = resolve_device(config.run.device)
        use_tf32(device)  # fp32 matmuls on tensor cores (CUDA only); autocast's bf16/fp16 ones already are
        world = init_world(device, config.run.dist_backend)
        lock = _on_main(world, lambda: _lock_run_dir(run_dir))  # referenced until the end: dropping it unlocks
        try:
            # `auto`: said once, and kept on resume (the run's config.yaml records the choice)
            config, choice = choose_train_precision(config, device, run_dir / CONFIG)
            if choice and world.is_main:
                console.print(choice)
            metrics = _train(config, run_dir, device, world)
        finally:
            if lock is not None:
                lock.release()
    # The run's DDP module is freed before its process group: its reducer would otherwise hold the group's last
    # reference and destroy it holding the GIL, while gloo's worker thread waits for the GIL (a hang at the end).
    gc.collect()
    close_world(world)
    return metrics


def _train(config: Config, run_dir: Path, device: torch.device, world: World) -> dict[str, float]:
    """`train` once the run directory is locked."""
    try:
        with _stop_at_once():  # a stop during the set-up (reading data, the compile check) ends it at once
            training = _start(config, run_dir, device, world)
    except _SetupStopped as stop:
        _stop_compile_workers()
        said = "stopped during the set-up, before training began (nothing saved; its checkpoints are as they were)"
        TrainLog(run_dir / TRAIN_LOG if world.is_main else None).say(said)
        raise Preempted(said, 130 if stop.signum == signal.SIGINT else 143) from None
    tc = config.train
    progress, task = training.progress, training.engine.task
    if training.finished() and progress.validated_at == progress.step:  # a finished run, run again: said, no writes
        console.print(
            f"{run_dir} finished at update {progress.step}; nothing to do (raise train.max_updates, train.epochs or "
            "train.max_minutes to train on)"
        )
        return training.result()
    metrics = training.begin()
    # leaving the block waits for the last checkpoint save (before the run's lock is released)
    with training.stop, training.saves, metrics, training_progress(enabled=world.is_main) as display:
        training.show_on(display)
        while not training.finished():
            batches = task.batches(progress.epoch)
            while progress.batch < len(batches) and not training.finished():
                step = training.take_step(batches)
                stats, status = update(training.engine, step)
                training.account(status, stats)
                if status == "ok" and (progress.step % tc.log_every == 0 or progress.step == training.total_steps):
                    training.log_window(step.lr)
                if status == "ok" and tc.valid_every and progress.step % tc.valid_every == 0:
                    training.validate_and_save()
                training.check_stop()
            if progress.batch >= len(batches):  # the epoch is done (not cut short by the schedule or a stop)
                progress.epoch, progress.batch = progress.epoch + 1, 0
                if not tc.valid_every:
                    training.validate_and_save()
        if progress.validated_at != progress.step:  # stopped mid-epoch (max_updates, patience, the time budget)
            training.validate_and_save()
        update_bar(display, training.bar, progress.step, progress.step, 0.0, None)  # the end, wherever it came
    training.curves.draw(final=True)
    return training.result()


class _Training:
    """A training run in progress: its model, checkpoints, metrics log and progress, and the loop's jobs on them."""

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        engine: Engine,
        model: torch.nn.Module,
        store: CheckpointStore,
        progress: Progress,
        state: dict[str, Any] | None,
        changes: list[dict[str, Any]],
        begun: float,
        init_line: str | None = None,
        log: TrainLog | None = None,
        average: WeightAverage | None = None,
    ) -> None:
        """A run about to go on from `progress`; `model` is the bare module (what is validated and saved).

        Args:
            state: the checkpoint resumed from (its last validation and recorded changes), None for a new run.
            changes: the recipe's changes since that checkpoint (resume.recipe_changes).
            begun: when this process began to build the run (time.time()): train.max_minutes counts its setup.
            init_line: what train.init_from did (init.py), said when the run begins.
            log: the run's train.log, opened by the set-up (None: opened here).
            average: train.ema_decay's average of `model` (None: off), what is validated and saved as the model.
        """
        self.config, self.tc, self.run_dir, self.engine, self.model = config, config.train, run_dir, engine, model
        self.store, self.progress, self.resumed, self.new_changes = store, progress, state is not None, changes
        self.changes = (state["changes"] if state is not None and "changes" in state else []) + changes
        # the updates this run resumed at, for curves.png (checkpoints before this record have none)
        self.resumes: list[int] = (state.get("resumes", []) + [progress.step]) if state is not None else []
        self.init_line, self.average = init_line, average
        self.log = log or TrainLog(run_dir / TRAIN_LOG if engine.world.is_main else None)
        self.metrics: MetricsLog | None = None  # opened by `begin`: a finished run run again writes nothing
        self.saves = BackgroundSaves(store)  # checkpoints are written while training goes on
        self.group_size = engine.world.size * self.tc.update_freq  # micro-batches per update, over all processes
        epoch_steps = self.tc.epochs * math.ceil(len(engine.task.batches(0)) / self.group_size)
        self.total_steps = epoch_steps if self.tc.max_updates is None else min(self.tc.max_updates, epoch_steps)
        self.stop = _SignalFlag()
        self.last_valid: dict[str, float] = state["metrics"] if state is not None else {}
        self.window, self.window_start = Stats(), time.time()  # training stats since the last log record
        self.started = begun - progress.seconds  # train.max_minutes: this start's setup and the starts before it
        self.pace = Pace(progress.step, time.time() - self.started)
        self.out_of_time = bool(self.tc.max_minutes) and progress.seconds >= self.tc.max_minutes * 60
        self.time_spent = 0.0  # train.fit_schedule_to_time: the fraction of the decay's time spent (set_clock)
        self.set_clock(progress.seconds)
        self.display: Display | None = None
        self.bar = TaskID(0)
        self.reach_said = False  # train.max_minutes' reach, said once (waste.reach_warning)
        self.begun = begun
        self.valid_took: float | None = None  # the last validation's seconds, to say the next one's
        self.curves = Curves(run_dir, enabled=engine.world.is_main, marks=curve_marks(self.resumes, self.changes))

    def begin(self) -> MetricsLog:
        """Write config.yaml (headed by the recorded changes), open metrics.jsonl and the trackers (closed when it is),
        say what the run will do."""
        progress, tc, world = self.progress, self.tc, self.engine.world
        if world.is_main:
            keep_prepared_data(self.config, self.run_dir, self.engine.task.tokenizer_fingerprint)
            write_text(self.run_dir / CONFIG, config_header(self.changes) + config_to_yaml(self.config))
        run, recipe = self.config.run, config_to_dict(self.config)  # run.report_to: TensorBoard, MLflow, W&B
        trackers = (
            _on_main(world, lambda: open_trackers(run.report_to, self.run_dir, run.name, recipe, progress.step)) or []
        )
        self.metrics = MetricsLog(
            self.run_dir / METRICS, enabled=world.is_main, resume_at=progress.step, trackers=trackers
        )
        if self.resumed:
            at = f"update {progress.step} (epoch {progress.epoch + 1}, batch {progress.batch})"
            self.log.say(f"resuming {self.run_dir} at {at}")
        if self.new_changes:
            self.log.say(changes_warning(self.new_changes))
        if self.init_line:
            self.log.say(escape(self.init_line))  # paths, not markup
        budget = f", or train.max_minutes={tc.max_minutes:g} of training if that comes first" if tc.max_minutes else ""
        if tc.fit_schedule_to_time:
            budget += " (the schedule's decay ends with whichever does: train.fit_schedule_to_time)"
        self.log.say(f"training {self.run_dir}: {self.total_steps} updates{budget}")
        if world.is_main and (wasted := warmup_warning(tc, self.total_steps)):
            self.log.say(wasted)
        return self.metrics

    def show_on(self, display: Display) -> None:
        """Show the run on `display` (a bar on a terminal; a disabled rich Progress elsewhere)."""
        self.display = display
        self.bar = display.add_task(
            "train",
            total=self.total_steps,
            completed=self.progress.step,
            stats="",
            before=self.progress.seconds,
            ends=None,
        )

    def result(self) -> dict[str, float]:
        """The last validation's metrics, plus `best_<train.best_metric>`."""
        best = self.progress.best
        return {**self.last_valid, f"best_{self.tc.best_metric}": best if best is not None else float("nan")}

    def finished(self) -> bool:
        """All updates done, or stopped early (patience, time budget)."""
        return self.progress.step >= self.total_steps or _finished(self.tc, self.progress, self.out_of_time)

    def take_step(self, batches: Sequence[Any]) -> Step:
        """The next update's input; its micro-batches (over all processes) are consumed, taken or skipped."""
        progress, world = self.progress, self.engine.world
        group = batches[progress.batch : progress.batch + self.group_size]
        mine = group[world.rank :: world.size]
        progress.batch += len(group)
        # a process with no batch left still joins the gradient sync, on any batch, with weight 0
        return Step(
            mine or group[:1],
            bool(mine),
            lr_at(progress.step + 1, self.tc, self.config.model.d_model, self.total_steps, self.time_spent),
        )

    def account(self, status: str, stats: Stats) -> None:
        """Count an update ("ok") into the progress and the log window, or a skipped one ("oom", "nonfinite").

        Raises:
            TformerError: train.max_nonfinite non-finite updates in a row.
        """
        progress = self.progress
        if status == "oom":
            progress.oom_skipped += 1
            self.log.say(
                f"[yellow]warning:[/] out of GPU memory at update {progress.step + 1}: batch skipped "
                f"({progress.oom_skipped} so far); consider a smaller train.max_tokens"
            )
        elif status == "nonfinite":
            progress.nonfinite_skipped += 1
            self.saves.wait()  # the last good checkpoint it may name is on disk
            _check_nonfinite(progress, self.tc.max_nonfinite, self.store, self.log)
        else:
            progress.step += 1
            progress.nonfinite_skipped = 0
            self.window.add(stats)
            if self.average is not None:
                self.average.update()

    def log_window(self, lr: float) -> None:
        """Write the training record of the updates since the last one (all processes) to metrics.jsonl, and
        its line to train.log and to the bar (a terminal) or stderr (elsewhere)."""
        progress, unit = self.progress, self.engine.task.unit
        mine = self.window.host()  # the training stats' one host sync, at a log step only
        sums = cast("list[float]", [mine.loss_sum, mine.correct, mine.count])  # host(): numbers, not tensors
        totals = sum_across(self.engine.world, sums)
        window = Stats(totals[0], int(totals[1]), int(totals[2]))
        rate = window.count / max(time.time() - self.window_start, 1e-9)
        assert self.metrics is not None  # opened by `begin`
        self.metrics.write(
            {
                "split": "train",
                "step": progress.step,
                "epoch": progress.epoch,
                "loss": window.loss,
                "accuracy": window.accuracy,
                "lr": lr,
                f"{unit}_per_s": rate,
            }
        )
        self.window, self.window_start = Stats(), time.time()
        seconds = time.time() - self.started
        # the total and the time left honour train.max_minutes, from the run's own average rate (log.Pace)
        total, left = self.pace.estimate(progress.step, seconds, self.total_steps, self.tc.max_minutes * 60)
        if not self.reach_said and (short := reach_warning(self.tc, total, self.total_steps)):
            self.log.say(short)  # also why the progress line counts to `total`, not to the schedule's end
            self.reach_said = True
        stats = f"loss {window.loss:.4f} acc {window.accuracy:.3f} lr {lr:.2e} {unit}/s {rate:.0f}"
        self.log.interval(interval_line(progress.step, total, progress.epoch + 1, stats, seconds, left))
        if self.display is not None:
            update_bar(self.display, self.bar, progress.step, total, left, stats)

    def validate_and_save(self) -> None:
        """Validate, log the result, save a checkpoint (also best.pt when it is the best so far) and say so."""
        progress, metric, started = self.progress, self.tc.best_metric, time.time()
        self.announce_validation()
        with self.average.swapped_in() if self.average is not None else nullcontext():
            self.last_valid = self.engine.task.evaluate(self.model, self.engine.device)
        self.valid_took = time.time() - started
        progress.validated_at = progress.step
        value = self.last_valid[metric]
        is_best = _improved(metric, value, progress.best)
        if is_best:
            progress.best, progress.stale_validations = value, 0
        else:
            progress.stale_validations += 1
        assert self.metrics is not None  # opened by `begin`
        self.metrics.write({"split": "valid", "step": progress.step, "epoch": progress.epoch, **self.last_valid})
        self.save(value, is_best)
        if self.engine.world.is_main:
            self.report_validation(is_best)
        self.window_start += time.time() - started  # the interval's throughput is that of training alone

    def announce_validation(self) -> None:
        """Say that a validation starts, where it may be long: the last one took LONG_PHASE seconds or more, or
        (the first) the run has already taken a while; the silence would look like a hang."""
        took = self.valid_took
        if took is not None and took >= LONG_PHASE:
            self.log.say(f"validating at update {self.progress.step} (the last validation took {hms(took)})")
        elif took is None and time.time() - self.begun >= FIRST_VALIDATION_SAID_AFTER:
            since = "the run resumed" if self.resumed else "the run started"
            self.log.say(f"validating at update {self.progress.step} (the first validation since {since})")

    def report_validation(self, is_best: bool) -> None:
        """Say the validation's metrics, write and show its translations (seq2seq), redraw curves.png."""
        progress = self.progress
        shown = "  ".join(f"{k} {v:.4f}" for k, v in self.last_valid.items())
        epoch = progress.epoch if progress.batch == 0 else f"{progress.epoch + 1} (part)"
        self.log.say(f"epoch {epoch} update {progress.step}: valid {shown}" + (" (best)" if is_best else ""))
        valid = self.engine.task.valid
        if isinstance(valid, PairValidation) and valid.translations is not None:
            keep_translations(valid.translations, self.run_dir, progress.step, self.log)
        self.curves.draw(final=False)

    def save(self, metric: float | None, is_best: bool) -> None:
        """Checkpoint everything a bit-exact resume needs (main process only); `metric` None: not validated.

        The state is copied now and written in the background (store.BackgroundSaves) while training goes on.
        """
        if not self.engine.world.is_main:
            return
        engine = self.engine
        weights = self.average.checkpoint() if self.average is not None else {"model": self.model.state_dict()}
        state = {
            **weights,
            "optimizer": engine.optimizer.state_dict(),
            "scaler": engine.scaler.state_dict(),
            "rng": rng_state(),
            "position": asdict(self.progress),  # the key checkpoints have always stored it under
            "config": config_to_dict(self.config),
            "metrics": self.last_valid,
            "tokenizer_fingerprint": engine.task.tokenizer_fingerprint,
            "changes": self.changes,  # of the recipe on resumes (resume.py)
            "resumes": self.resumes,
        }
        self.saves.submit(state, self.progress.step, metric, is_best)

    def set_clock(self, seconds: float) -> None:
        """train.fit_schedule_to_time: the decay's clock at `seconds` of training (the same in every process, so
        that all step with one learning rate): it starts when the warm-up ends; `time_spent` is the fraction of
        the time from there to train.max_minutes spent."""
        progress, tc = self.progress, self.tc
        if not tc.fit_schedule_to_time:
            return
        if progress.decay_began is None and progress.step >= tc.warmup_steps:  # also a checkpoint that kept no clock
            progress.decay_began = seconds
        began, budget = progress.decay_began, tc.max_minutes * 60
        if began is not None:
            self.time_spent = 1.0 if began >= budget else (seconds - began) / (budget - began)

    def check_stop(self) -> None:
        """Note when the time budget is spent (all processes agree); on SIGTERM/SIGINT, save and stop.

        Raises:
            Preempted: a signal arrived (in any process); exit code 130 for SIGINT, 143 for SIGTERM.
        """
        progress, world, tc = self.progress, self.engine.world, self.tc
        progress.seconds = time.time() - self.started
        if tc.max_minutes:  # one exchange: whether any process is out of time, and their mean clock
            late, seconds = sum_across(world, [float(progress.seconds >= tc.max_minutes * 60), progress.seconds])
            self.set_clock(seconds / world.size)
            if late:
                self.out_of_time = True
                self.log.say(f"train.max_minutes={tc.max_minutes:g} reached at update {progress.step}")
        if any_across(world, self.stop.signum is not None):
            self.save(None, False)
            self.saves.wait()
            self.curves.draw(final=True)
            said = f"stopped at update {progress.step} (checkpoint saved); rerun the same command to resume"
            self.log.say(said)
            raise Preempted(said, 130 if self.stop.signum == signal.SIGINT else 143)


def _start(config: Config, run_dir: Path, device: torch.device, world: World) -> _Training:
    """Build the model and optimiser, resume them from the run's latest good checkpoint if any, open the log.

    The order is that of the random draws (initialisation, then the restored generators, then the compile
    check's batch), so that a resumed run goes on exactly as the straight run would have.
    """
    tc, begun = config.train, time.time()  # train.max_minutes counts from here: reading data, building, compiling
    torch.manual_seed(config.run.seed + world.rank)
    task = make_task(config)
    model = task.build_model().to(device)
    optimizer = build_optimizer(model, tc)
    scaler = torch.amp.GradScaler(device.type, enabled=tc.precision == "fp16")
    store, state = _open_checkpoints(run_dir, tc, world)
    progress = Progress()
    changes: list[dict[str, Any]] = []  # the recipe's changes since the checkpoint (`_resume`)
    if state is not None:
        parts = {"model": model, "optimizer": optimizer, "scaler": scaler}
        progress, changes = _resume(state, config, task.tokenizer_fingerprint, parts, store.dir)
    resumed_at = progress.step if state is not None else None  # train.init_from: a new run's weights only
    init_line = init_from(config, model, task.tokenizer_fingerprint, resumed_at)
    average = WeightAverage(model, tc.ema_decay) if tc.ema_decay else None  # of the weights resumed or initialised
    if average is not None and state is not None:
        average.resume(state)
    log = TrainLog(run_dir / TRAIN_LOG if world.is_main else None)
    # after the resume: bf16-weights copies the model
    engine = build_engine(model, task, optimizer, scaler, tc, world, say=log.say)
    return _Training(config, run_dir, engine, model, store, progress, state, changes, begun, init_line, log, average)


def _resume(
    state: dict[str, Any], config: Config, fingerprint: str | None, parts: dict[str, Any], where: Path
) -> tuple[Progress, list[dict[str, Any]]]:
    """Load `state` into `parts` (model, optimizer, scaler by their checkpoint keys) and the random generators.

    The optimiser's settings (betas, eps, weight decay) are the recipe's, its state (moments, step counts) the
    checkpoint's: a changed train.betas takes effect as a changed train.lr does, and both are recorded.

    Returns:
        The progress to go on from, and the recipe's changes since the checkpoint (resume.recipe_changes).

    Raises:
        TformerError: the checkpoint in `where` was trained with another model, data or tokenizer than
            `config` and `fingerprint` (the task's tokenizer) describe, or a key that cannot change mid-run changed.
    """
    saved, current = with_defaults(absolute_paths_of(state["config"], where.parent)), config_to_dict(config)
    check_same_structure(saved, current, where)
    if state.get("tokenizer_fingerprint") != fingerprint:
        raise TformerError(f"{where} was trained with another tokenizer than {config.data.dir}")
    progress = Progress(**state["position"])
    changes = recipe_changes(saved, current, progress.step + 1, mid_epoch=progress.batch > 0)
    for key, part in parts.items():
        if key == "optimizer":
            settings = [{k: v for k, v in group.items() if k != "params"} for group in part.param_groups]
            load_optimizer_state(part, state[key])
            for group, recipe in zip(part.param_groups, settings, strict=True):
                group.update(recipe)
        elif key == "model":
            part.load_state_dict(trained_weights(state))  # not the average train.ema_decay saves as `model`
        else:
            part.load_state_dict(state[key])
    set_rng_state(state["rng"])
    return progress, changes


def _lock_run_dir(run_dir: Path) -> FolderLock:
    """Lock `run_dir` (created if needed) for this process, then remove what killed writes left there.

    Raises:
        TformerError: `run_dir` is, is inside or holds a prepared data folder (outputs.check_run_dir), or is locked.
    """
    check_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(run_dir, "tformer train").acquire()
    remove_temporaries(run_dir)
    return lock


def _on_main(world: World, action: Callable[[], Any]) -> Any:
    """`action()` in the main process only (None elsewhere); all processes raise if it raised a TformerError.

    The other processes wait for it, so what the main process repairs is in place before they read.
    """
    result, error = None, None
    if world.is_main:
        try:
            result = action()
        except TformerError as exc:
            error = exc
    if any_across(world, error is not None):
        raise error or TformerError("the main process (rank 0) stopped with an error; see its message")
    return result


def _open_checkpoints(run_dir: Path, tc: TrainConfig, world: World) -> tuple[CheckpointStore, dict[str, Any] | None]:
    """The run's checkpoint store and the state to resume from (None: a new run).

    The main process, holding the run's lock, makes the folder consistent (CheckpointStore.recover);
    the other processes then read it.
    """
    keep = (tc.keep_last, tc.keep_best, tc.best_metric in HIGHER_IS_BETTER)
    recovered = _on_main(world, lambda: CheckpointStore.recover(run_dir, *keep))
    if world.is_main:
        return recovered
    store = CheckpointStore(run_dir, *keep)
    return store, store.latest_good()


def _check_nonfinite(progress: Progress, limit: int, store: CheckpointStore, log: TrainLog) -> None:
    """Warn of a skipped non-finite update; stop at `limit` in a row, naming the last checkpoint (or none).

    Raises:
        TformerError: `limit` non-finite updates in a row.
    """
    log.say(
        f"[yellow]warning:[/] non-finite loss or gradient at update {progress.step + 1}: skipped "
        f"({progress.nonfinite_skipped} in a row)"
    )
    if progress.nonfinite_skipped >= limit:
        latest = store.index["latest"]
        last = f"the last good checkpoint is {store.dir / latest}" if latest else "no checkpoint was saved yet"
        raise TformerError(
            f"{limit} non-finite updates in a row after update {progress.step}: stopping. Lower train.lr, "
            f"use train.precision=fp32, or check the data; {last}"
        )


class _SignalFlag:
    """Records SIGTERM/SIGINT instead of dying mid-update; restores the old handlers on exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum

    def __enter__(self) -> _SignalFlag:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


LONG_PHASE = 5.0  # seconds: a phase that takes this long is said before it starts
FIRST_VALIDATION_SAID_AFTER = 30.0  # seconds since this start: the first validation of a longer run is said


class _SetupStopped(BaseException):
    """SIGTERM / SIGINT during a run's set-up. A BaseException, raised by the signal handler itself, so that the
    compiler's and data readers' `except Exception` do not swallow it and no phase runs to its end first."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _stop_at_once() -> Iterator[None]:
    """SIGTERM and SIGINT raise `_SetupStopped` at once in this block (main thread only; elsewhere nothing)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise _SetupStopped(signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _stop_compile_workers() -> None:
    """End torch.compile's worker processes now. Their pools shut down at exit waiting for the jobs under way,
    which kept a stopped run alive for the rest of its compile (a minute or more on a busy CPU)."""
    import sys

    compiling = sys.modules.get("torch._inductor.async_compile")
    for pool in list(getattr(compiling, "_pool_set", ())):
        processes = getattr(pool, "_processes", None) or {}  # a ProcessPoolExecutor's
        sidecar = getattr(pool, "process", None)  # a SubprocPool's
        for process in [*processes.values(), *([sidecar] if sidecar is not None else [])]:
            try:
                process.kill()
            except (OSError, AttributeError):
                pass
        try:
            pool.shutdown(wait=False, cancel_futures=True)
        except TypeError:  # a SubprocPool's shutdown takes no arguments
            pool.shutdown()
        except Exception:  # a pool whose workers are gone may fail to say goodbye: they are stopped all the same
            pass
