"""The training engine's promises: bit-exact resume, preemption, non-finite updates, corrupt checkpoints,
torchrun equivalence. Each run is the tiny classifier in a fresh process, as a user would run it."""

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tformer_cli.config import load_config
from tformer_cli.errors import CheckpointError, TformerError
from tformer_cli.files import sha256_file
from tformer_cli.run import load_run
from tformer_cli.run.checkpoints import load_checkpoint
from tformer_cli.train import loop, step
from tformer_cli.train.store import CheckpointStore
from tformer_cli.train.tasks import ClassifierTask

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes" / "tiny_classifier.yaml")
# dropout on (so RNG restoration matters), a schedule that does not depend on the run length
COMMON = [
    "model.dropout=0.1",
    "train.schedule=constant",
    "train.warmup_steps=5",
    "train.log_every=1",
    "run.threads=1",
    "train.epochs=3",
]


def _train(out: Path, *extra: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "tformer_cli", "train", TINY, f"run.out_dir={out}", *COMMON, *extra],
        capture_output=True,
        text=True,
        env=env,
    )
    if check:
        assert result.returncode == 0, result.stderr[-2000:]
    return result


def _losses(run: Path) -> list[float]:
    return [
        r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"
    ]


def _final_params(run: Path) -> dict[str, torch.Tensor]:
    index = json.loads((run / "checkpoints/index.json").read_text())
    return load_checkpoint(run / "checkpoints" / index["latest"])["model"]


def _bitwise_equal(a: dict, b: dict) -> bool:
    """The same names and the same bits, wherever each side lives (a checkpoint loads on the CPU)."""
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    _train(out, "train.max_updates=40")
    return out / "tiny_classifier"


def test_resume_in_a_new_process_is_bit_exact(straight, tmp_path):
    _train(tmp_path, "train.max_updates=17")  # stops mid-epoch (16 batches per epoch)
    _train(tmp_path, "train.max_updates=40")  # a new process resumes from the checkpoint
    resumed = tmp_path / "tiny_classifier"
    assert _losses(resumed) == _losses(straight)
    assert _bitwise_equal(_final_params(resumed), _final_params(straight))


def _forget_the_generators(rng: dict) -> None:
    """Reseed every torch generator a run draws from (the CPU's; on CUDA dropout draws from the GPUs')."""
    rng["torch"] = torch.Generator().manual_seed(12345).get_state()
    rng["cuda"] = [torch.Generator(device=f"cuda:{i}").manual_seed(12345).get_state() for i in range(len(rng["cuda"]))]


def test_control_without_the_rng_state_differs(straight, tmp_path):
    _train(tmp_path, "train.max_updates=17")
    run = tmp_path / "tiny_classifier"
    store = CheckpointStore(run)
    name = store.index["latest"]
    state = load_checkpoint(run / "checkpoints" / name)
    assert len(state["rng"]["cuda"]) == torch.cuda.device_count()  # a GPU machine saved its GPUs' generators
    _forget_the_generators(state["rng"])
    torch.save(state, run / "checkpoints" / name)
    store.index["files"][name]["sha256"] = sha256_file(run / "checkpoints" / name)
    store._write_index()
    _train(tmp_path, "train.max_updates=40")
    assert not _bitwise_equal(_final_params(run), _final_params(straight))


