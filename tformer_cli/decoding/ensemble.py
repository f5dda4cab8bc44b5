"""Ensemble decoding: several encoder-decoders trained on one vocabulary translate as one model.

At each step the next token's probability is the mean of the members' probabilities, and the searches
(decoding/search.py) read its log as their logits: fairseq's `--path a.pt:b.pt`, OpenNMT-py's `-model a b`,
Marian's `--models`. Independently trained models make different mistakes, so their average is usually
better than any one of them; decoding costs the sum of the members' costs.

`Ensemble` has the methods the searches call on a `Seq2Seq` (`encode`, `decode`, `encoder` and `decoder` for
the positions served) and `EnsembleCache` the one they call on a cache (`reorder`): each member keeps its
own key/value cache (decoding/cache.py's `search_cache` makes them). The members' memories travel as one
tensor, concatenated along the model width, so that the searches' row selections apply to all at once.
An ensemble decodes on the dynamic path only (decoding/api.py).

Shape legend: B batch rows, S source length, T target steps, D_i member i's model width, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import torch
from torch import Tensor, nn

from tformer_cli.model.cache import DecodeCache
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack


class Ensemble(nn.Module):
    """log p(y | prefix, x) = log (1/M) sum_i p_i(y | prefix, x) over M members (a mixture of their distributions).

    The members must read and write the same vocabulary and serve the same positions (decoding/load.py checks
    both where it loads them): `encoder` and `decoder` are the first member's, for the lengths they serve.
    """

    def __init__(self, members: list[Seq2Seq]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble has at least 2 members, got {len(members)}")
        self.members = nn.ModuleList(members)
        self.widths = [m.lm_head.in_features for m in members]  # D_i: where each member's memory sits in the one

    @property
    def seq2seqs(self) -> Iterable[Seq2Seq]:
        """The members, as the Seq2Seq models they are (an nn.ModuleList types its items as modules)."""
        return cast("Iterable[Seq2Seq]", self.members)

    @property
    def encoder(self) -> Stack:
        return cast(Seq2Seq, self.members[0]).encoder

    @property
    def decoder(self) -> Stack:
        return cast(Seq2Seq, self.members[0]).decoder

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]:
        """(B, S) -> the members' memories side by side (B, S, sum D_i) and the source's key mask (B, 1, 1, S),
        None when there is no padding (the same for every member: one source)."""
        encoded = [member.encode(src) for member in self.seq2seqs]
        return torch.cat([memory for memory, _ in encoded], dim=-1), encoded[0][1]

    def decode(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: EnsembleCache | None = None
    ) -> Tensor:
        """(B, T) target prefix -> log of the members' mean next-token probabilities (B, T, V), in fp32."""
        memories = memory.split(self.widths, dim=-1)
        caches = cache.members if cache is not None else [None] * len(self.members)
        logprobs = torch.stack(
            [
                member.decode(tgt, part, memory_mask, member_cache).float().log_softmax(-1)
                for member, part, member_cache in zip(self.seq2seqs, memories, caches, strict=True)
            ]
        )  # (M, B, T, V)
        return torch.logsumexp(logprobs, dim=0) - math.log(len(self.members))


class EnsembleCache:
    """The members' decoding caches, one each, moved together: a search keeps the same rows in all of them."""

    def __init__(self, members: list[DecodeCache]) -> None:
        self.members = members

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (the search's rows: sentences, or hypotheses) in every member's cache."""
        for cache in self.members:
            cache.reorder(index)
