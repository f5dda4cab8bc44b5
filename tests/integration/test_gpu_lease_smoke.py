"""bench/gpu_lease.sh on a CPU: with too little time left for any stage, each says it did not run and none reads a
log that was never written; with a stand-in for python3, what each stage puts in the summary (on a GPU machine the
summary is all that comes back)."""

import os
import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "bench" / "gpu_lease.sh"
STAGES = ("suite", "train", "decode", "loop", "same")  # the stages a deadline bounds (all but gpu)


def test_stages_without_time_say_so_and_read_no_missing_log(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GPU_LEASE_SECONDS": "5", "GPU_COMMIT": "c0ffee1"}
    done = subprocess.run(["bash", str(SCRIPT), *STAGES], env=env, capture_output=True, text=True, timeout=60)
    summary = (tmp_path / "summary.txt").read_text()
    for stage in STAGES:
        assert f"[{stage}] not run" in summary
    assert "No such file" not in done.stderr + done.stdout, done.stderr
    assert "reported:" not in summary  # no count of a suite that never ran
    assert summary.startswith("== gpu_lease (c0ffee1; ")  # the commit given, not git's


# A stand-in for python3: pytest under -n 14 reports one passed test; the longest test, in a process of its own,
# passes, or (HANG set) sleeps past the deadline (21 s: just over the script's 20 s floor for a stage); the loop's
# and the same-results benchmark's closing lines, among others.
FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$*" == *"gpu_train.py --only loop"* ]]; then
    printf '%s\\n' "matmul peak: 700 TFLOP/s" "Real loop: 300 updates" "- Loop / update(): **97.0%**."
    exit 0
fi
if [[ "$*" == *gpu_same_results.py* ]]; then
    printf '%s\\n' "step 1" "| training loss | 4.1 | 4.12 | 0.5% |" "**PASS**: both within 1%"
    exit 0
fi
if [[ "$*" == *"-n 14"* ]]; then
    echo "[gw0] [100%] PASSED tests/a.py::test_a"
    echo "== 1 passed in 1.0s =="
    exit 0
fi
if [[ "$*" == *"-m pytest"* ]]; then
    [[ -n ${HANG:-} ]] && exec sleep 60  # exec: the deadline's signal reaches the sleep
    echo "tests/integration/test_run_safety.py::test_kill_9_at_every_point_of_a_save PASSED"
    exit 0
fi
exit 1
"""


def test_the_longest_tests_own_result_is_in_the_summary(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    longest = "test_kill_9_at_every_point_of_a_save (in a process of its own)"
    for hang, seconds, said in (("", "60", "PASSED"), ("1", "21", "no result: stopped at 21 s")):
        out = tmp_path / f"out{hang}"
        env = {**os.environ, "OUT": str(out), "PYTHON": str(python), "GPU_LEASE_SECONDS": seconds, "HANG": hang}
        subprocess.run(["bash", str(SCRIPT), "suite"], env=env, capture_output=True, text=True, timeout=120)
        summary = (out / "summary.txt").read_text()
        if hang:  # the share left at the deadline: 21 s, or 20 where the stages before it crossed a second
            assert re.search(rf"{re.escape(longest)}: no result: stopped at (20|21) s", summary), summary
        else:
            assert f"{longest}: {said}" in summary


def test_the_loop_and_same_results_stages_put_their_closing_lines_in_the_summary(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": str(python), "GPU_LEASE_SECONDS": "60"}
    subprocess.run(["bash", str(SCRIPT), "loop", "same"], env=env, capture_output=True, text=True, timeout=60)
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert "loop (bench/gpu_train.py --only loop): rc 0" in summary
    assert "    Real loop: 300 updates" in summary and "    - Loop / update(): **97.0%**." in summary
    assert "same (bench/gpu_same_results.py): rc 0" in summary
    assert "    | training loss | 4.1 | 4.12 | 0.5% |" in summary and "    **PASS**: both within 1%" in summary
    assert "    matmul peak: 700 TFLOP/s" not in summary and "    step 1" not in summary  # the rest stays in the logs


# A stand-in for python3 whose suite has a failure and an error in one module's fixture: each traceback written to
# $TFORMER_TEST_FAILURES as tests/conftest.py writes it; the rerun of those two alone passes one and fails the other.
FAILING_PYTHON = """#!/usr/bin/env bash
if [[ "$*" == *"-n 14"* ]]; then
    echo "[gw0] [ 50%] FAILED tests/a.py::test_flaky"
    echo "[gw1] [100%] ERROR tests/b.py::test_walk"
    printf '%s\\n' "=== tests/a.py::test_flaky (call)" "    assert seconds < 5" "E   assert 7.5 < 5" \\
        "=== tests/b.py::test_walk (setup)" "E   subprocess.TimeoutExpired: Command timed out after 120 seconds" \\
        >>"$TFORMER_TEST_FAILURES"
    exit 1
fi
if [[ "$*" == *"-m pytest -v"*"tests/b.py::test_walk tests/a.py::test_flaky" ]]; then
    echo "=== tests/b.py::test_walk (setup)" >>"$TFORMER_TEST_FAILURES"
    echo "== 1 passed, 1 error in 3.0s =="
    exit 1
fi
[[ "$*" == *test_kill_9* ]] && exit 0
exit 3
"""


def test_failures_come_with_their_reason_and_a_rerun_alone(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAILING_PYTHON)
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": str(python), "GPU_LEASE_SECONDS": "60"}
    subprocess.run(["bash", str(SCRIPT), "suite"], env=env, capture_output=True, text=True, timeout=60)
    summary = (out / "summary.txt").read_text().splitlines()
    assert "    FAILED tests/a.py::test_flaky" in summary and "    ERROR tests/b.py::test_walk" in summary
    assert "    why: E   assert 7.5 < 5" in summary
    assert "    why: E   subprocess.TimeoutExpired: Command timed out after 120 seconds" in summary
    assert "    rerun alone (pytest -v, the 2 failed): rc 1;  1 passed, 1 error in 3.0s " in summary
    assert (out / "suite-failures.txt").read_text().count("=== ") == 2  # the rerun's own go elsewhere
    assert (out / "suite-rerun-failures.txt").is_file()
