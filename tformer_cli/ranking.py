"""Next-item ranking metrics split by the rule that made each target: a model's, and the best possible.

For each target the items are ranked by score; accuracy counts rank 1, Hit@10 a rank <= 10, and MRR
averages 1 / rank. Each is also reported per rule (local, long-range, random: data/sessions.py), since
that split is where an LSTM and a Transformer differ.

- A model's ranks (`model_sums`): a tie counts against the target, so the rank is the number of items
  scoring at least as high as the target (a model that scores every item the same ranks every target
  last, not first).
- The Bayes-optimal ranks (`best_sums`): given the generator's probabilities P(next = y, rule r |
  history), ranking items by P(next = y | history) maximises the expected accuracy, Hit@10 and MRR at
  once (the most probable items take the best ranks). Each metric is then an expectation, computed
  exactly: items of equal probability share their ranks in a random order, each equally likely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tformer_cli.data.sessions import RULES as RULE_NAMES

HIT_AT = 10  # Hit@10
_TIE = 1e-12  # probabilities closer than this are one tie (they are computed, not drawn)


@dataclass
class RankSums:
    """Per rule (in RULE_NAMES order): targets, and the sums of correct, hit and reciprocal rank over them.

    A model's sums count targets; the Bayes-optimal ones are expectations (fractional counts).
    """

    count: Tensor = field(default_factory=lambda: torch.zeros(len(RULE_NAMES), dtype=torch.float64))
    correct: Tensor = field(default_factory=lambda: torch.zeros(len(RULE_NAMES), dtype=torch.float64))
    hit: Tensor = field(default_factory=lambda: torch.zeros(len(RULE_NAMES), dtype=torch.float64))
    reciprocal: Tensor = field(default_factory=lambda: torch.zeros(len(RULE_NAMES), dtype=torch.float64))

    def add(self, other: RankSums) -> None:
        for name in ("count", "correct", "hit", "reciprocal"):
            setattr(self, name, getattr(self, name) + getattr(other, name).cpu())

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """`accuracy`, `hit10`, `mrr` over all targets, then each `_<rule>` (NaN for a rule without targets)."""
        out: dict[str, float] = {}
        sums = {"accuracy": self.correct, f"hit{HIT_AT}": self.hit, "mrr": self.reciprocal}
        for metric, total in sums.items():
            out[f"{prefix}{metric}"] = float(total.sum() / self.count.sum()) if self.count.sum() > 0 else math.nan
        for r, rule in enumerate(RULE_NAMES):
            for metric, total in sums.items():
                out[f"{prefix}{metric}_{rule}"] = float(total[r] / self.count[r]) if self.count[r] > 0 else math.nan
        return out


def model_sums(scores: Tensor, targets: Tensor, rules: Tensor) -> RankSums:
    """A model's rank sums.

    Args:
        scores: (M, I) a score for every candidate item (higher is better), any float dtype.
        targets: (M,) the index of each target among the I candidates.
        rules: (M,) the rule index of each target.
    """
    target_score = scores.gather(1, targets[:, None])  # (M, 1)
    rank = (scores >= target_score).sum(1).double()  # ties count against the target
    per_rule = torch.nn.functional.one_hot(rules, len(RULE_NAMES)).double()  # (M, R)
    return RankSums(
        count=per_rule.sum(0),
        correct=((rank == 1).double() @ per_rule),
        hit=((rank <= HIT_AT).double() @ per_rule),
        reciprocal=((1.0 / rank) @ per_rule),
    )


def best_sums(probs: Tensor) -> RankSums:
    """The Bayes-optimal predictor's expected rank sums.

    Args:
        probs: (M, R, I) P(next = item i, made by rule r | history) for M targets, float64; each
            (R, I) slice sums to 1.

    Returns:
        Expected counts per rule (P(rule r | history) summed) and the expected sums of correct, hit
        and reciprocal rank, items of equal probability taking their shared ranks in a uniformly
        random order.
    """
    total = probs.sum(1)  # (M, I) P(next = item | history): the optimal ranking's scores
    ordered, order = total.sort(dim=1, descending=True, stable=True)
    first, last = _tie_groups(ordered)  # (M, I) the 1-based ranks each sorted item's tie group spans
    size = (last - first + 1).double()
    n = total.size(1)
    harmonic = torch.cat([probs.new_zeros(1), (1.0 / torch.arange(1, n + 1, device=probs.device)).cumsum(0)])

    def expected(per_place: Tensor) -> Tensor:  # sum over targets of E[per item score] for each rule
        per_item = torch.empty_like(per_place).scatter_(1, order, per_place)  # back to the items' order
        return torch.einsum("mri,mi->r", probs, per_item)

    def within(k: int) -> Tensor:  # P(rank <= k) for an item of the group
        return (k - first + 1).clamp(min=0).double().minimum(size) / size

    return RankSums(
        count=probs.sum((0, 2)),
        correct=expected(within(1)),
        hit=expected(within(HIT_AT)),
        reciprocal=expected((harmonic[last] - harmonic[first - 1]) / size),  # E[1 / rank] over the group's ranks
    )


def _tie_groups(ordered: Tensor) -> tuple[Tensor, Tensor]:
    """For (M, I) values sorted descending: each place's first and last 1-based rank among equal values."""
    n = ordered.size(1)
    rank = torch.arange(1, n + 1, device=ordered.device).expand_as(ordered)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[:, 1:] = (ordered[:, :-1] - ordered[:, 1:]) > _TIE
    ends = torch.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    first = torch.where(starts, rank, 0).cummax(1).values  # the latest start at or before each place
    last = torch.where(ends, rank, n + 1).flip(1).cummin(1).values.flip(1)  # the earliest end at or after
    return first, last
