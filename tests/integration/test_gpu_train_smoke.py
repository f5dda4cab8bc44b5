"""bench/gpu_train.py in smoke mode (a tiny shape on the CPU, eager rows only): every row runs, tformer's two losses
agree, the real loop reports a rate. The GPU run itself (bf16, compiled rows, the WMT14 sample) needs a GPU."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import gpu_train  # noqa: E402


@pytest.mark.slow
def test_smoke_run_measures_every_system_and_the_loop(tmp_path, capsys, monkeypatch):
    chunks = []  # the chunk of each linear_cross_entropy call of the model-only rows
    fused_loss = gpu_train.linear_cross_entropy
    monkeypatch.setattr(gpu_train, "linear_cross_entropy", lambda *args: chunks.append(args[4]) or fused_loss(*args))

    report = gpu_train.main(["--smoke", "--no-compile", "--work", str(tmp_path)])

    labels = [row.system.label for row in report.rows]
    expected = [
        "tformer eager, logits + token_loss",
        "tformer eager, linear_cross_entropy chunk 32",
        "tformer update() as train runs it: train.precision=bf16-weights",
        "torch.nn.Transformer eager",
    ]
    if importlib.util.find_spec("transformers") is not None:
        expected.append("HF MarianMTModel eager")
    assert labels == expected
    for row in report.rows + report.loop_rows:
        assert row.error is None, f"{row.system.label}: {row.error}"
        assert row.rate > 0 and row.ms > 0 and row.tflops > 0 and math.isfinite(row.first_loss)

    # the same batch and initialisation through token_loss and linear_cross_entropy: the same loss formula
    plain, chunked = report.rows[0].first_loss, report.rows[1].first_loss
    assert abs(plain - chunked) < 1e-4
    assert set(chunks) == {32} and len(chunks) == 5  # the chunked row's 2 + 3 updates, and only it
    assert abs(plain - math.log(gpu_train.SMOKE.vocab)) < 1.0  # a fresh model's loss, not a constant

    loop = report.loop
    assert loop is not None and loop.updates == 20 and loop.rate > 0 and loop.tokens_per_update > 0
    assert [row.system.shape.vocab for row in report.loop_rows] == [loop.vocab, gpu_train.SMOKE.vocab]
    assert "Loop / update() at vocabulary" in report.body and "Projected 100,000 updates" in report.body
    assert "FAILED" not in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the default run would start")
def test_without_cuda_the_default_run_refuses_in_one_line():
    with pytest.raises(SystemExit) as exc:
        gpu_train.main([])
    assert "sees no CUDA device" in str(exc.value)


def test_a_failing_row_is_reported_not_dropped():
    def broken(device: torch.device):
        raise RuntimeError("no kernel for this\nsecond line")

    row = gpu_train.measure(gpu_train.System("broken", "peer", gpu_train.SMOKE, broken), torch.device("cpu"), 1, 1, 1.0)
    assert row.error == "RuntimeError: no kernel for this"
    assert "| broken | failed: RuntimeError: no kernel for this |" in gpu_train.model_table([row])
    assert "n/a" in gpu_train.best_ratio([row])
