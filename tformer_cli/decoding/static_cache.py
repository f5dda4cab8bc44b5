"""Static caches: keys and values in buffers allocated once at a fixed length, written where a step's position
(a tensor on the device, `Cursor.pos`) says, so that every tensor a decoding step touches keeps its shape and
address from step to step (decoding/static.py decodes with them; on CUDA the step is then captured in a graph).

They implement the model's cache interface (tformer_cli/model/cache.py), as decoding/cache.py's caches do, and
every member keeps its base's meaning: `record` gives the new steps' positions as the cursor holds them (a tensor,
never read on the host), attention spans all L steps (`n_keys`), the steps not yet written masked out, and
`reorder` moves rows in place.

Shape legend: B sentences (or LM rows), K beam, R = B x K rows, H_kv key/value heads, L the cache's length in
steps, S source length, d_head head width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tformer_cli.decoding.cache import _fold, _unfold
from tformer_cli.model.cache import DecodeCache, KVCache, LayerCache


class Cursor:
    """Where a static cache writes: `pos` (0-d long tensor) the next step; `write` the steps of the current forward."""

    def __init__(self, device: torch.device) -> None:
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.write = self.pos.view(1).clone()

    def advance(self, t: int) -> Tensor:
        """The positions of `t` new steps (pos .. pos + t - 1); `pos` moves past them, in place."""
        self.write = self.pos + torch.arange(t, device=self.pos.device)
        self.pos.add_(t)
        return self.write


class StaticKVCache(KVCache):
    """Self-attention keys and values (R, H_kv, L, d_head), allocated once (zeros: a masked key's value is
    still multiplied by its zero weight, and must not be NaN); `update` writes at the cursor and returns all
    L steps."""

    k: Tensor  # allocated once, never released
    v: Tensor

    def __init__(self, cursor: Cursor, shape: tuple[int, ...], like: Tensor) -> None:
        super().__init__()
        self.cursor = cursor
        self.k, self.v = like.new_zeros(shape), like.new_zeros(shape)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k.index_copy_(2, self.cursor.write, k)
        self.v.index_copy_(2, self.cursor.write, v)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (as many as there are rows), in place."""
        self.k.copy_(self.k.index_select(0, index))
        self.v.copy_(self.v.index_select(0, index))


class StaticBeamKVCache(StaticKVCache):
    """Beam search's self-attention keys and values (B, H_kv, L, K, d_head): step s of slot j holds the keys of
    the hypothesis that sat in slot j at step s, never moved (decoding/cache.py's `BeamKVCache`, at a fixed
    length). `update` takes (R, H_kv, 1, d_head) and returns (B, H_kv, L * K, d_head); its rows are sentences,
    which `reorder` (inherited) keeps in place."""

    def __init__(self, cursor: Cursor, shape: tuple[int, ...], like: Tensor) -> None:
        super().__init__(cursor, shape, like)
        self.beam = shape[3]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        n, h, d = k.size(0) // self.beam, k.size(1), k.size(3)
        self.k.index_copy_(2, self.cursor.write, k.view(n, self.beam, h, d).transpose(1, 2).unsqueeze(2))
        self.v.index_copy_(2, self.cursor.write, v.view(n, self.beam, h, d).transpose(1, 2).unsqueeze(2))
        return self.k.flatten(2, 3), self.v.flatten(2, 3)

    def relayout_queries(self, q: Tensor) -> Tensor:
        return _fold(q, self.beam)

    def relayout_outputs(self, out: Tensor) -> Tensor:
        return _unfold(out)


class StaticMemoryKV(KVCache):
    """Cross-attention's keys and values of a batch (B, H_kv, S, d_head), in buffers allocated once: the first
    step's `keep_memory` copies into them; `forget` before the next batch's first step. Its rows are sentences,
    which `reorder` keeps in place."""

    def __init__(self, shape: tuple[int, ...], like: Tensor, beam: int = 1) -> None:
        super().__init__()
        self.buffers = (like.new_zeros(shape), like.new_zeros(shape))
        self.beam = beam  # > 1: a sentence's K hypotheses query its keys together (decoding/cache.py)

    def keep_memory(self, k: Tensor, v: Tensor) -> None:
        self.buffers[0].copy_(k)
        self.buffers[1].copy_(v)
        self.memory = self.buffers

    def forget(self) -> None:
        self.memory = None

    def relayout_queries(self, q: Tensor) -> Tensor:
        return _fold(q, self.beam) if self.beam > 1 else q

    def relayout_outputs(self, out: Tensor) -> Tensor:
        return _unfold(out) if self.beam > 1 else out

    def reorder(self, index: Tensor) -> None:
        """Keep sentences `index` (as many as there are rows), in place: the buffers keep their addresses."""
        if self.memory is not None:
            for buffer in self.buffers:
                buffer.copy_(buffer.index_select(0, index))


