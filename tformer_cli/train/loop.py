"""The training loop, top to bottom: set up, resume, then update / log / validate / checkpoint.

Run directory layout:
    config.yaml        the resolved recipe
    metrics.jsonl      one line per log interval and per validation
    checkpoints/last.pt, checkpoints/best.pt
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from tformer_cli.config import config_to_dict, config_to_yaml
from tformer_cli.errors import TformerError
from tformer_cli.log import MetricsLog, console, training_progress
from tformer_cli.schema import Config
from tformer_cli.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from tformer_cli.train.optim import build_optimizer, lr_at
from tformer_cli.train.tasks import Stats, make_task


@dataclass
class Position:
    """Where training is: updates done, and the next batch of which epoch."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    best: float | None = None
    validated_at: int = -1  # the update of the latest validation


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise TformerError("run.device=cuda but no CUDA device is available; use run.device=cpu")
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu" if name == "auto" else name)


def autocast_for(precision: str, device: torch.device):
    """bf16/fp16 autocast contexts (fp32: none)."""
    if precision == "fp32":
        return nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise TformerError("train.precision=fp16 needs CUDA; on CPU use train.precision=bf16")
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def check_same_structure(saved: dict, current: dict, where: Path) -> None:
    """Refuse to resume when the model or data section changed (they would not fit the weights)."""
    changed = [
        f"{section}.{key}: {saved[section].get(key)!r} -> {value!r}"
        for section in ("model", "data")
        for key, value in current[section].items()
        if saved[section].get(key) != value
    ]
    if changed:
        raise TformerError(f"{where} was trained with a different recipe ({'; '.join(changed)}); "
                           "use a new run.name or restore those keys")


def _improved(metric: str, value: float, best: float | None) -> bool:
    return best is None or (value > best if metric == "accuracy" else value < best)


def train(config: Config, run_dir: Path) -> dict[str, float]:
    """Train `config` into `run_dir` (resuming from its last checkpoint if there is one).

    Returns:
        The final validation metrics, plus `best_<metric>`.
    """
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    device = resolve_device(config.run.device)
    torch.manual_seed(config.run.seed)
    task = make_task(config)
    model = task.build_model().to(device)
    optimizer = build_optimizer(model, config.train)
    scaler = torch.amp.GradScaler(enabled=config.train.precision == "fp16")
    pos = Position()

    ckpt_dir = run_dir / "checkpoints"
    if (ckpt_dir / "last.pt").is_file():
        state = load_checkpoint(ckpt_dir / "last.pt")
        check_same_structure(state["config"], config_to_dict(config), ckpt_dir / "last.pt")
        if state.get("tokenizer_fingerprint") != task.tokenizer_fingerprint:
            raise TformerError(f"{ckpt_dir / 'last.pt'} was trained with another tokenizer than {config.data.dir}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        pos = Position(**state["position"])
        console.print(f"resuming {run_dir} at update {pos.step} (epoch {pos.epoch + 1}, batch {pos.batch})")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(config), encoding="utf-8")
    metrics = MetricsLog(run_dir / "metrics.jsonl")

    tc = config.train
    steps_per_epoch = len(task.batches(0))
    total_steps = tc.epochs * steps_per_epoch if tc.max_updates is None else min(tc.max_updates, tc.epochs * steps_per_epoch)
    last_valid: dict[str, float] = {}

    def validate_and_save() -> None:
        nonlocal last_valid
        last_valid = task.evaluate(model, device)
        pos.validated_at = pos.step
        is_best = _improved(tc.best_metric, last_valid[tc.best_metric], pos.best)
        if is_best:
            pos.best = last_valid[tc.best_metric]
        metrics.write({"split": "valid", "step": pos.step, "epoch": pos.epoch, **last_valid})
        state = {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
            "rng": rng_state(), "position": vars(pos).copy(), "config": config_to_dict(config), "metrics": last_valid,
            "tokenizer_fingerprint": task.tokenizer_fingerprint,
        }
        save_checkpoint(state, ckpt_dir / "last.pt")
        if is_best:
            save_checkpoint(state, ckpt_dir / "best.pt")
        shown = "  ".join(f"{k} {v:.4f}" for k, v in last_valid.items())
        progress.console.print(f"epoch {pos.epoch + (pos.batch == 0)} update {pos.step}: valid {shown}"
                               + (" (best)" if is_best else ""))

    window, window_start = Stats(), time.time()
    with training_progress() as progress:
        bar = progress.add_task("train", total=total_steps, completed=pos.step, stats="")
        while pos.step < total_steps:
            batches = task.batches(pos.epoch)
            while pos.batch < len(batches) and pos.step < total_steps:
                lr = lr_at(pos.step + 1, tc, config.model.d_model, total_steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                model.train()
                with autocast_for(tc.precision, device):
                    loss, stats = task.loss(model, batches[pos.batch], device)
                if not math.isfinite(stats.loss_sum):
                    raise TformerError(f"non-finite loss at update {pos.step + 1}; lower train.lr or use fp32")
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if tc.clip_norm > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
                scaler.step(optimizer)
                scaler.update()
                pos.step, pos.batch = pos.step + 1, pos.batch + 1
                window.add(stats)

                if pos.step % tc.log_every == 0 or pos.step == total_steps:
                    rate = window.count / max(time.time() - window_start, 1e-9)
                    metrics.write({"split": "train", "step": pos.step, "epoch": pos.epoch, "loss": window.loss,
                                   "accuracy": window.accuracy, "lr": lr, f"{task.unit}_per_s": rate})
                    progress.update(bar, completed=pos.step, stats=(
                        f"loss {window.loss:.4f} acc {window.accuracy:.3f} lr {lr:.2e} {rate:,.0f} {task.unit}/s"))
                    window, window_start = Stats(), time.time()
                if tc.valid_every and pos.step % tc.valid_every == 0:
                    validate_and_save()
            if pos.batch >= len(batches):
                pos.epoch, pos.batch = pos.epoch + 1, 0
                if not tc.valid_every:
                    validate_and_save()
        if pos.validated_at != pos.step or not last_valid:  # stopped mid-epoch, or resumed a finished run
            validate_and_save()
    return {**last_valid, f"best_{tc.best_metric}": pos.best if pos.best is not None else float("nan")}
