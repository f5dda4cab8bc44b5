"""bench/gpu_lease.sh with too little time left for any stage: each says it did not run, and none reads a log
that was never written (on a GPU machine the summary is all that comes back)."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "bench" / "gpu_lease.sh"


def test_stages_without_time_say_so_and_read_no_missing_log(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GPU_LEASE_SECONDS": "5", "GPU_LEASE_COMMIT": "test"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "suite", "train", "decode"], env=env, capture_output=True, text=True, timeout=60
    )
    summary = (tmp_path / "summary.txt").read_text()
    for stage in ("suite", "train", "decode"):
        assert f"[{stage}] not run" in summary
    assert "No such file" not in done.stderr + done.stdout, done.stderr
    assert "reported:" not in summary  # no count of a suite that never ran
