"""`precision: auto` (tformer_cli/precision.py): bf16 where the device multiplies it natively, else fp32.

The capability check is faked in both directions; the real one runs in a fresh interpreter, with and without
ONEDNN_MAX_CPU_ISA=AVX2 (which takes oneDNN's bf16 instructions away on any CPU), where the CPU has them.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from tformer_cli import precision
from tformer_cli.cli import app
from tformer_cli.decoding.load import load_for_decoding

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes" / "tiny_classifier.yaml")
runner = CliRunner()


def _fake_cpu(monkeypatch, has_bf16: bool) -> None:
    monkeypatch.setattr(precision, "_cpu_has_bf16_instructions", lambda: has_bf16)


@pytest.mark.parametrize(
    ("has_bf16", "isa", "expected"),
    [(True, None, "bf16"), (False, None, "fp32"), (True, "AVX2", "fp32"), (True, "avx512_core_amx", "bf16")],
)
def test_auto_is_bf16_only_where_the_cpu_and_onednn_have_bf16(monkeypatch, has_bf16, isa, expected):
    _fake_cpu(monkeypatch, has_bf16)
    if isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    choice, line = precision.resolve("auto", torch.device("cpu"), "train.precision")
    assert choice == expected
    assert line.startswith(f"train.precision: auto -> {expected} (")
    assert ("AVX2" in line) == (isa == "AVX2")


def test_a_named_precision_is_kept_and_says_nothing(monkeypatch):
    _fake_cpu(monkeypatch, False)
    assert precision.resolve("bf16", torch.device("cpu"), "train.precision") == ("bf16", None)


_REAL = "import torch; from tformer_cli.precision import resolve; print(resolve('auto', torch.device('cpu'), 'x')[0])"


@pytest.mark.skipif(not precision._cpu_has_bf16_instructions(), reason="this CPU has no AVX512-BF16 or AMX")
def test_the_real_check_on_a_bf16_cpu_and_under_onednn_avx2():
    """On this CPU: bf16; with oneDNN capped at AVX2 (a CPU without bf16, as far as oneDNN goes): fp32."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    native = subprocess.run([sys.executable, "-c", _REAL], env=env, capture_output=True, text=True, check=True)
    capped = subprocess.run(
        [sys.executable, "-c", _REAL],
        env={**env, "ONEDNN_MAX_CPU_ISA": "AVX2"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert (native.stdout.strip(), capped.stdout.strip()) == ("bf16", "fp32")


@pytest.mark.skipif(precision._cpu_has_bf16_instructions(), reason="this CPU has AVX512-BF16 or AMX")
def test_the_real_check_on_a_cpu_without_bf16():
    assert precision.resolve("auto", torch.device("cpu"), "x")[0] == "fp32"


def _train(tmp_path: Path, *extra: str):
    auto = ["run.device=cpu", "train.precision=auto"]  # the CPU's instructions decide (auto would take a GPU)
    args = ["train", TINY, f"run.out_dir={tmp_path}", "train.epochs=1", *auto, *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


def _recorded(tmp_path: Path) -> str:
    return yaml.safe_load((tmp_path / "tiny_classifier" / "config.yaml").read_text())["train"]["precision"]


@pytest.mark.parametrize(("has_bf16", "expected"), [(True, "bf16"), (False, "fp32")])
def test_train_says_its_choice_records_it_and_a_resume_keeps_it(monkeypatch, tmp_path, has_bf16, expected):
    _fake_cpu(monkeypatch, has_bf16)
    first = _train(tmp_path)
    assert f"train.precision: auto -> {expected} (" in first.output
    assert _recorded(tmp_path) == expected
    _fake_cpu(monkeypatch, not has_bf16)  # resumed on a machine of the other kind
    resumed = _train(tmp_path, "train.epochs=2")
    assert f"train.precision: auto -> {expected} (chosen when this run started)" in resumed.output
    assert _recorded(tmp_path) == expected


@pytest.mark.parametrize(("has_bf16", "dtype"), [(True, torch.bfloat16), (False, torch.float32)])
def test_decode_auto_casts_the_weights_by_the_device(monkeypatch, tmp_path, has_bf16, dtype):
    _fake_cpu(monkeypatch, False)
    _train(tmp_path)
    _fake_cpu(monkeypatch, has_bf16)
    run = load_for_decoding(tmp_path / "tiny_classifier", ["decode.precision=auto"], "cpu", 0)
    assert next(run.model.parameters()).dtype == dtype
    assert run.config.decode.precision == ("bf16" if has_bf16 else "fp32")  # eval files name the real choice
