"""A trained run loaded for decoding text: `tformer translate`, `generate`, `score`, `eval --src`, `perplexity`; several
loaded as an ensemble (`translate` and `eval --src --ensemble`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tformer_cli.decoding.ensemble import Ensemble
from tformer_cli.decoding.packed import pack_linears
from tformer_cli.decoding.search import served_length
from tformer_cli.errors import TformerError
from tformer_cli.kinds import Command
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.run import Run, check_served, load_run


def load_for_decoding(
    path: Path,
    overrides: list[str] | None = None,
    device: str = "auto",
    average: int = 0,
    command: Command | None = None,
) -> Run:
    """`load_run` (see there), refused if `command` does not serve the run (the kinds table's reason:
    `run.check_served`), then the CPU linears packed once for MKL or oneDNN (decoding/packed.py).

    Args:
        command: the command loading it; None (a library caller): any model kind loads.

    Raises:
        CheckpointError: see `load_run`.
        TformerError: a run `command` does not serve ("RUN is a classifier: it reads no text ...").
    """
    run = load_run(path, overrides, device, average)
    if command is not None:
        check_served(run, command)
    pack_linears(run.model)  # on CPU, weights packed once for MKL or oneDNN; elsewhere unused
    return run


def load_ensemble(
    paths: list[Path], overrides: list[str] | None = None, device: str = "auto", command: Command = "translate"
) -> Run:
    """The runs or checkpoints `paths` loaded as one model that translates (decoding/ensemble.py). The first leads:
    its recipe's decode.* settings (with `overrides`) and decode.precision apply to every member, and eval files go
    beside its run (named `<checkpoint>_ens<M>`).

    Raises:
        CheckpointError, TformerError: see `load_for_decoding`; a member trained with another tokenizer than the
            first (an ensemble averages distributions over one vocabulary), or serving other lengths;
            decode.static=always (an ensemble decodes on the dynamic path).
    """
    first = load_for_decoding(paths[0], overrides, device, 0, command)
    if first.config.decode.static == "always":
        raise TformerError("decode.static=always: an ensemble decodes on the dynamic path; use auto or never")
    same = [*(overrides or []), f"decode.precision={first.config.decode.precision}"]
    members = [first]
    for path in paths[1:]:
        member = load_for_decoding(path, same, device, 0, command)
        if member.tokenizer_fingerprint != first.tokenizer_fingerprint:
            raise TformerError(
                f"--ensemble {path}: trained with another tokenizer than {first.checkpoint}; an ensemble's models "
                "share one vocabulary"
            )
        if _served(member) != _served(first):
            raise TformerError(
                f"--ensemble {path}: serves {_served(member)} source and output positions, {first.checkpoint} "
                f"{_served(first)}; an ensemble's models serve the same lengths"
            )
        members.append(member)
    ensemble = Ensemble([_seq2seq(m) for m in members])
    return dataclasses.replace(first, model=ensemble, ensemble=tuple(m.checkpoint for m in members[1:]))


def _served(run: Run) -> tuple[int | None, int | None]:
    """The source and output positions a run's encoder-decoder serves (None: any length)."""
    served, model = run.config.model.max_len, _seq2seq(run)
    return served_length(model.encoder, served), served_length(model.decoder, served)


def _seq2seq(run: Run) -> Seq2Seq:
    assert isinstance(run.model, Seq2Seq), "the commands that ensemble serve encoder-decoders alone (check_served)"
    return run.model
