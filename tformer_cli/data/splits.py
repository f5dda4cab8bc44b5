"""A recipe's data as its splits, read in one go: what a training task trains and validates on.

`read_splits` is the data side's one explicit choice of `data.kind` (a closed set, as kinds.DATA_KINDS lists
it): generated data is made once from its recipe section, already split; prepared data is data.dir, locked
and checked against the recipe (prepared.PreparedData) before its arrays are opened. The validation set
(validation.py) and a task's own checks (train/tasks.py) work on what it returns and read nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer_cli.data import pattern, sessions
from tformer_cli.data.batching import TokenArray
from tformer_cli.data.pattern import PatternData
from tformer_cli.data.prepared import PreparedData
from tformer_cli.data.sessions import Sessions
from tformer_cli.errors import ConfigError
from tformer_cli.schema import DataConfig, TokenizerConfig


@dataclass(frozen=True)
class PreparedSplits:
    """data.dir as opened and checked, and the arrays of its splits, each a tuple of the kind's sides
    (kinds.DATA_KINDS: (text,) for text data, (src, tgt) for parallel data)."""

    prepared: PreparedData
    train: tuple[TokenArray, ...]  # () where the training split was not asked for (`tformer eval`)
    valid: tuple[TokenArray, ...]


# What `read_splits` gives for each kind: pattern; sessions (train, valid and test by name); text and parallel.
Splits = PatternData | dict[str, Sessions] | PreparedSplits


def read_splits(data: DataConfig, tokenizer: TokenizerConfig, for_training: bool = True) -> Splits:
    """The splits of the recipe's data, read once.

    Args:
        data, tokenizer: the recipe's sections (prepared data is checked against both).
        for_training: also open the training split's arrays (prepared data; generated data is made whole
            either way). `tformer eval` scores the other splits alone.

    Raises:
        DataError: see `PreparedData`; a missing or damaged array (`TokenArray`).
        ConfigError: a data.kind this tformer does not know.
    """
    match data.kind:
        case "pattern":
            return pattern.generate_from(data.pattern)
        case "sessions":
            return sessions.splits(data.sessions)
        case "text" | "parallel":
            prepared = PreparedData(data, tokenizer)
            train = prepared.split("train") if for_training else ()
            return PreparedSplits(prepared, train, prepared.split("valid"))
    raise ConfigError(f"unknown data.kind {data.kind!r}")
