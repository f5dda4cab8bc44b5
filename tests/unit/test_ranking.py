"""Next-item ranking metrics by rule (ranking.py): a model's from scores, the Bayes-optimal from probabilities."""

import math

import pytest
import torch

from tformer_cli.ranking import RankSums, best_sums, model_sums

LOCAL, LONG, RANDOM = 0, 1, 2


def test_a_model_s_accuracy_hit10_and_mrr_by_rule_by_hand(device):
    scores = torch.arange(12, 0, -1, dtype=torch.float32, device=device).repeat(5, 1)  # item i has rank i + 1
    targets = torch.tensor([0, 9, 10, 1, 3], device=device)  # ranks 1, 10, 11, 2, 4
    rules = torch.tensor([LOCAL, LOCAL, LONG, LONG, RANDOM], device=device)
    metrics = model_sums(scores, targets, rules).metrics()
    assert metrics["accuracy"] == pytest.approx(1 / 5)
    assert metrics["hit10"] == pytest.approx(4 / 5)  # rank 10 is a hit, rank 11 is not
    assert metrics["mrr"] == pytest.approx((1 + 1 / 10 + 1 / 11 + 1 / 2 + 1 / 4) / 5)
    assert metrics["accuracy_local"] == pytest.approx(1 / 2) and metrics["accuracy_long"] == 0.0
    assert (metrics["hit10_local"], metrics["hit10_long"], metrics["hit10_random"]) == (1.0, 0.5, 1.0)
    assert metrics["mrr_long"] == pytest.approx((1 / 11 + 1 / 2) / 2)
    assert metrics["mrr_random"] == pytest.approx(1 / 4)


def test_an_item_scoring_the_same_as_the_target_ranks_before_it(device):
    scores = torch.zeros(2, 20, device=device)  # a model that cannot tell the items apart
    scores[1, 3] = 1.0
    metrics = model_sums(scores, torch.tensor([5, 3], device=device), torch.tensor([LOCAL, LOCAL], device=device))
    assert metrics.metrics()["mrr"] == pytest.approx((1 / 20 + 1) / 2)  # the last rank, not the first
    assert metrics.metrics()["accuracy"] == pytest.approx(1 / 2)


def test_a_rule_without_targets_has_no_number():
    sums = model_sums(torch.randn(3, 5), torch.tensor([0, 1, 2]), torch.tensor([LOCAL, LOCAL, RANDOM]))
    metrics = sums.metrics()
    assert math.isnan(metrics["accuracy_long"]) and math.isnan(metrics["mrr_long"])
    assert not math.isnan(metrics["accuracy"])


def test_sums_add_up_over_batches():
    scores, targets, rules = torch.randn(10, 30), torch.randint(0, 30, (10,)), torch.randint(0, 3, (10,))
    total = RankSums()
    total.add(model_sums(scores[:4], targets[:4], rules[:4]))
    total.add(model_sums(scores[4:], targets[4:], rules[4:]))
    assert total.metrics() == pytest.approx(model_sums(scores, targets, rules).metrics(), nan_ok=True)


def test_bayes_optimal_metrics_by_hand(device):
    # one target: local 0.4 on item 0, long-range 0.15 on items 1 and 2, random 0.3 spread over the 4 items
    probs = torch.zeros(1, 3, 4, dtype=torch.float64, device=device)
    probs[0, LOCAL, 0] = 0.4
    probs[0, LONG, 1:3] = 0.15
    probs[0, RANDOM] = 0.075
    sums = best_sums(probs)  # ranking: item 0 (0.475), items 1 and 2 tied (0.225: ranks 2, 3), item 3 (0.075)
    assert sums.count.tolist() == pytest.approx([0.4, 0.3, 0.3])
    metrics = sums.metrics()
    assert metrics["accuracy"] == pytest.approx(0.475)  # the top probability
    assert (metrics["accuracy_local"], metrics["accuracy_long"]) == (pytest.approx(1.0), 0.0)
    assert metrics["accuracy_random"] == pytest.approx(0.25)  # random lands on item 0 one time in 4
    tied = (1 / 2 + 1 / 3) / 2  # items 1 and 2 take ranks 2 and 3 in either order
    assert metrics["mrr_long"] == pytest.approx(tied)
    assert metrics["mrr_random"] == pytest.approx((1 + tied + tied + 1 / 4) / 4)
    assert metrics["mrr"] == pytest.approx(0.475 * 1 + 0.45 * tied + 0.075 / 4)
    assert metrics["hit10"] == pytest.approx(1.0)  # 4 items: all are in the top 10


def test_bayes_optimal_hit10_shares_a_tie_across_the_cut(device):
    # item 0 first, then 11 items of equal probability for ranks 2..12: each is in the top 10 with chance 9/11
    probs = torch.zeros(1, 3, 12, dtype=torch.float64, device=device)
    probs[0, LOCAL, 0] = 0.45
    probs[0, RANDOM, 1:] = 0.05
    metrics = best_sums(probs).metrics()
    assert metrics["hit10_random"] == pytest.approx(9 / 11)
    assert metrics["hit10"] == pytest.approx(0.45 + 0.55 * 9 / 11)
    assert metrics["accuracy_random"] == 0.0 and metrics["hit10_local"] == pytest.approx(1.0)


def test_bayes_optimal_ties_between_rules_are_broken_at_random(device):
    # items 0 and 1 equally likely, one by the local rule, the other by the long-range rule: each is
    # ranked first half the time, so each rule's accuracy is 1/2 (not 1 for whichever a sort puts first)
    probs = torch.zeros(1, 3, 5, dtype=torch.float64, device=device)
    probs[0, LOCAL, 0], probs[0, LONG, 1], probs[0, RANDOM] = 0.4, 0.4, 0.04
    metrics = best_sums(probs).metrics()
    assert metrics["accuracy_local"] == pytest.approx(0.5)
    assert metrics["accuracy_local"] == pytest.approx(metrics["accuracy_long"])
    assert metrics["mrr_local"] == pytest.approx(metrics["mrr_long"])


def test_no_ranking_beats_the_bayes_optimal_one_in_expectation():
    torch.manual_seed(0)
    probs = torch.rand(200, 3, 15, dtype=torch.float64) ** 4  # peaked rows
    probs /= probs.sum((1, 2), keepdim=True)
    best = best_sums(probs).metrics()
    for scores in (probs.sum(1) + 1e-3 * torch.randn(200, 15, dtype=torch.float64), torch.randn(200, 15)):
        other = _expected_model_metrics(scores, probs)
        for metric in ("accuracy", "hit10", "mrr"):
            assert other[metric] <= best[metric] + 1e-9, metric


def _expected_model_metrics(scores: torch.Tensor, probs: torch.Tensor) -> dict[str, float]:
    """A model's metrics averaged over every possible target, each weighted by its probability."""
    p = probs.sum(1)  # (M, I) P(target = item)
    rank = (scores[:, None, :] >= scores[:, :, None]).sum(2).double()  # [m, i]: items scoring at least item i's
    mean = lambda x: float(x.sum() / p.size(0))  # noqa: E731
    return {"accuracy": mean(p * (rank == 1)), "hit10": mean(p * (rank <= 10)), "mrr": mean(p / rank)}
