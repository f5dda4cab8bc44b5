"""manifest.json: what `prepare` wrote into data.dir, and the checks made against it.

A folder is `prepare`'s own (the only kind it replaces) when its manifest says so (`created_by`), or
is of the first format (version 1, written before the marker existed). The manifest lists every
output file with its size, the tokenizer's sha256, and the `data` and `tokenizer` settings that made
the output, so that `prepare` can tell whether the folder is really up to date and `train` can refuse
data prepared with another recipe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer_cli.data.sources import describe_inputs, input_sha256, local_files
from tformer_cli.errors import DataError
from tformer_cli.files import LOCK, FolderLock
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.schema import DataConfig, TokenizerConfig
from tformer_cli.tokenizer import fingerprint

MANIFEST = "manifest.json"
CREATED_BY = "tformer prepare"
VERSION = 2
# Every name prepare writes into data.dir (and atomic writes' temporaries, `.NAME.<random>.tmp`).
OUTPUT_NAME = re.compile(r"manifest\.json|spm\.model|(train|valid|test)\.(src|tgt|text)\.(bin|idx)|\..+\.tmp")

# data keys that never change prepare's output: where it goes, how fast, what training cuts from it.
_IGNORED = ("dir", "workers", "block_size", "pattern", "sessions")
_SOURCE_ONLY = {
    "local": ("hub", "hub_config", "hub_revision", "train_split", "valid_split", "test_split"),
    "hub": ("train", "valid", "test"),
}


def data_dir_lock(data_dir: Path, shared: bool) -> FolderLock:
    """The lock of a prepared data folder: `.NAME.lock` beside it (not inside: `prepare` replaces the folder).

    `prepare` takes it exclusively while it writes; training takes it shared while it reads, so that no
    `prepare` replaces the data under a run. Neither waits: a conflict is a one-line error naming the holders.
    """
    out = data_dir.resolve()  # a symlinked data.dir: its target's lock, as prepare works beside the target
    return FolderLock(out.parent, "tformer prepare", f".{out.name}{LOCK}", shared, readers="a training run reads it")


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The parsed `folder/manifest.json`, or None when there is none.

    Raises:
        DataError: the file cannot be read or is not a JSON object (one line naming it).
    """
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: damaged (invalid JSON: {exc.msg} at line {exc.lineno})") from None
    except UnicodeError:
        raise DataError(f"{path}: damaged (not UTF-8 text)") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: damaged (not a JSON object)")
    return manifest


def made_by_prepare(manifest: dict[str, Any]) -> bool:
    """Whether a manifest marks its folder as `prepare`'s output (the current marker or the first format)."""
    return manifest.get("created_by") == CREATED_BY or (manifest.get("version") == 1 and "settings_key" in manifest)


def holds_only_outputs(folder: Path) -> bool:
    """Whether every entry of `folder` is a file with a name that `prepare` writes (an empty folder too)."""
    return not foreign_entries(folder)


def foreign_entries(folder: Path) -> list[str]:
    """The names in `folder` that are not files `prepare` writes (a folder, a link, another name), sorted."""
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.is_symlink() or not entry.is_file() or not OUTPUT_NAME.fullmatch(entry.name)
    )


def prepared_settings(data: DataConfig, tokenizer: TokenizerConfig) -> dict[str, dict[str, Any]]:
    """The `data` and `tokenizer` settings that determine prepare's output, as plain JSON values."""
    shaping = dataclasses.asdict(data)
    ignored = {*_IGNORED, *_SOURCE_ONLY["local" if data.train is not None else "hub"]}
    kind = DATA_KINDS[data.kind]
    if not kind.generated:  # the keys only the other prepared kinds read
        ignored |= {key for other in DATA_KINDS.values() if not other.generated for key in other.keys} - {*kind.keys}
    for key in ignored:
        shaping.pop(key)
    settings = {"data": shaping, "tokenizer": dataclasses.asdict(tokenizer)}
    return json.loads(json.dumps(settings))  # tuples as lists, as they come back from the manifest


def settings_key(data: DataConfig, tokenizer: TokenizerConfig, inputs: dict[str, Any]) -> str:
    """The sha256 of what determines prepare's output: the settings and the inputs (`sources.describe_inputs`)."""
    settings = {**prepared_settings(data, tokenizer), "inputs": inputs}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def stale_reason(folder: Path, manifest: dict[str, Any], key: str) -> str | None:
    """Why `folder` (prepare's own) does not hold what this recipe would prepare; None when it does.

    `key`: this recipe's `settings_key`. Up to date means: the current format, the same inputs and settings
    (the manifest's `settings_key` is `key`), every listed file present with its recorded size, and spm.model
    the tokenizer the data was encoded with.
    """
    if manifest.get("version") != VERSION:
        return f"{MANIFEST} is of an older format (version {manifest.get('version')})"
    if manifest.get("settings_key") != key:
        return "inputs or settings changed"
    files = manifest.get("files")
    if not isinstance(files, dict) or "spm.model" not in files:
        return f"{MANIFEST} lists no output files"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size:,} bytes, {MANIFEST} says {size:,}"
    return foreign_tokenizer(folder, manifest)


