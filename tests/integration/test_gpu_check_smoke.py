"""bench/gpu_check.sh in smoke mode (a tiny model on the CPU, seconds of training): each command's output lands
under OUT as it runs, and a second invocation in the same OUT adds to the call's log instead of emptying it (a
device call may run the script several times; a command it stops leaves what it printed). The GPU figures need a
GPU. Skipped where the shared data folder (../shared/data/wmt14-en-de beside the repository) is absent."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DATA = ROOT.parent / "shared" / "data"

pytestmark = pytest.mark.skipif(
    not (DATA / "wmt14-en-de").is_dir(), reason=f"{DATA / 'wmt14-en-de'} is absent (the shared data folder)"
)


def _gpu_check(*stages: str, out: Path, work: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        **extra,
        "OUT": str(out),
        "GPU_DATA": str(DATA),
        "GPU_CHECK_WORK": str(work),
        "GPU_CHECK_SMOKE": "1",
        "GPU_CHECK_MINUTES": "0.05",
        "PYTHON": sys.executable,
    }
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), *stages], env=env, capture_output=True, text=True, timeout=600
    )


def test_each_commands_log_lands_under_out_and_a_second_run_adds_to_the_calls_log(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    first = _gpu_check("data", "eager", out=out, work=work)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "train: read" in (out / "logs" / "prepare.log").read_text()
    assert "update 1/" in (out / "logs" / "eager.log").read_text()
    second = _gpu_check("summary", out=out, work=work, GPU_COMMIT="c0ffee1")
    assert second.returncode == 0, second.stdout + second.stderr
    log = (out / "gpu_check.log").read_text()
    headers = [line for line in log.splitlines() if line.startswith("== ") and "bench/gpu_check.sh" in line]
    assert [h.split("bench/gpu_check.sh ")[1] for h in headers] == ["data eager", "summary"]
    assert "===== eager:" in log  # the first invocation's commands are still in the call's log
    assert "train eager (fp32, compile=false): updates" in (out / "summary.txt").read_text()
    assert "commit c0ffee1;" in (out / "summary.txt").read_text().splitlines()[0]  # the commit given, not git's
    assert re.search(r"the first update logged \d+ s after the command started", (out / "summary.txt").read_text())


def test_overrides_reach_the_runs_and_translate_takes_the_compiled_run_where_no_eager_one_was_trained(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    trained = _gpu_check("data", "eager", out=out, work=work, GPU_CHECK_OVERRIDES="train.pad_to_multiple=8")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "train.pad_to_multiple=8" in (out / "logs" / "eager.log").read_text().splitlines()[0]  # the command
    assert "train eager (fp32, compile=false, train.pad_to_multiple=8): updates" in (out / "summary.txt").read_text()
    (work / "runs" / "eager").rename(work / "runs" / "compiled")  # as after `data compiled`, without a compile
    translated = _gpu_check("translate", out=out, work=work)
    assert translated.returncode == 0, translated.stdout + translated.stderr
    assert "beam 4, the compiled run's best.pt)" in (out / "summary.txt").read_text()
