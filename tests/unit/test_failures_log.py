"""tests/conftest.py's TFORMER_TEST_FAILURES: each failure's traceback written as it comes, once, for a run that a
deadline kills before pytest's closing summary (a CI job's timeout; bench/gpu_check.sh's test stages keep it)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT_CONFTEST = Path(__file__).parents[1] / "conftest.py"


@pytest.fixture
def log_report(request):
    """tests/conftest.py's hook, as pytest loaded it (tests/unit has a conftest.py of its own: `import conftest`
    would find that one)."""
    (plugin,) = [
        p for p in request.config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(ROOT_CONFTEST)
    ]
    return plugin.pytest_runtest_logreport


def _report(failed: bool, nodeid: str, when: str = "call") -> SimpleNamespace:
    return SimpleNamespace(failed=failed, nodeid=nodeid, when=when, longreprtext=f"E   {nodeid} broke")


def test_each_failure_is_appended_with_its_test_and_phase(tmp_path, monkeypatch, log_report):
    path = tmp_path / "failures.txt"
    monkeypatch.setenv("TFORMER_TEST_FAILURES", str(path))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    log_report(_report(True, "tests/a.py::t", "setup"))
    log_report(_report(False, "tests/b.py::t"))  # a pass: nothing
    log_report(_report(True, "tests/c.py::t"))
    assert path.read_text().splitlines() == [
        "=== tests/a.py::t (setup)",
        "E   tests/a.py::t broke",
        "=== tests/c.py::t (call)",
        "E   tests/c.py::t broke",
    ]


def test_an_xdist_worker_leaves_it_to_the_controller_and_unset_writes_nothing(tmp_path, monkeypatch, log_report):
    path = tmp_path / "failures.txt"
    monkeypatch.setenv("TFORMER_TEST_FAILURES", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    log_report(_report(True, "tests/a.py::t"))
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    monkeypatch.delenv("TFORMER_TEST_FAILURES")
    log_report(_report(True, "tests/a.py::t"))
    assert not path.exists()
