"""`tformer check`'s data lines: what a recipe reads and what data.dir holds, read from the disk only (the hub is
not contacted). The state comes as values (`FolderState`), the lines are made from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tformer_cli.data.manifest import (
    SOURCE_KEYS,
    content_difference,
    prepared_state,
    read_manifest,
    setting_differences,
)
from tformer_cli.data.prepared import (
    LOCAL,
    _as_config_value,
    _inputs_here,
    _source_overrides,
    _yaml_value,
    with_prepared_sources,
)
from tformer_cli.data.sources import local_files
from tformer_cli.errors import DataError, command_line
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.schema import DataConfig, TokenizerConfig

NO_DATA = "set data.train (local files) or data.hub (a Hugging Face dataset)"


@dataclass(frozen=True)
class FolderState:
    """What data.dir holds for a recipe, as training would take it (`prepared.with_prepared_sources`'s rules).

    Attributes:
        data: the recipe's data section with where its data comes from taken from the folder's manifest (the
            folder is the truth), or the section as it is.
        taken: a line saying where the data came from when that is not the recipe's; None when nothing was taken.
        refused: why training would refuse the folder (None: it would not), and `advice`, the commands that work.
    """

    data: DataConfig
    taken: str | None = None
    refused: str | None = None
    advice: str = ""


def folder_state(
    data: DataConfig, tokenizer: TokenizerConfig, recipe: str | Path | None, overrides: list[str] | None
) -> FolderState:
    """data.dir against the recipe: adopted as prepared, refused with the commands that work, or not yet prepared.

    Args:
        recipe, overrides: as the user gave them (the advice is the user's command with overrides changed).
    """
    folder = Path(data.dir)
    if DATA_KINDS[data.kind].generated or (manifest := read_manifest(folder)) is None:
        return FolderState(data)
    if manifest.get("kind") != data.kind:
        return FolderState(data)  # `prepared_state` names both kinds
    try:
        shaping, source = setting_differences(manifest, data, tokenizer)
    except DataError:  # a manifest of another format: `prepared_state` says so
        return FolderState(data)
    recorded = manifest["settings"]["data"]
    sources = {key: _as_config_value(recorded.get(key)) for key in SOURCE_KEYS if key in recorded or key in LOCAL}
    if shaping:
        here = _inputs_here(data)
        prepare = command_line("prepare", recipe, overrides, [] if here else _source_overrides(sources, data))
        as_prepared = command_line("train", recipe, overrides, [f"{d.key}={_yaml_value(d.there)}" for d in shaping])
        return FolderState(
            data,
            refused=f"prepared with other settings: {'; '.join(map(str, shaping[:3]))}",
            advice=f"prepare it again with `{prepare}`, or train on it as prepared with `{as_prepared}`",
        )
    if not source:
        return FolderState(data)
    if differs := content_difference(manifest, data):
        advice = f"prepare it again from them with `{command_line('prepare', recipe, overrides)}`"
        return FolderState(data, refused=differs, advice=advice)
    adopted, taken = with_prepared_sources(
        data, tokenizer, recipe, overrides
    )  # refuses nothing now: adopted as training would
    return FolderState(adopted, taken)


@dataclass(frozen=True)
class DataReport:
    """`tformer check`'s data lines, and `missing`: the error of a missing local input (None when none is
    missing, or when data.dir already holds what the files would give: training reads data.dir only)."""

    lines: list[str] = field(default_factory=list)
    missing: str | None = None


def data_report(
    d: DataConfig, tokenizer: TokenizerConfig, recipe: str | Path | None, overrides: list[str] | None
) -> DataReport:
    """What the recipe reads and whether data.dir holds it (`DataReport`)."""
    if DATA_KINDS[d.kind].generated:
        seed = getattr(d, d.kind).seed
        return DataReport(
            [f"data: {d.kind}, generated from data.{d.kind}.seed={seed} when training starts (no prepare)"]
        )
    files = local_files(d)
    lines = _input_lines(d, files)
    state = folder_state(d, tokenizer, recipe, overrides)
    if state.refused is not None:  # not what this recipe trains on: the reason comes with the commands that work
        return DataReport([*lines, f"  data.dir {d.dir}: {state.refused}: {state.advice}"])
    missing = [(split, path) for split, paths in files.items() for path in paths if not path.is_file()]
    if state.taken is not None:
        lines.append(f"  {state.taken}")
        files, missing = local_files(state.data), []  # training reads data.dir, prepared from these
    hashable = bool(files) and all(p.is_file() for paths in files.values() for p in paths)
    stale = prepared_state(state.data, tokenizer, hash_inputs=hashable)
    if stale is None:
        return DataReport([*lines, f"  data.dir {d.dir}: prepared and matches the recipe"])
    lines.append(f"  data.dir {d.dir}: {stale}: run `{command_line('prepare', recipe, overrides)}`")
    if not files and d.hub is None:
        return DataReport(lines, f"no data: {NO_DATA}")
    if missing:
        split, path = missing[0]
        more = f" (and {len(missing) - 1} more missing, listed above)" if len(missing) > 1 else ""
        return DataReport(lines, f"data.{split}: file not found: {path}{more}; `tformer prepare` reads it")
    return DataReport(lines)


def _input_lines(d: DataConfig, files: dict[str, list[Path]]) -> list[str]:
    """The recipe's inputs: each local file found or missing, or the hub dataset (not contacted), or none."""
    if files:
        found = {split: ", ".join(f"{p} ({'found' if p.is_file() else 'MISSING'})" for p in paths)
                 for split, paths in files.items()}  # fmt: skip
        return [f"data: {d.kind}, local files", *(f"  data.{split}: {names}" for split, names in found.items())]
    if d.hub is not None:
        splits = ", ".join(s for s in (d.train_split, d.valid_split, d.test_split) if s)
        revision = f", revision {d.hub_revision}" if d.hub_revision else ""
        return [
            f"data: {d.kind}, hub dataset {d.hub} ({d.hub_config or 'default config'}{revision}), splits {splits} "
            "(not contacted here: `tformer prepare` downloads it)"
        ]
    return [f"data: {d.kind}, none: {NO_DATA}"]


def prepared_lines(data_dir: str, manifest: dict[str, Any]) -> list[str]:
    """`tformer prepare`'s lines of the manifest it wrote: the folder and tokenizer, then each split's counts."""
    tokenizer = manifest["tokenizer"]
    lines = [f"prepared: {data_dir}  (tokenizer {tokenizer['fingerprint'][:12]}, {tokenizer['vocab_size']} pieces)"]
    for split, counts in manifest["splits"].items():
        drops = {k.removeprefix("dropped_"): v for k, v in counts.items() if k.startswith("dropped_")}
        lines.append(
            f"  {split}: read {counts['read']:,}  kept {counts['kept']:,}  dropped {drops}  tokens {counts['tokens']}"
        )
    return lines
