"""`tformer prepare`: read a corpus, train SentencePiece, encode into memory-mappable arrays.

Output (data.dir):
    spm.model                     the tokenizer (its sha256 is the fingerprint)
    {split}.{side}.bin / .idx     flat token ids (uint16 or int32) and int64 offsets (n + 1)
                                  side is src/tgt for parallel data, text for text
    manifest.json                 who made the folder, the settings and inputs (with hashes) it was made
                                  from, every output file's size, counts, drops, length statistics

Everything is built in a temporary folder beside data.dir (`.NAME.<random>.tmp`) and moved into place
at the end, so a failure leaves the previous output (or nothing), never half of one. Running again with
unchanged inputs and settings, and intact output, does nothing.

Nothing but prepare's own output is ever replaced: an existing file, a non-empty folder without
prepare's manifest, or a data.dir that holds one of the inputs is refused. One prepare at a time
writes a data.dir (a lock file `.NAME.lock` beside it), and not while a training run reads it (training
holds the same lock, shared); under that lock, the leftovers of earlier, killed prepares of the same
data.dir are removed.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tformer_cli.data.manifest import (
    CREATED_BY,
    MANIFEST,
    VERSION,
    data_dir_lock,
    foreign_entries,
    holds_only_outputs,
    made_by_prepare,
    prepared_settings,
    read_manifest,
    settings_key,
    stale_reason,
)
from tformer_cli.data.sources import Example, describe_inputs, local_files, split_sources
from tformer_cli.errors import DataError
from tformer_cli.files import write_json
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.schema import DataConfig, TokenizerConfig
from tformer_cli.tokenizer import EOS_ID, Tokenizer, batched, fingerprint, train_sentencepiece

CHUNK = 4096  # lines per encoding task
Log = Callable[[str], None]


def _names(spec: str | tuple[str, ...] | None) -> str | None:
    return spec if spec is None or isinstance(spec, str) else " + ".join(spec)


def _sides(data: DataConfig) -> list[str]:
    return list(DATA_KINDS[data.kind].sides)


def prepare(data: DataConfig, tokenizer: TokenizerConfig, log: Log = print) -> dict[str, Any]:
    """Prepare the recipe's data into `data.dir` with a tokenizer trained by its `tokenizer` section; return the
    manifest.

    Raises:
        DataError: unreadable or inconsistent input, unreachable hub, or a data.dir that is not
            prepare's to replace (one line each).
        TformerError: another prepare is writing the same data.dir (naming its pid).
    """
    if DATA_KINDS[data.kind].generated:
        raise DataError(f"data.kind={data.kind} is generated at training time; nothing to prepare")
    out = Path(data.dir).resolve()  # a symlinked data.dir: work beside its target
    sources = split_sources(data)
    _refuse_inputs_inside(data, out)
    with _locked(out):
        for leftover in _leftovers(out):
            shutil.rmtree(leftover)
            log(f"removed {leftover}, left by an interrupted prepare")
        previous = _previous_output(out, log)
        inputs = describe_inputs(data, sources)
        key = settings_key(data, tokenizer, inputs)
        if previous is not None:
            reason = stale_reason(out, previous, key)
            if reason is None:
                log(f"{out}: up to date (inputs and settings unchanged, files intact); nothing to do")
                return previous
            log(f"{out}: preparing again: {reason}")
        if "valid" not in sources:
            log("note: no validation split (data.valid is not set): `tformer train` will need one")
        return _build_and_swap(data, tokenizer, sources, out, {"settings_key": key, "inputs": inputs}, log)


def _refuse_inputs_inside(data: DataConfig, out: Path) -> None:
    """Refuse a data.dir that holds an input file: replacing data.dir would delete it."""
    for split, files in local_files(data).items():
        for path in files:
            if path.resolve().is_relative_to(out):
                raise DataError(
                    f"data.dir={out} holds the input {path} (data.{split}): prepare replaces data.dir, "
                    "which would delete it; choose another data.dir"
                )


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold `.NAME.lock` beside data.dir (not inside: data.dir itself is replaced)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = data_dir_lock(out, shared=False).acquire()
    except OSError as exc:
        raise DataError(f"data.dir={out}: cannot create or lock its parent folder ({exc.strerror or exc})") from None
    try:
        yield
    finally:
        lock.release()


def _leftovers(out: Path) -> list[Path]:
    """Folders that killed prepares of `out` left beside it: names prepare makes, holding only its files."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.([a-z0-9_]{{8}}\.(tmp|old)|old)")  # mkdtemp's 8 characters
    return [
        path
        for path in sorted(out.parent.iterdir())
        if pattern.fullmatch(path.name) and path.is_dir() and not path.is_symlink() and holds_only_outputs(path)
    ]