def test_sigterm_saves_and_resuming_continues_exactly(straight, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tformer_cli",
            "train",
            TINY,
            f"run.out_dir={tmp_path}",
            *COMMON,
            "train.max_updates=40",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "tiny_classifier" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    if proc.returncode == 0:  # finished before the signal landed: nothing to resume
        pytest.skip("the run finished before SIGTERM arrived")
    assert proc.returncode == 143, stderr
    last = stderr.strip().splitlines()[-1]  # a stop the user asked for is said as such, not as an error
    said = r"stopped at update \d+ \(checkpoint saved\); rerun the same command to resume"
    assert re.fullmatch(said, last), stderr
    assert "error" not in stderr, stderr
    _train(tmp_path, "train.max_updates=40")
    assert _bitwise_equal(_final_params(tmp_path / "tiny_classifier"), _final_params(straight))


def test_nonfinite_losses_are_skipped_then_halt(tmp_path, monkeypatch):
    config = load_config(TINY, [f"run.out_dir={tmp_path}", *COMMON, "train.max_nonfinite=3", "train.valid_every=4"])
    real_loss = ClassifierTask.loss_on
    calls = {"n": 0}

    def flaky(self, model, *inputs):
        calls["n"] += 1
        loss, stats = real_loss(self, model, *inputs)
        if calls["n"] == 6 or calls["n"] >= 12:  # one transient NaN, then NaN for good
            return loss * float("nan"), type(stats)(float("nan"), stats.correct, stats.count)
        return loss, stats

    monkeypatch.setattr(ClassifierTask, "loss_on", flaky)
    with pytest.raises(TformerError, match="3 non-finite updates in a row after update 10"):
        loop.train(config, tmp_path / "run")
    store = CheckpointStore(tmp_path / "run")
    good = store.latest_good()
    assert good is not None and good["position"]["step"] == 8  # the last validation's checkpoint is intact
    assert all(torch.isfinite(v).all() for v in good["model"].values() if v.is_floating_point())


def test_truncated_checkpoint_is_detected_and_the_previous_one_used(straight, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    store = CheckpointStore(run)
    latest = run / "checkpoints" / store.index["latest"]
    latest.write_bytes(latest.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        store.verified(latest.name)
    with pytest.raises(CheckpointError, match="not a loadable tformer checkpoint"):
        load_checkpoint(latest)
    previous = store.latest_good()
    assert previous is not None and previous["position"]["step"] < 40


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL takes one GPU per process)")


@pytest.mark.parametrize(
    "run_device, backend",
    [
        ("cpu", "auto"),
        pytest.param("cuda", "auto", marks=[pytest.mark.cuda, TWO_GPUS]),
        pytest.param("cuda", "gloo", marks=pytest.mark.cuda),
    ],
)
def test_two_processes_under_torchrun_equal_one_process_with_the_same_global_batch(tmp_path, run_device, backend):
    """gloo on the CPU (also on a GPU machine); NCCL on two GPUs (it refuses two processes on one GPU); DDP on CUDA
    tensors with the two processes sharing one GPU over gloo (run.dist_backend=gloo)."""
    extra = [
        "model.dropout=0.0", "train.max_updates=12", "train.batch_size=16", f"run.device={run_device}",
        f"run.dist_backend={backend}",
    ]  # fmt: skip
    _train(tmp_path / "one", *extra, "train.update_freq=2")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={_free_port()}",  # its cases may run at once (pytest -n)
            "-m",
            "tformer_cli",
            "train",
            TINY,
            f"run.out_dir={tmp_path / 'two'}",
            *COMMON,
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = _final_params(tmp_path / "one/tiny_classifier"), _final_params(tmp_path / "two/tiny_classifier")
    assert one.keys() == two.keys()
    for key in one:
        assert torch.allclose(one[key], two[key], atol=1e-5, rtol=1e-4), key
    assert _losses(tmp_path / "one/tiny_classifier") == pytest.approx(
        _losses(tmp_path / "two/tiny_classifier"), rel=1e-4
    )


def test_out_of_memory_in_forward_skips_the_batch(tmp_path, monkeypatch):
    config = load_config(TINY, [f"run.out_dir={tmp_path}", *COMMON, "train.max_updates=6"])
    real_loss = ClassifierTask.loss_on
    calls = {"n": 0}

    def oom_once(self, model, *inputs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_loss(self, model, *inputs)

    monkeypatch.setattr(ClassifierTask, "loss_on", oom_once)
    loop.train(config, tmp_path / "run")
    state = CheckpointStore(tmp_path / "run").latest_good()
    assert state["position"]["step"] == 6 and state["position"]["oom_skipped"] == 1
    assert state["position"]["batch"] == 7  # the skipped batch was consumed, not retried


def test_compile_failure_falls_back_to_eager(tmp_path, monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler (simulated)")

    monkeypatch.setattr(torch, "compile", broken_compile)
    config = load_config(TINY, [f"run.out_dir={tmp_path}", *COMMON, "train.max_updates=3", "train.compile=true"])
    result = loop.train(config, tmp_path / "run")
    assert result["accuracy"] > 0


def test_time_budget_stops_saves_and_counts_across_resumes(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(loop, "time", SimpleNamespace(time=lambda: clock[0]))
    real_update = loop.update  # the name _train looks up (imported from step.py)

    def update_taking_6_seconds(*args, **kwargs):
        clock[0] += 6.0
        return real_update(*args, **kwargs)

    monkeypatch.setattr(loop, "update", update_taking_6_seconds)
    overrides = [f"run.out_dir={tmp_path}", *COMMON, "train.epochs=10", "train.valid_every=0"]

    def steps_validated():
        records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
        return [r["step"] for r in records if r["split"] == "valid"]

    loop.train(load_config(TINY, [*overrides, "train.max_minutes=0.5"]), tmp_path / "run")
    assert steps_validated() == [5]  # 5 updates x 6 s = the 30 s budget: validated and saved there
    assert (tmp_path / "run/checkpoints/step_00000005.pt").is_file()
    loop.train(load_config(TINY, [*overrides, "train.max_minutes=1"]), tmp_path / "run")  # resume: 30 s more
    assert steps_validated() == [5, 10]


def test_time_budget_counts_the_setup_before_the_first_update(tmp_path, monkeypatch):
    """train.max_minutes counts the time the run takes to start (data, model, train.compile's check) too: a
    compile of minutes is part of the hour a recipe promises."""
    clock = [1000.0]
    monkeypatch.setattr(loop, "time", SimpleNamespace(time=lambda: clock[0]))
    real_update, real_build = loop.update, loop.build_engine

    def update_taking_6_seconds(*args, **kwargs):
        clock[0] += 6.0
        return real_update(*args, **kwargs)

    def build_taking_12_seconds(*args, **kwargs):
        clock[0] += 12.0
        return real_build(*args, **kwargs)

    monkeypatch.setattr(loop, "update", update_taking_6_seconds)
    monkeypatch.setattr(loop, "build_engine", build_taking_12_seconds)
    overrides = [f"run.out_dir={tmp_path}", *COMMON, "train.epochs=10", "train.valid_every=0", "train.max_minutes=0.5"]
    loop.train(load_config(TINY, overrides), tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [3]  # 12 s + 3 updates x 6 s = the 30 s budget


def _updates_take_6_seconds(monkeypatch) -> None:
    """The loop's clock starts at 1000 s and moves 6 s an update, nothing else."""
    clock = [1000.0]
    monkeypatch.setattr(loop, "time", SimpleNamespace(time=lambda: clock[0]))
    real_update = loop.update

    def update_taking_6_seconds(*args, **kwargs):
        clock[0] += 6.0
        return real_update(*args, **kwargs)

    monkeypatch.setattr(loop, "update", update_taking_6_seconds)


def _logged_lr(run: Path) -> dict[int, float]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["lr"] for r in records if r["split"] == "train"}


FITTED = [*COMMON, "train.schedule=cosine", "train.lr=1e-3", "train.max_updates=100", "train.epochs=100"]


def _cosine(fraction: float) -> float:
    return 1e-3 * 0.5 * (1 + math.cos(math.pi * min(1.0, fraction)))


def test_a_schedule_fitted_to_the_time_decays_to_its_floor_as_the_budget_runs_out(tmp_path, monkeypatch):
    """train.fit_schedule_to_time: 6 s per update, the warm-up's 2 updates end at 12 s, so the cosine's decay runs
    over the 48 s left of a minute, whatever train.max_updates says; a resume goes on from the clock it saved."""
    _updates_take_6_seconds(monkeypatch)
    overrides = [f"run.out_dir={tmp_path}", *FITTED, "train.warmup_steps=2", "train.fit_schedule_to_time=true"]

    def rates(budget_s: float, first: int, last: int) -> dict[int, float]:
        """Updates first..last: update k starts 6 (k - 1) s in, the decay's clock at 12 s."""
        return {k: _cosine(max((k - 2) / 98, (6 * (k - 1) - 12) / (budget_s - 12))) for k in range(first, last + 1)}

    loop.train(load_config(TINY, [*overrides, "train.max_minutes=0.5"]), tmp_path / "run")  # 5 updates
    assert _logged_lr(tmp_path / "run") == pytest.approx({1: 5e-4, 2: 1e-3, **rates(30, 3, 5)})
    assert _logged_lr(tmp_path / "run")[5] == pytest.approx(_cosine(12 / 18))  # 2/3 of the way down
    loop.train(load_config(TINY, [*overrides, "train.max_minutes=1"]), tmp_path / "run")  # resumed: 30 s more
    assert {k: v for k, v in _logged_lr(tmp_path / "run").items() if k > 5} == pytest.approx(rates(60, 6, 10))
    assert _logged_lr(tmp_path / "run")[10] < 0.04 * 1e-3  # update 10 starts at 54 s, 7/8 of the decay's time


def test_a_schedule_fitted_to_the_time_without_a_warm_up_counts_from_the_start(tmp_path, monkeypatch):
    _updates_take_6_seconds(monkeypatch)
    overrides = [f"run.out_dir={tmp_path}", *FITTED, "train.warmup_steps=0", "train.fit_schedule_to_time=true"]
    loop.train(load_config(TINY, [*overrides, "train.max_minutes=0.5"]), tmp_path / "run")
    assert _logged_lr(tmp_path / "run") == pytest.approx(
        {k: _cosine(max(k / 100, 6 * (k - 1) / 30)) for k in range(1, 6)}
    )


def test_early_stopping_after_patience_validations_without_improvement(tmp_path):
    config = load_config(
        TINY,
        [
            f"run.out_dir={tmp_path}",
            *COMMON,
            "train.epochs=10",
            "train.lr=1e-12",
            "train.patience=2",
            "train.valid_every=5",
        ],
    )
    loop.train(config, tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [5, 10, 15]  # best at 5, no better at 10 and 15: stop mid-epoch


class _CountingModule(torch.nn.Module):
    """Stands for what torch.compile returns (no real compile on a 2-core CI machine): delegates to the
    module it wraps and counts the calls through it, with gradients (updates) and without (the check)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = {"grad": 0, "no_grad": 0}

    def forward(self, *args, **kwargs):
        self.calls["grad" if torch.is_grad_enabled() else "no_grad"] += 1
        return self.inner(*args, **kwargs)


@pytest.mark.parametrize("compile", [True, False])
def test_train_compile_runs_every_update_through_the_compiled_module(tmp_path, monkeypatch, compile):
    made = []

    def recording_compile(module, **kwargs):
        made.append(_CountingModule(module))
        return made[-1]

    monkeypatch.setattr(torch, "compile", recording_compile)
    overrides = [f"run.out_dir={tmp_path}", *COMMON, "train.max_updates=5", f"train.compile={str(compile).lower()}"]
    loop.train(load_config(TINY, overrides), tmp_path / "run")
    if not compile:
        assert made == []
        return
    assert len(made) == 1
    assert made[0].calls == {"grad": 6, "no_grad": 0}  # compiled's check batch (as training runs) and 5 updates
    # what was compiled is the model that was trained and saved, with its loss (step.Objective)
    assert isinstance(made[0].inner, step.Objective)
    saved = _final_params(tmp_path / "run")
    assert _bitwise_equal(saved, made[0].inner.model.state_dict())


def _valid_records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "valid"]


@pytest.mark.parametrize("metric,best_step", [("loss", 8), ("accuracy", 4)])
def test_best_pt_holds_the_best_validation_in_the_metric_s_direction(tmp_path, monkeypatch, metric, best_step):
    """Validation metrics that go down, up, down and up again: best.pt is the lowest loss, or the first
    highest accuracy (a tie is not a new best), whatever came before or after it."""
    scripted = iter(
        [
            {"loss": 0.9, "accuracy": 0.3},  # step 2
            {"loss": 0.5, "accuracy": 0.7},  # step 4: the best accuracy
            {"loss": 0.7, "accuracy": 0.5},  # step 6
            {"loss": 0.4, "accuracy": 0.6},  # step 8: the lowest loss
            {"loss": 0.6, "accuracy": 0.7},  # step 10: ties the best accuracy
        ]
    )
    monkeypatch.setattr(ClassifierTask, "evaluate", lambda self, model, device: next(scripted))
    overrides = [f"run.out_dir={tmp_path}", *COMMON, "train.max_updates=10", "train.valid_every=2"]
    result = loop.train(load_config(TINY, [*overrides, f"train.best_metric={metric}"]), tmp_path / "run")
    checkpoints = tmp_path / "run/checkpoints"
    best = load_checkpoint(checkpoints / "best.pt")
    assert [r["step"] for r in _valid_records(tmp_path / "run")] == [2, 4, 6, 8, 10]
    assert best["position"]["step"] == best_step
    assert best["metrics"] == ({"loss": 0.4, "accuracy": 0.6} if metric == "loss" else {"loss": 0.5, "accuracy": 0.7})
    assert result[f"best_{metric}"] == best["metrics"][metric]
    index = json.loads((checkpoints / "index.json").read_text())
    assert index["files"]["best.pt"]["step"] == best_step
    assert index["files"]["best.pt"]["sha256"] == index["files"][f"step_{best_step:08d}.pt"]["sha256"]


def test_best_pt_of_a_real_run_is_its_lowest_validation_loss(tmp_path):
    """A real run validated every 2 updates with best_metric=loss: best.pt is the step whose validation
    loss in metrics.jsonl is lowest, and the run's first validation is not that step."""
    overrides = [f"run.out_dir={tmp_path}", *COMMON, "train.lr=3e-2", "train.max_updates=20", "train.valid_every=2"]
    loop.train(load_config(TINY, [*overrides, "train.best_metric=loss"]), tmp_path / "run")
    valid = _valid_records(tmp_path / "run")
    lowest = min(valid, key=lambda r: r["loss"])
    assert lowest is not valid[0]  # else an inverted comparison would pick the same step
    best = load_checkpoint(tmp_path / "run/checkpoints/best.pt")
    assert best["position"]["step"] == lowest["step"]
    assert best["metrics"]["loss"] == lowest["loss"]


def test_a_run_trained_on_one_device_loads_and_resumes_on_the_other(tmp_path, two_devices):
    """A GPU's run goes on on a CPU, and the reverse: the checkpoint's weights, optimiser and generators."""
    first, second = two_devices
    overrides = [f"run.out_dir={tmp_path}", *COMMON, "train.valid_every=0"]
    loop.train(load_config(TINY, [*overrides, f"run.device={first.type}", "train.max_updates=5"]), tmp_path / "run")
    saved = _final_params(tmp_path / "run")
    run = load_run(tmp_path / "run", device=second.type)
    assert run.device.type == second.type
    assert _bitwise_equal({k: v.cpu() for k, v in run.model.state_dict().items()}, saved)
    loop.train(load_config(TINY, [*overrides, f"run.device={second.type}", "train.max_updates=10"]), tmp_path / "run")
    state = CheckpointStore(tmp_path / "run").latest_good()
    assert state["position"]["step"] == 10
    assert not _bitwise_equal(state["model"], saved)  # it trained on from there
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
