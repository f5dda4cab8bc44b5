"""The StreamRec session generator (data/sessions.py) and its exact next-item probabilities."""

import dataclasses
import math

import pytest
import torch

from tformer_cli.data.sessions import (
    LOCAL,
    LONG,
    NO_TARGET,
    PAD_ID,
    RANDOM,
    generate,
    next_item_probabilities,
    split,
)
from tformer_cli.schema import SessionsConfig

SMALL = SessionsConfig(n_sessions=300, n_valid=50, n_test=50, n_items=40)


def test_the_same_seed_gives_the_same_sessions_and_another_seed_others():
    a, b = generate(SMALL), generate(SMALL)
    c = generate(dataclasses.replace(SMALL, seed=1))
    assert torch.equal(a.items, b.items) and torch.equal(a.rules, b.rules)
    assert not torch.equal(a.items, c.items)


def test_items_are_ids_1_to_n_items_and_every_next_item_has_its_rule():
    data = generate(SMALL)
    assert data.items.shape == (300, 20) and data.rules.shape == (300, 19)
    assert int(data.items.min()) == 1 and int(data.items.max()) == SMALL.n_items
    assert set(data.rules.unique().tolist()) == {LOCAL, LONG, RANDOM}  # no padding without min_len


def test_rules_come_with_the_chapters_frequencies():
    cfg = SessionsConfig(n_sessions=20_000, n_valid=1, n_test=1)
    rules = generate(cfg).rules  # (N, 19): rules[:, t] made the item after position t
    n = rules.size(0)
    for t in range(rules.size(1)):
        long_possible = t > 3  # long_after 3 (and min_gap 3 <= t)
        expected = {LOCAL: 0.4, LONG: 0.6 * 0.3 * long_possible, RANDOM: 0.6 * (1 - 0.3 * long_possible)}
        for rule, p in expected.items():
            share = float((rules[:, t] == rule).float().mean())
            assert abs(share - p) < 5 * math.sqrt(max(p * (1 - p), 1e-9) / n), (t, rule, share, p)


def test_each_rule_makes_the_item_it_says():
    cfg = SessionsConfig(n_sessions=2_000, n_valid=1, n_test=1, n_items=7)  # small: item 7 is followed by 1 often
    data = generate(cfg)
    items, rules = data.items, data.rules
    current, following = items[:, :-1], items[:, 1:]
    local = rules == LOCAL
    assert torch.equal(following[local], current[local] % 7 + 1)
    assert bool((following[local & (current == 7)] == 1).all()) and int((local & (current == 7)).sum()) > 50
    for s, t in (rules == LONG).nonzero().tolist():  # a copy of an item at least min_gap = 3 back
        assert t > 3 and int(items[s, t + 1]) in items[s, : t - 3 + 1].tolist(), (s, t)


def test_a_long_range_copy_comes_from_min_gap_back_or_earlier_never_closer():
    # a million items: values repeat only by copying, so where a copied item can have come from is known
    cfg = SessionsConfig(n_sessions=4_000, n_valid=1, n_test=1, n_items=1_000_000, p_local=0.0, min_gap=5)
    data = generate(cfg)
    s, t = (data.rules == LONG).nonzero(as_tuple=True)  # the copy is the item at t + 1 of session s
    occurs = data.items[s] == data.items[s, t + 1][:, None]  # (copies, L): where the copied item is
    far = occurs & (torch.arange(cfg.session_len)[None, :] <= (t - 5)[:, None])  # ... at least 5 back
    assert bool(far.any(1).all())  # never a copy of a nearer item only
    single = far.sum(1) == 1  # one place far enough back: that is the source
    gaps = (t[single] - far[single].long().argmax(1)).tolist()
    assert gaps.count(5) > 100  # min_gap itself is allowed
    assert 18 in gaps  # and the first item (j = 0) from the last position (t = 18)


def test_shorter_sessions_are_the_same_sessions_cut_and_padded():
    full = generate(SMALL)
    padded = generate(dataclasses.replace(SMALL, min_len=5))
    lengths = (padded.items != PAD_ID).sum(1)
    assert int(lengths.min()) == 5 and int(lengths.max()) == 20
    for s in range(len(padded)):
        n = int(lengths[s])
        assert torch.equal(padded.items[s, :n], full.items[s, :n]) and bool((padded.items[s, n:] == PAD_ID).all())
        assert torch.equal(padded.rules[s, : n - 1], full.rules[s, : n - 1])
        assert bool((padded.rules[s, n - 1 :] == NO_TARGET).all())  # no target past the end
    assert torch.equal(padded.targets == PAD_ID, padded.rules == NO_TARGET)


def test_splits_are_train_then_valid_then_test():
    data = generate(SMALL)
    parts = [split(SMALL, name) for name in ("train", "valid", "test")]
    assert [len(p) for p in parts] == [200, 50, 50]
    assert torch.equal(torch.cat([p.items for p in parts]), data.items)
    with pytest.raises(ValueError, match="unknown split"):
        split(SMALL, "dev")


def test_next_item_probabilities_by_hand():
    cfg = SessionsConfig(n_items=4, session_len=3, p_local=0.5, p_long=0.5, long_after=0, min_gap=1)
    probs = next_item_probabilities(torch.tensor([[1, 3, 2]]), cfg)  # (1, 2, rules, items)
    # after item 1 at t = 0: no earlier item, so local (item 2) 0.5, random 0.5 / 4 each
    assert probs[0, 0].tolist() == [[0, 0.5, 0, 0], [0, 0, 0, 0], [0.125] * 4]
    # after item 3 at t = 1: local (item 4) 0.5; long-range (the item at j = 0, item 1) 0.5 * 0.5; random 0.25 / 4
    assert probs[0, 1].tolist() == [[0, 0, 0, 0.5], [0.25, 0, 0, 0], [0.0625] * 4]


def test_the_generator_draws_next_items_with_the_probabilities_it_states():
    """Empirical (rule, next item) frequencies after each history, against `next_item_probabilities`."""
    cfg = SessionsConfig(n_sessions=120_000, n_valid=1, n_test=1, n_items=3, session_len=6, long_after=2, min_gap=2)
    data = generate(cfg)
    t = 4  # the item after position 4: long-range copies from positions 0..2
    probs = next_item_probabilities(data.items, cfg)[:, t]  # (N, rules, items)
    observed = torch.zeros_like(probs)
    observed[torch.arange(len(data)), data.rules[:, t], data.items[:, t + 1] - 1] = 1.0
    history = (data.items[:, : t + 1] - 1) @ (3 ** torch.arange(t + 1))  # one number per history
    expected = torch.zeros(3 ** (t + 1), *probs.shape[1:], dtype=torch.float64).index_add_(0, history, probs)
    seen = torch.zeros_like(expected).index_add_(0, history, observed)  # (histories, rules, items) counts
    assert bool((seen[expected == 0] == 0).all())  # nothing the probabilities rule out ever happens
    possible = expected > 0
    chi2 = float(((seen - expected)[possible] ** 2 / expected[possible]).sum())
    cells = int(possible.sum()) - int((expected.sum((1, 2)) > 0).sum())  # one constraint per history
    assert cells > 1_000 and chi2 < cells + 5 * math.sqrt(2 * cells), (chi2, cells)
