"""Schedules and the loss, against their formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_cli.config import load_config
from tformer_cli.model import build_model
from tformer_cli.train.optim import build_optimizer, lr_at


def _train_cfg(*overrides):
    return load_config(None, list(overrides)).train


@pytest.mark.parametrize("step", [1, 4000, 100_000])
def test_inverse_sqrt_matches_the_paper(step):
    cfg = _train_cfg("train.schedule=inverse_sqrt", "train.warmup_steps=4000")
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert lr_at(step, cfg, 512, 100_000) == pytest.approx(expected, rel=1e-12)
    scaled = _train_cfg("train.schedule=inverse_sqrt", "train.warmup_steps=4000", "train.lr_scale=2.0")
    assert lr_at(step, scaled, 512, 100_000) == pytest.approx(2 * expected)


def test_inverse_sqrt_peaks_at_warmup():
    cfg = _train_cfg("train.schedule=inverse_sqrt", "train.warmup_steps=4000")
    assert lr_at(4000, cfg, 512, 10**5) > lr_at(3999, cfg, 512, 10**5)
    assert lr_at(4000, cfg, 512, 10**5) > lr_at(4001, cfg, 512, 10**5)
    assert lr_at(4000, cfg, 512, 10**5) == pytest.approx(7.0e-4, rel=0.01)


def test_cosine_and_constant_with_warmup():
    cfg = _train_cfg("train.schedule=cosine", "train.lr=1e-3", "train.warmup_steps=200", "train.min_lr_ratio=0.1")
    assert lr_at(100, cfg, 128, 2500) == pytest.approx(5e-4)
    assert lr_at(200, cfg, 128, 2500) == pytest.approx(1e-3)
    assert lr_at(1350, cfg, 128, 2500) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert lr_at(2500, cfg, 128, 2500) == pytest.approx(1e-4)
    const = _train_cfg("train.schedule=constant", "train.lr=1e-3", "train.warmup_steps=10")
    assert lr_at(5, const, 128, 100) == pytest.approx(5e-4) and lr_at(50, const, 128, 100) == 1e-3


def test_label_smoothing_matches_its_formula_by_hand():
    # V = 4, eps = 0.1: loss = (1 - eps) * -log p_y + eps * mean_v(-log p_v)
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0]])
    target = torch.tensor([0])
    logp = torch.log_softmax(logits, -1)[0]
    by_hand = 0.9 * -logp[0] + 0.1 * (-logp).mean()
    assert F.cross_entropy(logits, target, label_smoothing=0.1) == pytest.approx(float(by_hand), rel=1e-6)
    # padding targets are ignored: adding a padded row changes nothing
    padded = F.cross_entropy(
        torch.cat([logits, logits]),
        torch.tensor([0, 0]) * torch.tensor([1, 0]) + torch.tensor([0, 0]),
        ignore_index=-100,
        label_smoothing=0.1,
    )
    assert padded == pytest.approx(float(by_hand), rel=1e-6)


def test_label_smoothed_task_loss_ignores_padding():
    from tformer_cli.train.tasks import _PreparedTask

    task = _PreparedTask.__new__(_PreparedTask)
    logits = torch.randn(2, 3, 7)
    targets = torch.tensor([[4, 5, 0], [6, 0, 0]])  # 0 = padding
    loss, stats = task._token_loss(logits, targets, 0.1)
    real = targets != 0
    expected = F.cross_entropy(logits[real], targets[real], label_smoothing=0.1)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6) and stats.count == 3


def test_no_decay_groups_hold_norms_biases_and_embeddings():
    model = build_model("lm", vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    cfg = _train_cfg("train.weight_decay=0.1", "train.decay_norms_biases_embeddings=false")
    decay, no_decay = build_optimizer(model, cfg).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])
    assert model.decoder.embedding.weight in no_decay["params"] or any(
        p is model.decoder.embedding.weight for p in no_decay["params"]
    )
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == sum(p.numel() for p in model.parameters())
    assert math.isclose(len(decay["params"]) + len(no_decay["params"]), len(list(model.parameters())))
