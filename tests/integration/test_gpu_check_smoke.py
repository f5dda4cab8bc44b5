"""bench/gpu_check.sh: in smoke mode (the benchmarks' tiny CPU modes) each stage's output lands under OUT and the
summary comes last, one line per stage; without a data root the training benchmark is refused by name, and an
unknown stage at once. The GPU figures need a GPU."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _gpu_check(*args: str, out: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TFORMER_DATA"}
    env.update({**extra, "OUT": str(out), "PYTHON": sys.executable})
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), *args], env=env, capture_output=True, text=True, timeout=600
    )


def test_each_stage_logs_under_out_and_the_summary_comes_last(tmp_path):
    out = tmp_path / "out"
    done = _gpu_check("gpu", "decode", out=out, GPU_CHECK_SMOKE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch " in (out / "logs" / "gpu.log").read_text()
    assert (out / "gpu_decode.md").is_file()  # the benchmark's table, where OUT points
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("== gpu_check summary (smoke, CPU; commit ")
    assert [line.split(":")[0] for line in summary[1:]] == ["gpu", "decode"]
    assert summary[2] == f"decode: table in {out}/gpu_decode.md"
    assert done.stdout.splitlines()[-3:] == summary  # printed last
    assert "===== decode:" in (out / "gpu_check.log").read_text()


def test_the_training_benchmark_without_a_data_root_is_refused_by_name(tmp_path):
    done = _gpu_check("train", out=tmp_path / "out")
    assert done.returncode == 1
    assert "train: FAILED: no wmt14-en-de under the data root '' (give --data DIR or set TFORMER_DATA)" in done.stdout


def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path):
    done = _gpu_check("gpu", "tests", out=tmp_path / "out")
    assert done.returncode == 2
    assert done.stderr.strip() == "unknown stage tests (choose from: gpu cuda suite train decode)"
    assert not (tmp_path / "out").exists()
