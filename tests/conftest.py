"""Shared test setup: no network (the hub fails at once instead of retrying), no $OUT, few threads, seeded RNGs,
PyTorch's default fp32 matmul precision, and the `device` fixture (CPU, and CUDA where there is one).

Device-dependent tests take the `device` fixture and put every tensor they hand the code on it: they run
on the CPU everywhere and on CUDA when a GPU is present, marked `cuda` (`pytest -m cuda` selects those;
without a GPU they are skipped, with the reason). Do not use `torch.set_default_device` in tests: it
would hide the bugs these tests are for (a tensor built without `device=` in the code under test).
"""

import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The bench scripts write their tables into $OUT where it is set (a GPU machine's result folder): a test
# that runs one in smoke mode must not put its tiny-model tables there. A test that wants OUT sets it.
os.environ.pop("OUT", None)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# One thread per pytest-xdist worker (the workers share the cores); two at most in a single process.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(1 if WORKERS > 1 else min(2, torch.get_num_threads()))

# Full fp32, set again before each test: `train` and `load_run` turn TF32 on for CUDA, and a session fixture
# that trains in-process must not loosen a later test's fp32 comparison on a GPU.
_MATMUL_PRECISION = torch.get_float32_matmul_precision()

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config, items):
    """Marks and selection the markers' help in pyproject.toml describes:
    - every test under tests/integration/ is marked `integration` (`-m "not integration"`: the quick run);
    - tests marked `slow` are deselected unless the `-m` expression names `slow` (`-m slow` selects them);
    - tests marked `cuda` (the cuda `device` and any test marked by hand) are skipped without a GPU."""
    for item in items:
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
    if "slow" not in (config.option.markexpr or ""):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module", params=DEVICES)
def device(request) -> torch.device:
    """Each device a device-dependent test runs on: the CPU, and CUDA (marked `cuda`)."""
    return torch.device(request.param)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("cuda", "cpu"), marks=pytest.mark.cuda, id="cuda-to-cpu"),
        pytest.param(("cpu", "cuda"), marks=pytest.mark.cuda, id="cpu-to-cuda"),
    ],
)
def two_devices(request) -> tuple[torch.device, torch.device]:
    """(where something is made, where it is used next): a GPU's checkpoint on a CPU, and the reverse."""
    return torch.device(request.param[0]), torch.device(request.param[1])


@pytest.fixture(autouse=True)
def _seeded_rngs():
    """Every test starts from the same state of the global RNGs (random, numpy, torch): a test that draws
    tensors or shapes without its own seed fails the same way on a rerun, alone or in the suite."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _an_idle_machine(monkeypatch):
    """The load average reads 0: `train` and `check` warn where the load leaves fewer free cores than threads,
    and the suite's own parallel workers load the machine; a test of that warning sets the load it wants."""
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))


@pytest.fixture(autouse=True)
def _default_fp32_precision():
    """Every test starts with full fp32 precision (no TF32 matmuls, and none in cuDNN's recurrent layers, whose
    TF32 is on by default), whatever ran before."""
    torch.set_float32_matmul_precision(_MATMUL_PRECISION)
    torch.backends.cudnn.allow_tf32 = False


def pytest_runtest_logreport(report):
    """TFORMER_TEST_FAILURES=PATH: each failure's or error's traceback appended to PATH as it comes. pytest prints
    them at the end of the run, which a run killed at a deadline (a CI job's timeout) never reaches; bench/gpu_check.sh
    keeps them in OUT. Written by the process that reports (under pytest-xdist, the controller, not the worker)."""
    path = os.environ.get("TFORMER_TEST_FAILURES")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
