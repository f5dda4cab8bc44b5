"""SentencePiece: training (bpe or unigram) with fixed special ids, loading, and a fingerprint.

The ids are fixed for every model tformer trains: pad 0, unk 1, bos 2, eos 3. The fingerprint is the
sha256 of the model file; it is stored in the data manifest and in every checkpoint, so a model is
never paired with a different tokenizer that merely has the same vocabulary size.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from tformer_cli.data.text import sha256_file
from tformer_cli.errors import DataError
from tformer_cli.schema import TokenizerConfig

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def train_sentencepiece(sentences: Iterable[str], cfg: TokenizerConfig, out: Path) -> None:
    """Train a model on `sentences` (sampled down to cfg.input_sentence_size) and write it to `out`."""
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
    except RuntimeError as exc:
        if failure:
            raise failure[0] from None
        first = str(exc).strip().splitlines()[-1]
        raise DataError(f"SentencePiece training failed (tokenizer.vocab_size={cfg.vocab_size}?): {first}") from None
    out.write_bytes(model.getvalue())


def fingerprint(path: Path) -> str:
    return sha256_file(path)


class Tokenizer:
    """A loaded SentencePiece model."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise DataError(f"tokenizer model not found: {path} (run `tformer prepare` first)")
        self.path = path
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.fingerprint = fingerprint(path)
        self.vocab_size = self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]


def batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
