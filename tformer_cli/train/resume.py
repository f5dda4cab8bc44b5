"""What the recipe of a resumed run may change, and how the run remembers what changed.

A resumed run trains with the recipe it is given, as fairseq and nanoGPT do: a new `train.lr` is the
learning rate from the next update on (HF Trainer keeps the checkpoint's schedule instead, which surprises
its users). What changed is not hidden: each change is recorded with the first update that used it, in the
checkpoints, at the top of config.yaml and in train.log. Keys that cannot change mid-run are refused by name:
the model, data and tokenizer (the weights would not fit), and the few training keys below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tformer_cli.errors import TformerError
from tformer_cli.schema import Config, config_to_dict

# key -> why it cannot change once a run has started
FIXED = {
    "train.best_metric": "best.pt, early stopping and the checkpoints kept were judged by it",
    "train.decay_norms_biases_embeddings": "it decides the optimiser's parameter groups, whose state was saved",
}
# keys that decide the batches of an epoch: a resume mid-epoch goes on at a batch index of the old order
BATCHES = ("train.batch_size", "train.max_tokens", "train.pad_to_multiple", "train.bpe_dropout", "run.seed")
SCHEDULE_LENGTH = ("train.epochs", "train.max_updates")
# model/data/tokenizer keys a resume may change: how many workers read the data, and where the prepared data
# lies (a run resumed elsewhere; the tokenizer's fingerprint and the data manifest's settings are the checks)
MAY_MOVE = ("data.workers", "data.dir")


def with_defaults(saved: dict) -> dict:
    """A checkpoint's recipe (config_to_dict) with the keys that its version of tformer did not have at their
    defaults, as every command reads it: a key added since is neither a change of the recipe nor another model."""
    defaults = config_to_dict(Config())
    return {
        section: {**defaults[section], **values} if isinstance(values, dict) and section in defaults else values
        for section, values in saved.items()
    }


def check_same_structure(saved: dict, current: dict, where: Path) -> None:
    """Refuse to resume when the model, data or tokenizer section changed (they would not fit the weights).

    Args:
        saved, current: config_to_dict of the checkpoint's recipe and of the recipe given now.
        where: the checkpoint folder, for the message.
    """
    changed = [
        f"{section}.{key}: {saved[section].get(key)!r} -> {value!r}"
        for section in ("model", "data", "tokenizer")
        for key, value in current[section].items()
        if section in saved and saved[section].get(key) != value and f"{section}.{key}" not in MAY_MOVE
    ]
    if changed:
        raise TformerError(
            f"{where} was trained with a different recipe ({'; '.join(changed)}); "
            "use a new run.name or restore those keys"
        )


def recipe_changes(saved: dict, current: dict, update: int, mid_epoch: bool) -> list[dict[str, Any]]:
    """The train.* keys and run.seed whose value differs from the checkpoint's recipe.

    Args:
        saved, current: config_to_dict of the checkpoint's recipe and of the recipe given now.
        update: the first update that will use the new values.
        mid_epoch: the checkpoint is inside an epoch (the batch order of that epoch is under way).

    Returns:
        One record per changed key: {"update", "key", "from", "to"}.

    Raises:
        TformerError: a key of FIXED changed, or one of BATCHES mid-epoch (every such key named).
    """
    pairs = [(f"train.{key}", saved["train"].get(key), value) for key, value in current["train"].items()]
    pairs.append(("run.seed", saved["run"].get("seed"), current["run"]["seed"]))
    changes = [{"update": update, "key": key, "from": old, "to": new} for key, old, new in pairs if old != new]
    refused = [f"{c['key']} ({FIXED[c['key']]})" for c in changes if c["key"] in FIXED]
    if mid_epoch:
        mid = "it decides the batches of the epoch under way"
        refused += [f"{c['key']} ({mid})" for c in changes if c["key"] in BATCHES]
    if refused:
        raise TformerError(
            f"cannot change mid-run: {'; '.join(refused)}; restore the value the run started with, "
            "or use a new run.name"
        )
    return changes


def describe(change: dict[str, Any]) -> str:
    """`train.lr 0.003 -> 0.001 from update 41`."""
    return f"{change['key']} {change['from']!r} -> {change['to']!r} from update {change['update']}"


def changes_warning(changes: list[dict[str, Any]]) -> str:
    """The one-line warning for the changes of this resume (rich markup)."""
    schedule = any(c["key"] in SCHEDULE_LENGTH for c in changes)
    return (
        "[yellow]warning:[/] the recipe changed since the checkpoint: "
        + "; ".join(describe(c) for c in changes)
        + (" (the learning-rate schedule follows the new length from here on)" if schedule else "")
        + "; recorded at the top of config.yaml"
    )


# config.yaml holds every key of the config tree, the generated data kinds' sections included: it says so once.
EVERY_KEY = (
    "# Every key of the recipe, defaults included; data.pattern and data.sessions are read only by data.kind pattern"
    " and sessions."
)


def config_header(changes: list[dict[str, Any]]) -> str:
    """YAML comment lines that head config.yaml: what it holds, and what changed on a resume, if anything."""
    if not changes:
        return EVERY_KEY + "\n"
    lines = [EVERY_KEY, "# The recipe as this run trains now. Changed on resume (earlier updates used the old values):"]
    return "\n".join([*lines, *(f"#   {describe(c)}" for c in changes)]) + "\n"