def _previous_output(out: Path, log: Log) -> dict[str, Any] | None:
    """The manifest of prepare's earlier output in `out`; None when there is nothing to keep.

    Nothing to keep: `out` is absent, an empty folder, or prepare's own files with a damaged manifest
    (a one-line warning).

    Raises:
        DataError: `out` is not a folder, or is a non-empty folder that prepare did not make.
    """
    if not out.exists():
        return None
    if not out.is_dir():
        raise DataError(f"data.dir={out} is an existing file, not a folder that prepare made; choose another data.dir")
    if not any(out.iterdir()):
        return None
    try:
        manifest = read_manifest(out)
    except DataError as exc:
        if not holds_only_outputs(out):
            raise DataError(f"{exc}, and data.dir={out} holds other files: prepare will not replace it") from None
        log(f"warning: {exc}; preparing again")
        return None
    if manifest is None or not made_by_prepare(manifest):
        raise DataError(
            f"data.dir={out} is a non-empty folder that tformer prepare did not make (no {MANIFEST} of its own); "
            "prepare only replaces its own output: choose a new or empty data.dir"
        )
    if foreign := foreign_entries(out):
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise DataError(
            f"data.dir={out} holds what tformer prepare did not make ({shown}); prepare replaces the folder whole, "
            "which would delete them: move them out of it, or choose another data.dir"
        )
    return manifest


def _build_and_swap(
    data: DataConfig,
    tokenizer: TokenizerConfig,
    sources: dict[str, Callable[[], Iterator[Example]]],
    out: Path,
    inputs: dict[str, Any],
    log: Log,
) -> dict[str, Any]:
    """Build into a temporary folder beside `out`, record every file's size, then swap it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    tmp.chmod(0o755)
    try:
        settings = prepared_settings(data, tokenizer)
        manifest = {"created_by": CREATED_BY, "version": VERSION, "settings": settings, **inputs}
        manifest.update(_build(data, tokenizer, sources, tmp, log))
        manifest["files"] = {path.name: path.stat().st_size for path in sorted(tmp.iterdir())}
        write_json(tmp / MANIFEST, manifest)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Move `tmp` to `out`; a previous `out` goes aside first (`.NAME.<random>.old`), then is deleted."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.replace(out, old)  # onto the new empty folder: a rename
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build(
    data: DataConfig,
    tokenizer: TokenizerConfig,
    sources: dict[str, Callable[[], Iterator[Example]]],
    tmp: Path,
    log: Log,
) -> dict[str, Any]:
    workers = data.workers or os.cpu_count() or 1
    sample = f"a sample of at most {tokenizer.input_sentence_size:,}" if tokenizer.input_sentence_size else "all the"
    source = _names(data.train) or data.hub
    log(f"training SentencePiece ({tokenizer.kind}, {tokenizer.vocab_size} pieces, on {sample} sentences) on {source}")
    started = time.time()
    train_sentencepiece(_tokenizer_sentences(data, sources["train"]), tokenizer, tmp / "spm.model")
    log(f"tokenizer trained in {time.time() - started:.0f} s")
    manifest: dict[str, Any] = {
        "kind": data.kind,
        "sides": _sides(data),
        "splits": {},
        "tokenizer": {
            "file": "spm.model",
            "fingerprint": fingerprint(tmp / "spm.model"),
            "vocab_size": Tokenizer(tmp / "spm.model").vocab_size,
        },
    }
    manifest["dtype"] = "uint16" if manifest["tokenizer"]["vocab_size"] <= np.iinfo(np.uint16).max else "int32"
    for split, examples in sources.items():  # the counts are said once, by the command, when all is done
        log(f"encoding {split} ({workers} worker{'s' if workers > 1 else ''})")
        manifest["splits"][split] = _encode_split(data, examples, tmp, split, manifest["dtype"], workers)
    return manifest


def _tokenizer_sentences(d: DataConfig, examples: Callable[[], Iterator[Example]]) -> Iterator[str]:
    """The training split's non-empty sides; refuses a split without any (SentencePiece would blame its settings).

    Raises:
        DataError: naming data.train (or the hub split) when it has no non-empty line.
    """
    sentences = (side for example in examples() for side in example if side.strip())
    first = next(sentences, None)
    if first is None:
        where = f"data.train={_names(d.train)}" if d.train is not None else f"data.hub={d.hub} split {d.train_split!r}"
        raise DataError(f"{where} has no non-empty lines: nothing to train the tokenizer on")
    return itertools.chain([first], sentences)


_worker_tokenizer: Tokenizer | None = None


def _pool_context() -> mp.context.BaseContext:
    """Where the encoding workers start: forked from multiprocessing's fork server where the platform has one, else
    the platform's default (spawn). Never forked from this process: a thread of it (PyTorch's, a tokenizer
    library's) may hold a lock at the moment of the fork, and a worker that hangs or dies on it leaves the pool
    waiting forever. The fork server is one clean process, started once, with this module loaded."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _init_worker(model: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer(Path(model))


