"""`tformer export`: a checkpoint's weights as safetensors, or a model folder that other tools load."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Checkpoint, ExportFormat, Force, Quantization, RunOverrides, out
from tformer_cli.errors import TformerError


def export(
    path: Checkpoint,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="The .safetensors file to write, or the folder (hf, ctranslate2; replaced if an export).",
        ),
    ],
    overrides: RunOverrides = None,
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="safetensors (the weights, any kind), hf (a Hugging Face model folder) or ctranslate2 "
            "(a CTranslate2 model folder; seq2seq and lm).",
        ),
    ] = ExportFormat.safetensors,
    quantization: Annotated[
        Quantization | None,
        typer.Option(
            help="--format ctranslate2: int8, int8_float16 or float16 weights (default: float32); the float16 "
            "types are for GPUs (on a CPU, CTranslate2 computes them as int8 and float32)."
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Export a checkpoint: its weights as safetensors, or a model folder other tools load (hf, ctranslate2).

    The folders carry the decoding settings (decode.* overrides change them: decode.beam=1 decode.no_repeat_ngram=3).
    Reads the run (on the CPU, the weights as trained); writes -o whole or not at all; prints `checkpoint -> -o`.
    """
    from tformer_cli.outputs import check_output
    from tformer_cli.run import load_run

    if overrides and fmt is ExportFormat.safetensors:
        raise TformerError("decode.* overrides apply to --format hf and ctranslate2 (safetensors: the weights only)")
    if device := [item for item in overrides or [] if item.startswith("run.device=")]:
        raise TformerError(f"{device[0]}: export reads the weights on the CPU, as trained; no device applies")
    if quantization is not None and fmt is not ExportFormat.ctranslate2:
        raise TformerError(f"--quantization applies to --format ctranslate2, not {fmt.value}")
    check_output(output, "safetensors" if fmt is ExportFormat.safetensors else "folder", (path,), force)
    tokenizer = fmt is not ExportFormat.safetensors  # the folders carry the tokenizer; the weights need no data
    run = load_run(path, overrides, device="cpu", cast=False, read_tokenizer=tokenizer)  # the weights as trained
    match fmt:
        case ExportFormat.safetensors:
            from tformer_cli.export import export_safetensors

            export_safetensors(run, output)
        case ExportFormat.hf:
            from tformer_cli.export.hugging_face import export_hugging_face

            export_hugging_face(run, output)
        case ExportFormat.ctranslate2:
            from tformer_cli.export.ctranslate2 import export_ctranslate2

            export_ctranslate2(run, output, quantization.value if quantization is not None else None)
    out.print(f"{run.checkpoint} -> {output}")
