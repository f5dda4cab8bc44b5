"""The PatternSequence generator."""

import torch

from tformer_cli.data.pattern import generate


def test_deterministic_per_seed():
    a, b, c = (
        generate(seed=3, n_examples=200, n_train=150),
        generate(seed=3, n_examples=200, n_train=150),
        generate(seed=4, n_examples=200, n_train=150),
    )
    assert torch.equal(a.train_tokens, b.train_tokens) and torch.equal(a.valid_labels, b.valid_labels)
    assert not torch.equal(a.train_tokens, c.train_tokens)


def test_every_sequence_contains_its_class_pattern():
    data = generate(seed=0)
    tokens = torch.cat([data.train_tokens, data.valid_tokens])
    labels = torch.cat([data.train_labels, data.valid_labels])
    assert tokens.shape == (10_000, 64) and data.train_tokens.shape[0] == 8_000
    for row, label, start in zip(tokens.tolist(), labels.tolist(), data.positions.tolist(), strict=True):
        assert row[start : start + 5] == data.patterns[label].tolist()


def test_vocabulary_classes_and_patterns():
    data = generate(seed=0)
    assert int(data.train_tokens.min()) >= 2 and int(data.train_tokens.max()) <= 99  # 0 pad, 1 reserved
    assert set(data.train_labels.tolist()) == set(range(10))
    assert len({tuple(p) for p in data.patterns.tolist()}) == 10
