"""The weights alone, as safetensors: a format that cannot carry code (`tformer export --format safetensors`)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_model

from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_path, same_file
from tformer_cli.run import Run


def export_safetensors(run: Run, output: Path) -> None:
    """Write `run`'s weights to `output` (atomically), the recipe and tokenizer fingerprint in its metadata.

    Tied weights are stored once, as safetensors' `save_model` does (`load_model` ties them again).

    Raises:
        TformerError: `output` is the checkpoint being exported.
    """
    if same_file(run.checkpoint, output):
        raise TformerError(f"-o {output} is the checkpoint being exported; write the export elsewhere")
    metadata = {"config": json.dumps(run.saved_config), "tokenizer_fingerprint": str(run.tokenizer_fingerprint)}
    with atomic_path(output) as tmp:
        save_model(run.model, str(tmp), metadata=metadata)
