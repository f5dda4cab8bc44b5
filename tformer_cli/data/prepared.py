"""data.dir read back: what `prepare` wrote, checked against the recipe before anything is read from it.

Training (train/tasks.py) and `tformer eval` (validation.py) open prepared data only through here (by way of
data/splits.py `read_splits`), so both refuse the same stale or foreign data with the same message.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tformer_cli.data.batching import TokenArray
from tformer_cli.data.manifest import (
    MANIFEST,
    SOURCE_KEYS,
    check_made_for,
    content_difference,
    data_dir_lock,
    foreign_tokenizer,
    read_manifest,
    setting_differences,
)
from tformer_cli.data.sources import local_files
from tformer_cli.errors import DataError, command_line
from tformer_cli.files import FolderLock
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.schema import DataConfig, TokenizerConfig


class PreparedData:
    """The tokenizer and token arrays of data.dir, as its manifest lists them.

    While this object lives it holds data.dir's lock shared (`manifest.data_dir_lock`): `tformer prepare`
    refuses to replace the folder under a training run (whose task keeps it) and names the run's process.
    """

    def __init__(self, data: DataConfig, tokenizer: TokenizerConfig) -> None:
        """Lock data.dir for reading, then read and check its manifest against the recipe's data and tokenizer.

        Raises:
            DataError: no or a damaged manifest, another data kind, data prepared with other data or
                tokenizer settings (or by an older tformer), an spm.model other than the one the data was
                encoded with (its sha256 against the manifest's), or no validation split (one line each).
            TformerError: a `tformer prepare` is writing data.dir (naming its process).
        """
        self.dir = Path(data.dir)
        self._lock = _read_lock(self.dir)
        self.manifest: dict[str, Any] = _checked_manifest(data, tokenizer)
        self.vocab_size = int(self.manifest["tokenizer"]["vocab_size"])
        self.tokenizer_fingerprint: str = self.manifest["tokenizer"]["fingerprint"]
        self.tokenizer_path = self.dir / "spm.model"
        self.sides = DATA_KINDS[data.kind].sides

    def split(self, name: str) -> tuple[TokenArray, ...]:
        """The arrays of one split ("train", "valid"), a side each in the kind's order: (text,) or (src, tgt)."""
        return tuple(self.array(name, side) for side in self.sides)

    def array(self, split: str, side: str) -> TokenArray:
        """The memory-mapped tokens of one split ("train", "valid") and side ("src", "tgt", "text")."""
        base = self.dir / f"{split}.{side}"
        return TokenArray(
            base.with_suffix(base.suffix + ".bin"), base.with_suffix(base.suffix + ".idx"), self.manifest["dtype"]
        )


def _read_lock(folder: Path) -> FolderLock | None:
    """data.dir's lock, held shared; None where there is nothing to lock (no folder yet: the manifest check
    says so) or no lock file can be made (a read-only parent, where no prepare can replace the folder either)."""
    if not folder.is_dir():
        return None
    lock = data_dir_lock(folder, shared=True)
    try:
        return lock.acquire()
    except OSError:
        return None


def _checked_manifest(data: DataConfig, tokenizer: TokenizerConfig) -> dict[str, Any]:
    """The manifest of data.dir, checked against the recipe (see `PreparedData`)."""
    manifest_path = Path(data.dir) / MANIFEST
    manifest = read_manifest(manifest_path.parent)
    if manifest is None:
        raise DataError(f"{manifest_path} not found: run `tformer prepare` with this recipe first")
    if manifest.get("kind") != data.kind:
        raise DataError(f"{manifest_path} holds {manifest.get('kind')} data, the recipe says data.kind={data.kind}")
    check_made_for(manifest, data, tokenizer, manifest_path)
    if not DATA_KINDS[data.kind].generated and (foreign := foreign_tokenizer(manifest_path.parent, manifest)):
        raise DataError(f"{manifest_path.parent}: {foreign}; run `tformer prepare` with this recipe again")
    if "valid" not in manifest["splits"]:
        raise DataError(_no_validation_split(data))
    return manifest


def _no_validation_split(d: DataConfig) -> str:
    """What to set when the prepared data (made with this recipe) has no validation split."""
    if d.train is None:
        return (
            f"data.valid_split is empty: training needs a validation split; set data.valid_split=NAME "
            f"(a split of {d.hub}) and run `tformer prepare` again"
        )
    return (
        "data.valid is not set: training needs a validation split; set data.valid=PATH "
        "(or data.hub with a validation split) and run `tformer prepare` again"
    )


def with_prepared_sources(
    data: DataConfig, tokenizer: TokenizerConfig, recipe: str | Path | None, overrides: list[str] | None
) -> tuple[DataConfig, str | None]:
    """The recipe's data section, with where its data comes from taken from data.dir's manifest: the prepared
    folder is the truth.

    A folder prepared with `data.train=...` overrides, or under another data root, or from local files
    while the recipe now names the hub (no data root set), trains as it is, and the run records where
    its data really came from. Refused (one line, with a command that works): settings that shape the
    arrays differ (tokenizer, lengths, languages), or the recipe's own input files are here with other
    content than the folder was prepared from.

    Args:
        recipe, overrides: as the user gave them (the advice is the user's command with overrides changed).

    Returns:
        The data section to train with, and a line saying where the data came from when that is not the recipe's
        (None when nothing was taken: no prepared folder yet, generated data, or the same sources).
    """
    folder = Path(data.dir)
    if DATA_KINDS[data.kind].generated or (manifest := read_manifest(folder)) is None:
        return data, None  # generated data; or not prepared: the training's own check says so
    if manifest.get("kind") != data.kind:
        return data, None  # the training's own check refuses it, naming both kinds
    shaping, source = setting_differences(manifest, data, tokenizer)
    recorded: dict[str, Any] = manifest["settings"]["data"]
    sources = {key: _as_config_value(recorded.get(key)) for key in SOURCE_KEYS if key in recorded or key in LOCAL}
    here = _inputs_here(data)
    if shaping:
        prepare = command_line("prepare", recipe, overrides, [] if here else _source_overrides(sources, data))
        as_prepared = command_line("train", recipe, overrides, [f"{d.key}={_yaml_value(d.there)}" for d in shaping])
        raise DataError(
            f"{folder} was prepared with other settings: {'; '.join(map(str, shaping[:3]))}; prepare it again with "
            f"`{prepare}`, or train on it as prepared with `{as_prepared}`"
        )
    if not source:
        return data, None
    if differs := content_difference(manifest, data):
        raise DataError(
            f"{folder}: {differs}; prepare it again from them with `{command_line('prepare', recipe, overrides)}`"
        )
    adopted = dataclasses.replace(data, **sources)
    why = (
        "the recipe's files have the same content"
        if here
        else ("the recipe's input files are not here" if data.train is not None else "the recipe names the hub")
    )
    return adopted, f"data: {folder} was prepared from {_describe(adopted)}; training reads it ({why})"


LOCAL = ("train", "valid", "test")  # absent from a manifest of hub data: None there


def _inputs_here(data: DataConfig) -> bool:
    """Whether the recipe names local input files and they all exist (a hub dataset does not count: data.dir
    prepared from local files is prepared again from those, not from a download of other data)."""
    files = local_files(data)
    return bool(files) and all(path.is_file() for paths in files.values() for path in paths)


def _as_config_value(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _describe(d: DataConfig) -> str:
    if d.train is not None:
        return ", ".join(f"data.{split}={getattr(d, split)}" for split in LOCAL if getattr(d, split) is not None)
    return f"the hub dataset {d.hub} ({d.hub_config or 'default config'})"


def _source_overrides(sources: dict[str, Any], data: DataConfig) -> list[str]:
    """`data.KEY=VALUE` for each source setting of the manifest that is not the recipe's."""
    return [f"data.{key}={_yaml_value(value)}" for key, value in sources.items() if value != getattr(data, key)]


def _yaml_value(value: Any) -> str:
    """A value as an override writes it (the overrides are read as YAML)."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) and any(c in value for c in ":#[]{},'\"") else str(value)
