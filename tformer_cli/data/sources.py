"""Where examples come from: local files (strict readers) or a Hugging Face dataset.

An example is a tuple of strings: (text,) for language modelling, (source, target) for translation.
Each split is a function returning a fresh iterator, because `prepare` reads the training split twice
(once to train SentencePiece, once to encode it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from tformer_cli.data.text import count_lines, read_error, read_lines, read_parallel, read_records
from tformer_cli.errors import DataError, first_line
from tformer_cli.files import sha256_file
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.schema import DataConfig

Example = tuple[str, ...]
SPLITS = ("train", "valid", "test")


def local_files(d: DataConfig) -> dict[str, list[Path]]:
    """The input files of each configured local split (none when the data comes from the hub)."""
    if d.train is None:
        return {}
    local = {"train": d.train, "valid": d.valid, "test": d.test}
    return {
        split: [path for paths in _local_paths(d, spec) for path in paths]
        for split, spec in local.items()
        if spec is not None
    }


def input_sha256(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        raise read_error(path, exc) from None


def _local_paths(d: DataConfig, spec: str | tuple[str, ...]) -> list[list[Path]]:
    """The files of a local split: one group per corpus ([src, tgt] for a parallel prefix, else [file])."""
    return [_corpus_paths(d, prefix) for prefix in ((spec,) if isinstance(spec, str) else spec)]


def _corpus_paths(d: DataConfig, prefix: str) -> list[Path]:
    path = Path(prefix)
    if DATA_KINDS[d.kind].paired and not path.name.removesuffix(".gz").endswith((".tsv", ".jsonl")):
        return [_with_lang(path, d.src_lang), _with_lang(path, d.tgt_lang)]
    return [path]


def _with_lang(prefix: Path, lang: str) -> Path:
    plain = prefix.with_name(f"{prefix.name}.{lang}")
    gz = prefix.with_name(f"{prefix.name}.{lang}.gz")
    return gz if not plain.exists() and gz.exists() else plain


def _local_examples(d: DataConfig, corpora: list[list[Path]]) -> Iterator[Example]:
    paired = DATA_KINDS[d.kind].paired
    for paths in corpora:
        if len(paths) == 2:
            yield from read_parallel(paths[0], paths[1])
        elif paths[0].name.removesuffix(".gz").endswith((".tsv", ".jsonl")):
            fields = [d.src_field or d.src_lang, d.tgt_field or d.tgt_lang] if paired else [d.text_field]
            for record in read_records(paths[0], fields):
                yield tuple(record)
        else:
            for line in read_lines(paths[0]):
                yield (line,)


def _hub_split(d: DataConfig, split: str) -> Any:
    import datasets  # imported here: slow to import, and only the hub path needs it
    from huggingface_hub.utils import logging as hub_logging

    datasets.logging.set_verbosity_error()  # our one-line error says what failed, not a page of retries
    hub_logging.set_verbosity_error()
    try:
        return datasets.load_dataset(d.hub, d.hub_config, split=split, revision=d.hub_revision)
    except (ConnectionError, OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as exc:
        reason = first_line(exc)
        hint = (
            f"data.train=PATH/train data.valid=PATH/valid (files PATH/train.{d.src_lang} and PATH/train.{d.tgt_lang})"
            if DATA_KINDS[d.kind].paired
            else "data.train=PATH/train.txt data.valid=PATH/valid.txt"
        )
        raise DataError(
            f"cannot load Hugging Face dataset {d.hub!r} ({d.hub_config}, split {split}): {reason}; "
            f"to use local files instead add: {hint}"
        ) from None


def _hub_examples(d: DataConfig, split: str) -> Iterator[Example]:
    dataset = _hub_split(d, split)
    fields = (
        [d.src_field or f"translation.{d.src_lang}", d.tgt_field or f"translation.{d.tgt_lang}"]
        if DATA_KINDS[d.kind].paired
        else [d.text_field]
    )
    for number, row in enumerate(dataset, start=1):
        values = []
        for dotted in fields:
            value: Any = row
            for part in dotted.split("."):
                if not isinstance(value, dict) or part not in value:
                    raise DataError(
                        f"{d.hub} {split} row {number}: no field {dotted!r} (set data.src_field/tgt_field/text_field)"
                    )
                value = value[part]
            values.append(value)
        yield tuple(values)


def split_sources(d: DataConfig) -> dict[str, Callable[[], Iterator[Example]]]:
    """The configured splits (train required), each as a function giving a fresh iterator."""
    local = {"train": d.train, "valid": d.valid, "test": d.test}
    hub_names = {"train": d.train_split, "valid": d.valid_split, "test": d.test_split}
    sources: dict[str, Callable[[], Iterator[Example]]] = {}
    if d.train is not None:
        for split, files in local_files(d).items():
            for path in files:
                if path.is_dir():
                    raise DataError(f"data.{split}: {path} is a directory, not a file")
                if not path.is_file():
                    raise DataError(f"data.{split}: file not found: {path}")
            spec = local[split]
            assert spec is not None  # local_files lists the splits given
            sources[split] = partial(_local_examples, d, _local_paths(d, spec))
        return sources
    if d.hub is None:
        raise DataError("no data: set data.train (local files) or data.hub (a Hugging Face dataset)")
    for split in SPLITS:
        if hub_names[split]:
            sources[split] = partial(_hub_examples, d, hub_names[split])
    return sources


def describe_inputs(d: DataConfig, sources: dict[str, Callable[[], Iterator[Example]]]) -> dict[str, Any]:
    """What the prepared data depends on: every local file's sha256, or the hub dataset's identity."""
    if d.train is not None:
        return {split: {str(p): input_sha256(p) for p in files} for split, files in local_files(d).items()}
    return {
        "hub": d.hub,
        "config": d.hub_config,
        "revision": d.hub_revision,
        "fingerprints": {
            split: getattr(_hub_split(d, name), "_fingerprint", None)
            for split, name in (("train", d.train_split), ("valid", d.valid_split), ("test", d.test_split))
            if split in sources
        },
    }


def locate(d: DataConfig, split: str, number: int, side: int) -> str:
    """Where example `number` (1-based, in reading order, empty ones included) of a split was read.

    Reads the split's files again (only on an error path): "line L of FILE" for local files, else the
    hub row. `side` picks the file of a parallel pair (0 source, 1 target). Falls back to "example N of
    data.SPLIT" when the files are gone or have fewer lines now.
    """
    if d.train is None:
        split_name = {"train": d.train_split, "valid": d.valid_split, "test": d.test_split}[split]
        return f"row {number} of {d.hub} split {split_name!r}"
    spec = {"train": d.train, "valid": d.valid, "test": d.test}[split]
    remaining = number
    try:
        for paths in _local_paths(d, spec) if spec is not None else []:
            header = int(paths[0].name.removesuffix(".gz").endswith(".tsv"))
            count = count_lines(paths[0]) - header
            if remaining <= count:
                return f"line {remaining + header} of {paths[min(side, len(paths) - 1)]}"
            remaining -= count
    except DataError:
        pass
    return f"example {number} of data.{split}"