def _encode_chunk(chunk: list[tuple[int, Example]]) -> list[tuple[int, list[list[int]]]]:
    """(example number, example) -> (example number, ids of each side), in a worker process."""
    assert _worker_tokenizer is not None  # set by _init_worker
    n_sides = len(chunk[0][1])
    per_side = [_worker_tokenizer.encode([example[s] for _, example in chunk]) for s in range(n_sides)]
    return [(number, [per_side[s][i] for s in range(n_sides)]) for i, (number, _) in enumerate(chunk)]


def _encoded(
    examples: Callable[[], Iterator[Example]], counts: dict[str, Any], model: Path, workers: int
) -> Iterator[tuple[int, list[list[int]]]]:
    """Encode a split's non-empty examples in parallel, in order, with their 1-based number in the split.

    Counts every example read, and those dropped for an empty side, into `counts`.
    """

    def nonempty() -> Iterator[tuple[int, Example]]:
        for example in examples():
            counts["read"] += 1
            if any(not side.strip() for side in example):
                counts["dropped_empty"] += 1
                continue
            yield counts["read"], example

    with _pool_context().Pool(workers, initializer=_init_worker, initargs=(str(model),)) as pool:
        for encoded_chunk in pool.imap(_encode_chunk, batched(nonempty(), CHUNK)):
            yield from encoded_chunk


def _drop_reason(d: DataConfig, encoded: list[list[int]]) -> str | None:
    """Why a training pair is left out (too long for data.max_len, or too unequal), or None to keep it."""
    n_src, n_tgt = len(encoded[0]) + 1, len(encoded[1]) + 1  # + eos
    if max(n_src, n_tgt) > d.max_len:
        return "too_long"
    if max(n_src, n_tgt) > d.max_len_ratio * min(n_src, n_tgt):
        return "ratio"
    return None


def _encode_split(
    data: DataConfig, examples: Callable[[], Iterator[Example]], tmp: Path, split: str, dtype: str, workers: int
) -> dict[str, Any]:
    """Encode one split in parallel (order kept), filter, and stream it to .bin/.idx files; return its counts."""
    filtered = DATA_KINDS[data.kind].paired and split == "train"  # valid/test keep every pair: they are scored
    counts: dict[str, Any] = {"read": 0, "kept": 0, "dropped_empty": 0}
    if filtered:
        counts.update(dropped_too_long=0, dropped_ratio=0)
    writer = _SplitWriter(tmp, split, _sides(data), dtype)
    try:
        for number, encoded in _encoded(examples, counts, tmp / "spm.model", workers):
            reason = _drop_reason(data, encoded) if filtered else None
            if reason is not None:
                counts[f"dropped_{reason}"] += 1
                continue
            writer.write(number, encoded)
            counts["kept"] += 1
    finally:
        writer.close()
    counts.update(writer.finish())
    if counts["kept"] == 0:
        raise DataError(f"data.{split}: no examples left after filtering ({counts['read']} read)")
    return counts


class _SplitWriter:
    """Streams one split's examples to `{split}.{side}.bin` and, at the end, the offsets to `.idx`."""

    def __init__(self, folder: Path, split: str, sides: list[str], dtype: str) -> None:
        self.paths = [folder / f"{split}.{side}" for side in sides]
        self.sides, self.dtype = sides, dtype
        self.bins = [path.with_name(path.name + ".bin").open("wb") for path in self.paths]
        self.offsets: list[list[int]] = [[0] for _ in sides]
        self.longest = [{"tokens": 0, "example": 0} for _ in sides]

    def write(self, number: int, encoded: list[list[int]]) -> None:
        """Append example `number` (1-based in the split, as read): each side's ids and EOS."""
        for s, ids in enumerate(encoded):
            row = np.asarray(ids + [EOS_ID], dtype=self.dtype)
            self.bins[s].write(row.tobytes())
            self.offsets[s].append(self.offsets[s][-1] + len(row))
            if len(row) > self.longest[s]["tokens"]:
                self.longest[s] = {"tokens": len(row), "example": number}

    def close(self) -> None:
        for handle in self.bins:
            handle.close()

    def finish(self) -> dict[str, Any]:
        """Write the .idx files; return length statistics, token counts and each side's longest example."""
        stats: dict[str, Any] = {"lengths": {}, "tokens": {}, "longest": {}}
        for s, side in enumerate(self.sides):
            offsets = np.asarray(self.offsets[s], dtype=np.int64)
            offsets.tofile(self.paths[s].with_name(self.paths[s].name + ".idx"))
            stats["lengths"][side] = _length_stats(np.diff(offsets))
            stats["tokens"][side] = int(offsets[-1])
            stats["longest"][side] = self.longest[s]
        return stats


def _length_stats(lengths: np.ndarray) -> dict[str, float]:
    if not lengths.size:
        return {}
    return {
        "mean": round(float(lengths.mean()), 2),
        "p50": int(np.percentile(lengths, 50)),
        "p95": int(np.percentile(lengths, 95)),
        "max": int(lengths.max()),
    }
