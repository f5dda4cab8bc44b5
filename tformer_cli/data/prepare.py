"""`tformer prepare`: read a corpus, train SentencePiece, encode into memory-mappable arrays.

Output (data.dir):
    spm.model                     the tokenizer (its sha256 is the fingerprint)
    {split}.{side}.bin / .idx     flat token ids (uint16 or int32) and int64 offsets (n + 1)
                                  side is src/tgt for parallel data, text for text
    manifest.json                 inputs and their hashes, counts, drops, length statistics, fingerprint

Everything is built in a temporary folder beside data.dir and moved into place at the end, so a
failure leaves the previous output (or nothing), never half of one. Running again with unchanged
inputs and settings does nothing.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tformer_cli.config import config_to_dict
from tformer_cli.data.sources import Example, describe_inputs, split_sources
from tformer_cli.errors import DataError
from tformer_cli.schema import Config
from tformer_cli.tokenizer import EOS_ID, Tokenizer, batched, fingerprint, train_sentencepiece

MANIFEST_VERSION = 1
CHUNK = 4096  # lines per encoding task


def _names(spec: str | tuple[str, ...] | None) -> str | None:
    return spec if spec is None or isinstance(spec, str) else " + ".join(spec)


def _sides(config: Config) -> list[str]:
    return ["src", "tgt"] if config.data.kind == "parallel" else ["text"]


def _settings_key(config: Config, inputs: dict[str, Any]) -> str:
    settings = {
        "data": config_to_dict(config)["data"],
        "tokenizer": config_to_dict(config)["tokenizer"],
        "inputs": inputs,
    }
    settings["data"].pop("workers")
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def prepare(config: Config, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Prepare `config.data` into `config.data.dir`; return the manifest.

    Raises:
        DataError: unreadable or inconsistent input, unreachable hub (one line each).
    """
    if config.data.kind == "pattern":
        raise DataError("data.kind=pattern is generated at training time; nothing to prepare")
    out = Path(config.data.dir)
    sources = split_sources(config)
    inputs = describe_inputs(config, sources)
    key = _settings_key(config, inputs)
    manifest_path = out / "manifest.json"
    if manifest_path.is_file():
        old = json.loads(manifest_path.read_text())
        if old.get("settings_key") == key:
            log(f"{out}: up to date (inputs and settings unchanged); nothing to do")
            return old
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
    try:
        manifest = _build(config, sources, tmp, log)
        manifest.update(version=MANIFEST_VERSION, settings_key=key, inputs=inputs)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _swap_into_place(tmp: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _build(
    config: Config, sources: dict[str, Callable[[], Iterator[Example]]], tmp: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    workers = config.data.workers or os.cpu_count() or 1
    tc = config.tokenizer
    log(f"training SentencePiece ({tc.kind}, {tc.vocab_size} pieces) on {_names(config.data.train) or config.data.hub}")
    train_sentencepiece(_training_sentences(sources["train"]), config.tokenizer, tmp / "spm.model")
    manifest: dict[str, Any] = {
        "kind": config.data.kind,
        "sides": _sides(config),
        "splits": {},
        "tokenizer": {
            "file": "spm.model",
            "fingerprint": fingerprint(tmp / "spm.model"),
            "vocab_size": Tokenizer(tmp / "spm.model").vocab_size,
        },
    }
    manifest["dtype"] = "uint16" if manifest["tokenizer"]["vocab_size"] <= np.iinfo(np.uint16).max else "int32"
    for split, examples in sources.items():
        counts = _encode_split(config, examples, tmp, split, manifest["dtype"], workers)
        manifest["splits"][split] = counts
        drops = ", ".join(f"{k.removeprefix('dropped_')} {v:,}" for k, v in counts.items() if k.startswith("dropped_"))
        log(f"{split}: read {counts['read']:,}, kept {counts['kept']:,}" + (f"; dropped: {drops}" if drops else ""))
    return manifest


def _training_sentences(examples: Callable[[], Iterator[Example]]) -> Iterator[str]:
    for example in examples():
        for side in example:
            if side.strip():
                yield side


_worker_tokenizer: Tokenizer | None = None


def _init_worker(model: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer(Path(model))


def _encode_chunk(chunk: list[Example]) -> list[list[list[int]]]:
    assert _worker_tokenizer is not None
    n_sides = len(chunk[0])
    per_side = [_worker_tokenizer.encode([example[s] for example in chunk]) for s in range(n_sides)]
    return [[per_side[s][i] for s in range(n_sides)] for i in range(len(chunk))]


def _encode_split(
    config: Config, examples: Callable[[], Iterator[Example]], tmp: Path, split: str, dtype: str, workers: int
) -> dict[str, Any]:
    """Encode one split in parallel (order kept), filter, and stream it to .bin/.idx files."""
    d = config.data
    parallel = d.kind == "parallel"
    counts = {"read": 0, "kept": 0, "dropped_empty": 0}
    if parallel and split == "train":
        counts.update(dropped_too_long=0, dropped_ratio=0)
    sides = _sides(config)
    lengths: list[list[int]] = [[] for _ in sides]
    bins = [open(tmp / f"{split}.{side}.bin", "wb") for side in sides]
    offsets = [[0] for _ in sides]

    def nonempty() -> Iterator[Example]:
        for example in examples():
            counts["read"] += 1
            if any(not side.strip() for side in example):
                counts["dropped_empty"] += 1
                continue
            yield example

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    try:
        with ctx.Pool(workers, initializer=_init_worker, initargs=(str(tmp / "spm.model"),)) as pool:
            for encoded_chunk in pool.imap(_encode_chunk, batched(nonempty(), CHUNK)):
                for encoded in encoded_chunk:
                    if parallel and split == "train":  # valid/test keep every pair: they are scored
                        n_src, n_tgt = len(encoded[0]) + 1, len(encoded[1]) + 1  # + eos
                        if max(n_src, n_tgt) > d.max_len:
                            counts["dropped_too_long"] += 1
                            continue
                        if max(n_src, n_tgt) > d.max_len_ratio * min(n_src, n_tgt):
                            counts["dropped_ratio"] += 1
                            continue
                    for s, ids in enumerate(encoded):
                        row = np.asarray(ids + [EOS_ID], dtype=dtype)
                        bins[s].write(row.tobytes())
                        offsets[s].append(offsets[s][-1] + len(row))
                        lengths[s].append(len(row))
                    counts["kept"] += 1
    finally:
        for handle in bins:
            handle.close()
    for s, side in enumerate(sides):
        np.asarray(offsets[s], dtype=np.int64).tofile(tmp / f"{split}.{side}.idx")
    counts["lengths"] = {side: _length_stats(lengths[s]) for s, side in enumerate(sides)}
    counts["tokens"] = {side: int(sum(lengths[s])) for s, side in enumerate(sides)}
    if counts["kept"] == 0:
        raise DataError(f"{split}: no examples left after filtering ({counts['read']} read)")
    return counts


def _length_stats(lengths: list[int]) -> dict[str, float]:
    if not lengths:
        return {}
    array = np.asarray(lengths)
    return {
        "mean": round(float(array.mean()), 2),
        "p50": int(np.percentile(array, 50)),
        "p95": int(np.percentile(array, 95)),
        "max": int(array.max()),
    }
