"""train.init_from: a new run that starts from another run's weights (nanoGPT's `init_from`, fairseq's
`--restore-file` with `--reset-optimizer --reset-lr-scheduler`).

Only the weights come over: the optimizer starts empty, the schedule at update 0, the update count at 0 and the
random generators from run.seed, as in a run from scratch. It applies once, when the run starts: a run that
already has a checkpoint resumes from its own (resume.py records a changed init_from like any train.* key).

What could make the weights silently wrong is refused before training, in one line: a model built otherwise
(the keys that shape the weights or what they compute; the dropouts may differ, which is what fine-tuning
changes) and another tokenizer than the one the data was prepared with (an embedding row would mean another
token).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch import nn

from tformer_cli.config import config_from_dict
from tformer_cli.errors import CheckpointError
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.run.checkpoints import load_verified, resolve_checkpoint
from tformer_cli.run.layout import run_dir_of
from tformer_cli.schema import Config, ModelConfig, position_limit

# model keys that do not change the weights' shapes nor what they compute in eval mode: regularisation
MAY_DIFFER = ("dropout", "attn_dropout", "activation_dropout")


def init_from(config: Config, model: nn.Module, fingerprint: str | None, resumed_at: int | None) -> str | None:
    """Load train.init_from's weights into `model` (freshly built from `config`) at a new run's start.

    Args:
        config: the run's recipe.
        model: the run's model as built, before an optimizer step, DDP or torch.compile wrap it.
        fingerprint: the tokenizer fingerprint of the run's prepared data (None for generated data).
        resumed_at: the update the run resumes at, or None for a run that starts now.

    Returns:
        The line to say (what was loaded, or why nothing was), None without train.init_from.

    Raises:
        CheckpointError: no such run or checkpoint, a checkpoint that does not verify, a model built otherwise
            than the recipe's, or another tokenizer than the data's (one line each, naming train.init_from).
    """
    source = config.train.init_from
    if source is None:
        return None
    if resumed_at is not None:
        return f"train.init_from={source} not applied: the run resumes from its own checkpoint (update {resumed_at})"
    try:
        checkpoint = resolve_checkpoint(Path(source))  # a run directory: its best, else latest, checkpoint
        state = load_verified(checkpoint)
    except CheckpointError as exc:
        raise CheckpointError(f"train.init_from: {exc}") from None
    saved = config_from_dict(state["config"], str(checkpoint)).model  # its model settings (older ones: defaults)
    _check_settings(saved, checkpoint, config)
    _check_tokenizer(state, checkpoint, config, fingerprint)
    _check_tensors(state, checkpoint, config, model)
    model.load_state_dict(state["model"])
    return f"initialised from {checkpoint} ({_whose(state, checkpoint)})"


def _check_settings(saved: ModelConfig, checkpoint: Path, config: Config) -> None:
    """Refuse a checkpoint whose model settings (`saved`) differ from the recipe's (but for those that `_may_differ`).

    Raises:
        CheckpointError: the first (up to 3) differing model keys with both values.
    """
    differences = [
        f"model.{key}={getattr(saved, key)!r} there, {value!r} in the recipe"
        for key, value in ((f.name, getattr(config.model, f.name)) for f in dataclasses.fields(config.model))
        if getattr(saved, key) != value and not _may_differ(key, config)
    ]
    if differences:
        raise CheckpointError(
            f"train.init_from: {checkpoint} holds another model: {'; '.join(differences[:3])} "
            f"(only {', '.join(f'model.{key}' for key in MAY_DIFFER)} may differ)"
        )


def _check_tensors(state: dict[str, Any], checkpoint: Path, config: Config, model: nn.Module) -> None:
    """Refuse a checkpoint whose tensors' names or shapes are not those of `model` (load_state_dict's own error
    runs over many lines).

    Raises:
        CheckpointError: the first such tensor, with both shapes.
    """
    theirs = {name: tuple(tensor.shape) for name, tensor in state["model"].items()}
    ours = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    for name in sorted(theirs.keys() | ours.keys()):
        if theirs.get(name) != ours.get(name):
            there, here = (str(shapes.get(name, "absent")) for shapes in (theirs, ours))
            raise CheckpointError(
                f"train.init_from: {checkpoint}'s weights do not fit the recipe's model: {name} is {there} there, "
                f"{here} here (compare {DATA_KINDS[config.data.kind].vocabulary})"
            )


def _may_differ(key: str, config: Config) -> bool:
    """Whether model.`key` may differ from the source's: the dropouts, and max_len where no table of positions
    is learned (it then only bounds the lengths served)."""
    return key in MAY_DIFFER or (key == "max_len" and position_limit(config.model) is None)


def _check_tokenizer(state: dict[str, Any], checkpoint: Path, config: Config, fingerprint: str | None) -> None:
    """Refuse a checkpoint trained with another tokenizer than the one the run's data was prepared with.

    Raises:
        CheckpointError: naming both fingerprints and the data folder the source was trained on.
    """
    theirs = state.get("tokenizer_fingerprint")
    if theirs == fingerprint:
        return
    trained_on = state["config"].get("data", {}).get("dir")
    raise CheckpointError(
        f"train.init_from: {checkpoint} was trained with another tokenizer than the data in {config.data.dir} "
        f"(fingerprints {str(theirs)[:12]} vs {str(fingerprint)[:12]}): its embeddings would read other tokens; "
        f"train on data prepared with its tokenizer (it trained on {trained_on})"
    )


def _whose(state: dict[str, Any], checkpoint: Path) -> str:
    """`update 120 of runs/base` (a checkpoint outside a run's folder: its recorded run.name)."""
    run = run_dir_of(checkpoint) or f"run {state['config'].get('run', {}).get('name')!r}"
    step = state.get("position", {}).get("step")
    averaged = f"the average of {len(state['averaged'])} checkpoints up to " if "averaged" in state else ""
    return f"{averaged}update {step} of {run}"
