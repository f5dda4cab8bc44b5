"""Schedules and the loss, against their formulas."""

import math

import pytest
import torch

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError
from tformer_cli.model import build_model
from tformer_cli.train.optim import build_optimizer, load_optimizer_state, lr_at


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


def test_cosine_fitted_to_the_time_follows_the_larger_fraction_spent():
    """train.fit_schedule_to_time: the decay goes as far as the larger of the updates' and the time's fractions."""
    cfg = _train_cfg("train.schedule=cosine", "train.lr=1e-3", "train.warmup_steps=200", "train.min_lr_ratio=0.1")
    half = 1e-4 + 0.9e-3 * 0.5
    assert lr_at(1350, cfg, 128, 2500, time_spent=0.2) == pytest.approx(half)  # the updates' 1/2 leads
    assert lr_at(1350, cfg, 128, 2500, time_spent=0.9) == pytest.approx(
        1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(0.9 * math.pi))
    )
    assert lr_at(300, cfg, 128, 2500, time_spent=1.5) == pytest.approx(1e-4)  # the time is up: the floor
    assert lr_at(100, cfg, 128, 2500, time_spent=0.9) == pytest.approx(5e-4)  # the warm-up counts updates only


def test_fitting_the_schedule_to_the_time_needs_a_budget_and_a_cosine():
    with pytest.raises(ConfigError, match="fit_schedule_to_time needs .*, got max_minutes 0 and schedule cosine"):
        load_config(None, ["train.fit_schedule_to_time=true"])
    with pytest.raises(ConfigError, match="got max_minutes 5 and schedule constant"):
        load_config(None, ["train.fit_schedule_to_time=true", "train.max_minutes=5", "train.schedule=constant"])
    assert load_config(None, ["train.fit_schedule_to_time=true", "train.max_minutes=5"]).train.fit_schedule_to_time


# Each token's distribution is a permutation of P = (1/2, 1/4, 1/8, 1/8), so every -log p is a multiple of
# ln 2: -log p over the 4 classes is (1, 2, 3, 3) ln 2 in some order, and its mean is 9/4 ln 2.
LN2 = math.log(2.0)
P = {1: 0.5, 2: 0.25, 3: 0.125}  # -log2 p -> p


def _token_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (2, 3, 4), targets (2, 3), probabilities (2, 3, 4)); target 0 is padding (PAD_ID)."""
    bits = [
        [[3, 1, 2, 3], [3, 2, 3, 1], [1, 2, 3, 3]],  # targets 1 (argmax: right), 2 (wrong), pad (argmax = 0)
        [[3, 3, 2, 1], [1, 3, 3, 2], [1, 3, 2, 3]],  # targets 3 (right), pad, pad
    ]
    probs = torch.tensor([[[P[b] for b in token] for token in row] for row in bits])
    shift = torch.tensor([[[0.0], [5.0], [-3.0]], [[2.0], [-1.0], [7.0]]])
    logits = (probs.log() + shift).requires_grad_()  # softmax ignores a constant per token
    return logits, torch.tensor([[1, 2, 0], [3, 0, 0]]), probs


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_token_loss_by_hand_sums_real_tokens_only(eps):
    """token_loss: the mean over the 3 real tokens of (1 - eps) * -log p_y + eps * mean_v(-log p_v);
    padding adds nothing to the loss, its gradient, the count or the correct count."""
    from tformer_cli.metrics import token_loss

    logits, targets, probs = _token_case()
    loss, stats = token_loss(logits, targets, eps)
    nll = [1, 3, 1]  # -log2 p_y of the real tokens: targets 1, 2, 3
    per_token = [(1 - eps) * n * LN2 + eps * 9 / 4 * LN2 for n in nll]
    assert float(loss.detach()) == pytest.approx(sum(per_token) / 3, rel=1e-6)  # token_loss works in fp32
    assert stats.count == 3 and stats.correct == 2
    assert float(stats.loss_sum) == pytest.approx(sum(per_token), rel=1e-6)
    assert stats.loss == pytest.approx(float(loss.detach()), rel=1e-6)
    # d loss / d logits = (p - q) / 3 on real tokens, q = (1 - eps) * one_hot(y) + eps / 4; zero on padding
    loss.backward()
    q = (1 - eps) * torch.nn.functional.one_hot(targets, 4) + eps / 4
    real = (targets != 0).unsqueeze(-1)
    assert torch.allclose(logits.grad, torch.where(real, (probs - q) / 3, 0.0), atol=1e-7)
    assert torch.equal(logits.grad[~real.squeeze(-1)], torch.zeros(3, 4))


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


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_the_fused_update_on_cuda_only(device, optimizer):
    """CUDA: one fused kernel for the whole update; elsewhere PyTorch's default."""
    model = build_model("lm", vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32).to(device)
    groups = build_optimizer(model, _train_cfg(f"train.optimizer={optimizer}")).param_groups
    assert all(bool(group["fused"]) == (device.type == "cuda") for group in groups)


def test_a_checkpoint_from_another_device_loads_with_this_devices_implementation():
    """A checkpoint written on a GPU says fused in every group; resumed on a CPU, the update stays the CPU's
    (and the reverse), with the checkpoint's state and hyperparameters."""
    model = build_model("lm", vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    cfg = _train_cfg("train.weight_decay=0.1", "train.decay_norms_biases_embeddings=false")
    written = build_optimizer(model, cfg)
    model(torch.randint(1, 20, (2, 5))).sum().backward()
    written.step()
    state = written.state_dict()
    for group in state["param_groups"]:
        group.update(fused=True, foreach=None, lr=0.5)  # as CUDA writes it, and a hyperparameter of its run
    resumed = build_optimizer(model, cfg)
    load_optimizer_state(resumed, state)
    assert [group["fused"] for group in resumed.param_groups] == [None, None]  # this machine's choice
    assert [group["lr"] for group in resumed.param_groups] == [0.5, 0.5]  # the checkpoint's
    first = resumed.param_groups[0]["params"][0]
    assert torch.equal(resumed.state[first]["exp_avg"], written.state[written.param_groups[0]["params"][0]]["exp_avg"])


def test_a_checkpoint_with_other_parameter_groups_is_refused():
    """Two groups written (norms, biases and embeddings apart from the decayed matrices), one to resume: refused,
    not loaded into the group that happens to pair up."""
    model = build_model("lm", vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    written = build_optimizer(model, _train_cfg("train.decay_norms_biases_embeddings=false"))
    model(torch.randint(1, 20, (2, 5))).sum().backward()
    written.step()
    resumed = build_optimizer(model, _train_cfg())
    assert len(written.param_groups) == 2 and len(resumed.param_groups) == 1
    with pytest.raises(ValueError, match="different number of parameter groups"):
        load_optimizer_state(resumed, written.state_dict())
