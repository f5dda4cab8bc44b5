"""A trained run loaded for decoding text: `tformer translate`, `generate`, `eval --src/--text`, attention maps."""

from __future__ import annotations

from pathlib import Path

from tformer_cli.decoding.packed import pack_linears
from tformer_cli.run import Run, load_run, not_served

SESSIONS_READ_NO_TEXT = "it reads item ids, not text (`tformer eval` scores it)"


def load_for_decoding(path: Path, overrides: list[str] | None = None, device: str = "auto", average: int = 0) -> Run:
    """`load_run` (see there), then the CPU linears packed once for MKL or oneDNN (decoding/packed.py).

    Any model kind loads; the caller checks that it is one its command serves. A run of session data is
    refused here, whatever its kind: its language model has no tokenizer, and every caller reads text.

    Raises:
        CheckpointError: see `load_run`.
        TformerError: a run of data.kind=sessions.
    """
    run = load_run(path, overrides, device, average)
    if run.config.data.kind == "sessions":  # one reason for every text command, before its `check_served`
        raise not_served(run, SESSIONS_READ_NO_TEXT)
    pack_linears(run.model)  # on CPU, weights packed once for MKL or oneDNN; elsewhere unused
    return run