def foreign_tokenizer(folder: Path, manifest: dict[str, Any]) -> str | None:
    """Why `folder`/spm.model is not the tokenizer the manifest says the data was encoded with; None when it is."""
    recorded = manifest.get("tokenizer", {}).get("fingerprint") if isinstance(manifest.get("tokenizer"), dict) else None
    if not (folder / "spm.model").is_file():
        return "spm.model is missing"
    found = fingerprint(folder / "spm.model")
    if found != recorded:
        return (
            f"spm.model is not the tokenizer the data was encoded with "
            f"(fingerprint {found[:12]}, {MANIFEST} says {str(recorded)[:12]})"
        )
    return None


# data keys that say where the data comes from, not what prepare makes of it: training takes them from the
# manifest (the prepared folder is the truth) unless the recipe's own input files are here with other content
SOURCE_KEYS = (
    "train", "valid", "test", "hub", "hub_config", "hub_revision",
    "train_split", "valid_split", "test_split", "src_field", "tgt_field", "text_field",
)  # fmt: skip


@dataclass(frozen=True)
class Difference:
    """A setting whose value in the manifest (`there`, JSON values: lists for tuples) is not the recipe's."""

    key: str  # section.key
    there: Any
    here: Any

    def __str__(self) -> str:
        return f"{self.key}={self.there!r} there, {self.here!r} in the recipe"


def setting_differences(
    manifest: dict[str, Any], data: DataConfig, tokenizer: TokenizerConfig
) -> tuple[list[Difference], list[Difference]]:
    """The settings in which the recipe and the prepared data differ: (those that shape the arrays, sources).

    Raises:
        DataError: a manifest of another format (an older one records no settings).
    """
    recorded = manifest.get("settings")
    if manifest.get("version") != VERSION or not isinstance(recorded, dict):
        raise DataError(
            f"{Path(data.dir) / MANIFEST} is of manifest format {manifest.get('version')}, this tformer reads "
            f"format {VERSION} (which records the settings used): run `tformer prepare` with this recipe again"
        )
    shaping: list[Difference] = []
    source: list[Difference] = []
    for section, current in prepared_settings(data, tokenizer).items():
        before = recorded.get(section, {})
        for key in sorted(set(before) | set(current)):
            if before.get(key) != current.get(key):
                differs = Difference(f"{section}.{key}", before.get(key), current.get(key))
                (source if section == "data" and key in SOURCE_KEYS else shaping).append(differs)
    return shaping, source


def content_difference(manifest: dict[str, Any], data: DataConfig) -> str | None:
    """Why the recipe's local input files are not the data the folder was prepared from; None when they are
    (the same sha256, split by split, in order), or when the recipe's inputs are not here to compare (a hub
    dataset, which is not contacted, or local files that are missing: the prepared folder is the truth)."""
    files = local_files(data)
    if not files or not all(path.is_file() for paths in files.values() for path in paths):
        return None
    recorded_inputs = manifest.get("inputs")
    inputs = recorded_inputs if isinstance(recorded_inputs, dict) else {}
    for split, paths in files.items():
        recorded = inputs.get(split) if isinstance(inputs.get(split), dict) else None
        names = ", ".join(str(p) for p in paths)
        if recorded is None:
            where = f"a hub dataset ({inputs['hub']})" if "hub" in inputs else f"no data.{split}"
            return f"data.{split}: the recipe's {names} are here and data.dir was prepared from {where}"
        if [input_sha256(p) for p in paths] != list(recorded.values()):
            return (
                f"data.{split}: the recipe's {names} differ in content from the files data.dir was prepared from "
                f"({', '.join(recorded)})"
            )
    return None


def check_made_for(manifest: dict[str, Any], data: DataConfig, tokenizer: TokenizerConfig, path: Path) -> None:
    """Refuse prepared data that is not what this recipe trains on.

    Settings that shape the arrays (tokenizer, lengths, languages) must be the recipe's. Where the data
    came from may differ (another data root, the hub instead of files): the recipe's local input files,
    when they are here, must have the content the folder was prepared from.

    Raises:
        DataError: a manifest of another format, the first (up to 3) differing shaping keys with both
            values, or the first split whose files differ in content.
    """
    shaping, source = setting_differences(manifest, data, tokenizer)
    if shaping:
        raise DataError(
            f"{path.parent} was prepared with other settings: {'; '.join(map(str, shaping[:3]))}; "
            "run `tformer prepare` with this recipe"
        )
    if source and (differs := content_difference(manifest, data)):
        raise DataError(f"{path.parent}: {differs}; run `tformer prepare` with this recipe")


def prepared_state(data: DataConfig, tokenizer: TokenizerConfig, hash_inputs: bool) -> str | None:
    """Why data.dir does not hold what `tformer prepare` would write for this recipe; None when it does.

    `tformer check`'s line on the prepared folder. `hash_inputs`: compare the local input files' sha256 with the
    manifest's (else the settings and the prepared files only: a hub dataset is not contacted, missing files cannot
    be read).
    """
    folder = Path(data.dir)
    try:
        manifest = read_manifest(folder)
        if manifest is None:
            return "not prepared"
        if manifest.get("kind") != data.kind:
            return f"holds {manifest.get('kind')} data, not {data.kind}"
        check_made_for(manifest, data, tokenizer, folder / MANIFEST)
        key = settings_key(data, tokenizer, describe_inputs(data, {})) if hash_inputs else manifest.get("settings_key")
        reason = stale_reason(folder, manifest, str(key))
    except DataError as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines())
        return message.split("; run `tformer prepare`")[0].removeprefix(f"{folder} was ")
    if reason is None and "valid" not in manifest.get("splits", {}):
        reason = "it holds no validation split"
    return None if reason is None else f"prepared, but {reason}"