class StaticDecodeCache(DecodeCache):
    """The caches of a stack for R rows and L steps; `valid` (R, L) marks the written steps of real tokens.

    The steps written are counted on the device (`Cursor.pos`): a Python int would be fixed into a captured step.
    `record` gives the new steps' positions as a tensor; attention spans all L steps (`n_keys`), masked.
    """

    def __init__(self, layers: list[LayerCache], cursor: Cursor, rows: int, max_steps: int) -> None:
        super().__init__(layers)
        self.cursor, self.max_steps = cursor, max_steps
        self.valid = torch.zeros(rows, max_steps, dtype=torch.bool, device=cursor.pos.device)
        self.steps = torch.arange(max_steps, device=cursor.pos.device)

    @property
    def n_keys(self) -> int:
        return self.max_steps

    def state(self) -> list[Tensor]:
        """The tensors a step changes in place besides the keys and values."""
        return [self.cursor.pos, self.valid]

    def reset(self) -> None:
        """Empty, for the next batch (the buffers stay)."""
        self.cursor.pos.zero_()
        self.valid.zero_()
        for layer in self.layers:
            if isinstance(layer.cross_kv, StaticMemoryKV):
                layer.cross_kv.forget()

    def record(self, key_mask: Tensor, causal: bool) -> tuple[Tensor, Tensor | None, bool]:
        write = self.cursor.advance(key_mask.size(1))  # the new steps' positions
        self.valid.index_copy_(1, write, key_mask)
        keys = self.valid[:, None, None, :]  # (R, 1, 1, L): steps not yet written are not valid
        if not causal or key_mask.size(1) == 1:
            return write, keys, False
        return write, keys & (self.steps[None, :] <= write[:, None]), False  # (R, 1, T_new, L)

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.self_kv.reorder(index)
        self.valid.copy_(self.valid.index_select(0, index))


class StaticBeamCache(StaticDecodeCache):
    """Beam search's caches for B sentences x K hypotheses and L steps: the keys stay where they were written,
    and `ancestry` (R, L) records for each hypothesis the slot its ancestor held at each step
    (decoding/cache.py's `BeamDecodeCache`, at a fixed length); `reorder` moves only that table."""

    def __init__(self, layers: list[LayerCache], cursor: Cursor, n_sent: int, beam: int, max_steps: int) -> None:
        super().__init__(layers, cursor, 1, max_steps)
        self.beam = beam
        device = cursor.pos.device
        self.ancestry = torch.zeros(n_sent * beam, max_steps, dtype=torch.long, device=device)
        self.slots = (torch.arange(n_sent * beam, device=device) % beam)[:, None]
        self.slot_ids = torch.arange(beam, device=device)

    def state(self) -> list[Tensor]:
        return [self.cursor.pos, self.ancestry]

    def reset(self) -> None:
        super().reset()
        self.ancestry.zero_()

    def record(self, key_mask: Tensor, causal: bool) -> tuple[Tensor, Tensor | None, bool]:
        """The step's position (1,) and the mask (B, 1, K, L * K): hypothesis k may attend to key s * K + j iff
        its ancestor at step s sat in slot j and step s is written. Beam search feeds one real token per
        hypothesis (not checked: a host read)."""
        if key_mask.size(1) != 1:
            raise ValueError(f"beam search decodes one step at a time, got {key_mask.size(1)}")
        write = self.cursor.advance(1)
        self.ancestry.index_copy_(1, write, self.slots)
        allowed = self.ancestry[:, :, None] == self.slot_ids  # (R, L, K)
        allowed &= (self.steps < self.cursor.pos)[None, :, None]
        return write, allowed.view(-1, self.beam, self.max_steps * self.beam).unsqueeze(1), False

    def relayout_score_bias(self, bias: Tensor) -> Tensor:
        return bias.repeat_interleave(self.beam, dim=-1)

    def reorder(self, index: Tensor) -> None:
        """Hypotheses `index` (R rows of the previous step) continue: only the ancestry table moves."""
        self.ancestry.copy_(self.ancestry.index_select(0, index))
