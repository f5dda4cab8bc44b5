"""Position information: sinusoidal and learned (added to embeddings), RoPE and ALiBi (inside attention).

`model.pos` chooses one: sinusoidal | learned | rope | alibi | none.

Every module takes the steps' positions as one long tensor `positions` (T,) (torchtune's `input_pos`): 0 .. T - 1
for a whole sequence, the cache's next positions while decoding (model/cache.py's `DecodeCache.record`; a
static decoding step's come from a counter on the device, so that one captured step serves every position).
The tables are read with it and never checked against it on the host (that would read its values): the
stack first makes them cover the positions it will ask for (`prepare`, with a Python int).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer_cli.errors import TformerError


def sinusoidal_table(n_positions: int, d_model: int, offset: int = 0) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    Returns:
        (n_positions, d_model) float32 table for positions offset .. offset + n_positions - 1.
    """
    pos = torch.arange(offset, offset + n_positions, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angles = pos * inv_freq  # (T, D/2)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """Adds the fixed sinusoidal table (the paper's choice; no parameters, any length)."""

    table: Tensor  # (max_len, D), a buffer

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def prepare(self, n: int) -> None:
        """Make the table cover positions 0 .. n - 1: the formula extends it to any position (rows kept)."""
        have = self.table.size(0)
        if n > have:
            extra = sinusoidal_table(n - have, self.d_model, have).to(self.table.device)
            self.table = torch.cat([self.table, extra])

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, T, D) scaled embeddings, positions (T,) within the table; returns x + PE[positions]."""
        return x + self.table.index_select(0, positions).to(x.dtype)


class LearnedPositions(nn.Module):
    """A trained embedding per position, up to `max_len` (an error beyond it)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)

    def prepare(self, n: int) -> None:
        """Check that positions 0 .. n - 1 have embeddings.

        Raises:
            TformerError: n is beyond `max_len` (a trained table cannot be extended).
        """
        if n > self.max_len:
            raise TformerError(
                f"sequence of length {n} is longer than the learned positions' maximum {self.max_len} (model.max_len)"
            )

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, T, D) scaled embeddings, positions (T,) below `max_len`; returns x + E[positions]."""
        return x + self.embedding(positions).to(x.dtype)


class Rotary(nn.Module):
    """RoPE (Su et al.): rotate each (x_i, x_{i + d/2}) pair of q and k by pos * theta_i.

    The score q_m . k_n then depends on m - n only, so relative positions need no extra parameters.
    The angles are computed in float64 and kept in fp32 outside the module's buffers, so casting the
    model to bf16 (`decode.precision=bf16`) rounds cos/sin, never the frequencies.
    """

    def __init__(self, d_head: int, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"RoPE needs an even head width, got {d_head}")
        self.inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (d_head/2,)
        self._cache: tuple[int, Tensor] | None = None  # (positions covered, [cos | sin] (T, 2 * d_head) in fp32)

    def _cos_sin(self, n: int, device: torch.device) -> Tensor:
        if self._cache is None or self._cache[0] < n or self._cache[1].device != device:
            # Built outside inference mode: a table first made during evaluation must still serve training.
            with torch.inference_mode(False), torch.no_grad():
                positions = torch.arange(max(n, 256), dtype=torch.float64, device=device)[:, None]
                angles = positions * self.inv_freq.to(device)
                angles = torch.cat([angles, angles], dim=-1)  # (T, d_head)
                self._cache = (angles.size(0), torch.cat([angles.cos().float(), angles.sin().float()], dim=-1))
        return self._cache[1]

    def prepare(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Build the angles of positions 0 .. n - 1 now, before `forward` reads them; returns the (cos, sin)
        tables (views of one: a static decoding step keeps them), which a later, longer `prepare` may replace."""
        cos, sin = self._cos_sin(n, device).chunk(2, dim=-1)
        return cos, sin

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x: (B, H, T, d_head) at `positions` (T,), prepared (`prepare`); None: 0 .. T - 1. Returns x rotated."""
        if positions is None:
            positions = torch.arange(x.size(2), device=x.device)
            self._cos_sin(x.size(2), x.device)
        assert self._cache is not None, "Rotary.prepare comes before the positions it covers"
        cos, sin = self._cache[1].index_select(0, positions).to(x.dtype).chunk(2, dim=-1)  # (T, d_head) each
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * cos + rotated * sin


def alibi_slopes(n_heads: int) -> Tensor:
    """Press et al.'s head slopes: a geometric sequence starting at 2^(-8/n).

    For 8 heads: 1/2, 1/4, ..., 1/256. When n is not a power of two, take the slopes of the closest
    smaller power of two, then every other slope of the next power of two (the paper's recipe).
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


class ALiBi(nn.Module):
    """Attention with linear biases: score(i, j) gets -slope_h * |i - j| (no position embeddings)."""

    slopes: Tensor  # (H,), a buffer

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, positions: Tensor, t_k: int) -> Tensor:
        """Bias (1, H, T_q, T_k) for queries at `positions` (T_q,) and keys at 0 .. T_k - 1."""
        q_pos = positions[:, None]
        k_pos = torch.arange(t_k, device=self.slopes.device)[None, :]
        distance = (q_pos - k_pos).abs().float()  # (T_q, T_k)
        return (-self.slopes[:, None, None] * distance).unsqueeze(0)
