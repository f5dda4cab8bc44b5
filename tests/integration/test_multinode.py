"""Training across machines: `torchrun --nnodes=2` (c10d rendezvous, gloo), two nodes on localhost, one process
each, gives the parameters of one process with the same global batch (update_freq 2), as two processes on one
node do (test_training_engine.py). Each node has its own output folder, as separate machines would: the run
is written by global rank 0 only."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from tformer_cli.run.checkpoints import load_checkpoint

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes" / "tiny_classifier.yaml")
SETTINGS = [
    "model.dropout=0.0", "train.schedule=constant", "train.warmup_steps=5", "train.log_every=1", "run.threads=1",
    "train.epochs=3", "train.max_updates=12", "train.batch_size=16", "run.device=cpu",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _final_params(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "best.pt")["model"]


def test_two_nodes_under_torchrun_equal_one_process_with_the_same_global_batch(tmp_path):
    one = subprocess.run(
        [sys.executable, "-m", "tformer_cli", "train", TINY, f"run.out_dir={tmp_path / 'one'}", *SETTINGS,
         "train.update_freq=2"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-2000:]
    endpoint = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=tformer-test",
                "-m",
                "tformer_cli",
                "train",
                TINY,
                f"run.out_dir={tmp_path / name}",
                *SETTINGS,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for name in ("node_a", "node_b")
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    written = [name for name in ("node_a", "node_b") if (tmp_path / name / "tiny_classifier" / "checkpoints").is_dir()]
    assert len(written) == 1  # global rank 0's node only
    expected, got = (
        _final_params(tmp_path / "one/tiny_classifier"),
        _final_params(tmp_path / written[0] / "tiny_classifier"),
    )
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.allclose(expected[key], got[key], atol=1e-5, rtol=1e-4), key
