"""`precision: auto`: bf16 where the device runs it fast, fp32 elsewhere, and the reason in one line.

bf16 pays only where the hardware multiplies bf16 natively: a CUDA GPU with bf16 (Ampere and later), or a
CPU whose oneDNN kernels have bf16 instructions (AVX512-BF16 or AMX). On a CPU without them oneDNN emulates
bf16, several times slower than fp32 (docs/results.md). `ONEDNN_MAX_CPU_ISA` below AVX512_CORE_BF16 takes
the instructions away from oneDNN on any CPU, so it counts as their absence.

`train.precision: auto` is resolved once, when a run starts, and the choice is what the run's config.yaml
and checkpoints record: a resumed run keeps it, on whatever machine it resumes. `decode.precision: auto` is
resolved each time a trained model is loaded for decoding, for the device it decodes on.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal, TypeVar, cast

import torch
import yaml

from tformer_cli.errors import TformerError, first_line
from tformer_cli.schema import Config

# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) that still allow its bf16 kernels; every other value caps below them
_BF16_ISAS = {
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX10_1_512",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512_AMX_FP16",
    "ALL",
    "DEFAULT",
}


def _cpu_has_bf16_instructions() -> bool:
    """Whether this CPU has AVX512-BF16 or AMX (what torch's cpuinfo reports)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def fast_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether bf16 matrix products run natively on `device`, and why, in words for the user.

    Returns:
        (True, reason) where bf16 is native, (False, reason) where it would be emulated or is missing.
    """
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{torch.cuda.get_device_name(device)} has bf16 tensor cores"
        return False, f"{torch.cuda.get_device_name(device)} has no bf16 tensor cores"
    if device.type != "cpu":
        return False, f"bf16 speed on {device.type} is not known"
    if not _cpu_has_bf16_instructions():
        return False, "this CPU has no bf16 instructions (AVX512-BF16 or AMX): bf16 would be emulated, slower"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap and cap not in _BF16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN's bf16 instructions off: bf16 would be emulated"
    return True, "this CPU has bf16 instructions (AVX512-BF16 or AMX)"


Setting = TypeVar("Setting", bound=str)  # train.precision's or decode.precision's Literal


def resolve(setting: Setting, device: torch.device, key: str) -> tuple[Setting | Literal["bf16", "fp32"], str | None]:
    """The precision that `setting` means on `device`, and the line that says why (None unless `auto`).

    Args:
        setting: train.precision or decode.precision as the recipe says it.
        device: where the work runs.
        key: the setting's name, for the message (`train.precision`).
    """
    if setting != "auto":
        return setting, None
    fast, reason = fast_bf16(device)
    choice: Literal["bf16", "fp32"] = "bf16" if fast else "fp32"
    return choice, f"{key}: auto -> {choice} ({reason})"


def choose_train_precision(config: Config, device: torch.device, recorded: Path) -> tuple[Config, str | None]:
    """`config` with train.precision resolved for `device`, and the line to print (None unless `auto`).

    A run that already started (`recorded`, its config.yaml, is there) keeps the precision it chose then, so
    that a resumed run trains as it began wherever it resumes.
    """
    if config.train.precision != "auto":
        return config, None
    earlier = _recorded_precision(recorded)
    choice: Literal["auto", "fp32", "bf16", "fp16", "bf16-weights"]  # train.precision's type
    if earlier is not None and earlier != "auto":
        choice = cast("Literal['fp32', 'bf16', 'fp16', 'bf16-weights']", earlier)  # what the run's start chose
        line: str | None = f"train.precision: auto -> {earlier} (chosen when this run started)"
    else:
        choice, line = resolve("auto", device, "train.precision")
    return dataclasses.replace(config, train=dataclasses.replace(config.train, precision=choice)), line


def _recorded_precision(path: Path) -> str | None:
    """train.precision as a run's config.yaml records it; None where there is no such file or key."""
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TformerError(f"{path}: cannot read the run's recorded config: {first_line(exc)}") from None
    train = saved.get("train") if isinstance(saved, dict) else None
    precision = train.get("precision") if isinstance(train, dict) else None
    return precision if isinstance(precision, str) else None
