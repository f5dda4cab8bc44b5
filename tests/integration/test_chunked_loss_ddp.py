"""train.loss_chunk under torchrun: the output weight (tied to the embedding) is used outside the model's forward,
by the chunked loss; DistributedDataParallel must still average its gradient. Two processes with the chunked
loss end where one process with the plain loss does, on the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tformer_cli.run.checkpoints import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "streamrec_transformer.yaml")
SMALL = [
    "run.device=cpu",  # two processes; under auto, a one-GPU machine would give NCCL one GPU for both
    "data.sessions.n_sessions=200",
    "data.sessions.n_valid=20",
    "data.sessions.n_test=20",
    "data.sessions.n_items=50",
    "model.d_model=16",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=32",
    "model.dropout=0.0",
    "train.label_smoothing=0.1",
    "train.batch_size=16",
    "train.epochs=2",  # 5 updates an epoch under update_freq=2: the 6 cross an epoch's end
    "train.max_updates=6",
    "train.valid_every=6",
    "train.log_every=1",
    "train.schedule=constant",
    # the key projection's bias has a zero gradient in exact arithmetic (softmax ignores a shift shared by
    # all keys); Adam with the recipe's eps 1e-9 turns its rounding noise into full-size steps
    "train.eps=1e-3",
    "train.warmup_steps=0",
    "run.threads=1",
]


def _final(run: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    index = json.loads((run / "checkpoints/index.json").read_text())
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    losses = [r["loss"] for r in records if r["split"] == "train"]
    return load_checkpoint(run / "checkpoints" / index["latest"])["model"], losses


def test_two_processes_with_the_chunked_loss_equal_one_process_with_the_plain_loss(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = [sys.executable, "-m", "tformer_cli", "train", RECIPE, f"run.out_dir={tmp_path / 'one'}", *SMALL]
    result = subprocess.run([*one, "train.update_freq=2"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29531"]
    two = [*torchrun, "-m", "tformer_cli", "train", RECIPE, f"run.out_dir={tmp_path / 'two'}", *SMALL]
    result = subprocess.run([*two, "train.loss_chunk=13"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (params_one, losses_one), (params_two, losses_two) = (
        _final(tmp_path / name / "streamrec_transformer") for name in ("one", "two")
    )
    assert len(losses_one) == 6 and losses_two == pytest.approx(losses_one, rel=1e-4)
    assert params_one.keys() == params_two.keys()
    for key in params_one:
        torch.testing.assert_close(params_two[key], params_one[key], atol=1e-5, rtol=1e-4, msg=key)
