"""StreamRec sessions: the synthetic next-item data of chapter 10 ("From LSTM to Transformer for
StreamRec Sessions"), and the generator's own next-item probabilities.

A session is `session_len` item ids from 1..n_items (0 is padding, as in every tformer vocabulary, so
item k is token k and the vocabulary is n_items + 1). The first item is uniform; then, from the current
item at 0-based position t, the next item is made by one of three rules, recorded beside it so that
metrics can be split by rule:

- local, with probability p_local: the current item + 1. Item n_items is followed by item 1: the ids
  wrap around, so every item has a successor and the rule reads the same for all of them.
- long-range, otherwise with probability p_long, where t > long_after and t >= min_gap: a copy of the
  item at a uniformly chosen earlier position j <= t - min_gap (at least min_gap back).
- random, otherwise: a uniform item.

The rules make the session itself, item after item, so a session is what a next-token language model
reads: inputs `items[:, :-1]`, targets `items[:, 1:]`, a target at every position. Everything comes
from one seeded `torch.Generator`: the recipe's `data.sessions` fixes the data set exactly. Sessions
are split in order: the first for training, then `n_valid` for validation, then `n_test` for test.

Shape legend: N sessions, L session_len, R = 3 rules, I = n_items.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer_cli.schema import SessionsConfig

PAD_ID = 0  # the same id as tokenizer.PAD_ID: every model reserves 0 for padding
LOCAL, LONG, RANDOM = 0, 1, 2  # the rules, as stored in Sessions.rules
RULES = ("local", "long", "random")  # their names in metric keys: accuracy_local, hit10_long, ...
NO_TARGET = -1  # Sessions.rules past a session's end


@dataclass(frozen=True)
class Sessions:
    """Sessions and the rule that made each of their items after the first."""

    items: Tensor  # (N, L) int64 item ids, PAD_ID after a session's end
    rules: Tensor  # (N, L - 1) int64: the rule that made items[:, t + 1]; NO_TARGET past the end

    def __len__(self) -> int:
        return self.items.size(0)

    @property
    def inputs(self) -> Tensor:
        """(N, L - 1) what the model reads: every item but the last."""
        return self.items[:, :-1]

    @property
    def targets(self) -> Tensor:
        """(N, L - 1) the next item at each input position (PAD_ID past a session's end)."""
        return self.items[:, 1:]

    def rows(self, index: Tensor) -> Sessions:
        """The sessions `index` selects, in that order."""
        return Sessions(self.items[index], self.rules[index])


def successor(items: Tensor, n_items: int) -> Tensor:
    """The local rule's next item: item + 1, with n_items followed by 1."""
    return items % n_items + 1


def long_range_applies(t: Tensor, cfg: SessionsConfig) -> Tensor:
    """Whether the long-range rule may make the item after position `t` (bool, `t`'s shape)."""
    return (t > cfg.long_after) & (t >= cfg.min_gap)


def generate(cfg: SessionsConfig) -> Sessions:
    """All `cfg.n_sessions` sessions (train, valid and test rows in that order), from `cfg.seed` alone.

    Every draw is made at every step whichever rule wins, so the items never depend on min_len: the
    lengths are drawn last, and shorter sessions are the same sessions cut and padded.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    n, length = cfg.n_sessions, cfg.session_len
    items = torch.empty(n, length, dtype=torch.long)
    rules = torch.empty(n, length - 1, dtype=torch.long)
    items[:, 0] = torch.randint(1, cfg.n_items + 1, (n,), generator=gen)
    for t in range(length - 1):
        local = torch.rand(n, generator=gen) < cfg.p_local
        long_allowed = bool(long_range_applies(torch.tensor(t), cfg))
        long = ~local & (torch.rand(n, generator=gen) < cfg.p_long) & long_allowed
        uniform = torch.randint(1, cfg.n_items + 1, (n,), generator=gen)
        back = torch.randint(0, max(t - cfg.min_gap + 1, 1), (n, 1), generator=gen)  # j <= t - min_gap
        earlier = items.gather(1, back).squeeze(1)
        items[:, t + 1] = torch.where(local, successor(items[:, t], cfg.n_items), torch.where(long, earlier, uniform))
        rules[:, t] = torch.where(local, LOCAL, torch.where(long, LONG, RANDOM))
    if cfg.min_len is not None:
        ends = torch.randint(cfg.min_len, length + 1, (n, 1), generator=gen)  # each session's length
        items[torch.arange(length)[None, :] >= ends] = PAD_ID
        rules[torch.arange(1, length)[None, :] >= ends] = NO_TARGET
    return Sessions(items, rules)


def _bounds(cfg: SessionsConfig) -> dict[str, tuple[int, int]]:
    """The rows of each split: the first sessions for training, then `n_valid` for validation, then `n_test`."""
    n_train = cfg.n_sessions - cfg.n_valid - cfg.n_test
    return {
        "train": (0, n_train),
        "valid": (n_train, n_train + cfg.n_valid),
        "test": (n_train + cfg.n_valid, cfg.n_sessions),
    }


def splits(cfg: SessionsConfig) -> dict[str, Sessions]:
    """The `train`, `valid` and `test` sessions of the data set `cfg` describes, generated once."""
    data = generate(cfg)
    return {name: Sessions(data.items[start:end], data.rules[start:end]) for name, (start, end) in _bounds(cfg).items()}


def split(cfg: SessionsConfig, name: str) -> Sessions:
    """The `train`, `valid` or `test` sessions of the data set `cfg` describes.

    Raises:
        ValueError: another split name (a caller's bug).
    """
    if name not in _bounds(cfg):
        raise ValueError(f"unknown split {name!r}")
    return splits(cfg)[name]


def next_item_probabilities(items: Tensor, cfg: SessionsConfig) -> Tensor:
    """P(next item = y and made by rule r | the session up to t): the generator's exact probabilities.

    The best any predictor can do given a session's history is to rank items by their sum over r; the
    split by r says how much of each rule's targets that ranking gets right (see ranking.py).

    Args:
        items: (N, L) sessions, on any device.
        cfg: the generator's settings.

    Returns:
        (N, L - 1, R, I) float64 on `items`' device: [s, t, r, y - 1] for the item after position t of
        session s. Rows at or past a session's end hold numbers that mean nothing (their target is padding).
    """
    n_items, length = cfg.n_items, items.size(1)
    t = torch.arange(length - 1, device=items.device)
    p_long = (1.0 - cfg.p_local) * cfg.p_long * long_range_applies(t, cfg).double()  # (L - 1,)
    probs = torch.zeros(items.size(0), length - 1, len(RULES), n_items, dtype=torch.float64, device=items.device)
    local_item = successor(items[:, :-1], n_items) - 1  # (N, L - 1) as an index
    probs[:, :, LOCAL].scatter_(2, local_item[..., None], cfg.p_local)
    # counts[s, j, y - 1]: how often item y occurs in positions 0..j of session s
    counts = F.one_hot(items, n_items + 1)[..., 1:].cumsum(1).double()  # (N, L, I)
    last_back = (t - cfg.min_gap).clamp(min=0)  # the latest position a long-range copy may come from
    candidates = (t - cfg.min_gap + 1).clamp(min=1).double()  # how many positions it chooses among
    probs[:, :, LONG] = counts[:, last_back] * (p_long / candidates)[None, :, None]
    probs[:, :, RANDOM] = ((1.0 - cfg.p_local - p_long) / n_items)[None, :, None]
    return probs
