"""BPE-dropout (Provilkov et al., 2020): the training pairs segmented anew at every epoch.

With probability p each merge of the BPE tokenizer is skipped where it applies, so a word comes in many
segmentations ("riding" as `▁riding`, `▁rid ing`, `▁r id ing`): a regulariser for small data, like OpenNMT-py's
`src_subword_alpha` / `tgt_subword_alpha` and Marian's `--sentencepiece-alphas` (one p for each side) on a
SentencePiece BPE model. Validation, test and translation keep the one segmentation of `prepare` (p = 0).

`prepare` writes token ids, not text: the sentences are recovered by decoding those ids once (SentencePiece
decodes to the normalised text it encoded, and each sentence is checked by encoding it back). An epoch's
segmentation is a function of (run.seed, epoch) only, so a resumed run sees the same pairs. A pair keeps its
prepared ids when a sampled side does not encode back to them (an unknown piece decodes to ⁇) or when its sampled
lengths do not fit the batch or the model's positions (`fits`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import sentencepiece as spm

from tformer_cli.data.batching import TokenArray
from tformer_cli.tokenizer import EOS_ID, Tokenizer

Fits = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (source lengths, target lengths) -> which pairs fit


class BpeDropout:
    """The training pairs of each epoch under BPE-dropout `p` = (source's, target's) (epoch -> source and target
    arrays). A side whose p is 0 keeps its prepared ids."""

    def __init__(
        self, tokenizer_path: Path, src: TokenArray, tgt: TokenArray, p: tuple[float, float], seed: int, fits: Fits
    ) -> None:
        self.sp = Tokenizer(tokenizer_path).sp
        self.prepared, self.p, self.seed, self.fits = (src, tgt), p, seed, fits
        self.texts: list[list[str] | None] = []
        same = np.ones(len(src), dtype=bool)
        for side, p_side in zip(self.prepared, p, strict=True):
            if not p_side:
                self.texts.append(None)
                continue
            ids = [side[i][:-1].tolist() for i in range(len(side))]  # without EOS
            texts = self.sp.decode(ids)
            same &= np.array([back == row for back, row in zip(self.sp.encode(texts), ids, strict=True)], dtype=bool)
            self.texts.append(texts)
        self.sampled = same  # the pairs that are segmented anew; the others keep their prepared ids

    def epoch(self, epoch: int) -> tuple[TokenArray, TokenArray]:
        """The epoch's (source, target) arrays, one row per prepared pair, in the same order."""
        spm.set_random_generator_seed((self.seed * 100_003 + epoch) % 2**32)
        sides: list[list[list[int]] | None] = []
        for texts, p_side in zip(self.texts, self.p, strict=True):
            if texts is None:
                sides.append(None)
                continue
            # one thread: SentencePiece's sampling follows the seed in a fixed order only then
            rows = self.sp.encode(texts, enable_sampling=True, alpha=p_side, num_threads=1)
            sides.append([[*row, EOS_ID] for row in rows])
        lengths = [
            prepared.lengths if side is None else np.array([len(row) for row in side])
            for side, prepared in zip(sides, self.prepared, strict=True)
        ]
        keep = self.sampled & self.fits(*lengths)
        return tuple(  # type: ignore[return-value]
            prepared
            if side is None
            else TokenArray.from_rows(
                [row if keep[i] else prepared[i] for i, row in enumerate(side)], prepared.tokens.dtype
            )
            for side, prepared in zip(sides, self.prepared, strict=True)
        )
