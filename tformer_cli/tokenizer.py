"""SentencePiece: training (bpe or unigram) with fixed special ids, loading, and a fingerprint.

The ids are fixed for every model tformer trains: pad 0, unk 1, bos 2, eos 3. The fingerprint is the
sha256 of the model file; it is stored in the data manifest and in every checkpoint, so a model is
never paired with a different tokenizer that merely has the same vocabulary size.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import sentencepiece as spm

from tformer_cli.errors import DataError
from tformer_cli.files import sha256_file
from tformer_cli.schema import TokenizerConfig

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def train_sentencepiece(sentences: Iterable[str], cfg: TokenizerConfig, out: Path) -> None:
    """Train a model on `sentences` (sampled down to cfg.input_sentence_size) and write it to `out`.

    Raises:
        DataError: SentencePiece refused the settings or the sentences (one line naming the settings), or
            reading `sentences` failed (that error, as raised).
    """
    model = io.BytesIO()
    failure: list[BaseException] = []

    def guarded() -> Iterator[str]:  # SentencePiece hides an iterator's exception; keep ours
        try:
            yield from sentences
        except BaseException as exc:
            failure.append(exc)
            raise

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=guarded(),
            model_writer=model,
            vocab_size=cfg.vocab_size,
            model_type=cfg.kind,
            character_coverage=cfg.character_coverage,
            input_sentence_size=cfg.input_sentence_size,
            shuffle_input_sentence=True,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            num_threads=cfg.threads,
            minloglevel=2,
        )
    except (RuntimeError, ValueError, OSError) as exc:
        if failure:
            raise failure[0] from None
        raise _training_error(exc, cfg) from None
    out.write_bytes(model.getvalue())


# SentencePiece's names for the settings tformer passes, and the recipe keys they come from.
_SPM_SETTINGS = {
    "vocab_size": "vocab_size",
    "model_type": "kind",
    "character_coverage": "character_coverage",
    "input_sentence_size": "input_sentence_size",
    "num_threads": "threads",
}


def _training_error(exc: Exception, cfg: TokenizerConfig) -> DataError:
    """SentencePiece's error as one line naming the recipe's tokenizer settings it mentions (else all of them).

    Its messages look like `INTERNAL: src/trainer_interface.cc(744) [check] Explanation.`: the source
    location goes, the check stays only when no explanation follows it.
    """
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
    named = [ours for theirs, ours in _SPM_SETTINGS.items() if theirs in text] or list(_SPM_SETTINGS.values())
    reason = re.sub(r"^[A-Z_]+: \S+\(\d+\) ", "", text)
    if reason.startswith("[") and "] " in reason:
        reason = reason.split("] ", 1)[1]
    settings = ", ".join(f"tokenizer.{key}={getattr(cfg, key)}" for key in named)
    return DataError(f"SentencePiece training failed ({settings}): {reason}")


def fingerprint(path: Path) -> str:
    return sha256_file(path)


class Tokenizer:
    """A loaded SentencePiece model."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise DataError(f"tokenizer model not found: {path} (run `tformer prepare` first)")
        self.path = path
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"{path}: not a readable SentencePiece model ({reason})") from None
        self.fingerprint = fingerprint(path)
        self.vocab_size = self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]


T = TypeVar("T")


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of `size` items (the last may be shorter)."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
